// Peers that hold the secret and attack the scheduler's resources, not its
// results (forging_worker's claim, sit and cycle modes against a real
// `ckpt-scheduler run` on loopback):
// - memory: RESULTs of 40 MiB from eight connections at once, a 1,025 MiB
//   message of a type the scheduler never takes and a flood of empty messages
//   leave the scheduler's peak RSS (VmHWM) within [workers] remote_memory_mib
//   + 64 MiB of what it held before;
// - hoarding: a HELLO offering 100 slots is given max_remote_slots, and a
//   worker that takes its TRAINs and answers none is dropped past its
//   interval deadline: its intervals go to the honest worker, the run ends;
// - the remote worker list: forty connections that come and go leave it
//   bounded (each new one takes a lost one's entry).
#include <gtest/gtest.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"
#include "remote_run.h"

namespace ckpt {
namespace {

using testing::Child;

// Waits until `c` has printed `text` `times` times; false when it exited
// first or `limit` passed.
bool WaitForOutput(Child& c, const std::string& text, int times = 1,
                   std::chrono::seconds limit = std::chrono::seconds(180)) {
  const auto count = [&] {
    const std::string log = c.Log();
    int n = 0;
    for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
    return n;
  };
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (count() >= times) return true;
    if (!c.Running()) return count() >= times;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int CountOf(const std::string& log, const std::string& text) {
  int n = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++n;
  return n;
}

// A /proc/PID/status figure ("VmRSS", "VmHWM") in bytes; -1 when unread.
int64_t ProcStatusBytes(pid_t pid, const std::string& key) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key + ":", 0) == 0) return std::atoll(line.c_str() + key.size() + 1) * 1024;
  }
  return -1;
}

class HostilePeerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("hostile");
    ASSERT_FALSE(dir_.empty());
    scheduler_bin_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
    worker_bin_ = testing::Env("CKPT_WORKER_BIN", CKPT_WORKER_BIN);
    forger_bin_ = testing::Env("CKPT_FORGING_WORKER_BIN", CKPT_FORGING_WORKER_BIN);
    secret_ = dir_ + "/experiment.secret";
    store_ = dir_ + "/store";
  }
  void TearDown() override {
    if (!HasFailure() && testing::Env("CKPT_TEST_KEEP").empty()) {
      std::filesystem::remove_all(dir_);
    } else {
      std::printf("kept %s for its logs\n", dir_.c_str());
    }
  }

  // A run of remote workers only, with `keys` added to its [workers] table.
  std::unique_ptr<Child> StartScheduler(int population, int intervals, const std::string& keys) {
    const std::string config = dir_ + "/tcp.toml";
    std::ofstream(config) << testing::RemoteRunConfig(
        "hostile", population, intervals,
        "listen = \"127.0.0.1:0\"\nsecret_file = \"" + secret_ + "\"\nlocal = false\n" + keys);
    return std::make_unique<Child>(
        std::vector<std::string>{scheduler_bin_, "run", config, "--store", store_, "--quiet",
                                 "--grace-ms", "5000"},
        dir_ + "/scheduler.log");
  }

  std::unique_ptr<Child> Forger(const std::vector<std::string>& args, const std::string& log) {
    std::vector<std::string> all = {forger_bin_, addr_, secret_};
    all.insert(all.end(), args.begin(), args.end());
    return std::make_unique<Child>(all, dir_ + "/" + log);
  }

  std::string dir_, scheduler_bin_, worker_bin_, forger_bin_, secret_, store_, addr_;
};

TEST_F(HostilePeerTest, AttackingPeersKeepTheSchedulerWithinTheRemoteMemoryBudget) {
  constexpr int64_t kBudgetMib = 64;
  // Sixteen members: each of the eight RESULT senders (1 slot, 2 tasks per
  // slot) gets a task to answer.
  auto scheduler =
      StartScheduler(16, 1, "remote_memory_mib = " + std::to_string(kBudgetMib) + "\n");
  addr_ = testing::WaitForWorkersAddr(*scheduler, store_);
  ASSERT_FALSE(addr_.empty()) << scheduler->Log();
  const int64_t before = ProcStatusBytes(scheduler->pid(), "VmRSS");
  ASSERT_GT(before, 0);

  // Eight connections at once, each answering a task with a RESULT of 40 MiB
  // (zeros, which no decoder takes): the budget holds one at a time.
  std::vector<std::unique_ptr<Child>> senders;
  senders.reserve(8);
  for (int i = 0; i < 8; ++i) {
    senders.push_back(Forger({"claim", "result", "40"}, "result" + std::to_string(i) + ".log"));
  }
  for (auto& s : senders) {
    EXPECT_TRUE(WaitForOutput(*s, "channel closed")) << s->Log() << "\n" << scheduler->Log();
  }
  // One 1,025 MiB message of a type the scheduler never takes from a worker.
  auto big = Forger({"claim", "train", "1025"}, "train.log");
  EXPECT_TRUE(WaitForOutput(*big, "channel closed")) << big->Log() << "\n" << scheduler->Log();
  // Two hundred thousand empty messages.
  auto empty = Forger({"claim", "empty", "200"}, "empty.log");
  EXPECT_TRUE(WaitForOutput(*empty, "claim ")) << empty->Log() << "\n" << scheduler->Log();

  ASSERT_TRUE(scheduler->Running()) << scheduler->Log();
  const int64_t peak = ProcStatusBytes(scheduler->pid(), "VmHWM");
  std::printf("scheduler RSS before the attacks %.1f MiB, peak %.1f MiB (budget %lld MiB)\n",
              before / 1048576.0, peak / 1048576.0, static_cast<long long>(kBudgetMib));
  EXPECT_LT(peak - before, (kBudgetMib + 64) << 20)
      << "peak " << peak << ", before " << before << "\n"
      << scheduler->Log();
  kill(scheduler->pid(), SIGTERM);
  ASSERT_TRUE(scheduler->WaitFor(std::chrono::seconds(60))) << scheduler->Log();
  const std::string log = scheduler->Log();
  // The refusal names the type, the claim and the rule.
  EXPECT_NE(log.find("a TRAIN of 1074790400 bytes: a worker never sends that type"),
            std::string::npos)
      << log;
}

