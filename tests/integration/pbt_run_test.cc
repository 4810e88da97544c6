// Whole-process tests of `ckpt-scheduler run`: real scheduler and worker
// processes, a real RocksDB store, real shared-memory rings, Fashion-MNIST.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "ckpt/base/kill_point.h"
#include "ckpt/format/checksum.h"
#include "ckpt/store/store.h"
#include "process_util.h"
#include "run_heads.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::ChildrenOf;
using testing::Head;
using testing::ResultsLogged;

// The segment of worker `w` of a scheduler of `store` with the default
// instance name ("ckpt-" + 10 hex digits of the store path's XXH3 + "-wN").
std::string SegmentOf(const std::string& store, int w) {
  const std::string abs = std::filesystem::absolute(store).lexically_normal().string();
  return "ckpt-" + HexU64(Xxh3_64(abs.data(), abs.size())).substr(0, 10) + "-w" + std::to_string(w);
}

// Waits (up to 60 s) until no process runs with a segment of a scheduler of
// `store` on its command line: the workers of a killed scheduler die with it
// (their parent-death signal) or notice it (the heartbeat). False when one
// is still there.
bool WaitForWorkersGone(const std::string& store) {
  const std::string prefix = SegmentOf(store, 0);
  const std::string instance = prefix.substr(0, prefix.size() - 1);  // "ckpt-...-w"
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until) {
    bool any = false;
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
      std::ifstream in(e.path() / "cmdline", std::ios::binary);
      const std::string cmdline((std::istreambuf_iterator<char>(in)),
                                std::istreambuf_iterator<char>());
      if (cmdline.find(instance) != std::string::npos) {
        any = true;
        break;
      }
    }
    if (!any) return true;
    std::this_thread::sleep_for(milliseconds(10));
  }
  return false;
}

std::string Config(const std::string& name, const std::string& mode, int workers,
                   int population = 6, int intervals = 4) {
  std::ostringstream os;
  os << "name = \"" << name << "\"\nseed = 99\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << population
     << "\nsteps_per_interval = 6\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n"
     << "[policy]\nkind = \"pbt\"\nmode = \"" << mode
     << "\"\nquantile = 0.34\nready_intervals = 1\n"
     << "[[devices]]\ndevice = \"cpu\"\ncount = " << workers
     << "\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return os.str();
}

class PbtRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("pbt");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string WriteConfig(const std::string& file, const std::string& text) {
    std::string path = dir_ + "/" + file;
    std::ofstream(path) << text;
    return path;
  }

  std::vector<std::string> RunArgs(const std::string& config, const std::string& store) {
    return {scheduler_, "run",        config, "--store", store, "--quiet", "--restart-backoff-ms",
            "100",      "--grace-ms", "5000"};
  }

  // Runs to completion; returns the exit code.
  int RunToEnd(const std::string& config, const std::string& store, std::string* log = nullptr) {
    Child c(RunArgs(config, store), dir_ + "/log-" + std::to_string(runs_++));
    if (!c.WaitFor(milliseconds(300000))) {
      ADD_FAILURE() << "scheduler did not finish in 300 s:\n" << c.Log();
      return -1;
    }
    if (log) *log = c.Log();
    int st = c.Wait();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ADD_FAILURE() << c.Log();
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }

  std::map<std::string, Head> Heads(const std::string& store_path, const std::string& exp) {
    return testing::ReadHeads(store_path, exp, /*verify=*/true);
  }

  // The arguments of a run that logs one line per result it receives
  // (CKPT_TRACE=1), so that a test can pace its kills by the run's progress
  // rather than by wall time: a fast machine finishes a wall-time-paced run
  // before the test has done the kills it meant to do.
  std::vector<std::string> TracedRunArgs(const std::string& config, const std::string& store) {
    std::vector<std::string> args = {"/usr/bin/env", "CKPT_TRACE=1"};
    for (auto& a : RunArgs(config, store)) args.push_back(a);
    return args;
  }

  // Waits until `c` has logged at least `n` results. False when it exited
  // first or 120 s passed.
  static bool WaitForResults(Child& c, int n) {
    const auto until = std::chrono::steady_clock::now() + milliseconds(120000);
    while (std::chrono::steady_clock::now() < until) {
      if (ResultsLogged(c) >= n) return true;
      if (!c.Running()) return false;
      std::this_thread::sleep_for(milliseconds(5));
    }
    return false;
  }

  std::string dir_;
  std::string scheduler_;
  int runs_ = 0;
};

