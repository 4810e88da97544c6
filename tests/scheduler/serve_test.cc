// Whole-process tests of `ckpt-scheduler serve`: the real daemon (fork/exec of
// build/bin/ckpt-scheduler, which runs build/bin/ckpt-worker beside it), a
// real RocksDB store, Fashion-MNIST, and the control socket through the client
// library and raw sockets.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <utility>
#include <vector>

#include "../format/tensor_files.h"
#include "../integration/process_util.h"
#include "ckpt/records/status.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/store/store.h"
#include "control_test_util.h"

namespace ckpt {
namespace {

using json = nlohmann::json;
using scheduler::ControlClient;
using std::chrono::milliseconds;
using testing::Child;
using testing::ChildrenOf;
using testing::RawClient;

constexpr int kPopulation = 4;
constexpr int kSteps = 4;

// A small experiment that runs until it is stopped.
std::string Experiment(const std::string& name, const std::string& policy) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 11\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << kPopulation << "\nsteps_per_interval = " << kSteps
     << "\nintervals = 100000\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.9\n"
     << "[policy]\nkind = \"" << policy << "\"\nmode = \"sync\"\nquantile = 0.25\n";
  return os.str();
}

bool WaitUntil(const std::function<bool()>& done, milliseconds within) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(milliseconds(100));
  }
  return done();
}

// Whether `pid` still runs (a zombie does not).
bool ProcessRuns(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  auto rp = line.rfind(')');
  return rp != std::string::npos && rp + 2 < line.size() && line[rp + 2] != 'Z';
}

class ServeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("serve");
    ASSERT_FALSE(dir_.empty());
    binary_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
    socket_ = dir_ + "/run/control.sock";
  }
  void TearDown() override {
    client_.reset();
    for (auto& c : serves_) {
      if (c->Running()) {
        for (pid_t w : ChildrenOf(c->pid())) kill(w, SIGKILL);
      }
    }
    serves_.clear();
    std::filesystem::remove_all(dir_);
  }

  std::string WriteConfig(const std::string& file, const std::string& store,
                          const std::string& control = "", const std::string& socket = "",
                          const std::string& grace = "grace_s = 20\n") {
    std::ostringstream os;
    os << "store = \"" << dir_ << "/" << store << "\"\n"
       << "runtime_directory = \"" << dir_ << "/run\"\n";
    if (!socket.empty()) os << "socket = \"" << socket << "\"\n";
    os << "metrics = \"\"\n"
       << grace << "log_progress = true\n"
       << "[control]\n"
       << control << "\n"
       << "[workers]\nrestart_backoff_s = 0.1\n"
       << "[[devices]]\ndevice = \"cpu\"\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
    const std::string path = dir_ + "/" + file;
    std::ofstream(path) << os.str();
    return path;
  }

  // Starts `serve` and waits until its socket answers; sets client_.
  Child* StartServe(const std::string& config) {
    serves_.push_back(
        std::make_unique<Child>(std::vector<std::string>{binary_, "serve", "--config", config},
                                dir_ + "/serve-" + std::to_string(serves_.size()) + ".log"));
    Child* c = serves_.back().get();
    client_ = testing::ConnectWhenUp(socket_, milliseconds(120000), [c] { return c->Running(); });
    EXPECT_NE(client_, nullptr) << "serve did not come up:\n" << c->Log();
    return c;
  }

  // A fresh connection (the daemon may have closed an idle one).
  ControlClient* Client() {
    scheduler::ControlClientOptions o;
    o.socket_path = socket_;
    auto c = ControlClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    client_ = c.ok() ? std::move(*c) : nullptr;
    return client_.get();
  }

  // The experiment's status name, or the error, for messages.
  std::string StatusOf(const std::string& exp) {
    auto s = client_->ExperimentStatus(exp);
    return s.ok() ? records::ExperimentStatusName(s->status) : s.status().ToString();
  }
  bool StatusIs(const std::string& exp, records::ExperimentStatus want) {
    auto s = client_->ExperimentStatus(exp);
    return s.ok() && s->status == want;
  }

  // Intervals trained by every member together (persistent across restarts).
  int64_t Done(const std::string& exp) {
    auto s = client_->ExperimentStatus(exp);
    if (!s.ok()) return -1;
    int64_t sum = 0;
    for (const auto& m : s->members) sum += m.intervals_done;
    return sum;
  }
  std::map<std::string, int64_t> Versions(const std::string& exp) {
    std::map<std::string, int64_t> out;
    auto s = client_->ExperimentStatus(exp);
    if (s.ok()) {
      for (const auto& m : s->members) out[m.member] = m.version;
    }
    return out;
  }

  // SIGTERM; expects exit 0 within the grace (20 s) plus the worker stop.
  void Terminate(Child* c) {
    const auto workers = ChildrenOf(c->pid());
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(kill(c->pid(), SIGTERM), 0);
    ASSERT_TRUE(c->WaitFor(milliseconds(40000))) << "serve ignored SIGTERM:\n" << c->Log();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(s, 25.0) << c->Log();
    const int st = c->Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st << "\n" << c->Log();
    EXPECT_FALSE(std::filesystem::exists(socket_)) << "the socket outlived the daemon";
    for (pid_t w : workers) EXPECT_FALSE(ProcessRuns(w)) << "worker " << w << " outlived serve";
  }

  std::unique_ptr<store::Store> OpenStore(const std::string& store) {
    store::StoreOptions o;
    o.path = dir_ + "/" + store;
    auto s = store::Store::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return nullptr;
    auto report = (*s)->Verify();
    EXPECT_TRUE(report.ok() && report->ok())
        << (report.ok() && !report->problems.empty() ? report->problems[0] : "verify failed");
    return std::move(*s);
  }

  std::unique_ptr<store::Store> OpenReadOnly(const std::string& store) {
    store::StoreOptions o;
    o.path = dir_ + "/" + store;
    auto s = store::Store::OpenReadOnly(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(*s) : nullptr;
  }

  std::string dir_;
  std::string binary_;
  std::string socket_;
  std::vector<std::unique_ptr<Child>> serves_;
  std::unique_ptr<ControlClient> client_;
};

