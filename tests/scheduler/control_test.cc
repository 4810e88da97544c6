// The control API of `serve`: a real Scheduler in serve mode in this process
// (with its real ckpt-worker child and store), its control socket, the client
// library and raw sockets that misbehave. The peer-credential check is tested
// through ControlOptions::peer_credentials, since the test cannot connect as
// another uid. Also: the service configuration file.
#include <grp.h>
#include <gtest/gtest.h>
#include <pwd.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "ckpt/records/status.h"
#include "ckpt/scheduler/control_client.h"
#include "ckpt/scheduler/scheduler.h"
#include "ckpt/scheduler/service.h"
#include "control_test_util.h"

namespace ckpt::scheduler {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;
using testing::RawClient;

std::string TempDir() {
  std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                     std::string("/ckpt-control-XXXXXX");
  char* p = mkdtemp(tmpl.data());
  return p ? std::string(p) : std::string();
}

std::string TinyExperiment(const std::string& name) {
  return "name = \"" + name +
         "\"\nseed = 3\n[model]\nspec = \"lenet5\"\n[data]\nbatch_size = 16\neval_size = 200\n"
         "[population]\nsize = 2\nsteps_per_interval = 2\nintervals = 100000\n"
         "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
         "[policy]\nkind = \"random\"\n";
}

class ControlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    ASSERT_FALSE(dir_.empty());
    socket_ = dir_ + "/run/control.sock";
  }
  void TearDown() override {
    (void)StopScheduler();  // a test that cares checks it itself
    std::filesystem::remove_all(dir_);
  }

  ControlOptions Control() {
    ControlOptions c;
    c.socket_path = socket_;
    c.client_idle_timeout = milliseconds(30000);
    return c;
  }

  // Starts a serving scheduler on its own thread and waits until its socket
  // answers (or Run returned).
  void StartScheduler(const ControlOptions& control, const std::string& store = "store",
                      std::function<StatusOr<ControlOptions>()> reload = {}) {
    SchedulerOptions o;
    o.store_path = dir_ + "/" + store;
    records::DeviceConfig d;
    d.device = "cpu";
    d.slots = 1;
    d.fusion = ipc::FusionMode::kPlain;
    o.devices = {d};
    o.worker_binary = CKPT_WORKER_BIN;
    o.progress = nullptr;
    o.serve = true;
    o.supervision.grace = milliseconds(5000);
    o.supervision.restart_backoff = milliseconds(100);
    o.control = control;
    o.reload = std::move(reload);
    o.notify = [this](const std::string& n) {
      std::lock_guard<std::mutex> lock(mu_);
      notes_.push_back(n);
    };
    auto s = Scheduler::Create(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    scheduler_ = std::move(*s);
    done_ = false;
    thread_ = std::thread([this] {
      run_status_ = scheduler_->Run();
      done_ = true;
    });
    client_ =
        testing::ConnectWhenUp(socket_, milliseconds(60000), [this] { return !done_.load(); });
  }

  Status StopScheduler() {
    if (!scheduler_) return Status::OK();
    client_.reset();
    scheduler_->RequestStop();
    thread_.join();
    scheduler_.reset();
    return run_status_;
  }

  std::vector<std::string> Notes() {
    std::lock_guard<std::mutex> lock(mu_);
    return notes_;
  }

  std::string dir_;
  std::string socket_;
  std::unique_ptr<Scheduler> scheduler_;
  std::thread thread_;
  std::atomic<bool> done_{false};
  Status run_status_;
  std::unique_ptr<ControlClient> client_;
  std::mutex mu_;
  std::vector<std::string> notes_;
};