TEST_F(PbtRunTest, SmallSyncPbtCompletesWithLineageAndExploits) {
  const std::string config = WriteConfig("small.toml", Config("small", "sync", 1));
  std::string log;
  ASSERT_EQ(RunToEnd(config, dir_ + "/store", &log), 0);
  EXPECT_NE(log.find("experiment small: done"), std::string::npos) << log;
  store::StoreOptions o;
  o.path = dir_ + "/store";
  auto s = store::Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto exp = (*s)->GetExperiment("small");
  ASSERT_TRUE(exp.ok());
  EXPECT_EQ(exp->status, "done");
  auto members = (*s)->ListMembers("small");
  ASSERT_TRUE(members.ok());
  ASSERT_EQ(members->size(), 6u);
  int exploits = 0;
  for (const auto& m : *members) {
    // Every member trained every interval: 4 intervals x 6 steps.
    EXPECT_EQ(m.step, 24) << m.member;
    auto versions = (*s)->ListVersions("small", m.member);
    ASSERT_TRUE(versions.ok());
    for (size_t i = 0; i < versions->size(); ++i) {
      const auto& v = (*versions)[i];
      if (v.reason != store::kReasonExploit) continue;
      ++exploits;
      ASSERT_TRUE(v.parent.has_value());
      // Exploit is metadata only: the donor's blob, not a copy.
      auto donor = (*s)->GetManifest("small", v.parent->member, v.parent->version);
      ASSERT_TRUE(donor.ok()) << donor.status().ToString();
      EXPECT_EQ(v.blob, donor->blob);
      EXPECT_NE(v.parent->member, m.member);
      // The member's next interval trained from exactly that state.
      for (size_t j = i + 1; j < versions->size(); ++j) {
        if ((*versions)[j].reason != store::kReasonTrained) continue;
        ASSERT_TRUE((*versions)[j].parent.has_value());
        EXPECT_EQ((*versions)[j].parent->member, m.member);
        EXPECT_EQ((*versions)[j].parent->version, v.version);
        break;
      }
    }
    auto lineage = (*s)->Lineage("small", m.member);
    ASSERT_TRUE(lineage.ok());
    EXPECT_GE(lineage->size(), 4u) << m.member;
  }
  EXPECT_GE(exploits, 1);
  // The audit log holds the decisions and the final evaluation.
  auto events = (*s)->ListEvents("small", 0, 100000);
  ASSERT_TRUE(events.ok());
  int exploit_events = 0, final_eval = 0;
  for (const auto& e : *events) {
    if (e.json.find("\"type\":\"exploit\"") != std::string::npos) ++exploit_events;
    if (e.json.find("\"type\":\"final_eval\"") != std::string::npos) ++final_eval;
  }
  EXPECT_EQ(exploit_events, exploits);
  EXPECT_EQ(final_eval, 1);
}

TEST_F(PbtRunTest, SyncPbtIsDeterministic) {
  const std::string config = WriteConfig("det.toml", Config("det", "sync", 1));
  ASSERT_EQ(RunToEnd(config, dir_ + "/a"), 0);
  ASSERT_EQ(RunToEnd(config, dir_ + "/b"), 0);
  auto a = Heads(dir_ + "/a", "det");
  auto b = Heads(dir_ + "/b", "det");
  ASSERT_EQ(a.size(), 6u);
  EXPECT_TRUE(a == b);
}