TEST_F(ServeTest, TwoExperimentsProgressPauseResumeAndRestore) {
  Child* serve = StartServe(WriteConfig("serve.toml", "store"));
  ASSERT_NE(client_, nullptr);
  // "a": random search (no exploits, so a member's lineage is its own);
  // "b": PBT. Both share the one worker's two slots.
  for (const auto& [name, policy] : {std::pair<std::string, std::string>{"a", "random"},
                                     std::pair<std::string, std::string>{"b", "pbt"}}) {
    auto id = client_->Submit(Experiment(name, policy), name + ".toml");
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    EXPECT_EQ(*id, name);
  }
  ASSERT_TRUE(
      WaitUntil([&] { return Done("a") >= 2 * kPopulation && Done("b") >= 2 * kPopulation; },
                milliseconds(180000)))
      << serve->Log();

  // Pause a: in-flight intervals finish, then nothing new while b trains on.
  ASSERT_TRUE(client_->Pause("a").ok());
  EXPECT_TRUE(StatusIs("a", records::ExperimentStatus::kPaused)) << StatusOf("a");
  int64_t b0 = Done("b");
  ASSERT_TRUE(WaitUntil([&] { return Done("b") >= b0 + 2 * kPopulation; }, milliseconds(120000)));
  auto ro = OpenReadOnly("store");
  ASSERT_NE(ro, nullptr);
  auto store_heads = [&](const std::string& exp) {
    EXPECT_TRUE(ro->Refresh().ok());
    std::map<std::string, int64_t> out;
    auto members = ro->ListMembers(exp);
    if (members.ok()) {
      for (const auto& m : *members) out[m.member] = m.version;
    }
    return out;
  };
  const auto paused_heads = store_heads("a");
  const auto paused_done = Done("a");
  ASSERT_EQ(paused_heads.size(), static_cast<size_t>(kPopulation));
  b0 = Done("b");
  ASSERT_TRUE(WaitUntil([&] { return Done("b") >= b0 + 3 * kPopulation; }, milliseconds(120000)));
  EXPECT_EQ(store_heads("a"), paused_heads) << "a trained while paused";
  EXPECT_EQ(Done("a"), paused_done);
  EXPECT_TRUE(StatusIs("a", records::ExperimentStatus::kPaused)) << StatusOf("a");

  // Resume: a trains again.
  ASSERT_TRUE(client_->Resume("a").ok());
  ASSERT_TRUE(
      WaitUntil([&] { return Done("a") >= paused_done + kPopulation; }, milliseconds(120000)));

  // Restore m000 of a to an earlier version, pinned so retention keeps it.
  const std::string m = "m000";
  const int64_t earlier = Versions("a")[m];
  ASSERT_GT(earlier, 0);
  ASSERT_TRUE(client_->Pin("a", m, earlier).ok());
  ASSERT_TRUE(WaitUntil([&] { return Versions("a")[m] >= earlier + 4; }, milliseconds(120000)));
  auto restored = client_->Restore("a", m, earlier);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ASSERT_GT(*restored, earlier + 3);
  ASSERT_TRUE(WaitUntil([&] { return Versions("a")[m] > *restored; }, milliseconds(120000)));
  ASSERT_TRUE(ro->Refresh().ok());
  auto source = ro->GetManifest("a", m, earlier);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  auto restore = ro->GetManifest("a", m, *restored);
  ASSERT_TRUE(restore.ok()) << restore.status().ToString();
  EXPECT_EQ(restore->reason, store::kReasonRestore);
  ASSERT_TRUE(restore->parent.has_value());
  EXPECT_EQ(restore->parent->version, earlier);
  EXPECT_EQ(restore->blob, source->blob);
  // The member's next interval trained from exactly the restored state.
  auto versions = ro->ListVersions("a", m);
  ASSERT_TRUE(versions.ok());
  const store::Manifest* next = nullptr;
  for (const auto& v : *versions) {
    if (v.version > *restored && v.reason == store::kReasonTrained) {
      next = &v;
      break;
    }
  }
  ASSERT_NE(next, nullptr);
  ASSERT_TRUE(next->parent.has_value());
  EXPECT_EQ(next->parent->member, m);
  EXPECT_EQ(next->parent->version, *restored);
  EXPECT_EQ(next->step, source->step + kSteps);
  EXPECT_TRUE(client_->Unpin("a", m, earlier).ok());

  // b kept training through all of it; stop both.
  ASSERT_TRUE(client_->Stop("a").ok());
  ASSERT_TRUE(client_->Stop("b").ok());
  auto list = client_->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  for (const auto& e : *list) EXPECT_EQ(e.status, records::ExperimentStatus::kStopped) << e.id;
  ro.reset();
  Terminate(serve);
}