TEST_F(ControlTest, EveryVerbAnswersAndErrorsNameTheProblem) {
  StartScheduler(Control());
  ASSERT_NE(client_, nullptr);
  auto notes = Notes();
  EXPECT_NE(std::find(notes.begin(), notes.end(), "READY=1"), notes.end());
  // The runtime directory was created 0750, the socket 0660.
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(stat(socket_.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0660u);

  auto list = client_->List();
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  EXPECT_TRUE(list->empty());

  auto bad = client_->Submit("name = \"x\"\n[population]\nsize = 0\n", "bad.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_TRUE(bad.status().IsInvalidArgument()) << bad.status().ToString();
  EXPECT_NE(bad.status().message().find("population.size (bad.toml line 3)"), std::string::npos)
      << bad.status().ToString();

  // A layer list whose outputs are not Fashion-MNIST's 10 classes is refused
  // at submit and creates no experiment (a worker's CONFIGURE refused it once
  // the experiment was in the store).
  std::string wide = TinyExperiment("wide");
  wide.replace(wide.find("spec = \"lenet5\""), std::string("spec = \"lenet5\"").size(),
               "spec = '[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 3}]'");
  auto refused = client_->Submit(wide, "wide.toml");
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsInvalidArgument()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(
                "model.spec (wide.toml line 4): the model's last layer has 3 outputs, but "
                "/usr/share/datasets/fashion-mnist has 10 classes"),
            std::string::npos)
      << refused.status().ToString();
  EXPECT_TRUE(client_->List()->empty());
  EXPECT_TRUE(client_->ExperimentStatus("wide").status().IsNotFound());

  auto id = client_->Submit(TinyExperiment("ctl"), "ctl.toml");
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(*id, "ctl");
  auto again = client_->Submit(TinyExperiment("ctl"), "ctl.toml");
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();

  auto missing = client_->ExperimentStatus("nope");
  EXPECT_TRUE(missing.status().IsNotFound()) << missing.status().ToString();
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);

  auto status = client_->ExperimentStatus("ctl");
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_EQ(status->population, 2);
  EXPECT_EQ(status->members.size(), 2u);
  EXPECT_EQ(status->status, records::ExperimentStatus::kRunning);
  auto all = client_->AllExperimentStatus();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 1u);
  EXPECT_EQ((*all)[0].members.size(), 2u);

  auto devices = client_->Devices();
  ASSERT_TRUE(devices.ok()) << devices.status().ToString();
  ASSERT_EQ(devices->size(), 1u);
  EXPECT_EQ((*devices)[0].device, "cpu");

  ASSERT_TRUE(client_->Pause("ctl").ok());
  EXPECT_EQ(client_->ExperimentStatus("ctl")->status, records::ExperimentStatus::kPaused);
  EXPECT_TRUE(client_->Pause("nope").IsNotFound());
  ASSERT_TRUE(client_->Resume("ctl").ok());
  EXPECT_EQ(client_->ExperimentStatus("ctl")->status, records::ExperimentStatus::kRunning);

  Status pin = client_->Pin("ctl", "m000", 999);
  EXPECT_TRUE(pin.IsNotFound()) << pin.ToString();
  auto restore = client_->Restore("ctl", "m999", 1);
  EXPECT_TRUE(restore.status().IsNotFound()) << restore.status().ToString();
  EXPECT_NE(restore.status().message().find("m999"), std::string::npos);

  ASSERT_TRUE(client_->Stop("ctl").ok());
  EXPECT_EQ(client_->ExperimentStatus("ctl")->status, records::ExperimentStatus::kStopped);
  Status after = client_->Pause("ctl");
  EXPECT_EQ(after.code(), StatusCode::kFailedPrecondition) << after.ToString();

  EXPECT_TRUE(StopScheduler().ok());
  EXPECT_FALSE(std::filesystem::exists(socket_)) << "Close must remove the socket";
}