// A worker that dies at shutdown (it SIGKILLs itself on SHUTDOWN) loses
// nothing, and the scheduler's log says so: an operator can tell a crash at
// exit from a clean exit.
TEST_F(PbtRunTest, AWorkerDyingAtShutdownIsSaidInTheLog) {
  const std::string config = WriteConfig("sd.toml", Config("sd", "sync", 1, 4, 2));
  setenv(base::kKillAtVariable, (std::string(base::kill_points::kWorkerShutdown) + ":1").c_str(),
         1);
  Child c(RunArgs(config, dir_ + "/sd"), dir_ + "/sd.log");
  unsetenv(base::kKillAtVariable);
  ASSERT_TRUE(c.WaitFor(milliseconds(300000))) << c.Log();
  const int st = c.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c.Log();
  EXPECT_NE(c.Log().find("kill point worker.shutdown"), std::string::npos) << c.Log();
  EXPECT_NE(c.Log().find("while the scheduler stopped: worker 0"), std::string::npos) << c.Log();
  EXPECT_NE(c.Log().find("killed by signal 9"), std::string::npos) << c.Log();
  const auto heads = Heads(dir_ + "/sd", "sd");
  ASSERT_EQ(heads.size(), 4u);
  for (const auto& [m, h] : heads) EXPECT_EQ(h.step, 12) << m;
}

TEST_F(PbtRunTest, KilledWorkersAreReplacedAndTheRunEndsAsUndisturbed) {
  const std::string config = WriteConfig("kw.toml", Config("kw", "sync", 2, 6, 6));
  ASSERT_EQ(RunToEnd(config, dir_ + "/calm"), 0);
  const auto calm = Heads(dir_ + "/calm", "kw");

  // Kills at wall-clock moments here: pacing them by results (as the
  // scheduler-kill test does) kills the replacement worker again and again
  // while it starts.
  //
  // Every kill well before the experiment ended is a worker_lost event. A
  // kill at the very end may leave none, by design: once the last experiment
  // ended the pool stops (WorkerPool::OnEvent returns once stopped_) and
  // shuts its workers down, so a worker that dies then loses no task and is
  // not reported. That is the "3 worker_lost events for 4 kills" once seen
  // here: its last kill fell into the shutdown. The structured trace's
  // "ended" line dates the end; kills within a second of it are not counted.
  const std::string trace = dir_ + "/rough.trace";
  setenv("CKPT_TRACE_FILE", trace.c_str(), 1);
  Child c(RunArgs(config, dir_ + "/rough"), dir_ + "/rough.log");
  unsetenv("CKPT_TRACE_FILE");
  std::mt19937 rng(5);
  std::vector<int64_t> kill_ms;
  std::set<pid_t> seen;
  auto unix_ms = [] {
    return std::chrono::duration_cast<milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  };
  for (int round = 0; round < 200 && kill_ms.size() < 4 && c.Running(); ++round) {
    std::this_thread::sleep_for(milliseconds(300 + rng() % 400));
    auto workers = ChildrenOf(c.pid());
    for (pid_t w : workers) seen.insert(w);
    if (workers.size() < 2) continue;  // wait until both run (restart backoff)
    kill(workers[rng() % workers.size()], SIGKILL);
    kill_ms.push_back(unix_ms());
  }
  ASSERT_TRUE(c.WaitFor(milliseconds(300000))) << c.Log();
  int st = c.Wait();
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << c.Log();
  EXPECT_GE(kill_ms.size(), 2u) << "the run ended before enough kills; make it longer\n" << c.Log();
  EXPECT_GE(seen.size(), 3u);  // both workers, and at least one replacement
  int64_t ended_ms = -1;
  {
    std::ifstream in(trace);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.value("ev", "") == "ended" && j.value("exp", "") == "kw") {
        ended_ms = j.value("unix_ms", int64_t{-1});
      }
    }
  }
  ASSERT_GT(ended_ms, 0) << "no \"ended\" line in " << trace;
  const auto before_end = static_cast<int>(std::count_if(
      kill_ms.begin(), kill_ms.end(), [&](int64_t t) { return t < ended_ms - 1000; }));
  const auto rough = Heads(dir_ + "/rough", "kw");
  {
    // Each loss is in the audit log, with the members it put back in the queue.
    store::StoreOptions o;
    o.path = dir_ + "/rough";
    auto s = store::Store::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    auto events = (*s)->ListEvents("kw", 0, 100000);
    ASSERT_TRUE(events.ok());
    int lost = 0;
    for (const auto& e : *events) {
      if (e.json.find("\"type\":\"worker_lost\"") != std::string::npos) ++lost;
    }
    EXPECT_GE(lost, before_end) << kill_ms.size() << " kills, " << before_end
                                << " over a second before the end\n"
                                << c.Log();
  }
  ASSERT_EQ(rough.size(), 6u);
  for (const auto& [m, h] : rough) EXPECT_EQ(h.step, 36) << m;
  EXPECT_TRUE(calm == rough);
}