TEST_F(ServeTest, SigtermDuringTrainingExitsZeroWithinGraceAndServeResumes) {
  const std::string config = WriteConfig("serve.toml", "store");
  Child* serve = StartServe(config);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(client_->Submit(Experiment("a", "pbt"), "a.toml").ok());
  ASSERT_TRUE(WaitUntil([&] { return Done("a") >= 2 * kPopulation; }, milliseconds(180000)));
  // Training: an interval is in flight when the signal comes.
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto d = client_->Devices();
        return d.ok() && !d->empty() && (*d)[0].busy > 0;
      },
      milliseconds(30000)));
  client_.reset();
  Terminate(serve);
  EXPECT_NE(serve->Log().find("terminated (SIGTERM)"), std::string::npos) << serve->Log();

  std::map<std::string, int64_t> heads;
  {
    auto s = OpenStore("store");
    ASSERT_NE(s, nullptr);
    auto e = s->GetExperiment("a");
    ASSERT_TRUE(e.ok());
    EXPECT_EQ(e->status, "running");  // a stop of the daemon does not end experiments
    auto members = s->ListMembers("a");
    ASSERT_TRUE(members.ok()) << members.status().ToString();
    for (const auto& m : *members) heads[m.member] = m.version;
  }
  ASSERT_EQ(heads.size(), static_cast<size_t>(kPopulation));

  // serve resumes it without being asked.
  Child* again = StartServe(config);
  ASSERT_NE(client_, nullptr);
  auto list = client_->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].status, records::ExperimentStatus::kRunning);
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto v = Versions("a");
        for (const auto& [m, h] : heads) {
          if (v[m] <= h) return false;
        }
        return true;
      },
      milliseconds(180000)))
      << again->Log();
  Terminate(again);
}

TEST_F(ServeTest, SigtermAbandonsIntervalsLongerThanTheGraceAndTheyRerun) {
  // Intervals of a few seconds each, a grace of one second.
  const std::string config = WriteConfig("serve.toml", "store", "", "", "grace_s = 1\n");
  Child* serve = StartServe(config);
  ASSERT_NE(client_, nullptr);
  std::string slow = Experiment("slow", "random");
  slow.replace(slow.find("steps_per_interval = 4"), 22, "steps_per_interval = 1500");
  ASSERT_TRUE(client_->Submit(slow, "slow.toml").ok());
  // Both slots training (up to two more tasks wait in the worker: random
  // search lets a member that finished run ahead of the barrier at once).
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto d = client_->Devices();
        return d.ok() && !d->empty() && (*d)[0].busy >= 2;
      },
      milliseconds(60000)));
  const int64_t before = Done("slow");
  client_.reset();
  const auto t0 = std::chrono::steady_clock::now();
  Terminate(serve);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 8.0);
  EXPECT_NE(serve->Log().find("grace period over"), std::string::npos) << serve->Log();
  int64_t committed = 0;
  {
    auto s = OpenStore("store");
    ASSERT_NE(s, nullptr);
    auto members = s->ListMembers("slow");
    ASSERT_TRUE(members.ok());
    for (const auto& m : *members) committed += m.version;
  }
  EXPECT_GE(committed, before);
  // The abandoned intervals rerun from the committed heads.
  Child* again = StartServe(config);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(WaitUntil([&] { return Done("slow") > committed; }, milliseconds(180000)))
      << again->Log();
  client_.reset();
  Terminate(again);
}