TEST_F(ControlTest, MalformedRequestsGetClearErrorsAndTheConnectionStaysUsable) {
  StartScheduler(Control());
  ASSERT_NE(client_, nullptr);
  RawClient c(socket_);
  ASSERT_TRUE(c.connected());
  struct Case {
    std::string line;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"{not json", "malformed JSON"},
      {"{\"verb\":\"list\"", "malformed JSON"},
      {"[1,2]", "must be a JSON object, not an array"},
      {"\"list\"", "must be a JSON object, not a string"},
      {"{}", "field 'verb' is required"},
      {"{\"verb\":5}", "field 'verb' must be a string, not an integer"},
      {"{\"verb\":\"frobnicate\"}", "unknown verb 'frobnicate'"},
      {"{\"verb\":\"pause\"}", "verb 'pause': field 'experiment' is required"},
      {"{\"verb\":\"pause\",\"experiment\":7}",
       "verb 'pause': field 'experiment' must be a string, not an integer"},
      {"{\"verb\":\"pause\",\"experiment\":\"\"}", "field 'experiment' must not be empty"},
      {"{\"verb\":\"restore\",\"experiment\":\"e\",\"member\":\"m\",\"version\":\"3\"}",
       "field 'version' must be a positive integer, not a string"},
      {"{\"verb\":\"restore\",\"experiment\":\"e\",\"member\":\"m\",\"version\":1.5}",
       "field 'version' must be a positive integer, not a number with a fraction"},
      {"{\"verb\":\"pin\",\"experiment\":\"e\",\"member\":\"m\",\"version\":0}",
       "field 'version' must be at least 1, not 0"},
      {"{\"verb\":\"pin\",\"experiment\":\"e\",\"member\":\"m\",\"version\":18446744073709551615}",
       "field 'version' must be a positive integer"},
      {"{\"verb\":\"unpin\",\"experiment\":\"e\",\"member\":\"m\"}", "field 'version' is required"},
      {"{\"verb\":\"list\",\"experiment\":\"e\"}", "verb 'list': unknown field 'experiment'"},
      {"{\"verb\":\"submit\",\"toml\":[]}", "field 'toml' must be a string, not an array"},
      {"{\"verb\":\"list\",\"id\":{}}", "field 'id' must be"},
      {std::string(40, '[') + std::string(40, ']'), "nested deeper than 32"},
      {"", "empty request line"},
      {"{\"verb\":\"\xff\xfe\"}", "malformed JSON"},
      {std::string("{\"verb\":\"list\"}\0garbage", 23), "NUL byte at offset 15"},
  };
  for (const auto& k : cases) {
    json reply = c.Call(k.line);
    ASSERT_TRUE(reply.is_object()) << k.line << " -> " << reply.dump();
    EXPECT_EQ(reply.value("ok", true), false) << k.line;
    EXPECT_EQ(reply.value("code", ""), "InvalidArgument") << k.line << " -> " << reply.dump();
    EXPECT_NE(reply.value("error", "").find(k.expect), std::string::npos)
        << k.line << " -> " << reply.dump();
  }
  // The same connection still works; ids are echoed; pipelined requests are
  // answered in order.
  json ok = c.Call("{\"verb\":\"list\",\"id\":42}");
  EXPECT_EQ(ok.value("ok", false), true) << ok.dump();
  EXPECT_EQ(ok.value("id", 0), 42);
  ASSERT_TRUE(c.Send("{\"verb\":\"list\",\"id\":\"a\"}\r\n{\"verb\":\"nope\",\"id\":\"b\"}\n"));
  std::string l1, l2;
  ASSERT_EQ(c.ReadLine(&l1, milliseconds(30000)), RawClient::Got::kLine);
  ASSERT_EQ(c.ReadLine(&l2, milliseconds(30000)), RawClient::Got::kLine);
  EXPECT_EQ(json::parse(l1).value("id", ""), "a") << l1;
  EXPECT_EQ(json::parse(l1).value("ok", false), true) << l1;
  EXPECT_EQ(json::parse(l2).value("id", ""), "b") << l2;
  EXPECT_EQ(json::parse(l2).value("ok", true), false) << l2;
  // The typed client still works after all of that.
  EXPECT_TRUE(client_->List().ok());
}

TEST_F(ControlTest, OversizedLineGetsAnErrorThenTheConnectionCloses) {
  ControlOptions control = Control();
  control.max_request_bytes = 4096;
  StartScheduler(control);
  ASSERT_NE(client_, nullptr);
  for (bool with_newline : {false, true}) {
    RawClient c(socket_);
    ASSERT_TRUE(c.connected());
    std::string big = "{\"verb\":\"submit\",\"toml\":\"" + std::string(10000, 'x') + "\"}";
    if (with_newline) big += "\n";
    c.Send(big);  // the server may close before it has read it all
    std::string line;
    ASSERT_EQ(c.ReadLine(&line, milliseconds(30000)), RawClient::Got::kLine);
    json reply = json::parse(line, nullptr, false);
    EXPECT_EQ(reply.value("ok", true), false) << line;
    EXPECT_EQ(reply.value("code", ""), "ResourceExhausted") << line;
    EXPECT_NE(reply.value("error", "").find("exceeds max_request_bytes (4096)"), std::string::npos)
        << line;
    EXPECT_EQ(c.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed);
  }
  // A request just under the limit is fine, and the daemon serves others.
  RawClient c(socket_);
  json reply = c.Call("{\"verb\":\"status\",\"experiment\":\"" + std::string(4000, 'e') + "\"}");
  EXPECT_EQ(reply.value("code", ""), "NotFound") << reply.dump().substr(0, 200);
  EXPECT_TRUE(client_->List().ok());
}