TEST_F(PbtRunTest, SchedulerKilledAndRerunEndsAsUninterrupted) {
  const std::string config = WriteConfig("ks.toml", Config("ks", "sync", 1, 6, 6));
  ASSERT_EQ(RunToEnd(config, dir_ + "/calm"), 0);
  const auto calm = Heads(dir_ + "/calm", "ks");

  // Each attempt is killed after one or two results (and a few random
  // milliseconds more), so that the kills fall at different points of the run
  // however fast the machine is, and ten of them cannot finish its 36 results.
  std::mt19937 rng(17);
  int kills = 0;
  for (int attempt = 0; attempt < 40 && kills < 10; ++attempt) {
    Child c(TracedRunArgs(config, dir_ + "/rough"),
            dir_ + "/ks-" + std::to_string(attempt) + ".log");
    if (!WaitForResults(c, 1 + static_cast<int>(rng() % 2))) break;  // finished
    std::this_thread::sleep_for(milliseconds(rng() % 30));
    if (!c.Running()) break;  // finished
    kill(c.pid(), SIGKILL);
    c.Wait();
    ++kills;
    // The workers die with their scheduler (and notice it if they did not).
    ASSERT_TRUE(WaitForWorkersGone(dir_ + "/rough"));
  }
  EXPECT_GE(kills, 10);
  ASSERT_EQ(RunToEnd(config, dir_ + "/rough"), 0);
  const auto rough = Heads(dir_ + "/rough", "ks");
  ASSERT_EQ(rough.size(), 6u);
  for (const auto& [m, h] : rough) EXPECT_EQ(h.step, 36) << m;
  EXPECT_TRUE(calm == rough);
}

// The same, with the kill placed at each kind of point a crash can fall on
// (CKPT_KILL_AT), so that every reconciliation path runs on every CI run:
// between a commit and its state record, between an exploit and its state
// record, in the middle of a barrier, and in the last generation with some
// members finished (a resumed run once re-decided that barrier and trained a
// laggard a seventh interval).
TEST_F(PbtRunTest, SchedulerKilledAtEachKindOfPointResumesAsUninterrupted) {
  const std::string config = WriteConfig("kp.toml", Config("kp", "sync", 1, 6, 6));
  ASSERT_EQ(RunToEnd(config, dir_ + "/calm"), 0);
  const auto calm = Heads(dir_ + "/calm", "kp");
  const std::vector<std::string> points = {
      "commit.after_write:4",    // committed, state record not yet written
      "scheduler.committed:9",   // generation 2 under way
      "scheduler.exploited:1",   // first exploit of a barrier, its state record not written
      "exploit.before_write:4",  // the second barrier, half applied
      "scheduler.committed:33",  // last generation, three members finished
      "scheduler.committed:35",  // last generation, one member left
  };
  for (size_t i = 0; i < points.size(); ++i) {
    SCOPED_TRACE(points[i]);
    const std::string store = dir_ + "/kp" + std::to_string(i);
    std::vector<std::string> args = {"/usr/bin/env", "CKPT_KILL_AT=" + points[i]};
    for (const auto& a : RunArgs(config, store)) args.push_back(a);
    Child killed(args, dir_ + "/kp" + std::to_string(i) + ".log");
    ASSERT_TRUE(killed.WaitFor(milliseconds(300000))) << killed.Log();
    const int st = killed.Wait();
    ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << "never reached\n" << killed.Log();
    ASSERT_TRUE(WaitForWorkersGone(store));  // its workers notice and exit
    ASSERT_EQ(RunToEnd(config, store), 0);
    const auto resumed = Heads(store, "kp");
    ASSERT_EQ(resumed.size(), 6u);
    for (const auto& [m, h] : resumed) EXPECT_EQ(h.step, 36) << m;
    EXPECT_TRUE(calm == resumed);
  }
}