TEST_F(ServeTest, SigkillOfServeAndRestartResumesEveryExperimentLosingNothing) {
  const std::string config = WriteConfig("serve.toml", "store");
  Child* serve = StartServe(config);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(client_->Submit(Experiment("a", "random"), "a.toml").ok());
  ASSERT_TRUE(client_->Submit(Experiment("b", "random"), "b.toml").ok());
  ASSERT_TRUE(
      WaitUntil([&] { return Done("a") >= 2 * kPopulation && Done("b") >= 2 * kPopulation; },
                milliseconds(180000)));
  const auto workers = ChildrenOf(serve->pid());
  ASSERT_FALSE(workers.empty());
  ASSERT_EQ(kill(serve->pid(), SIGKILL), 0);
  serve->Wait();
  client_.reset();
  // Orphaned workers notice their scheduler is gone and exit.
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (pid_t w : workers) {
          if (ProcessRuns(w)) return false;
        }
        return true;
      },
      milliseconds(30000)));
  for (pid_t w : workers) {
    if (ProcessRuns(w)) kill(w, SIGKILL);
  }
  EXPECT_TRUE(std::filesystem::exists(socket_));  // stale, left by the killed daemon

  // What was committed when it died.
  std::map<std::string, std::map<std::string, store::Manifest>> committed;
  {
    auto s = OpenStore("store");
    ASSERT_NE(s, nullptr);
    for (const std::string exp : {"a", "b"}) {
      auto heads = s->ListMembers(exp);
      ASSERT_TRUE(heads.ok()) << heads.status().ToString();
      for (const auto& m : *heads) {
        auto man = s->GetManifest(exp, m.member, m.version);
        ASSERT_TRUE(man.ok()) << exp << " " << m.member << ": " << man.status().ToString();
        committed[exp][m.member] = *man;
      }
    }
  }

  // The restarted daemon replaces the stale socket and resumes both.
  Child* again = StartServe(config);
  ASSERT_NE(client_, nullptr) << again->Log();
  auto list = client_->List();
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 2u);
  for (const auto& e : *list) EXPECT_EQ(e.status, records::ExperimentStatus::kRunning) << e.id;
  ASSERT_TRUE(WaitUntil(
      [&] {
        for (const auto& [exp, members] : committed) {
          auto v = Versions(exp);
          for (const auto& [m, man] : members) {
            if (v[m] <= man.version) return false;
          }
        }
        return true;
      },
      milliseconds(180000)))
      << again->Log();
  client_.reset();
  Terminate(again);

  // Nothing committed was lost: every member's committed head is in its
  // lineage now, unchanged.
  auto s = OpenStore("store");
  ASSERT_NE(s, nullptr);
  for (const auto& [exp, members] : committed) {
    for (const auto& [m, man] : members) {
      auto lineage = s->Lineage(exp, m);
      ASSERT_TRUE(lineage.ok());
      bool found = false;
      for (const auto& l : *lineage) {
        if (l.member != m || l.version != man.version) continue;
        found = true;
        EXPECT_EQ(l.step, man.step) << exp << " " << m;
        EXPECT_EQ(l.reason, man.reason);
      }
      EXPECT_TRUE(found) << exp << " " << m << " v" << man.version << " missing from the lineage";
      ASSERT_FALSE(lineage->empty());
      EXPECT_GT(lineage->front().version, man.version);
    }
  }
}