TEST_F(ControlTest, ClientStalledMidLineIsClosedAtTheIdleTimeoutAndNeverBlocksOthers) {
  ControlOptions control = Control();
  control.client_idle_timeout = milliseconds(3000);
  StartScheduler(control);
  ASSERT_NE(client_, nullptr);
  RawClient stalled(socket_);
  RawClient silent(socket_);
  ASSERT_TRUE(stalled.connected());
  ASSERT_TRUE(silent.connected());
  const auto start = std::chrono::steady_clock::now();
  ASSERT_TRUE(stalled.Send("{\"verb\":\"li"));
  // Others are served while it stalls, on new and existing connections.
  for (int i = 0; i < 3; ++i) {
    RawClient other(socket_);
    json reply = other.Call("{\"verb\":\"list\"}");
    EXPECT_EQ(reply.value("ok", false), true) << reply.dump();
  }
  // ... before the stalled one was dropped: it is still open, unanswered.
  std::string line;
  EXPECT_EQ(stalled.ReadLine(&line, milliseconds(0)), RawClient::Got::kTimeout)
      << "others were served only after the stalled client was closed";
  // It gets no reply and is closed after the timeout; so is the silent one.
  EXPECT_EQ(stalled.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed) << line;
  const double closed_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(closed_s, 2.5);
  EXPECT_EQ(silent.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed) << line;
  // A client that keeps trickling bytes without finishing a line is closed
  // too: only an answered request re-arms the deadline.
  RawClient trickle(socket_);
  const auto t0 = std::chrono::steady_clock::now();
  bool closed = false;
  for (int i = 0; i < 200 && !closed; ++i) {
    if (!trickle.Send("x")) break;
    closed = trickle.ReadLine(&line, milliseconds(100)) == RawClient::Got::kClosed;
  }
  EXPECT_TRUE(closed);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 15);
  RawClient after(socket_);
  EXPECT_EQ(after.Call("{\"verb\":\"list\"}").value("ok", false), true);
}

TEST_F(ControlTest, DisallowedPeerIsRefusedThroughTheCredentialSeam) {
  std::atomic<uint32_t> uid{4242}, gid{4242};
  std::atomic<bool> readable{true};
  ControlOptions control = Control();
  control.allowed_users = {"4243"};
  control.allowed_groups = {"777"};
  control.peer_credentials = [&](int fd, uint32_t* u, uint32_t* g) {
    *u = uid.load();
    *g = gid.load();
    return readable.load();
  };
  // SIGHUP re-reads this.
  std::mutex reload_mu;
  ControlOptions reloaded = control;
  reloaded.allowed_users = {"4242"};
  uid = 0;
  gid = 0;
  StartScheduler(control, "store", [&]() -> StatusOr<ControlOptions> {
    std::lock_guard<std::mutex> lock(reload_mu);
    return reloaded;
  });
  ASSERT_NE(client_, nullptr);

  auto expect_refused = [&](const std::string& what) {
    RawClient c(socket_);
    ASSERT_TRUE(c.connected());
    std::string line;
    ASSERT_EQ(c.ReadLine(&line, milliseconds(30000)), RawClient::Got::kLine) << what;
    json reply = json::parse(line, nullptr, false);
    EXPECT_EQ(reply.value("ok", true), false) << line;
    EXPECT_EQ(reply.value("code", ""), "FailedPrecondition") << line;
    EXPECT_NE(reply.value("error", "").find(what), std::string::npos) << line;
    EXPECT_EQ(c.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed);
  };
  auto expect_served = [&](const std::string& why) {
    RawClient c(socket_);
    json reply = c.Call("{\"verb\":\"list\"}");
    EXPECT_EQ(reply.value("ok", false), true) << why << ": " << reply.dump();
  };

  uid = 4242;
  gid = 4242;
  expect_refused("permission denied: uid 4242 (gid 4242) is not among");
  readable = false;
  expect_refused("credentials (SO_PEERCRED) could not be read");
  readable = true;
  uid = 4243;
  expect_served("allowed user");
  uid = 5000;
  gid = 777;
  expect_served("allowed group");
  uid = 0;
  gid = 4242;
  expect_served("root");
  uid = static_cast<uint32_t>(geteuid());
  expect_served("the scheduler's own uid");
  // A connection accepted before is unaffected by later refusals.
  EXPECT_TRUE(client_->List().ok());

  // SIGHUP: the reloaded users apply to new connections.
  uid = 4242;
  gid = 4242;
  ASSERT_EQ(raise(SIGHUP), 0);
  bool allowed = false;
  for (int i = 0; i < 200 && !allowed; ++i) {
    RawClient c(socket_);
    json reply = c.Call("{\"verb\":\"list\"}");
    allowed = reply.is_object() && reply.value("ok", false);
    if (!allowed) std::this_thread::sleep_for(milliseconds(25));
  }
  EXPECT_TRUE(allowed) << "uid 4242 still refused after SIGHUP reload";
  uid = 4243;  // no longer listed
  gid = 4243;
  expect_refused("uid 4243");
}