TEST_F(HostilePeerTest, AHoarderGetsItsSlotCapAndASilentWorkerIsDroppedPastItsDeadline) {
  constexpr int kPopulation = 6;
  constexpr int kIntervals = 2;
  constexpr int kCycles = 40;
  constexpr int kMaxRemote = 8;
  auto scheduler = StartScheduler(kPopulation, kIntervals,
                                  "max_remote = " + std::to_string(kMaxRemote) +
                                      "\nmax_remote_slots = 2\ntask_timeout_floor_s = 2\n");
  addr_ = testing::WaitForWorkersAddr(*scheduler, store_);
  ASSERT_FALSE(addr_.empty()) << scheduler->Log();

  // Connections that come and go.
  auto cycler = Forger({"cycle", std::to_string(kCycles)}, "cycle.log");
  ASSERT_TRUE(cycler->WaitFor(std::chrono::minutes(3))) << cycler->Log();
  EXPECT_EQ(cycler->Wait(), 0) << cycler->Log();

  // The hoarder, alone: it offers 100 slots, is given 2 (2 tasks each), and
  // answers none of its TRAINs.
  auto sitter = Forger({"sit", "100"}, "sitter.log");
  ASSERT_TRUE(WaitForOutput(*sitter, "got TRAIN", 4)) << sitter->Log() << "\n" << scheduler->Log();
  ASSERT_TRUE(WaitForOutput(*scheduler, "offered 100 slots; using 2")) << scheduler->Log();
  std::vector<std::string> args = {worker_bin_, "--connect", addr_, "--secret-file", secret_};
  for (const auto& f : testing::WorkerTrainingFlags()) args.push_back(f);
  Child honest(args, dir_ + "/worker-honest.log");

  ASSERT_TRUE(scheduler->WaitFor(std::chrono::minutes(6))) << "the run did not finish:\n"
                                                           << scheduler->Log() << "\n"
                                                           << sitter->Log();
  const int status = scheduler->Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << scheduler->Log();
  const std::string log = scheduler->Log();
  ASSERT_TRUE(sitter->WaitFor(std::chrono::seconds(60))) << sitter->Log();
  ASSERT_TRUE(honest.WaitFor(std::chrono::seconds(60))) << honest.Log();

  // Capped: never more than 2 slots x 2 tasks in flight, though the run had
  // six members to hand out while it was alone.
  EXPECT_EQ(CountOf(sitter->Log(), "got TRAIN"), 4) << sitter->Log();
  // Dropped past its deadline, logged with the interval and the rule; its
  // intervals were trained by the honest worker.
  EXPECT_NE(log.find("went unanswered for"), std::string::npos) << log;
  EXPECT_NE(log.find("x the median interval"), std::string::npos) << log;
  const auto run = testing::ReadStore(store_, "hostile");
  EXPECT_EQ(run.verify_problem, "");
  ASSERT_EQ(run.heads.size(), static_cast<size_t>(kPopulation));
  testing::ExpectEachIntervalTrainedOnce(testing::ReadCommits(run), run, kIntervals);
  EXPECT_GE(testing::CountEvents(run, "worker_lost"), 1);

  // The remote worker list stayed bounded: of the 42 connections, one or two
  // at a time, every one taken on took one of the first max_remote entries.
  const std::regex connected(R"(worker (\d+) \(r\d+\) connected from)");
  int connections = 0;
  int highest = -1;
  for (std::sregex_iterator it(log.begin(), log.end(), connected), end; it != end; ++it) {
    ++connections;
    highest = std::max(highest, std::stoi((*it)[1]));
  }
  EXPECT_GE(connections, kCycles / 2) << log;
  EXPECT_LT(highest, kMaxRemote) << log;
}

}  // namespace
}  // namespace ckpt