TEST_F(ServeTest, ControlApiErrorsAreClearAndTheDaemonKeepsServing) {
  const std::string config =
      WriteConfig("serve.toml", "store", "max_request_bytes = 4096\nclient_idle_timeout_s = 2\n");
  Child* serve = StartServe(config);
  ASSERT_NE(client_, nullptr);
  {
    RawClient c(socket_);
    EXPECT_NE(c.Call("{\"verb\":").value("error", "").find("malformed JSON"), std::string::npos);
    EXPECT_NE(c.Call("{\"verb\":\"explode\"}").value("error", "").find("unknown verb 'explode'"),
              std::string::npos);
    EXPECT_NE(c.Call("{\"verb\":\"stop\",\"experiment\":[1]}")
                  .value("error", "")
                  .find("field 'experiment' must be a string, not an array"),
              std::string::npos);
    json missing = c.Call("{\"verb\":\"pause\",\"experiment\":\"ghost\"}");
    EXPECT_EQ(missing.value("code", ""), "NotFound") << missing.dump();
    EXPECT_NE(missing.value("error", "").find("ghost"), std::string::npos);
    json bad_toml = c.Call(json{
        {"verb", "submit"},
        {"toml", "name = \"x\"\n[population]\nsize = -2\n"},
        {"origin", "x.toml"}}.dump());
    EXPECT_NE(bad_toml.value("error", "").find("population.size (x.toml line 3)"),
              std::string::npos)
        << bad_toml.dump();
  }
  {
    RawClient big(socket_);
    big.Send(std::string(5000, ' ') + "\n");
    std::string line;
    ASSERT_EQ(big.ReadLine(&line, milliseconds(30000)), RawClient::Got::kLine);
    EXPECT_NE(line.find("exceeds max_request_bytes (4096)"), std::string::npos) << line;
    EXPECT_EQ(big.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed);
  }
  {
    RawClient stalled(socket_);
    ASSERT_TRUE(stalled.Send("{\"verb\":\"sta"));
    RawClient other(socket_);
    EXPECT_EQ(other.Call("{\"verb\":\"status\"}").value("ok", false), true);
    std::string line;
    EXPECT_EQ(stalled.ReadLine(&line, milliseconds(0)), RawClient::Got::kTimeout);
    EXPECT_EQ(stalled.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed);
    EXPECT_NE(serve->Log().find("stalled mid-request"), std::string::npos) << serve->Log();
  }
  // SIGHUP re-reads the file: the new limit applies, the store change is reported.
  WriteConfig("serve.toml", "elsewhere", "max_request_bytes = 2048\nclient_idle_timeout_s = 2\n");
  ASSERT_EQ(kill(serve->pid(), SIGHUP), 0);
  ASSERT_TRUE(WaitUntil(
      [&] { return !serve->Running() || serve->Log().find("SIGHUP") != std::string::npos; },
      milliseconds(30000)))
      << serve->Log();
  ASSERT_TRUE(serve->Running()) << "serve died on SIGHUP:\n" << serve->Log();
  EXPECT_TRUE(WaitUntil(
      [&] {
        RawClient c(socket_);
        return c.Call(std::string(3000, ' ') + "{\"verb\":\"list\"}").value("code", "") ==
               "ResourceExhausted";
      },
      milliseconds(30000)));
  EXPECT_TRUE(WaitUntil([&] { return serve->Log().find("changes store") != std::string::npos; },
                        milliseconds(10000)))
      << serve->Log();
  RawClient c(socket_);
  EXPECT_EQ(c.Call("{\"verb\":\"list\"}").value("ok", false), true);
  client_.reset();
  Terminate(serve);
}