TEST_F(PbtRunTest, SegmentsOfAKilledSchedulerAreSweptByTheNextOne) {
  const std::string config = WriteConfig("sw.toml", Config("sw", "sync", 1, 2, 2));
  std::vector<std::string> args = {"/usr/bin/env", "CKPT_KILL_AT=scheduler.committed:1"};
  for (const auto& a : RunArgs(config, dir_ + "/killed")) args.push_back(a);
  Child killed(args, dir_ + "/sw-killed.log");
  ASSERT_TRUE(killed.WaitFor(milliseconds(300000))) << killed.Log();
  const int st = killed.Wait();
  ASSERT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) << killed.Log();
  const std::string left = "/dev/shm/" + SegmentOf(dir_ + "/killed", 0);
  // It is there now, unless a scheduler of a test running alongside has
  // already swept it (which is what this checks, too).
  ASSERT_TRUE(WaitForWorkersGone(dir_ + "/killed"));  // its worker notices and exits
  // A scheduler of another store removes it at start.
  Child other(RunArgs(config, dir_ + "/other"), dir_ + "/sw-other.log");
  ASSERT_TRUE(other.WaitFor(milliseconds(300000))) << other.Log();
  ASSERT_EQ(other.Wait(), 0) << other.Log();
  EXPECT_FALSE(std::filesystem::exists(left)) << left << "\n" << other.Log();
}

TEST_F(PbtRunTest, MalformedKillAtIsRefusedByName) {
  const std::string config = WriteConfig("kb.toml", Config("kb", "sync", 1));
  std::vector<std::string> args = {"/usr/bin/env", "CKPT_KILL_AT=commit.after_write"};
  for (const auto& a : RunArgs(config, dir_ + "/kb")) args.push_back(a);
  Child c(args, dir_ + "/kb.log");
  ASSERT_TRUE(c.WaitFor(milliseconds(30000)));
  const int st = c.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << c.Log();
  EXPECT_NE(c.Log().find("CKPT_KILL_AT=commit.after_write is not POINT:N"), std::string::npos)
      << c.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/kb"));
}

TEST_F(PbtRunTest, BadConfigurationsFailBeforeAnythingStarts) {
  struct Case {
    std::string from, to, needle;
  };
  const std::string good = Config("bad", "sync", 1);
  const std::vector<Case> cases = {
      {"seed = 99", "seed = 99\ncolour = 3", "colour ("},
      {"size = 6", "size = \"6\"", "population.size ("},
      {"size = 6", "size = 0", "population.size ("},
      {"[data]\n", "[data]\npath = \"/nonexistent\"\n", "data.path ("},
  };
  for (const auto& c : cases) {
    std::string text = good;
    text.replace(text.find(c.from), c.from.size(), c.to);
    const std::string path = WriteConfig("bad.toml", text);
    Child child(RunArgs(path, dir_ + "/bad-store"), dir_ + "/bad.log");
    ASSERT_TRUE(child.WaitFor(milliseconds(30000)));
    int st = child.Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << child.Log();
    EXPECT_NE(child.Log().find(c.needle), std::string::npos) << child.Log();
    EXPECT_NE(child.Log().find("line"), std::string::npos) << child.Log();
    // Nothing started: no store was created.
    EXPECT_FALSE(std::filesystem::exists(dir_ + "/bad-store"));
    std::filesystem::remove(dir_ + "/bad.log");
  }
  // An empty search space.
  std::string text = good;
  text = text.substr(0, text.find("[search_space.lr]")) + text.substr(text.find("[policy]"));
  Child child(RunArgs(WriteConfig("empty.toml", text), dir_ + "/bad-store"), dir_ + "/empty.log");
  child.Wait();
  EXPECT_NE(child.Log().find("search_space"), std::string::npos) << child.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/bad-store"));
}

