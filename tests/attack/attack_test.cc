// Attacks on a worker's TCP link by real processes on real loopback sockets:
// tcp_attack_proxy sits between a `ckpt-worker --connect` and a
// `ckpt-scheduler run`, and after the TLS handshake flips one bit of the
// worker's stream, or injects a forged RESULT record (a score of 1e308), or
// replays the recorded opening of the worker's session on a connection of its
// own. A fourth worker connects directly. Each attack is refused and logged
// with the peer (the tampered connections as a worker lost with "TLS record
// refused", the replay as a refused connection); the run still ends, and its
// heads are exactly those of an undisturbed run with spawned workers (sync
// PBT, same seed), so nothing the attacker sent was committed.
//
// Loopback only (127.0.0.1): nothing here opens or reaches another address.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "process_util.h"
#include "remote_run.h"

namespace ckpt {
namespace {

using testing::Child;
using testing::TraceLine;

constexpr int kPopulation = 6;
constexpr int kIntervals = 6;
constexpr int kStepsPerInterval = 20;

// The worker -> scheduler byte at which each proxy strikes: past the TLS
// handshake (a few hundred bytes) and HELLO, inside the first RESULTs.
constexpr int kFlipAt = 30000;
constexpr int kInjectAt = 2000;
// The opening the replaying proxy records and sends again.
constexpr int kReplayBytes = 4096;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

TEST(AttackTest, FlippedInjectedAndReplayedRecordsAreRefusedAndNothingIsCommitted) {
  const std::string dir = testing::TempDir("attack");
  ASSERT_FALSE(dir.empty());
  const std::string scheduler_bin = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  const std::string worker_bin = testing::Env("CKPT_WORKER_BIN", CKPT_WORKER_BIN);
  const std::string proxy_bin = testing::Env("CKPT_ATTACK_PROXY_BIN", CKPT_ATTACK_PROXY_BIN);
  const std::string name = "attack";
  const testing::RemoteRunPlan plan =
      testing::PlanRemoteRun(dir, scheduler_bin, name, kPopulation, kIntervals, kStepsPerInterval);
  ASSERT_EQ(plan.reference.heads.size(), static_cast<size_t>(kPopulation));
  const auto& [reference, secret, config, store] = plan;
  Child scheduler({"/usr/bin/env", "CKPT_TRACE=1", scheduler_bin, "run", config, "--store", store,
                   "--quiet", "--grace-ms", "5000"},
                  dir + "/scheduler.log");
  const std::string addr = testing::WaitForWorkersAddr(scheduler, store);
  ASSERT_EQ(addr.rfind("127.0.0.1:", 0), 0u) << addr << "\n" << scheduler.Log();

  const auto worker_args = [&](const std::string& to) {
    std::vector<std::string> args = {worker_bin, "--connect", to, "--secret-file", plan.secret};
    for (const auto& f : testing::WorkerTrainingFlags()) args.push_back(f);
    return args;
  };
  struct Attack {
    std::string mode;
    int offset;
    std::unique_ptr<Child> proxy;
    std::unique_ptr<Child> worker;
  };
  std::vector<Attack> attacks;
  attacks.push_back({"flip", kFlipAt, nullptr, nullptr});
  attacks.push_back({"inject", kInjectAt, nullptr, nullptr});
  attacks.push_back({"replay", kReplayBytes, nullptr, nullptr});
  for (auto& a : attacks) {
    const std::string port_file = dir + "/proxy-" + a.mode + ".addr";
    a.proxy =
        std::make_unique<Child>(std::vector<std::string>{proxy_bin, port_file, addr, a.mode,
                                                         std::to_string(a.offset), name + "/m0"},
                                dir + "/proxy-" + a.mode + ".log");
    std::string via;
    for (int i = 0; i < 1000 && via.empty(); ++i) {
      via = ReadFile(port_file);
      if (via.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_FALSE(via.empty()) << a.mode << " proxy did not start:\n" << a.proxy->Log();
    a.worker = std::make_unique<Child>(worker_args(via), dir + "/worker-" + a.mode + ".log");
  }
  Child honest(worker_args(addr), dir + "/worker-honest.log");

  ASSERT_TRUE(scheduler.WaitFor(std::chrono::minutes(8))) << "the run did not finish:\n"
                                                          << scheduler.Log();
  const int status = scheduler.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << scheduler.Log();
  const std::string log = scheduler.Log();
  for (auto& a : attacks) {
    EXPECT_NE(a.proxy->Log().find("attacked"), std::string::npos)
        << a.mode << " never struck (the run was too short for it?):\n"
        << a.proxy->Log() << "\n"
        << log;
    kill(a.proxy->pid(), SIGKILL);
    a.proxy->Wait();
    kill(a.worker->pid(), SIGKILL);
    a.worker->Wait();
  }
  ASSERT_TRUE(honest.WaitFor(std::chrono::seconds(60))) << honest.Log();
  honest.Wait();

  // The tampered connections died of TLS's authentication, each logged with
  // the worker and its address; the replay never got past the handshake.
  const auto trace = testing::ParseTrace(log);
  int tls_losses = 0;
  for (const auto& t : trace) {
    if (t.kind != TraceLine::kLost) continue;
    if (t.text.find("TLS record refused") != std::string::npos) {
      ++tls_losses;
      EXPECT_NE(t.text.find("127.0.0.1:"), std::string::npos) << t.text;
    }
  }
  EXPECT_EQ(tls_losses, 2) << log;
  EXPECT_NE(log.find("refused a worker connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find("not a ckpt worker"), std::string::npos) << log;

  // Nothing forged, changed or replayed was committed: the heads are the
  // undisturbed run's, every interval trained once, the store verifies.
  const auto run = testing::ReadStore(store, name);
  EXPECT_EQ(run.verify_problem, "");
  ASSERT_EQ(run.heads.size(), static_cast<size_t>(kPopulation));
  testing::ExpectEachIntervalTrainedOnce(testing::ReadCommits(run), run, kIntervals);
  testing::ExpectHeadsAsReference(run, reference);
  if (!HasFailure() && testing::Env("CKPT_TEST_KEEP").empty()) {
    std::filesystem::remove_all(dir);
  } else {
    std::printf("kept %s for its logs\n", dir.c_str());
  }
}

}  // namespace
}  // namespace ckpt