TEST_F(ServeTest, SecondServeOnTheSameStoreExitsNonZeroAndLeavesTheFirstAlone) {
  const std::string config = WriteConfig("serve.toml", "store");
  Child* first = StartServe(config);
  ASSERT_NE(client_, nullptr);
  ASSERT_TRUE(client_->Submit(Experiment("a", "random"), "a.toml").ok());
  struct stat before;
  ASSERT_EQ(stat(socket_.c_str(), &before), 0);

  Child second({binary_, "serve", "--config", config}, dir_ + "/second.log");
  ASSERT_TRUE(second.WaitFor(milliseconds(60000))) << second.Log();
  int st = second.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << st;
  EXPECT_NE(second.Log().find("another ckpt-scheduler holds the store"), std::string::npos)
      << second.Log();
  EXPECT_NE(second.Log().find(dir_ + "/store"), std::string::npos) << second.Log();

  // Another store, the same socket: refused too, the live socket left alone.
  const std::string other = WriteConfig("other.toml", "other-store");
  Child third({binary_, "serve", "--config", other}, dir_ + "/third.log");
  ASSERT_TRUE(third.WaitFor(milliseconds(60000))) << third.Log();
  st = third.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) != 0) << st;
  EXPECT_NE(third.Log().find("is served by a running scheduler"), std::string::npos) << third.Log();

  struct stat after;
  ASSERT_EQ(stat(socket_.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  ASSERT_NE(Client(), nullptr);
  const int64_t done = Done("a");
  EXPECT_TRUE(WaitUntil([&] { return Done("a") >= done + kPopulation; }, milliseconds(180000)))
      << first->Log();
  EXPECT_TRUE(first->Running());
  client_.reset();
  Terminate(first);
}

TEST_F(ServeTest, NotifiesTheServiceManagerReadyAndStopping) {
  // A datagram socket standing in for systemd's $NOTIFY_SOCKET.
  const std::string notify_path = dir_ + "/notify";
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, notify_path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  auto next_message = [&]() -> std::string {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 60000) <= 0) return "(none within 60 s)";
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "(recv failed)";
  };
  setenv("NOTIFY_SOCKET", notify_path.c_str(), 1);
  Child* serve = StartServe(WriteConfig("serve.toml", "store"));
  unsetenv("NOTIFY_SOCKET");
  ASSERT_NE(client_, nullptr);
  EXPECT_EQ(next_message(), "READY=1");
  client_.reset();
  ASSERT_EQ(kill(serve->pid(), SIGTERM), 0);
  EXPECT_EQ(next_message(), "STOPPING=1");
  ASSERT_TRUE(serve->WaitFor(milliseconds(40000)));
  const int st = serve->Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << serve->Log();
  close(fd);
}

TEST_F(ServeTest, BadConfigurationExitsTwoNamingTheKeyAndLine) {
  const std::string path = dir_ + "/bad.toml";
  std::ofstream(path) << "store = \"" << dir_ << "/store\"\n[control]\nmax_clients = 0\n";
  Child c({binary_, "serve", "--config", path}, dir_ + "/bad.log");
  ASSERT_TRUE(c.WaitFor(milliseconds(30000)));
  const int st = c.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << st << "\n" << c.Log();
  EXPECT_NE(c.Log().find("control.max_clients (" + path + " line 3)"), std::string::npos)
      << c.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/store")) << "a bad file must not touch the store";
}

// A damaged member-state record in the store: `serve` starts anyway, reports
// the experiment it cannot resume (naming the member) and runs the others,
// instead of crashing into a Restart=on-failure loop.
TEST_F(ServeTest, DamagedMemberRecordIsReportedAndServeKeepsServing) {
  {
    auto s = OpenStore("store");
    ASSERT_NE(s, nullptr);
    const std::string toml = Experiment("damaged", "pbt");
    ASSERT_TRUE(s->CreateExperiment("damaged", json{{"toml", toml}}.dump()).ok());
    ASSERT_TRUE(s->SetExperimentStatus("damaged", "running").ok());
    std::map<std::string, std::map<std::string, double>> hp;
    for (int i = 0; i < kPopulation; ++i) {
      hp["m00" + std::to_string(i)] = {{"lr", 0.01}, {"momentum", 0.9}};
    }
    ASSERT_TRUE(s->CreateMembers("damaged", hp).ok());
    ASSERT_TRUE(s->SetMemberState("damaged", "m001", "{\"v\":2,\"interval\":\"x").ok());
  }
  Child* serve = StartServe(WriteConfig("scheduler.toml", "store"));
  ASSERT_NE(client_, nullptr);
  EXPECT_TRUE(WaitUntil(
      [&] { return serve->Log().find("cannot resume experiment damaged") != std::string::npos; },
      milliseconds(20000)))
      << serve->Log();
  EXPECT_NE(serve->Log().find("experiment damaged member m001: state record is not JSON"),
            std::string::npos)
      << serve->Log();
  // It keeps serving: a new experiment runs.
  auto id = client_->Submit(Experiment("healthy", "pbt"), "healthy.toml");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_TRUE(WaitUntil([&] { return Done("healthy") >= kPopulation; }, milliseconds(120000)))
      << serve->Log();
  Terminate(serve);
}