TEST_F(ControlTest, ConnectionsBeyondMaxClientsAreRefused) {
  ControlOptions control = Control();
  control.max_clients = 2;
  StartScheduler(control);
  ASSERT_NE(client_, nullptr);  // connection 1
  auto second = std::make_unique<RawClient>(socket_);
  ASSERT_EQ(second->Call("{\"verb\":\"list\"}").value("ok", false), true);
  RawClient third(socket_);
  std::string line;
  ASSERT_EQ(third.ReadLine(&line, milliseconds(30000)), RawClient::Got::kLine);
  EXPECT_NE(line.find("too many clients: max_clients (2)"), std::string::npos) << line;
  EXPECT_EQ(third.ReadLine(&line, milliseconds(30000)), RawClient::Got::kClosed);
  second.reset();
  // The server notices the close on its next read; then a slot is free.
  bool served = false;
  for (int i = 0; i < 200 && !served; ++i) {
    RawClient c(socket_);
    served = c.Call("{\"verb\":\"list\"}").value("ok", false);
    if (!served) std::this_thread::sleep_for(milliseconds(25));
  }
  EXPECT_TRUE(served);
}

TEST_F(ControlTest, StaleSocketIsReplacedLiveOneIsLeftAloneShutdownRemovesIt) {
  // A socket file nobody listens on (a crashed scheduler's).
  std::filesystem::create_directories(dir_ + "/run");
  {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_.c_str(), sizeof addr.sun_path - 1);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    close(fd);
  }
  ASSERT_TRUE(std::filesystem::exists(socket_));
  StartScheduler(Control());
  ASSERT_NE(client_, nullptr) << run_status_.ToString();
  struct stat before;
  ASSERT_EQ(stat(socket_.c_str(), &before), 0);

  // A second scheduler (another store) on the same socket path refuses to
  // start and leaves the live socket alone.
  {
    SchedulerOptions o;
    o.store_path = dir_ + "/other-store";
    o.worker_binary = CKPT_WORKER_BIN;
    o.progress = nullptr;
    o.serve = true;
    o.control = Control();
    auto second = Scheduler::Create(o);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    Status run = (*second)->Run();
    EXPECT_EQ(run.code(), StatusCode::kAlreadyExists) << run.ToString();
    EXPECT_NE(run.message().find(socket_), std::string::npos) << run.ToString();
  }
  struct stat after;
  ASSERT_EQ(stat(socket_.c_str(), &after), 0);
  EXPECT_EQ(before.st_ino, after.st_ino);
  EXPECT_TRUE(client_->List().ok());

  // A second scheduler on the same store is refused by the store's lock.
  {
    SchedulerOptions o;
    o.store_path = dir_ + "/store";
    o.worker_binary = CKPT_WORKER_BIN;
    auto second = Scheduler::Create(o);
    ASSERT_FALSE(second.ok());
    EXPECT_TRUE(second.status().IsUnavailable()) << second.status().ToString();
  }
  EXPECT_TRUE(client_->List().ok());

  // shutdown: answered, then a graceful stop that removes the socket.
  Status s = client_->Shutdown("test over");
  EXPECT_TRUE(s.ok()) << s.ToString();
  thread_.join();
  EXPECT_TRUE(run_status_.ok()) << run_status_.ToString();
  scheduler_.reset();
  EXPECT_FALSE(std::filesystem::exists(socket_));
  auto notes = Notes();
  EXPECT_NE(std::find(notes.begin(), notes.end(), "STOPPING=1"), notes.end());
}

TEST_F(ControlTest, NonSocketFileAtThePathIsNeverRemoved) {
  std::filesystem::create_directories(dir_ + "/run");
  std::ofstream(socket_) << "precious";
  SchedulerOptions o;
  o.store_path = dir_ + "/store";
  o.worker_binary = CKPT_WORKER_BIN;
  o.progress = nullptr;
  o.serve = true;
  o.control = Control();
  auto s = Scheduler::Create(o);
  ASSERT_TRUE(s.ok());
  Status run = (*s)->Run();
  EXPECT_EQ(run.code(), StatusCode::kFailedPrecondition) << run.ToString();
  EXPECT_NE(run.message().find("is not a socket"), std::string::npos) << run.ToString();
  std::ifstream in(socket_);
  std::string text;
  in >> text;
  EXPECT_EQ(text, "precious");
}

// ---- the service configuration file ----

