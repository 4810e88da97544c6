// Workers as a Slurm job: a real single-node Slurm (scripts/slurm-local:
// Debian's slurm-wlm and munge), a real `ckpt-scheduler run` listening on
// TCP with no local workers, and deploy/slurm/ckpt-workers.sbatch submitted
// with sbatch, its srun tasks running `ckpt-worker --connect`. The job is
// cancelled mid-run (all its workers lost at once); a second job joins the
// running experiment and finishes it; the result equals an undisturbed run
// with spawned local workers, and nothing committed before the cancel is
// lost.
//
// The cluster: $CKPT_SLURM_DIR's when that one is up (the CI step starts one
// and leaves it running), else a private one in $TMPDIR/ckpt-slurm-test-<pid>,
// started and stopped here.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
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
using testing::Trim;

constexpr int kPopulation = 6;
constexpr int kIntervals = 8;
constexpr int kStepsPerInterval = 6;
// The private cluster's run directory: $TMPDIR/<prefix><pid of this test>.
constexpr char kPrivateClusterPrefix[] = "ckpt-slurm-test-";

// Nothing committed before the cancel was lost or changed: every head that
// `ls` (ckpt-tool's JSON, read then) shows is in the commit log with that
// blob (retention may have dropped the version since; the log keeps it).
void ExpectCommittedKept(const std::string& ls, const testing::Commits& commits,
                         const testing::StoreSnapshot& run) {
  const auto snapshot = nlohmann::json::parse(ls, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(snapshot.is_object() && snapshot.contains("members")) << ls;
  int committed = 0;
  for (const auto& m : snapshot["members"]) {
    const std::string member = m.value("member", "");
    const int64_t version = m.value("version", int64_t{0});
    if (version == 0) continue;
    ++committed;
    auto it = commits.blob.find({member, version});
    ASSERT_NE(it, commits.blob.end()) << member << " v" << version << " is not in the log";
    EXPECT_EQ(it->second, m.value("blob", "")) << member << " v" << version;
    EXPECT_GE(run.heads.at(member).version, version) << member;
  }
  EXPECT_GT(committed, 0) << ls;
}

// Both jobs' workers trained: the first job's before its cancel (both of
// them: WaitForFirstJobToTrain), the second job's every result after it (the
// first job's workers were gone by then). Counted by results around the
// cancel, not by worker index: a new connection takes a lost remote worker's
// index (the scheduler's remote list reuses its entries).
void ExpectBothJobsTrained(int results_at_cancel, int results_at_end) {
  EXPECT_GT(results_at_cancel, 0);
  EXPECT_GT(results_at_end - results_at_cancel, 0);
}

class SlurmWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir("slurm");
    ASSERT_FALSE(dir_.empty());
    source_ = testing::Env("CKPT_SOURCE_DIR", CKPT_SOURCE_DIR);
    scheduler_ = testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN);
    worker_ = testing::Env("CKPT_WORKER_BIN", CKPT_WORKER_BIN);
    std::string out;
    ASSERT_EQ(Sh("command -v sbatch srun scancel squeue scontrol && test -x /usr/sbin/slurmctld "
                 "&& test -x /usr/sbin/munged",
                 &out),
              0)
        << "Slurm or munge is not installed (scripts/setup-deps installs slurm-wlm and munge):\n"
        << out;

    slurm_dir_ = testing::Env("CKPT_SLURM_DIR");
    if (slurm_dir_.empty()) {
      StopStaleClusters();
      slurm_dir_ = TmpRoot() + "/" + kPrivateClusterPrefix + std::to_string(getpid());
    }
    slurm_ = "CKPT_SLURM_DIR=" + slurm_dir_ + " " + source_ + "/scripts/slurm-local";
    if (Sh(slurm_ + " status", &out) != 0) {
      started_slurm_ = true;
      ASSERT_EQ(Sh(slurm_ + " start", &out), 0) << "scripts/slurm-local start failed:\n" << out;
    }
    std::string env;
    ASSERT_EQ(Sh(slurm_ + " env", &env), 0) << env;
    const std::string prefix = "export SLURM_CONF=";
    ASSERT_EQ(env.rfind(prefix, 0), 0u) << env;
    setenv("SLURM_CONF", Trim(env.substr(prefix.size())).c_str(), 1);

    secret_ = dir_ + "/experiment.secret";  // made by the scheduler, mode 0600
  }

  void TearDown() override {
    std::string out;
    for (const auto& job : jobs_) Sh("scancel " + job, &out);
    if (started_slurm_) {
      if (Sh(slurm_ + " stop", &out) != 0) ADD_FAILURE() << "slurm-local stop:\n" << out;
    }
    if (HasFailure() || !testing::Env("CKPT_TEST_KEEP").empty()) {
      std::printf("kept %s for its logs (slurm: %s/log)\n", dir_.c_str(), slurm_dir_.c_str());
    } else {
      std::filesystem::remove_all(dir_);
      if (started_slurm_) std::filesystem::remove_all(slurm_dir_);
    }
  }

  static std::string TmpRoot() { return testing::Env("TMPDIR", "/tmp"); }

  // Private clusters of earlier runs of this test that were killed (by a
  // ctest timeout, say) before they could stop theirs: the pid in the run
  // directory's name is gone. Their daemons are stopped, their files removed.
  void StopStaleClusters() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(TmpRoot(), ec)) {
      const std::string name = e.path().filename().string();
      if (name.rfind(kPrivateClusterPrefix, 0) != 0) continue;
      const std::string pid = name.substr(std::strlen(kPrivateClusterPrefix));
      if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos) continue;
      if (kill(std::stoi(pid), 0) == 0 || errno == EPERM) continue;
      std::string out;
      Sh("CKPT_SLURM_DIR=" + e.path().string() + " " + source_ + "/scripts/slurm-local stop", &out);
      std::filesystem::remove_all(e.path(), ec);
    }
  }

  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }

  // sbatch of the shipped script, for this CPU-only node: 2 tasks of 1 CPU,
  // --device cpu. The script's #SBATCH --gpus-per-task=1 stays (the local
  // cluster has count-only GPUs for it). Returns the job id, "" on failure.
  std::string Submit(const std::string& addr, const std::string& tag) {
    std::string worker_args;
    for (const auto& f : testing::WorkerTrainingFlags()) {
      if (f == "--device" || f == "cpu") continue;  // CKPT_DEVICE below
      worker_args += (worker_args.empty() ? "" : " ") + f;
    }
    std::string out;
    const std::string cmd =
        "cd " + dir_ + " && CKPT_SCHEDULER=" + addr + " CKPT_SECRET_FILE=" + secret_ +
        " CKPT_WORKER=" + worker_ + " CKPT_DEVICE=cpu CKPT_WORKER_ARGS='" + worker_args +
        "' sbatch --parsable --job-name=ckpt-test-" + tag +
        " --ntasks-per-node=2 --cpus-per-task=1 --time=20:00 --output=" + dir_ + "/job-" + tag +
        "-%j.out " + source_ + "/deploy/slurm/ckpt-workers.sbatch";
    if (Sh(cmd, &out) != 0) {
      ADD_FAILURE() << cmd << "\n" << out;
      return "";
    }
    std::string id = Trim(out);
    id = id.substr(id.rfind('\n') + 1);  // the last line: "<id>" or "<id>;<cluster>"
    id = id.substr(0, id.find(';'));
    if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos) {
      ADD_FAILURE() << "sbatch printed no job id:\n" << out;
      return "";
    }
    jobs_.push_back(id);
    return id;
  }

  // The job's state as scontrol reports it ("RUNNING", "COMPLETED", ...);
  // "" once Slurm has forgotten it.
  static std::string JobField(const std::string& id, const std::string& field) {
    std::string out;
    if (Sh("scontrol -o show job " + id, &out) != 0) return "";
    const auto at = out.find(field + "=");
    if (at == std::string::npos) return "";
    const auto from = at + field.size() + 1;
    return out.substr(from, out.find(' ', from) - from);
  }

  // Waits until the job has ended (no longer pending, running or completing).
  static bool WaitForJobEnd(const std::string& id, std::chrono::seconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < until) {
      const std::string state = JobField(id, "JobState");
      if (state != "PENDING" && state != "RUNNING" && state != "COMPLETING" &&
          state != "CONFIGURING") {
        return true;
      }
      std::this_thread::sleep_for(milliseconds(200));
    }
    return false;
  }

  std::string JobOutput(const std::string& tag, const std::string& id) {
    std::ifstream in(dir_ + "/job-" + tag + "-" + id + ".out");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

  // Waits (up to 5 minutes, while the run lasts) until both workers of job
  // `first` have trained and a third of the run's `total` results are in;
  // `first_workers`: the scheduler's indexes of the job's workers.
  void WaitForFirstJobToTrain(Child& scheduler, const std::string& first, int total,
                              std::set<int>* first_workers) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::minutes(5);
    for (;;) {
      const auto trace = testing::ParseTrace(scheduler.Log());
      first_workers->clear();
      int trained = 0;  // of first_workers, how many delivered a result
      for (const auto& t : trace) {
        if (t.kind == testing::TraceLine::kConnected) first_workers->insert(t.worker);
      }
      for (int w : *first_workers) trained += testing::CountTrace(trace, TraceLine::kResult, w) > 0;
      if (trained == 2 && testing::ResultsLogged(scheduler) >= total / 3) break;
      ASSERT_TRUE(scheduler.Running() && std::chrono::steady_clock::now() < until)
          << "job " << first << " (" << JobField(first, "JobState")
          << "): not both workers trained within 5 minutes, or the run ended first\n"
          << JobOutput("first", first) << "\nscheduler:\n"
          << scheduler.Log();
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  // Cancels job `first` (its 2 workers) and waits until Slurm has ended it.
  void CancelFirstJob(const std::string& first) {
    std::string out;
    ASSERT_EQ(Sh("scancel " + first, &out), 0) << out;
    ASSERT_TRUE(WaitForJobEnd(first, std::chrono::seconds(60)))
        << "job " << first << " still " << JobField(first, "JobState") << " 60 s after scancel";
    EXPECT_EQ(JobField(first, "JobState"), "CANCELLED");
    const std::string first_output = JobOutput("first", first);
    EXPECT_NE(first_output.find("ckpt-workers: job " + first + ": 2 workers"), std::string::npos)
        << first_output;
  }

  std::string dir_, source_, scheduler_, worker_, slurm_dir_, slurm_, secret_;
  bool started_slurm_ = false;
  std::vector<std::string> jobs_;
};

TEST_F(SlurmWorkersTest, WorkerJobRunsAPopulationAndASecondJobFinishesACancelledOne) {
  const std::string name = "slurm";
  const std::string reference_config =
      WriteFile("reference.toml", testing::RemoteRunConfig(name, kPopulation, kIntervals, ""));
  ASSERT_EQ(testing::RunReference(scheduler_, reference_config, dir_ + "/reference",
                                  dir_ + "/reference.log"),
            0);
  const auto reference = testing::ReadStore(dir_ + "/reference", name);
  ASSERT_EQ(reference.heads.size(), static_cast<size_t>(kPopulation));

  const std::string config =
      WriteFile("tcp.toml", testing::RemoteRunConfig(name, kPopulation, kIntervals,
                                                     "listen = \"127.0.0.1:0\"\nsecret_file = \"" +
                                                         secret_ + "\"\nlocal = false\n"));
  const std::string store = dir_ + "/store";
  Child scheduler({"/usr/bin/env", "CKPT_TRACE=1", scheduler_, "run", config, "--store", store,
                   "--quiet", "--grace-ms", "5000"},
                  dir_ + "/scheduler.log");
  const std::string addr = testing::WaitForWorkersAddr(scheduler, store);
  ASSERT_FALSE(addr.empty()) << "no " << store << "/workers.addr:\n" << scheduler.Log();
  EXPECT_NE(scheduler.Log().find("listening for workers on " + addr), std::string::npos)
      << scheduler.Log();
  struct stat st {};
  ASSERT_EQ(stat(secret_.c_str(), &st), 0) << "the scheduler made no secret file " << secret_;
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // First job: two workers; cancelled once both have trained and a third of
  // the run is committed (a task may start long after the other on a busy
  // machine).
  const std::string first = Submit(addr, "first");
  ASSERT_FALSE(first.empty());
  const int total = kPopulation * kIntervals;
  std::set<int> first_workers;  // the scheduler's indexes of the first job's workers
  WaitForFirstJobToTrain(scheduler, first, total, &first_workers);
  if (HasFatalFailure()) return;
  ASSERT_EQ(first_workers.size(), 2u) << scheduler.Log();
  CancelFirstJob(first);
  if (HasFatalFailure()) return;

  // What is committed now, read while the scheduler runs (ckpt-tool reads
  // never block it); none of it may be lost or changed later.
  std::string ls;
  ASSERT_EQ(Sh(std::string(CKPT_TOOL_BIN) + " --store " + store + " --json ls " + name, &ls), 0)
      << ls;
  const int results_at_cancel = testing::ResultsLogged(scheduler);
  ASSERT_TRUE(scheduler.Running()) << "the scheduler ended with its workers gone:\n"
                                   << scheduler.Log();
  EXPECT_LT(results_at_cancel, total) << "the run ended before the cancel; make it longer";

  // Second job: new workers join the running experiment and finish it.
  const std::string second = Submit(addr, "second");
  ASSERT_FALSE(second.empty());
  ASSERT_TRUE(scheduler.WaitFor(std::chrono::minutes(5)))
      << "the run did not finish in 5 minutes after job " << second << " started:\n"
      << scheduler.Log() << "\njob output:\n"
      << JobOutput("second", second);
  const int status = scheduler.Wait();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << scheduler.Log();
  EXPECT_NE(scheduler.Log().find("experiment " + name + ": done"), std::string::npos);

  // The scheduler shut its workers down: the job ends by itself, cleanly.
  ASSERT_TRUE(WaitForJobEnd(second, std::chrono::seconds(120)))
      << "job " << second << " still " << JobField(second, "JobState")
      << " 120 s after the run ended:\n"
      << JobOutput("second", second);
  EXPECT_EQ(JobField(second, "JobState"), "COMPLETED") << JobOutput("second", second);
  EXPECT_EQ(JobField(second, "ExitCode"), "0:0") << JobOutput("second", second);

  const auto run = testing::ReadStore(store, name);
  EXPECT_EQ(run.verify_problem, "");
  ASSERT_EQ(run.heads.size(), static_cast<size_t>(kPopulation));
  for (const auto& [member, head] : run.heads) {
    EXPECT_EQ(head.step, kIntervals * kStepsPerInterval) << member;
  }
  // Both workers of the cancelled job were lost, and each loss is in the log.
  EXPECT_EQ(testing::CountEvents(run, "worker_lost"), 2) << scheduler.Log();
  const auto commits = testing::ReadCommits(run);
  testing::ExpectEachIntervalTrainedOnce(commits, run, kIntervals);
  ExpectCommittedKept(ls, commits, run);
  if (HasFatalFailure()) return;
  ExpectBothJobsTrained(results_at_cancel, testing::ResultsLogged(scheduler));
  // And the end is the undisturbed run's, member for member.
  testing::ExpectHeadsAsReference(run, reference);
}

}  // namespace
}  // namespace ckpt