// The allowlist holds for an experiment resumed at start as for a submitted
// one: stored while the list (or the configuration) allowed its model, it is
// refused once the list no longer does, named with the file and the
// directories, and the daemon serves the others.
TEST_F(ServeTest, AResumedExperimentIsHeldToTheAllowedModelDirsToo) {
  const std::string root = std::filesystem::weakly_canonical(dir_).string();
  const std::string models = root + "/models";
  std::filesystem::create_directories(models);
  std::ofstream(root + "/outside.pt", std::ios::binary) << std::string("PK\x03\x04", 4) << "x";
  {
    auto s = OpenStore("store");
    ASSERT_NE(s, nullptr);
    std::string toml = Experiment("stale", "pbt");
    const std::string lenet = "spec = \"lenet5\"";
    toml.replace(toml.find(lenet), lenet.size(), "spec = \"torchscript:" + root + "/outside.pt\"");
    ASSERT_TRUE(s->CreateExperiment("stale", json{{"toml", toml}}.dump()).ok());
    ASSERT_TRUE(s->SetExperimentStatus("stale", "running").ok());
  }
  Child* serve = StartServe(
      WriteConfig("serve.toml", "store", "", "", "allowed_model_dirs = [\"" + models + "\"]\n"));
  ASSERT_NE(client_, nullptr);
  EXPECT_TRUE(WaitUntil(
      [&] { return serve->Log().find("cannot resume experiment stale") != std::string::npos; },
      milliseconds(20000)))
      << serve->Log();
  const std::string log = serve->Log();
  EXPECT_NE(log.find("stale: model.spec"), std::string::npos) << log;
  EXPECT_NE(log.find("allowed_model_dirs [" + models + "]"), std::string::npos) << log;
  EXPECT_EQ(log.find("does not load"), std::string::npos) << "the model was loaded:\n" << log;
  auto listed = client_->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty()) << "the refused experiment runs";
  auto id = client_->Submit(Experiment("healthy", "random"), "healthy.toml");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  client_.reset();
  Terminate(serve);
  auto s = OpenStore("store");
  ASSERT_NE(s, nullptr);
  auto events = s->ListEvents("stale", 0, 100);
  ASSERT_TRUE(events.ok());
  bool reported = false;
  for (const auto& e : *events) {
    reported = reported || (e.json.find("resume_failed") != std::string::npos &&
                            e.json.find("allowed_model_dirs") != std::string::npos);
  }
  EXPECT_TRUE(reported) << "no resume_failed event naming the allowlist";
}

// allowed_model_dirs: a submission naming a TorchScript file outside the
// allowed directories (directly, through "..", or through a link) is refused
// before anything starts, with the file, its resolved path and the allowed
// directories. A FIFO inside is refused without blocking the daemon. A file
// inside is accepted and the worker loads it from the descriptor it checked:
// this archive is broken on purpose, so the experiment fails with the
// loader's reason.
TEST_F(ServeTest, TorchScriptModelsAreAcceptedOnlyFromAllowedModelDirs) {
  const std::string root = std::filesystem::weakly_canonical(dir_).string();
  const std::string models = root + "/models";
  std::filesystem::create_directories(models);
  std::ofstream(root + "/outside.pt", std::ios::binary) << std::string("PK\x03\x04", 4) << "x";
  std::ofstream(models + "/broken.pt", std::ios::binary)
      << std::string("PK\x03\x04", 4) << "truncated archive";
  ASSERT_EQ(symlink((root + "/outside.pt").c_str(), (models + "/link.pt").c_str()), 0);
  ASSERT_EQ(mkfifo((models + "/fifo.pt").c_str(), 0600), 0);
  Child* serve = StartServe(WriteConfig(
      "serve.toml", "store", "", "", "grace_s = 20\nallowed_model_dirs = [\"" + models + "\"]\n"));
  ASSERT_NE(client_, nullptr);
  auto with_model = [](const std::string& name, const std::string& path) {
    std::string toml = Experiment(name, "random");
    const std::string lenet = "spec = \"lenet5\"";
    toml.replace(toml.find(lenet), lenet.size(), "spec = \"torchscript:" + path + "\"");
    return toml;
  };
  const std::vector<std::pair<std::string, std::string>> outside = {
      {root + "/outside.pt", root + "/outside.pt"},
      {models + "/../outside.pt", root + "/outside.pt"},
      {models + "/link.pt", root + "/outside.pt"},
      {"/dev/shm/ckpt-model.pt", "/dev/shm/ckpt-model.pt"}};
  for (const auto& [path, resolved] : outside) {
    auto r = client_->Submit(with_model("out", path), "out.toml");
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("out.toml: model.spec"), std::string::npos) << m;
    std::string named = "'" + path;
    named += "' resolves to ";
    named += resolved;
    EXPECT_NE(m.find(named), std::string::npos) << m;
    EXPECT_NE(m.find("allowed_model_dirs [" + models + "]"), std::string::npos) << m;
  }
  EXPECT_NE(serve->Log().find("submit refused: out.toml: model.spec"), std::string::npos)
      << serve->Log();
  auto fifo = client_->Submit(with_model("fifo", models + "/fifo.pt"), "fifo.toml");
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find("is not a regular file (it is a FIFO)"), std::string::npos)
      << fifo.status().ToString();
  auto listed = client_->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty()) << "a refused submission left an experiment";

  auto inside = client_->Submit(with_model("inside", models + "/broken.pt"), "inside.toml");
  ASSERT_TRUE(inside.ok()) << inside.status().ToString();
  EXPECT_TRUE(WaitUntil([&] { return StatusIs("inside", records::ExperimentStatus::kFailed); },
                        milliseconds(120000)))
      << StatusOf("inside") << "\n"
      << serve->Log();
  EXPECT_NE(serve->Log().find("does not load"), std::string::npos) << serve->Log();
  client_.reset();
  Terminate(serve);
}