// The production modes (directory 0750, socket 0660) with their group set to
// `gid`, so that a peer of that primary group can reach the socket.
void OpenSocketToGroup(const std::string& dir, const std::string& socket, gid_t gid) {
  struct stat st;
  ASSERT_EQ(stat((dir + "/run").c_str(), &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0750u);
  ASSERT_EQ(stat(socket.c_str(), &st), 0);
  ASSERT_EQ(st.st_mode & 0777, 0660u);
  ASSERT_EQ(chmod(dir.c_str(), 0711), 0);  // mkdtemp made it 0700
  ASSERT_EQ(chown((dir + "/run").c_str(), static_cast<uid_t>(-1), gid), 0);
  ASSERT_EQ(chown(socket.c_str(), static_cast<uid_t>(-1), gid), 0);
}

std::string Verb(const std::string& verb, const std::string& exp, const std::string& more = "") {
  return "{\"verb\":\"" + verb + "\",\"experiment\":\"" + exp + "\"" + more + "}";
}

// Authorization with real uids: a child process that setuid()s to nobody
// (65534) connects. It may submit, read everything, and change its own
// experiment; changing root's experiment or shutting down is refused, naming
// who submitted it and who may; root may change nobody's experiment; after a
// reload that lists it in admins, nobody may change root's.
TEST_F(ControlTest, UsersChangeOnlyTheirOwnExperimentsAndOnlyAdminsShutDown) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid() a child to another uid";
  constexpr uid_t kNobody = 65534;
  constexpr gid_t kNogroup = 65534;
  ControlOptions control = Control();
  control.allowed_users = {std::to_string(kNobody)};
  std::mutex reload_mu;
  ControlOptions reloaded = control;
  reloaded.admins = {std::to_string(kNobody)};
  StartScheduler(control, "store", [&]() -> StatusOr<ControlOptions> {
    std::lock_guard<std::mutex> lock(reload_mu);
    return reloaded;
  });
  ASSERT_NE(client_, nullptr);
  OpenSocketToGroup(dir_, socket_, kNogroup);
  ASSERT_TRUE(client_->Submit(TinyExperiment("roots"), "roots.toml").ok());
  const std::string submit =
      json{{"verb", "submit"}, {"toml", TinyExperiment("nobodys")}, {"origin", "n.toml"}}.dump();
  const std::vector<std::string> requests = {
      submit,
      "{\"verb\":\"list\"}",
      "{\"verb\":\"status\"}",
      Verb("status", "roots"),
      Verb("pause", "nobodys"),
      Verb("resume", "nobodys"),
      Verb("pause", "roots"),
      Verb("resume", "roots"),
      Verb("restore", "roots", ",\"member\":\"m000\",\"version\":1"),
      Verb("pin", "roots", ",\"member\":\"m000\",\"version\":1"),
      Verb("unpin", "roots", ",\"member\":\"m000\",\"version\":1"),
      Verb("stop", "roots"),
      "{\"verb\":\"shutdown\"}",
  };
  std::vector<json> r = testing::CallAs(kNobody, kNogroup, socket_, requests);
  ASSERT_EQ(r.size(), requests.size());
  for (size_t i = 0; i < 6; ++i)
    EXPECT_TRUE(r[i].value("ok", false)) << requests[i] << ": " << r[i];
  EXPECT_EQ(r[1]["experiments"].size(), 2u) << r[1];
  for (size_t i = 6; i < 12; ++i) {
    EXPECT_FALSE(r[i].value("ok", true)) << requests[i] << ": " << r[i];
    EXPECT_EQ(r[i].value("code", ""), "FailedPrecondition") << r[i];
    const std::string verb = json::parse(requests[i])["verb"];
    EXPECT_NE(r[i].value("error", "")
                  .find("permission denied: uid 65534 may not " + verb +
                        " experiment 'roots', submitted by uid 0"),
              std::string::npos)
        << r[i];
    EXPECT_NE(r[i].value("error", "").find("[control] admins"), std::string::npos) << r[i];
  }
  EXPECT_NE(r[12].value("error", "").find("uid 65534 may not shut the service down"),
            std::string::npos)
      << r[12];
  // Nothing of root's changed, and the service still runs.
  auto roots = client_->ExperimentStatus("roots");
  ASSERT_TRUE(roots.ok()) << roots.status().ToString();
  EXPECT_EQ(roots->status, records::ExperimentStatus::kRunning);
  EXPECT_FALSE(done_.load());
  // Root (an admin) changes nobody's experiment.
  EXPECT_TRUE(client_->Pause("nobodys").ok());
  EXPECT_EQ(client_->ExperimentStatus("nobodys")->status, records::ExperimentStatus::kPaused);

  // SIGHUP: listed in admins, nobody changes root's experiment.
  ASSERT_EQ(raise(SIGHUP), 0);
  bool admin = false;
  for (int i = 0; i < 200 && !admin; ++i) {
    admin =
        testing::CallAs(kNobody, kNogroup, socket_, {Verb("pause", "roots")})[0].value("ok", false);
    if (!admin) std::this_thread::sleep_for(milliseconds(25));
  }
  EXPECT_TRUE(admin) << "uid 65534 still no admin after the reload";
  EXPECT_EQ(client_->ExperimentStatus("roots")->status, records::ExperimentStatus::kPaused);
}

