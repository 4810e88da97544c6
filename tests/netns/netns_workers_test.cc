// Three hosts on one machine: network namespaces ckpt-s-<pid> (the
// scheduler), ckpt-a-<pid> and ckpt-b-<pid> (one `ckpt-worker --connect`
// each), joined by veth pairs to a bridge in ckpt-s (10.77.0.0/24: s is .1,
// a .2, b .3). Mid-run, a's link is taken down: its TCP connection goes
// silent, the scheduler declares a lost by heartbeat timeout, b retrains a's
// members, and the run ends exactly as an undisturbed one (sync PBT with the
// same seed), with nothing committed lost and the store verifying.
//
// Needs CAP_NET_ADMIN (root in CI); skips, saying so, where namespaces cannot
// be made. Names carry the test's pid, so parallel runs do not collide;
// namespaces left by a killed earlier run (its pid gone) are removed first.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>

#include "process_util.h"
#include "remote_run.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;
using testing::Child;
using testing::Sh;
using testing::TraceLine;

constexpr int kPopulation = 6;
constexpr int kIntervals = 8;
// Intervals long enough (hundreds of ms) that the cut lands inside one.
constexpr int kStepsPerInterval = 30;
constexpr char kSchedulerIp[] = "10.77.0.1";

// Namespaces of earlier runs of this test whose process is gone.
void RemoveStaleNamespaces() {
  std::string out;
  if (Sh("ip netns list", &out) != 0) return;
  static const std::regex kName("^ckpt-[sab]-([0-9]+)");
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, kName)) continue;
    const pid_t pid = std::stoi(m[1]);
    if (pid == getpid() || kill(pid, 0) == 0) continue;
    std::string ignored;
    Sh("ip netns del " + m[0].str(), &ignored);
  }
}

// The scheduler's worker ids of the connections from ckpt-a and ckpt-b; -1
// where none came.
struct HostWorkers {
  int a = -1;
  int b = -1;
};

// Waits up to 2 minutes for a worker to connect from each host.
HostWorkers WaitForBothHosts(const Child& scheduler) {
  HostWorkers w;
  const auto connect_until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while ((w.a < 0 || w.b < 0) && std::chrono::steady_clock::now() < connect_until) {
    const auto trace = testing::ParseTrace(scheduler.Log());
    w.a = testing::WorkerConnectedFrom(trace, "10.77.0.2");
    w.b = testing::WorkerConnectedFrom(trace, "10.77.0.3");
    if (w.a < 0 || w.b < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return w;
}

// Waits (up to 2 minutes, while the run lasts) until the scheduler sends
// `worker` a TRAIN beyond the `sent_before` it had sent.
void WaitForNextTrain(Child& scheduler, int worker, int sent_before) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (testing::CountTrace(testing::ParseTrace(scheduler.Log()), TraceLine::kSent, worker) ==
             sent_before &&
         scheduler.Running() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(2));
  }
}

// The index of the last trace line that says `worker` was lost;
// trace.size() if none does.
size_t LossOf(const std::vector<TraceLine>& trace, int worker) {
  size_t lost_at = trace.size();
  for (size_t i = 0; i < trace.size(); ++i) {
    if (trace[i].kind == TraceLine::kLost && trace[i].worker == worker) lost_at = i;
  }
  return lost_at;
}

// The tasks sent to `worker` before trace line `end` without a result:
// task -> member.
std::map<int64_t, std::string> InFlightBefore(const std::vector<TraceLine>& trace, int worker,
                                              size_t end) {
  std::map<int64_t, std::string> in_flight;
  for (size_t i = 0; i < end; ++i) {
    if (trace[i].worker != worker) continue;
    if (trace[i].kind == TraceLine::kSent) in_flight[trace[i].task] = trace[i].text;
    if (trace[i].kind == TraceLine::kResult) in_flight.erase(trace[i].task);
  }
  return in_flight;
}

// Whether, after trace line `from`, `worker` was sent `member` and returned
// a result for that task.
bool RetrainedAfter(const std::vector<TraceLine>& trace, size_t from, int worker,
                    const std::string& member) {
  for (size_t i = from + 1; i < trace.size(); ++i) {
    if (trace[i].kind != TraceLine::kSent || trace[i].worker != worker || trace[i].text != member) {
      continue;
    }
    for (size_t j = i + 1; j < trace.size(); ++j) {
      if (trace[j].kind == TraceLine::kResult && trace[j].worker == worker &&
          trace[j].task == trace[i].task) {
        return true;
      }
    }
  }
  return false;
}