// A store whose disk starts failing (EIO on every write under the store,
// injected below the real scheduler and RocksDB by eio_shim once the run has
// results) is not the members' fault: ckpt stops, exits 1 naming the error
// and charges no member, instead of failing every member until all are
// stopped. Started again on the healthy disk it resumes and ends as a run
// that never failed.
TEST_F(PbtRunTest, AStoreThatFailsForGoodStopsTheRunNonZeroAndARestartEndsAsUndisturbed) {
  const std::string config = WriteConfig("eio.toml", Config("eio", "sync", 1, 4, 6));
  ASSERT_EQ(RunToEnd(config, dir_ + "/reference"), 0);
  const std::string store = dir_ + "/store";
  std::filesystem::create_directories(store);
  const std::string trigger = dir_ + "/eio-now";
  std::vector<std::string> args = {
      "/usr/bin/env", "CKPT_TRACE=1", std::string("LD_PRELOAD=") + CKPT_EIO_SHIM,
      "CKPT_EIO_PATH=" + std::filesystem::canonical(store).string(), "CKPT_EIO_TRIGGER=" + trigger};
  for (auto& a : RunArgs(config, store)) args.push_back(a);
  Child c(args, dir_ + "/eio.log");
  ASSERT_TRUE(WaitForResults(c, 6)) << c.Log();
  std::ofstream(trigger) << "the disk fails from now on\n";
  ASSERT_TRUE(c.WaitFor(milliseconds(120000))) << "still running with a failed store:\n" << c.Log();
  const int st = c.Wait();
  const std::string log = c.Log();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 1) << log;
  EXPECT_NE(log.find("the store refuses every write, so ckpt stopped"), std::string::npos) << log;
  EXPECT_NE(log.find("Input/output error"), std::string::npos) << log;
  EXPECT_EQ(log.find("failed (commit_error)"), std::string::npos) << log;
  EXPECT_EQ(log.find("stopped after"), std::string::npos) << log;

  std::string rerun;
  ASSERT_EQ(RunToEnd(config, store, &rerun), 0);
  EXPECT_NE(rerun.find("experiment eio: done"), std::string::npos) << rerun;
  const auto want = Heads(dir_ + "/reference", "eio");
  ASSERT_EQ(want.size(), 4u);
  EXPECT_TRUE(Heads(store, "eio") == want);
}