// allowed_groups: a group counts when it is one of the peer's supplementary
// groups in the group database (getgrouplist), named by number (so the
// group's member list is not read when the options are resolved).
TEST_F(ControlTest, ASupplementaryGroupOfThePeersUserCounts) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to setuid() a child to another uid";
  // A user of this host with a supplementary group other than its primary one.
  uid_t uid = 0;
  gid_t primary = 0, extra = 0;
  setgrent();
  for (group* g = getgrent(); g != nullptr && uid == 0; g = getgrent()) {
    for (char** m = g->gr_mem; m != nullptr && *m != nullptr; ++m) {
      passwd* pw = getpwnam(*m);
      if (pw != nullptr && pw->pw_uid != 0 && pw->pw_gid != g->gr_gid) {
        uid = pw->pw_uid;
        primary = pw->pw_gid;
        extra = g->gr_gid;
        break;
      }
    }
  }
  endgrent();
  if (uid == 0) GTEST_SKIP() << "no user of this host has a supplementary group in /etc/group";
  ControlOptions control = Control();
  control.allowed_groups = {std::to_string(extra)};
  StartScheduler(control);
  ASSERT_NE(client_, nullptr);
  OpenSocketToGroup(dir_, socket_, primary);
  json r = testing::CallAs(uid, primary, socket_, {"{\"verb\":\"list\"}"})[0];
  EXPECT_TRUE(r.value("ok", false)) << "uid " << uid << " (gid " << primary
                                    << ") with supplementary group " << extra << ": " << r;
}

// A submission is validated off the event loop: while one is held in its
// validation (the before_validation seam), another client's status is
// answered, and the submitter's reply comes when the validation ends. Past
// submit_validation_timeout the submitter gets an error naming the bound and
// nothing is created, even when the validation ends well later.
TEST_F(ControlTest, StatusIsAnsweredWhileASubmissionIsValidatedAndTheBoundIsNamed) {
  std::mutex mu;
  std::condition_variable cv;
  int entered = 0;
  bool release = false;
  ControlOptions control = Control();
  control.before_validation = [&] {
    std::unique_lock<std::mutex> lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
  };
  auto wait_entered = [&](int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return entered >= n; });
  };
  auto set_release = [&](bool r) {
    std::lock_guard<std::mutex> lock(mu);
    release = r;
    cv.notify_all();
  };
  StartScheduler(control);
  ASSERT_NE(client_, nullptr);

  RawClient submitter(socket_);
  ASSERT_TRUE(submitter.connected());
  const std::string submit = json{
      {"verb", "submit"},
      {"toml", TinyExperiment("slow")},
      {"origin", "slow.toml"},
      {"id", 7}}.dump();
  ASSERT_TRUE(submitter.Send(submit + "\n"));
  ASSERT_TRUE(wait_entered(1)) << "the validation never started";
  RawClient other(socket_);
  json status = other.Call("{\"verb\":\"status\"}");
  EXPECT_TRUE(status.value("ok", false)) << "status not answered during a validation: " << status;
  std::string line;
  EXPECT_EQ(submitter.ReadLine(&line, milliseconds(0)), RawClient::Got::kTimeout) << line;
  set_release(true);
  ASSERT_EQ(submitter.ReadLine(&line, milliseconds(60000)), RawClient::Got::kLine);
  json reply = json::parse(line, nullptr, false);
  EXPECT_TRUE(reply.value("ok", false)) << line;
  EXPECT_EQ(reply.value("experiment", ""), "slow") << line;
  EXPECT_EQ(reply.value("id", 0), 7) << line;

  // The bound: a scheduler whose validations may take 0.2 s.
  ControlOptions tight = control;
  tight.submit_validation_timeout = milliseconds(200);
  ASSERT_TRUE(StopScheduler().ok());
  StartScheduler(tight, "store2");
  ASSERT_NE(client_, nullptr);
  set_release(false);
  const int before = entered;
  RawClient late(socket_);
  ASSERT_TRUE(late.Send(
      json{{"verb", "submit"}, {"toml", TinyExperiment("late")}, {"origin", "late.toml"}}.dump() +
      "\n"));
  ASSERT_TRUE(wait_entered(before + 1));
  ASSERT_EQ(late.ReadLine(&line, milliseconds(60000)), RawClient::Got::kLine);
  reply = json::parse(line, nullptr, false);
  EXPECT_EQ(reply.value("code", ""), "ResourceExhausted") << line;
  EXPECT_NE(reply.value("error", "")
                .find("late.toml: validating the experiment and its files took longer than "
                      "submit_validation_timeout_s (0.2 s)"),
            std::string::npos)
      << line;
  set_release(true);
  // The connection goes on; the late result created nothing.
  json list = late.Call("{\"verb\":\"list\"}");
  EXPECT_TRUE(list.value("ok", false)) << list;
  EXPECT_TRUE(list["experiments"].empty()) << list;
}