// allowed_data_dirs: a submission whose [data] path names the workers'
// secret, a file outside the allowed directories or a link out of one is
// refused before anything opens it, naming the path, what it resolves to and
// the allowed directories, and repeating none of the file's bytes. A tensor
// file inside is accepted.
TEST_F(ServeTest, DataFilesAreReadOnlyFromAllowedDataDirs) {
  const std::string root = std::filesystem::weakly_canonical(dir_).string();
  const std::string data = root + "/data";
  std::filesystem::create_directories(data);
  std::vector<uint8_t> x(size_t{20} * 28 * 28, 7);
  std::vector<int64_t> y;
  for (int64_t i = 0; i < 20; ++i) y.push_back(i % 10);
  const std::string file = testing::Safetensors({testing::Make("train.x", "U8", {20, 1, 28, 28}, x),
                                                 testing::Make("train.y", "I64", {20}, y)});
  std::ofstream(data + "/good.safetensors", std::ios::binary) << file;
  std::ofstream(root + "/outside.safetensors", std::ios::binary) << file;
  ASSERT_EQ(symlink((root + "/outside.safetensors").c_str(), (data + "/link.safetensors").c_str()),
            0);
  const std::string secret = root + "/secret";
  const std::string secret_text =
      "S3CR3TW0RKERK3Y9QZXVJ8L4HT6YB5NR1PD0GFC2XQ9WZ3KM7JV4LH8TY6BN5RP1";
  std::ofstream(secret) << secret_text;
  ASSERT_EQ(chmod(secret.c_str(), 0600), 0);
  std::string config = WriteConfig("serve.toml", "store", "", "",
                                   "grace_s = 20\nallowed_data_dirs = [\"" + data + "\"]\n");
  {
    std::ifstream in(config);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    const std::string workers = "[workers]\n";
    text.replace(text.find(workers), workers.size(),
                 workers + "listen = \"127.0.0.1:0\"\nsecret_file = \"" + secret + "\"\n");
    std::ofstream(config) << text;
  }
  Child* serve = StartServe(config);
  ASSERT_NE(client_, nullptr);
  auto with_data = [](const std::string& name, const std::string& path) {
    std::string toml = Experiment(name, "random");
    const std::string table = "[data]\n";
    toml.replace(toml.find(table), table.size(),
                 table + "format = \"safetensors\"\npath = \"" + path + "\"\nval_size = 4\n");
    return toml;
  };
  const std::vector<std::pair<std::string, std::string>> outside = {
      {secret, secret},
      {root + "/outside.safetensors", root + "/outside.safetensors"},
      {data + "/link.safetensors", root + "/outside.safetensors"},
      {data + "/../secret", secret}};
  for (const auto& [path, resolved] : outside) {
    auto r = client_->Submit(with_data("out", path), "out.toml");
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_TRUE(r.status().IsInvalidArgument()) << r.status().ToString();
    const std::string& m = r.status().message();
    EXPECT_NE(m.find("out.toml: data.path"), std::string::npos) << m;
    std::string named = "'" + path;
    named += "' resolves to ";
    named += resolved;
    named += ", which is outside them";
    EXPECT_NE(m.find(named), std::string::npos) << m;
    EXPECT_NE(m.find("allowed_data_dirs [" + data + "]"), std::string::npos) << m;
    EXPECT_EQ(m.find(secret_text.substr(0, 4)), std::string::npos) << m;
  }
  auto listed = client_->List();
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_TRUE(listed->empty()) << "a refused submission left an experiment";
  auto inside = client_->Submit(with_data("inside", data + "/good.safetensors"), "inside.toml");
  EXPECT_TRUE(inside.ok()) << inside.status().ToString();
  client_.reset();
  Terminate(serve);
}

}  // namespace
}  // namespace ckpt