// The audit log holds one worker loss, `worker`'s, which put back `requeued`
// members.
void ExpectOneLoss(const testing::StoreSnapshot& run, int worker, size_t requeued,
                   const Child& scheduler) {
  int lost_events = 0;
  for (const auto& e : run.events) {
    const auto j = nlohmann::json::parse(e, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || j.value("type", "") != "worker_lost") continue;
    ++lost_events;
    EXPECT_EQ(j.value("worker", -1), worker) << e;
    EXPECT_EQ(j.value("requeued", size_t{0}), requeued) << e;
  }
  EXPECT_EQ(lost_events, 1) << scheduler.Log();
}

class NetnsWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string out;
    ASSERT_EQ(Sh("command -v ip", &out), 0) << "no `ip` (iproute2; scripts/setup-deps)";
    const std::string probe = "ckpt-probe-" + std::to_string(getpid());
    if (Sh("ip netns add " + probe, &out) != 0) {
      GTEST_SKIP() << "cannot make network namespaces here (needs root or CAP_NET_ADMIN): " << out;
    }
    Sh("ip netns del " + probe, &out);
    RemoveStaleNamespaces();

    dir_ = testing::TempDir("netns");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
    worker_ = testing::Env("CKPT_WORKER_BIN", CKPT_WORKER_BIN);
    const std::string pid = std::to_string(getpid());
    s_ = "ckpt-s-" + pid;
    a_ = "ckpt-a-" + pid;
    b_ = "ckpt-b-" + pid;

    // The bridge lives in s; each worker namespace has eth0, whose peer
    // (port2, port3) is a port of that bridge.
    std::string cmd = "set -e; ip netns add " + s_ + "; ip netns add " + a_ + "; ip netns add " +
                      b_ + "; ip -n " + s_ + " link set lo up; ip -n " + s_ +
                      " link add br0 type bridge; ip -n " + s_ + " addr add " + kSchedulerIp +
                      "/24 dev br0; ip -n " + s_ + " link set br0 up;";
    int host = 2;
    for (const std::string& ns : {a_, b_}) {
      const std::string port = "port" + std::to_string(host);
      cmd += " ip -n " + ns + " link set lo up; ip -n " + ns +
             " link add eth0 type veth peer name " + port + " netns " + s_ + "; ip -n " + s_ +
             " link set " + port + " master br0; ip -n " + s_ + " link set " + port +
             " up; ip -n " + ns + " addr add 10.77.0." + std::to_string(host) +
             "/24 dev eth0; ip -n " + ns + " link set eth0 up;";
      ++host;
    }
    made_namespaces_ = true;
    ASSERT_EQ(Sh(cmd, &out), 0) << cmd << "\n" << out;
    // Both worker hosts reach the scheduler's host before anything runs: a
    // connection to a closed port there is refused (s answered), not
    // unreachable or timed out.
    for (const std::string& ns : {a_, b_}) {
      Sh("ip netns exec " + ns + " timeout 5 bash -c \"echo > /dev/tcp/" + kSchedulerIp + "/9\"",
         &out);
      ASSERT_NE(out.find("refused"), std::string::npos)
          << ns << " cannot reach " << kSchedulerIp << ":\n"
          << out;
    }
    secret_ = dir_ + "/experiment.secret";
  }

  void TearDown() override {
    if (made_namespaces_) {
      std::string out;
      for (const auto& ns : {s_, a_, b_}) Sh("ip netns del " + ns, &out);
    }
    if (dir_.empty()) return;
    if (HasFailure() || !testing::Env("CKPT_TEST_KEEP").empty()) {
      std::printf("kept %s for its logs\n", dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
    }
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  std::vector<std::string> WorkerArgs(const std::string& ns, const std::string& addr) {
    std::vector<std::string> args = {"/usr/sbin/ip", "netns", "exec",          ns,     worker_,
                                     "--connect",    addr,    "--secret-file", secret_};
    for (const auto& f : testing::WorkerTrainingFlags()) args.push_back(f);
    return args;
  }

  std::string dir_, scheduler_, worker_, s_, a_, b_, secret_;
  bool made_namespaces_ = false;
};

TEST_F(NetnsWorkersTest, CuttingAWorkersLinkLosesNothingAndTheOtherHostRetrainsItsMembers) {
  const std::string name = "netns";
  const std::string reference_config =
      WriteFile("reference.toml",
                testing::RemoteRunConfig(name, kPopulation, kIntervals, "", kStepsPerInterval));
  ASSERT_EQ(testing::RunReference(scheduler_, reference_config, dir_ + "/reference",
                                  dir_ + "/reference.log"),
            0);
  const auto reference = testing::ReadStore(dir_ + "/reference", name);
  ASSERT_EQ(reference.heads.size(), static_cast<size_t>(kPopulation));

  const std::string config =
      WriteFile("tcp.toml", testing::RemoteRunConfig(name, kPopulation, kIntervals,
                                                     "listen = \"" + std::string(kSchedulerIp) +
                                                         ":0\"\nsecret_file = \"" + secret_ +
                                                         "\"\nlocal = false\n",
                                                     kStepsPerInterval));
  const std::string store = dir_ + "/store";
  Child scheduler({"/usr/sbin/ip", "netns", "exec", s_, "/usr/bin/env", "CKPT_TRACE=1", scheduler_,
                   "run", config, "--store", store, "--quiet", "--grace-ms", "5000"},
                  dir_ + "/scheduler.log");
  const std::string addr = testing::WaitForWorkersAddr(scheduler, store);
  ASSERT_EQ(addr.rfind(std::string(kSchedulerIp) + ":", 0), 0u)
      << "workers.addr is '" << addr << "'\n"
      << scheduler.Log();

  Child worker_a(WorkerArgs(a_, addr), dir_ + "/worker-a.log");
  Child worker_b(WorkerArgs(b_, addr), dir_ + "/worker-b.log");
  // Both are connected before the results are counted: one worker's start
  // (a second or more on a loaded machine, where it starts again for its
  // BLAS kernels) can outlast the other's first third of the results.
  const auto [a, b] = WaitForBothHosts(scheduler);
  ASSERT_GE(a, 0) << "no worker connected from ckpt-a (10.77.0.2):\n"
                  << scheduler.Log() << "\nworker a:\n"
                  << worker_a.Log();
  ASSERT_GE(b, 0) << "no worker connected from ckpt-b (10.77.0.3):\n"
                  << scheduler.Log() << "\nworker b:\n"
                  << worker_b.Log();
  const int total = kPopulation * kIntervals;
  ASSERT_TRUE(testing::WaitForResults(scheduler, total / 3)) << scheduler.Log() << "\nworker a:\n"
                                                             << worker_a.Log() << "\nworker b:\n"
                                                             << worker_b.Log();
  const auto early = testing::ParseTrace(scheduler.Log());
  ASSERT_GT(testing::CountTrace(early, TraceLine::kResult, a), 0) << "a trained nothing";

  // Mid-interval: the cut follows a fresh TRAIN to a at once (an interval
  // takes hundreds of ms here; noticing and cutting take a few). Its link
  // goes down: no FIN, no RST reaches the scheduler, only silence.
  const int sent_before = testing::CountTrace(early, TraceLine::kSent, a);
  WaitForNextTrain(scheduler, a, sent_before);
  std::string out;
  ASSERT_EQ(Sh("ip -n " + a_ + " link set eth0 down", &out), 0) << out;
  ASSERT_TRUE(scheduler.Running()) << "the run ended before the cut; make it longer\n"
                                   << scheduler.Log();

  ASSERT_TRUE(scheduler.WaitFor(std::chrono::minutes(5)))
      << "the run did not finish in 5 minutes after the cut:\n"
      << scheduler.Log();
  const int status = scheduler.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << scheduler.Log();
  // b was told to stop and did, cleanly; a, cut off, gives up on its own
  // (its heartbeat timeout) or is stopped here.
  ASSERT_TRUE(worker_b.WaitFor(std::chrono::seconds(60))) << worker_b.Log();
  const int b_status = worker_b.Wait();
  EXPECT_TRUE(WIFEXITED(b_status) && WEXITSTATUS(b_status) == 0) << worker_b.Log();
  kill(worker_a.pid(), SIGKILL);
  worker_a.Wait();

  // The scheduler found a silent (heartbeat timeout), not closed, and put
  // back what a had in flight; b trained each of those members afterwards.
  const auto trace = testing::ParseTrace(scheduler.Log());
  const size_t lost_at = LossOf(trace, a);
  ASSERT_LT(lost_at, trace.size()) << "worker " << a << " (ckpt-a) was never lost:\n"
                                   << scheduler.Log();
  EXPECT_NE(trace[lost_at].text.find("heartbeat timeout"), std::string::npos)
      << trace[lost_at].text;
  const auto in_flight = InFlightBefore(trace, a, lost_at);
  ASSERT_FALSE(in_flight.empty()) << "a had nothing in flight when its link went down";
  for (const auto& [task, member] : in_flight) {
    EXPECT_TRUE(RetrainedAfter(trace, lost_at, b, member))
        << member << " (task " << task << " on a) was not retrained by b:\n"
        << scheduler.Log();
  }

  const auto run = testing::ReadStore(store, name);
  EXPECT_EQ(run.verify_problem, "");
  ASSERT_EQ(run.heads.size(), static_cast<size_t>(kPopulation));
  for (const auto& [member, head] : run.heads) {
    EXPECT_EQ(head.step, kIntervals * kStepsPerInterval) << member;
  }
  testing::ExpectEachIntervalTrainedOnce(testing::ReadCommits(run), run, kIntervals);
  // One loss, a's, in the audit log, with the members it put back.
  ExpectOneLoss(run, a, in_flight.size(), scheduler);
  testing::ExpectHeadsAsReference(run, reference);
}

}  // namespace
}  // namespace ckpt
