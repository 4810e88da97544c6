// Whole runs of `ckpt-scheduler run` with workers on cuda:0: real scheduler
// and worker processes, a real store, real shared-memory rings. Skipped where
// no CUDA device can be expected (cuda_visible.h); where one is visible and
// cuda:0 cannot be used, they fail. Each worker must say (its HELLO, in the
// scheduler's trace: scheduler/src/trace.h) that it trains on the device
// asked for.
//
// Written and compiled without a GPU: these tests have not run on one yet.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../scheduler/src/trace.h"
#include "ckpt/model/trainer.h"
#include "ckpt/store/store.h"
#include "cuda_visible.h"
#include "model_test_util.h"
#include "process_util.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;

// How long a run may take: CKPT_GPU_RUN_WAIT_S (scripts/gpu-check sets it
// below its own limit for the test, so that a slow run fails here and gtest
// still writes its report), else 400 s.
int RunWaitSeconds() {
  const char* s = std::getenv("CKPT_GPU_RUN_WAIT_S");
  const int v = s != nullptr ? std::atoi(s) : 0;
  return v > 0 ? v : 400;
}

// Why cuda:0 cannot be used here, or "" when it can.
std::string NoGpuReason() {
  static const std::string why = [] {
    model::TrainerOptions o = model::testing::BaseOptions("lenet5", "sgd");
    o.device = "cuda:0";
    auto t = model::Trainer::Create(o);
    return t.ok() ? std::string() : t.status().ToString();
  }();
  return why;
}

// Random search: hyperparameters drawn from the experiment's seeded
// generator and no exploits, so a CPU run and a GPU run train the same
// members with the same hyperparameters, and their scores are comparable
// member by member.
std::string Config(const std::string& device, int count, int population, int intervals) {
  std::ostringstream os;
  os << "name = \"gpu\"\nseed = 7\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 32\neval_size = 1000\n"
     << "[population]\nsize = " << population
     << "\nsteps_per_interval = 40\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.01\nmax = 0.1\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.9\n"
     << "[policy]\nkind = \"random\"\n"
     << "[[devices]]\ndevice = \"" << device << "\"\ncount = " << count
     << "\nslots = 2\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return os.str();
}

class GpuRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string no = testing::NoCudaDevice(); !no.empty()) GTEST_SKIP() << no;
    const std::string why = NoGpuReason();
    ASSERT_TRUE(why.empty()) << "a CUDA device is visible, yet cuda:0 cannot be used: " << why;
    dir_ = testing::TempDir("gpu-run");
    ASSERT_FALSE(dir_.empty());
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // Runs `config` (its workers on `device`) to completion in its own store;
  // returns the members' heads. Every worker's HELLO must name `device`.
  // `max_workers` receives the most ckpt-worker children seen at once.
  std::map<std::string, store::MemberHead> Run(const std::string& tag, const std::string& device,
                                               const std::string& config,
                                               int* max_workers = nullptr) {
    const std::string path = dir_ + "/" + tag + ".toml";
    std::ofstream(path) << config;
    const std::string store_dir = dir_ + "/" + tag + "-store";
    const std::string trace_path = dir_ + "/" + tag + "-trace.jsonl";
    setenv(scheduler::trace::kEnv, trace_path.c_str(), 1);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) env.emplace_back(*e);
    unsetenv(scheduler::trace::kEnv);
    // The scheduler dies with this test (killed at its limit, say), and its
    // workers with it (they have the same signal): nothing stays on the GPU.
    const pid_t test_pid = getpid();
    testing::Child c(
        {scheduler_, "run", path, "--store", store_dir, "--quiet"}, dir_ + "/" + tag + ".log", env,
        [test_pid] { return prctl(PR_SET_PDEATHSIG, SIGKILL) == 0 && getppid() == test_pid; });
    int most = 0;
    const int wait_s = RunWaitSeconds();
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(wait_s);
    while (c.Running() && std::chrono::steady_clock::now() < until) {
      most = std::max(most, static_cast<int>(testing::ChildrenOf(c.pid()).size()));
      std::this_thread::sleep_for(milliseconds(20));
    }
    if (max_workers != nullptr) *max_workers = most;
    std::map<std::string, store::MemberHead> heads;
    if (!c.WaitFor(milliseconds(1000))) {
      ADD_FAILURE() << tag << ": scheduler did not finish in " << wait_s << " s:\n" << c.Log();
      return heads;
    }
    const int st = c.Wait();
    EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << tag << ":\n" << c.Log();
    ExpectWorkersOn(device, trace_path, tag);
    store::StoreOptions so;
    so.path = store_dir;
    auto s = store::Store::Open(so);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return heads;
    auto members = (*s)->ListMembers("gpu");
    EXPECT_TRUE(members.ok()) << members.status().ToString();
    if (!members.ok()) return heads;
    for (const auto& m : *members) heads[m.member] = m;
    auto report = (*s)->Verify();
    EXPECT_TRUE(report.ok() && report->ok()) << tag << ": store does not verify";
    return heads;
  }

  // The HELLO of every worker started, from the scheduler's trace, names
  // `device`: a worker asked for cuda:0 trains there, not on a fallback.
  static void ExpectWorkersOn(const std::string& device, const std::string& trace_path,
                              const std::string& tag) {
    std::ifstream in(trace_path);
    int hellos = 0;
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_object() || j.value("ev", "") != scheduler::trace::kHello) continue;
      ++hellos;
      EXPECT_EQ(j.value("device", ""), device) << tag << ": worker " << j.value("worker", -1);
    }
    EXPECT_GT(hellos, 0) << tag << ": no worker HELLO in the trace " << trace_path;
  }

  std::string dir_;
  std::string scheduler_;
};

// The same random search on cuda:0 and on the CPU: every member completes its
// steps on both, with the same hyperparameters, and its validation accuracy
// on 1,000 images agrees within 0.03 (float rounding and kernel choice
// differ between the devices; 80 SGD steps keep the trajectories close).
TEST_F(GpuRunTest, PopulationOnCudaMatchesTheCpuRun) {
  auto gpu = Run("cuda", "cuda:0", Config("cuda:0", 1, 4, 2));
  auto cpu = Run("cpu", "cpu", Config("cpu", 1, 4, 2));
  ASSERT_EQ(gpu.size(), 4u);
  ASSERT_EQ(cpu.size(), gpu.size());
  for (const auto& [member, g] : gpu) {
    ASSERT_EQ(cpu.count(member), 1u) << member;
    const auto& c = cpu.at(member);
    EXPECT_EQ(g.step, 80) << member;
    EXPECT_EQ(g.step, c.step) << member;
    EXPECT_EQ(g.hparams, c.hparams) << member;
    ASSERT_FALSE(std::isnan(g.last_score)) << member;
    EXPECT_GT(g.last_score, 0.5) << member << ": 80 steps of LeNet-5 learn Fashion-MNIST";
    EXPECT_NEAR(g.last_score, c.last_score, 0.03) << member;
  }
}

// Two workers on one GPU (count = 2, as several GPUs are simulated): both run
// at once and the population completes.
TEST_F(GpuRunTest, TwoWorkersOnOneGpu) {
  int workers = 0;
  auto heads = Run("two", "cuda:0", Config("cuda:0", 2, 6, 2), &workers);
  EXPECT_EQ(workers, 2) << "ckpt-worker processes seen at once";
  ASSERT_EQ(heads.size(), 6u);
  for (const auto& [member, h] : heads) {
    EXPECT_EQ(h.step, 80) << member;
    EXPECT_FALSE(std::isnan(h.last_score)) << member;
  }
}

}  // namespace
}  // namespace ckpt