// The same run on Fashion-MNIST's IDX files and on a safetensors copy of them
// (examples/make_dataset.py keeps ckpt's splits) ends with the same committed
// heads, bit for bit: the tensor file goes through the TOML, CONFIGURE and the
// worker's reader, and trains as the IDX files do. A bad file stops the run
// before anything starts, naming the file, the tensor and the row.
TEST_F(PbtRunTest, TensorFileRunEndsAsTheIdxRunAndABadFileIsRefusedBeforeStart) {
  const std::string file = dir_ + "/fm.safetensors";
  const std::string make = std::string(CKPT_PROJECT_PYTHON) + " " + CKPT_MAKE_DATASET +
                           " fashion-mnist /usr/share/datasets/fashion-mnist " + file +
                           " > /dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  const std::string idx = Config("td", "sync", 1, 4, 3);
  std::string tensor = idx;
  const std::string data = "[data]\n";
  tensor.replace(tensor.find(data), data.size(),
                 data + "format = \"safetensors\"\npath = \"" + file + "\"\n");
  ASSERT_EQ(RunToEnd(WriteConfig("idx.toml", idx), dir_ + "/idx"), 0);
  ASSERT_EQ(RunToEnd(WriteConfig("tensor.toml", tensor), dir_ + "/tensor"), 0);
  const auto a = Heads(dir_ + "/idx", "td");
  const auto b = Heads(dir_ + "/tensor", "td");
  ASSERT_EQ(a.size(), 4u);
  EXPECT_TRUE(a == b);

  // Labels run 0..9; classes = 3 makes label 3 (or more) out of range.
  std::string bad = tensor;
  bad.replace(bad.find("format = "), 0, "classes = 3\n");
  Child child(RunArgs(WriteConfig("bad.toml", bad), dir_ + "/bad-store"), dir_ + "/bad.log");
  ASSERT_TRUE(child.WaitFor(milliseconds(60000)));
  const int st = child.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 2) << child.Log();
  EXPECT_NE(child.Log().find(file + ": train.y: label "), std::string::npos) << child.Log();
  EXPECT_NE(child.Log().find("is outside [0, 3)"), std::string::npos) << child.Log();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/bad-store"));
}

// Each trained event names its score by the experiment's metric and carries
// the hyperparameters the interval trained with: a regression's events say
// val_neg_mse (they said val_accuracy whatever the metric), so readers of the
// events (ckpt-tool events, the Python Result's history) need no second
// source for either.
TEST_F(PbtRunTest, TrainedEventsCarryTheMetricsNameAndTheHyperparameters) {
  const std::string file = dir_ + "/diabetes.safetensors";
  const std::string make = std::string(CKPT_PROJECT_PYTHON) + " " + CKPT_MAKE_DATASET +
                           " diabetes " + file + " > /dev/null";
  ASSERT_EQ(std::system(make.c_str()), 0) << make;
  std::ostringstream os;
  os << "name = \"reg\"\nseed = 5\n"
     << "[model]\nspec = '{\"input\": [10], \"layers\": [{\"type\": \"linear\", \"out\": 8}, "
     << "{\"type\": \"relu\"}, {\"type\": \"linear\", \"out\": 1}]}'\noptimizer = \"sgd\"\n"
     << "[data]\nformat = \"safetensors\"\npath = \"" << file << "\"\nbatch_size = 16\n"
     << "eval_size = 50\n"
     << "[population]\nsize = 2\nsteps_per_interval = 3\nintervals = 2\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.01\n"
     << "[policy]\nkind = \"random\"\n"
     << "[[devices]]\ndevice = \"cpu\"\ncount = 1\nslots = 1\nfusion = \"plain\"\n";
  ASSERT_EQ(RunToEnd(WriteConfig("reg.toml", os.str()), dir_ + "/store"), 0);
  store::StoreOptions o;
  o.path = dir_ + "/store";
  auto s = store::Store::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto events = (*s)->ListEvents("reg", 0, 100000);
  ASSERT_TRUE(events.ok()) << events.status().ToString();
  int trained = 0;
  for (const auto& e : *events) {
    const auto j = nlohmann::json::parse(e.json);
    if (j.value("type", "") != "trained") continue;
    ++trained;
    EXPECT_TRUE(j.contains("val_neg_mse")) << e.json;
    EXPECT_FALSE(j.contains("val_accuracy")) << e.json;
    ASSERT_TRUE(j.contains("hparams")) << e.json;
    const double lr = j["hparams"].value("lr", 0.0);
    EXPECT_GE(lr, 0.001) << e.json;
    EXPECT_LE(lr, 0.01) << e.json;
  }
  EXPECT_EQ(trained, 4);
}

}  // namespace
}  // namespace ckpt