TEST(ServiceConfigTest, ExampleFileParses) {
  const std::string path = std::string(CKPT_SOURCE_DIR) + "/deploy/scheduler.toml";
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  // Group names must resolve; "ckpt" exists only where the service is installed.
  std::string toml = text.str();
  const std::string ckpt_group = "allowed_groups = [\"ckpt\"]";
  const size_t at = toml.find(ckpt_group);
  ASSERT_NE(at, std::string::npos);
  toml.replace(at, ckpt_group.size(), "allowed_groups = [\"root\"]");
  auto c = ParseServiceConfig(toml, path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->store, "/var/lib/ckpt/store");
  EXPECT_EQ(c->socket, "/run/ckpt/control.sock");
  EXPECT_EQ(c->supervision.grace, milliseconds(30000));
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].device, "auto");
  EXPECT_EQ(c->devices[0].slots, 4);
  SchedulerOptions o = SchedulerOptionsFor(*c);
  EXPECT_TRUE(o.serve);
  EXPECT_EQ(o.control.socket_path, "/run/ckpt/control.sock");
  EXPECT_EQ(o.control.max_clients, 64);
  EXPECT_EQ(o.control.allowed_groups, std::vector<std::string>{"root"});
}

TEST(ServiceConfigTest, ErrorsNameTheKeyAndTheLine) {
  struct Case {
    std::string text;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"store = \"s\"\nstroe = \"x\"\n", "stroe (f.toml line 2): unknown key"},
      {"[control]\nmax_clients = 0\n",
       "control.max_clients (f.toml line 2): must be in [1, 100000], not 0"},
      {"[control]\nmax_clients = \"8\"\n",
       "control.max_clients (f.toml line 2): must be an integer"},
      {"grace_s = -1\n", "grace_s (f.toml line 1): must be in [0, 86400] seconds"},
      {"[control]\nallowed_users = [\"root\", \"no-such-user-ckpt\"]\n",
       "control.allowed_users (f.toml line 2): no user named 'no-such-user-ckpt'"},
      {"[control]\nallowed_groups = [\"no-such-group-ckpt\"]\n",
       "no group named 'no-such-group-ckpt'"},
      {"[control]\nallowed_users = \"root\"\n", "must be an array of strings"},
      {"[workers]\nheartbeat = 3\n", "workers.heartbeat (f.toml line 2): unknown key"},
      {"[[devices]]\ndevice = \"gpu0\"\n",
       "devices[0].device (f.toml line 2): must be cpu, auto or cuda:N"},
      {"[[devices]]\ndevice = \"cpu\"\nslots = 0\n", "devices[0].slots (f.toml line 3)"},
      {"metrics = \"localhost\"\n", "metrics (f.toml line 1): must be host:port"},
      {"socket = \"/" + std::string(200, 's') + "\"\n", "longer than 107 bytes"},
      {"store = \n", "f.toml line 1"},
      {"log_progress = 1\n", "log_progress (f.toml line 1): must be true or false"},
  };
  for (const auto& k : cases) {
    auto c = ParseServiceConfig(k.text, "f.toml");
    ASSERT_FALSE(c.ok()) << k.text;
    EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
    EXPECT_NE(c.status().message().find(k.expect), std::string::npos)
        << k.text << " -> " << c.status().ToString();
  }
  auto numeric = ParseServiceConfig("[control]\nallowed_users = [\"0\", \"12345\"]\n", "f.toml");
  EXPECT_TRUE(numeric.ok()) << numeric.status().ToString();
}

TEST(ServiceConfigTest, ReloadReportsWhatNeedsARestart) {
  auto a = ParseServiceConfig("store = \"a\"\n[control]\nmax_clients = 4\n", "a.toml");
  auto b = ParseServiceConfig(
      "store = \"b\"\ngrace_s = 3\n[control]\nmax_clients = 8\n[workers]\nring_mib = 8\n"
      "[[devices]]\ndevice = \"cpu\"\n",
      "b.toml");
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(SettingsNeedingRestart(*a, *a), "");
  EXPECT_EQ(SettingsNeedingRestart(*a, *b), "store, devices, grace_s, [workers]");
  EXPECT_EQ(ControlOptionsFor(*b).max_clients, 8);
}

TEST(ServiceConfigTest, MissingFileIsNotFound) {
  auto c = LoadServiceConfig("/nonexistent/scheduler.toml");
  EXPECT_TRUE(c.status().IsNotFound()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("/nonexistent/scheduler.toml"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::scheduler
