// ckpt-chaos: runs real `ckpt-scheduler run` experiments and attacks them with
// faults at moments drawn from a seed, then checks that nothing was lost.
//
//   ckpt-chaos --runs N --seed S [--faults-per-run K] [--kinds a,b] [--dir DIR]
//
// One undisturbed run of the experiment gives the reference heads; each chaos
// run then trains the same experiment (synchronous PBT with a fixed seed is
// deterministic) in a store of its own while faults are injected, paced by the
// run's progress (the results its scheduler logs with CKPT_TRACE=1), never by
// wall time. After each run: the final heads must equal the reference's, the
// store must verify, every member must have trained each interval exactly
// once, and no head seen after a crash may have gone back. The last line on
// stdout is one JSON object with the figures (see tests/chaos/README.md).
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../integration/process_util.h"
#include "ckpt/store/store.h"

namespace ckpt::chaos {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::ChildrenOf;  // live (not zombie) direct children

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

enum class Kind {
  kWorkerSigkill,
  kWorkerSigstop,
  kSchedulerSigkill,
  kSchedulerSigterm,
  kSchedulerKillPoint,
  kWorkerKillPoint,
  kCorruptBlob,
  kDiskFull,
};
constexpr Kind kAllKinds[] = {Kind::kWorkerSigkill,      Kind::kWorkerSigstop,
                              Kind::kSchedulerSigkill,   Kind::kSchedulerSigterm,
                              Kind::kSchedulerKillPoint, Kind::kWorkerKillPoint,
                              Kind::kCorruptBlob,        Kind::kDiskFull};

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kWorkerSigkill:
      return "worker_sigkill";
    case Kind::kWorkerSigstop:
      return "worker_sigstop";
    case Kind::kSchedulerSigkill:
      return "scheduler_sigkill";
    case Kind::kSchedulerSigterm:
      return "scheduler_sigterm";
    case Kind::kSchedulerKillPoint:
      return "scheduler_kill_point";
    case Kind::kWorkerKillPoint:
      return "worker_kill_point";
    case Kind::kCorruptBlob:
      return "corrupt_blob";
    case Kind::kDiskFull:
      return "disk_full";
  }
  return "?";
}

// Kill points a scheduler passes (scheduler/src/experiment.cc and
// store/src/store_impl.cc) and a worker passes (worker/src/worker_loop.cc).
const std::vector<std::string> kSchedulerPoints = {"commit.before_write",  "commit.after_write",
                                                   "scheduler.committed",  "scheduler.exploited",
                                                   "exploit.before_write", "exploit.after_write"};
const std::vector<std::string> kWorkerPoints = {"worker.decode", "worker.train", "worker.encode",
                                                "worker.result_sent"};

// A child process with stdout and stderr appended to a file; with
// `mount_ns_of` > 0, in the mount namespace of that process.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::vector<std::string>& env,
        const std::string& log_path, pid_t mount_ns_of = 0) {
    std::vector<std::string> a = args, e = env;
    std::vector<char*> argv, envp;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    // setns() into a mount namespace moves the working directory to its
    // root: relative paths need it back.
    const std::string cwd = std::filesystem::current_path().string();
    pid_ = fork();
    if (pid_ == 0) {
      const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      if (mount_ns_of > 0) {
        const std::string ns = "/proc/" + std::to_string(mount_ns_of) + "/ns/mnt";
        const int nsfd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
        if (nsfd < 0 || setns(nsfd, CLONE_NEWNS) != 0 || chdir(cwd.c_str()) != 0) {
          std::perror("ckpt-chaos: entering the store's mount namespace");
          _exit(126);
        }
      }
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
  }
  ~Child() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  int Wait() {
    if (!waited_) {
      waitpid(pid_, &status_, 0);
      waited_ = true;
    }
    return status_;
  }
  bool Running() {
    if (waited_) return false;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) {
      waited_ = true;
      return false;
    }
    return true;
  }
  bool WaitFor(milliseconds timeout) {
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      if (!Running()) return true;
      std::this_thread::sleep_for(milliseconds(10));
    }
    return false;
  }

 private:
  pid_t pid_ = -1;
  int status_ = 0;
  bool waited_ = false;
};

// Follows a log file as it grows, timestamping each complete line when it is
// first seen.
class LogFollower {
 public:
  explicit LogFollower(std::string path) : path_(std::move(path)) {}
  struct Line {
    Clock::time_point seen;
    std::string text;
  };
  // Reads what was appended since the last call.
  void Poll() {
    std::ifstream in(path_, std::ios::binary);
    if (!in) return;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += chunk.size();
    partial_ += chunk;
    const auto now = Clock::now();
    size_t start = 0;
    for (size_t nl = partial_.find('\n'); nl != std::string::npos;
         nl = partial_.find('\n', start)) {
      lines_.push_back(Line{now, partial_.substr(start, nl - start)});
      if (lines_.back().text.find("got RESULT") != std::string::npos) ++results_;
      start = nl + 1;
    }
    partial_.erase(0, start);
  }
  const std::vector<Line>& lines() const { return lines_; }
  int results() const { return results_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  size_t offset_ = 0;
  std::string partial_;
  std::vector<Line> lines_;
  int results_ = 0;
};

// "worker N" in a scheduler line ("worker 1 (cpu) lost: ...", "worker 1: got RESULT").
int WorkerIndexOf(const std::string& line, const char* after) {
  const size_t at = line.find(after);
  if (at == std::string::npos) return -1;
  return std::atoi(line.c_str() + at + std::strlen(after));
}

struct Head {
  int64_t version = 0;
  int64_t step = 0;
  std::string blob;
  std::map<std::string, double> hparams;
  bool operator==(const Head& o) const {
    return version == o.version && step == o.step && blob == o.blob && hparams == o.hparams;
  }
};

struct StoreCheck {
  bool opened = false;
  std::string error;
  std::map<std::string, Head> heads;
  bool verified = false;
  std::string verify_problem;
  int trained_twice = 0;  // (member, interval) pairs committed more than once
  int intervals_missing = 0;
  int fallbacks = 0;  // "corrupt_state" events: members that fell back
  std::vector<std::string> verify_problems;
};

StoreCheck CheckStore(const std::string& path, const std::string& exp, int intervals, bool verify) {
  StoreCheck c;
  store::StoreOptions o;
  o.path = path;
  auto s = store::Store::Open(o);
  if (!s.ok()) {
    c.error = s.status().ToString();
    return c;
  }
  c.opened = true;
  auto members = (*s)->ListMembers(exp);
  if (!members.ok()) {
    c.error = members.status().ToString();
    return c;
  }
  // Members that fell back from a damaged head retrain the intervals since
  // their intact version: those commits are expected twice.
  std::map<std::string, int> fell_back;
  if (verify) {
    auto events = (*s)->ListEvents(exp, 0, 1 << 20);
    if (events.ok()) {
      for (const auto& e : *events) {
        const json j = json::parse(e.json, nullptr, false);
        if (j.is_object() && j.value("type", "") == "corrupt_state") {
          ++fell_back[j.value("member", "")];
          ++c.fallbacks;
        }
      }
    }
  }
  for (const auto& m : *members) {
    c.heads[m.member] = Head{m.version, m.step, m.blob ? m.blob->Hex() : "", m.hparams};
    if (!verify) continue;
    auto versions = (*s)->ListVersions(exp, m.member);
    if (!versions.ok()) {
      c.error = versions.status().ToString();
      continue;
    }
    std::map<int, int> trained;
    for (const auto& v : *versions) {
      if (v.reason != store::kReasonTrained) continue;
      auto it = v.metrics.find("interval");
      if (it != v.metrics.end()) ++trained[static_cast<int>(it->second)];
    }
    for (int i = 1; i <= intervals; ++i) {
      if (trained[i] > 1 + fell_back[m.member]) ++c.trained_twice;
      if (trained[i] == 0) ++c.intervals_missing;
    }
  }
  if (verify) {
    auto report = (*s)->Verify();
    c.verified = report.ok() && report->ok();
    if (!report.ok()) {
      c.verify_problem = report.status().ToString();
    } else {
      c.verify_problems = report->problems;
      if (!report->ok()) c.verify_problem = report->problems[0];
    }
  }
  return c;
}

// Damages, on disk, the head blob of a member whose next interval will read
// it: a member whose head is its own trained result, shared with no other
// head, before the last interval, and past a barrier already applied (another
// member is ahead of it, so no exploit can copy the damage to another member
// before it is found). Flips one byte in the middle of the blob in every
// RocksDB blob file holding it. Returns the blob's id, "" when no member fits.
std::string DamageAHeadBlob(const std::string& path, const std::string& exp, int intervals,
                            std::mt19937_64& rng) {
  std::string needle, hex;
  {
    store::StoreOptions o;
    o.path = path;
    auto s = store::Store::Open(o);
    if (!s.ok()) return "";
    auto members = (*s)->ListMembers(exp);
    if (!members.ok()) return "";
    std::map<std::string, int> interval_of, heads_with_blob;
    int max_interval = 0;
    for (const auto& m : *members) {
      if (!m.blob) continue;
      ++heads_with_blob[m.blob->Hex()];
      auto man = (*s)->GetManifest(exp, m.member, m.version);
      if (!man.ok()) continue;
      int interval = -1;
      if (man->reason == store::kReasonTrained) {
        auto it = man->metrics.find("interval");
        if (it != man->metrics.end()) interval = static_cast<int>(it->second);
      }
      interval_of[m.member] = interval;
      max_interval = std::max(max_interval, interval);
    }
    std::vector<const store::MemberHead*> fit;
    for (const auto& m : *members) {
      const int iv = interval_of.count(m.member) ? interval_of[m.member] : -1;
      // iv > 1: an older trained version exists to fall back to.
      if (m.blob && iv > 1 && iv < intervals && iv < max_interval &&
          heads_with_blob[m.blob->Hex()] == 1) {
        fit.push_back(&m);
      }
    }
    if (fit.empty()) return "";
    const store::MemberHead* victim = fit[rng() % fit.size()];
    auto blob = (*s)->ReadHeadBlob(exp, victim->member);
    if (!blob.ok()) return "";
    const std::string bytes(reinterpret_cast<const char*>(blob->data()), blob->size());
    // 64 bytes from the middle (tensor data) find the blob's copy on disk.
    needle = bytes.substr(bytes.size() / 2, 64);
    hex = victim->blob->Hex();
    if (!(*s)->Flush().ok()) return "";
  }
  int damaged = 0;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.path().extension() != ".blob") continue;
    std::ifstream in(entry.path(), std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = content.find(needle); at != std::string::npos;
         at = content.find(needle, at + 1)) {
      std::fstream f(entry.path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(at + 17));
      f.put(static_cast<char>(content[at + 17] ^ 0x10));
      if (f.good()) ++damaged;
    }
  }
  return damaged > 0 ? hex : "";
}

// A small tmpfs in a private mount namespace, mounted on `mountpoint` (which
// stays an empty directory outside it): a process that unshares its mount
// namespace, mounts the tmpfs and waits. Schedulers join its namespace
// (Child's mount_ns_of); the harness reaches the files through
// /proc/PID/root. The tmpfs goes away with the process.
class PrivateTmpfs {
 public:
  PrivateTmpfs(const std::string& mountpoint, uint64_t bytes) : mountpoint_(mountpoint) {
    std::filesystem::create_directories(mountpoint);
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      close(ready[0]);
      const std::string opts = "size=" + std::to_string(bytes);
      char ok = 0;
      if (unshare(CLONE_NEWNS) == 0 &&
          mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
          mount("tmpfs", mountpoint.c_str(), "tmpfs", 0, opts.c_str()) == 0) {
        ok = 1;
      }
      if (write(ready[1], &ok, 1) != 1 || !ok) _exit(1);
      close(ready[1]);
      while (true) pause();
    }
    close(ready[1]);
    char ok = 0;
    if (pid_ > 0 && read(ready[0], &ok, 1) == 1 && ok == 1) ok_ = true;
    close(ready[0]);
  }
  ~PrivateTmpfs() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  bool ok() const { return ok_; }
  pid_t pid() const { return pid_; }
  // `path` (under the mountpoint) as the harness sees it.
  std::string Outside(const std::string& path) const {
    return "/proc/" + std::to_string(pid_) + "/root" + path;
  }

 private:
  std::string mountpoint_;
  pid_t pid_ = -1;
  bool ok_ = false;
};

// Writes `path` until its file system is full. Returns the bytes written.
uint64_t FillWithBallast(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return 0;
  std::vector<char> chunk(1 << 20, 'b');
  uint64_t written = 0;
  size_t size = chunk.size();
  while (size > 0) {
    const ssize_t n = write(fd, chunk.data(), size);
    if (n > 0) {
      written += static_cast<uint64_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      size /= 2;  // ENOSPC: the last pages with smaller writes
    }
  }
  close(fd);
  return written;
}

struct Options {
  int runs = 3;
  uint64_t seed = 1;
  int faults_per_run = 6;
  std::vector<std::string> kinds;
  std::string dir;
  std::string scheduler;
  bool keep = false;
  int population = 6;
  int intervals = 6;
  int workers = 2;
  double heartbeat_timeout_s = 2;
  double run_timeout_s = 600;
  // Size of the tmpfs a run with a disk_full fault keeps its store on.
  uint64_t tmpfs_bytes = uint64_t{256} << 20;
};

struct Totals {
  int runs = 0;
  std::map<std::string, int> faults;
  int committed_lost = 0;
  int runs_diverged = 0;
  int verify_failures = 0;
  int trained_twice = 0;
  int members_lost = 0;
  double max_recovery_s = 0;
  std::string max_recovery_kind;
};

std::string ExperimentToml(const Options& o) {
  std::ostringstream os;
  os << "name = \"chaos\"\nseed = 4242\nmetrics = \"\"\n"
     << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
     << "[data]\nbatch_size = 16\neval_size = 200\n"
     << "[population]\nsize = " << o.population
     << "\nsteps_per_interval = 6\nintervals = " << o.intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
     << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.95\n"
     << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.34\nready_intervals = 1\n"
     << "[supervision]\nmax_restarts = 100000\nrestart_backoff_s = 0.1\n"
     << "max_restart_backoff_s = 0.5\ngrace_s = 5\nheartbeat_timeout_s = " << o.heartbeat_timeout_s
     << "\n"
     << "[[devices]]\ndevice = \"cpu\"\ncount = " << o.workers
     << "\nslots = 1\nfusion = \"plain\"\nintra_op_threads = 1\n";
  return os.str();
}

class ChaosRunner {
 public:
  explicit ChaosRunner(Options o) : o_(std::move(o)) {
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "CKPT_KILL_AT=", 13) != 0 && std::strncmp(*e, "CKPT_TRACE=", 11) != 0) {
        base_env_.emplace_back(*e);
      }
    }
    base_env_.push_back("CKPT_TRACE=1");
    for (const auto& k : o_.kinds) {
      for (Kind kind : kAllKinds) {
        if (k == KindName(kind)) kinds_.push_back(kind);
      }
    }
    if (kinds_.empty()) {
      for (Kind k : kAllKinds) kinds_.push_back(k);
    }
    // A full disk needs a tmpfs in a private mount namespace: root only.
    if (geteuid() != 0 && std::count(kinds_.begin(), kinds_.end(), Kind::kDiskFull)) {
      std::printf(
          "ckpt-chaos: not root, so no disk_full faults (they need a tmpfs mounted in a "
          "private mount namespace)\n");
      kinds_.erase(std::remove(kinds_.begin(), kinds_.end(), Kind::kDiskFull), kinds_.end());
    }
  }

  // The reference run. False (with the reason printed) when it fails.
  bool Calm() {
    config_ = o_.dir + "/chaos.toml";
    std::ofstream(config_) << ExperimentToml(o_);
    const std::string store = o_.dir + "/calm";
    std::filesystem::remove_all(store);
    const std::string log = o_.dir + "/calm.log";
    std::filesystem::remove(log);
    const auto t0 = Clock::now();
    Child c(Args(store), base_env_, log);
    LogFollower f(log);
    if (!c.WaitFor(milliseconds(static_cast<int64_t>(o_.run_timeout_s * 1000)))) {
      std::fprintf(stderr, "ckpt-chaos: the undisturbed run did not finish; log %s\n", log.c_str());
      return false;
    }
    const int st = c.Wait();
    f.Poll();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "ckpt-chaos: the undisturbed run failed; log %s\n", log.c_str());
      return false;
    }
    calm_results_ = f.results();
    StoreCheck check = CheckStore(store, "chaos", o_.intervals, true);
    if (!check.opened || !check.verified ||
        check.heads.size() != static_cast<size_t>(o_.population)) {
      std::fprintf(stderr, "ckpt-chaos: the undisturbed store does not check: %s %s\n",
                   check.error.c_str(), check.verify_problem.c_str());
      return false;
    }
    calm_ = check.heads;
    std::printf("undisturbed run: %d results in %.1f s\n", calm_results_, SecondsSince(t0));
    std::fflush(stdout);
    return true;
  }

  bool has_kinds() const { return !kinds_.empty(); }

  void Run(int run, std::mt19937_64& rng, Totals* totals) {
    // Logs and kill-once files; the store too, unless it is on a tmpfs.
    const std::string base = o_.dir + "/run" + std::to_string(run);
    std::filesystem::remove_all(base);
    // The faults of this run, at increasing counts of results (summed over
    // the scheduler's incarnations).
    std::vector<std::pair<int, Kind>> plan;
    for (int i = 0; i < o_.faults_per_run; ++i) {
      const int at =
          1 + static_cast<int>(rng() % static_cast<uint64_t>(std::max(1, calm_results_ - 3)));
      plan.emplace_back(at, kinds_[rng() % kinds_.size()]);
    }
    std::sort(plan.begin(), plan.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    // A run with a full disk keeps its store on a small tmpfs of its own:
    // `store` is the path the schedulers see, `view` the harness's.
    std::unique_ptr<PrivateTmpfs> tmpfs;
    std::string store = base, view = base, ballast;
    if (std::any_of(plan.begin(), plan.end(),
                    [](const auto& p) { return p.second == Kind::kDiskFull; })) {
      const std::string mnt = base + "-tmpfs";
      tmpfs = std::make_unique<PrivateTmpfs>(mnt, o_.tmpfs_bytes);
      if (tmpfs->ok()) {
        store = mnt + "/store";
        view = tmpfs->Outside(store);
        ballast = tmpfs->Outside(mnt + "/ballast");
      } else {
        std::printf("run %d: cannot mount a tmpfs in a private mount namespace: no disk_full\n",
                    run);
        tmpfs.reset();
        plan.erase(std::remove_if(plan.begin(), plan.end(),
                                  [](const auto& p) { return p.second == Kind::kDiskFull; }),
                   plan.end());
      }
    }
    std::string plan_text;
    for (const auto& [at, k] : plan)
      plan_text += " " + std::string(KindName(k)) + "@" + std::to_string(at);
    std::printf("run %d:%s\n", run, plan_text.c_str());
    std::fflush(stdout);

    size_t next = 0;
    int results_before = 0;  // in earlier incarnations
    int incarnation = 0;
    bool finished = false;
    bool failed = false;
    std::map<std::string, Head> seen_heads;  // after each scheduler death
    int lost_here = 0;
    std::map<std::string, int> faults_here;
    const auto run_start = Clock::now();
    // Recovery clocks: per worker index, when its fault began; for the
    // scheduler, when it was killed.
    std::map<int, std::pair<Clock::time_point, Kind>> worker_fault;
    struct PendingRecovery {
      bool active = false;
      Clock::time_point since;
      Kind kind = Kind::kSchedulerSigkill;
    } scheduler_fault;
    auto recovered = [&](Clock::time_point since, Kind k, Clock::time_point at) {
      const double s = std::chrono::duration<double>(at - since).count();
      std::printf("  %s: recovered in %.1f s\n", KindName(k), s);
      if (s > totals->max_recovery_s) {
        totals->max_recovery_s = s;
        totals->max_recovery_kind = KindName(k);
      }
    };

    bool damage_next = false;
    std::set<std::string> damaged;  // blob ids damaged on purpose
    // A disk_full fault: the ballast fills the tmpfs until a commit has
    // failed with no space (the scheduler logs "store full"), then goes.
    bool ballast_in = false;
    Clock::time_point ballast_since;
    PendingRecovery disk_fault;
    auto remove_ballast = [&]() {
      std::filesystem::remove(ballast);
      ballast_in = false;
    };
    while (!finished && !failed) {
      if (damage_next) {
        damage_next = false;
        const std::string hex = DamageAHeadBlob(view, "chaos", o_.intervals, rng);
        if (!hex.empty()) {
          damaged.insert(hex);
          ++faults_here[KindName(Kind::kCorruptBlob)];
          std::printf("  damaged blob %s on disk\n", hex.substr(0, 12).c_str());
        }
      }
      if (SecondsSince(run_start) > o_.run_timeout_s) {
        std::printf("  run %d: not finished after %.0f s\n", run, o_.run_timeout_s);
        failed = true;
        break;
      }
      ++incarnation;
      std::vector<std::string> env = base_env_;
      // A kill point due now is armed in this incarnation's environment.
      std::string armed;
      bool armed_scheduler_point = false;
      if (next < plan.size() && (plan[next].second == Kind::kSchedulerKillPoint ||
                                 plan[next].second == Kind::kWorkerKillPoint)) {
        armed_scheduler_point = plan[next].second == Kind::kSchedulerKillPoint;
        const auto& points = armed_scheduler_point ? kSchedulerPoints : kWorkerPoints;
        const int n = 1 + static_cast<int>(rng() % 8);
        armed = points[rng() % points.size()] + ":" + std::to_string(n);
        env.push_back("CKPT_KILL_AT=" + armed);
        // One worker kill per arming, not one per worker incarnation.
        const std::string once = base + "-killonce-" + std::to_string(incarnation);
        std::filesystem::remove(once);
        env.push_back("CKPT_KILL_ONCE=" + once);
        ++next;
        std::printf("  incarnation %d: CKPT_KILL_AT=%s\n", incarnation, armed.c_str());
      }
      const std::string log = base + "-" + std::to_string(incarnation) + ".log";
      std::filesystem::remove(log);
      Child c(Args(store), env, log, tmpfs ? tmpfs->pid() : 0);
      LogFollower f(log);
      bool we_killed = false;
      size_t scanned = 0;
      std::set<pid_t> stopped;
      while (c.Running()) {
        f.Poll();
        // Recoveries and losses in the new lines.
        for (; scanned < f.lines().size(); ++scanned) {
          const auto& line = f.lines()[scanned];
          if (line.text.find("got RESULT") != std::string::npos) {
            if (scheduler_fault.active) {
              recovered(scheduler_fault.since, scheduler_fault.kind, line.seen);
              scheduler_fault.active = false;
            }
            const int w = WorkerIndexOf(line.text, "worker ");
            auto it = worker_fault.find(w);
            if (it != worker_fault.end()) {
              recovered(it->second.first, it->second.second, line.seen);
              worker_fault.erase(it);
            }
          } else if (ballast_in && line.text.find("store full: ") != std::string::npos) {
            // A commit failed for want of space: free it.
            remove_ballast();
            ++faults_here[KindName(Kind::kDiskFull)];
            disk_fault = {true, ballast_since, Kind::kDiskFull};
            std::printf("  disk full: a commit failed after %.1f s; ballast removed\n",
                        std::chrono::duration<double>(line.seen - ballast_since).count());
          } else if (disk_fault.active &&
                     line.text.find("store writable again") != std::string::npos) {
            recovered(disk_fault.since, disk_fault.kind, line.seen);
            disk_fault.active = false;
          } else if (line.text.find("ckpt-worker: kill point worker.") != std::string::npos) {
            ++faults_here[KindName(Kind::kWorkerKillPoint)];
          } else if (line.text.find(") lost: ") != std::string::npos) {
            const int w = WorkerIndexOf(line.text, "worker ");
            if (w >= 0 && worker_fault.count(w) == 0) {
              // A loss the harness did not cause directly (a worker kill
              // point): its recovery counts from when it was seen.
              worker_fault[w] = {line.seen, Kind::kWorkerKillPoint};
            }
          }
        }
        if (ballast_in && SecondsSince(ballast_since) > 60) {
          std::printf("  disk full: no commit failed within 60 s; ballast removed\n");
          remove_ballast();
        }
        // While the disk is full, and until the scheduler has written again,
        // no other fault is injected: a scheduler restarted on a full disk
        // could not open its store, and one already waiting for space would
        // not report a second full disk.
        if (!ballast_in && !disk_fault.active && next < plan.size() &&
            results_before + f.results() >= plan[next].first) {
          const Kind k = plan[next].second;
          if (k == Kind::kDiskFull) {
            const uint64_t bytes = FillWithBallast(ballast);
            ballast_in = true;
            ballast_since = Clock::now();
            std::printf("  disk full: %.1f MB of ballast\n", static_cast<double>(bytes) / 1e6);
            ++next;
            continue;
          }
          if (k == Kind::kCorruptBlob) {
            // The damage is done between incarnations, on a store at rest.
            kill(c.pid(), SIGKILL);
            we_killed = true;
            ++faults_here[KindName(Kind::kSchedulerSigkill)];
            scheduler_fault = {true, Clock::now(), Kind::kSchedulerSigkill};
            damage_next = true;
            ++next;
            break;
          }
          if (k == Kind::kSchedulerKillPoint || k == Kind::kWorkerKillPoint) {
            // Armed at the next start: end this incarnation now.
            kill(c.pid(), SIGKILL);
            we_killed = true;
            ++faults_here[KindName(Kind::kSchedulerSigkill)];
            scheduler_fault = {true, Clock::now(), Kind::kSchedulerSigkill};
            break;
          }
          if (k == Kind::kSchedulerSigkill || k == Kind::kSchedulerSigterm) {
            // SIGTERM not before the scheduler's signal handlers are set: once
            // this incarnation has a result.
            if (k == Kind::kSchedulerSigkill || f.results() > 0) {
              kill(c.pid(), k == Kind::kSchedulerSigkill ? SIGKILL : SIGTERM);
              we_killed = true;
              ++faults_here[KindName(k)];
              scheduler_fault = {true, Clock::now(), k};
              ++next;
              break;
            }
          } else {
            // A worker fault: wait until every worker is up (a restart may be
            // under way) so that it falls on a working process.
            std::vector<pid_t> live;
            for (pid_t w : ChildrenOf(c.pid())) {
              if (!stopped.count(w)) live.push_back(w);
            }
            if (static_cast<int>(live.size()) >= o_.workers) {
              std::this_thread::sleep_for(milliseconds(rng() % 30));
              const pid_t victim = live[rng() % live.size()];
              const int index = WorkerIndexOfPid(victim);
              if (kill(victim, k == Kind::kWorkerSigkill ? SIGKILL : SIGSTOP) == 0) {
                ++faults_here[KindName(k)];
                if (k == Kind::kWorkerSigstop) stopped.insert(victim);
                if (index >= 0) worker_fault[index] = {Clock::now(), k};
              }
              ++next;
            }
          }
        }
        std::this_thread::sleep_for(milliseconds(5));
      }
      const int st = c.Wait();
      f.Poll();
      results_before += f.results();
      if (ballast_in) {
        std::printf("  disk full: the scheduler ended before a commit failed; ballast removed\n");
        remove_ballast();
      }
      disk_fault.active = false;
      // A stopped worker whose scheduler died is killed with it (its
      // parent-death signal is SIGKILL, which a stopped process takes too).
      if (we_killed && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) {
        // Not expected: SIGTERM stops it gracefully.
        std::printf("  incarnation %d: died of SIGTERM instead of stopping\n", incarnation);
      }
      const bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
      if (killed && !we_killed) {
        if (armed_scheduler_point) {
          ++faults_here[KindName(Kind::kSchedulerKillPoint)];
          scheduler_fault = {true, Clock::now(), Kind::kSchedulerKillPoint};
        } else {
          std::printf("  incarnation %d: killed by SIGKILL with no cause; log %s\n", incarnation,
                      log.c_str());
          failed = true;
        }
      } else if (!killed && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
        std::ifstream in(log);
        std::stringstream ss;
        ss << in.rdbuf();
        if (ss.str().find("experiment chaos: done") != std::string::npos) finished = true;
      } else if (!killed) {
        std::printf("  incarnation %d: exit status %d; log %s\n", incarnation,
                    WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log.c_str());
        failed = true;
      }
      // Workers die with their scheduler; wait until they have.
      for (int i = 0; i < 200 && !ChildrenOfDead(c.pid()); ++i) {
        std::this_thread::sleep_for(milliseconds(10));
      }
      // What is committed now must survive: heads only ever move forward.
      if (!finished && !failed) {
        StoreCheck now = CheckStore(view, "chaos", o_.intervals, false);
        if (now.opened) {
          for (const auto& [m, h] : seen_heads) {
            auto it = now.heads.find(m);
            if (it == now.heads.end() || it->second.version < h.version) ++lost_here;
          }
          seen_heads = now.heads;
        }
      }
    }
    const StoreCheck end = CheckStore(view, "chaos", o_.intervals, true);
    for (const auto& [m, h] : seen_heads) {
      auto it = end.heads.find(m);
      if (it == end.heads.end() || it->second.version < h.version) ++lost_here;
    }
    // A member that fell back from a damaged head has more versions than in
    // the undisturbed run: its head must hold the same state (blob, step,
    // hyperparameters), under a later version number.
    bool heads_differ = end.heads.size() != calm_.size();
    for (const auto& [m, h] : calm_) {
      auto it = end.heads.find(m);
      if (it == end.heads.end()) {
        heads_differ = true;
        continue;
      }
      Head got = it->second;
      if (end.fallbacks > 0 && got.version >= h.version) got.version = h.version;
      if (!(got == h)) heads_differ = true;
    }
    const bool diverged = failed || !end.opened || heads_differ;
    // Verify must find the blobs damaged on purpose, and nothing else.
    bool verified = end.verify_problem.empty() || !end.verify_problems.empty();
    for (const auto& p : end.verify_problems) {
      bool expected = false;
      for (const auto& hex : damaged) expected = expected || p.find(hex) != std::string::npos;
      if (!expected) verified = false;
    }
    if (!end.opened) verified = false;
    int members_lost = 0;
    for (const auto& [m, h] : calm_) {
      if (!end.heads.count(m)) ++members_lost;
    }
    ++totals->runs;
    for (const auto& [k, n] : faults_here) totals->faults[k] += n;
    totals->committed_lost += lost_here;
    totals->runs_diverged += diverged ? 1 : 0;
    totals->verify_failures += verified ? 0 : 1;
    totals->trained_twice += end.trained_twice;
    totals->members_lost += members_lost;
    int injected = 0;
    for (const auto& [k, n] : faults_here) injected += n;
    std::printf("  run %d: %d faults, %d incarnations, %.1f s: %s%s%s%s\n", run, injected,
                incarnation, SecondsSince(run_start),
                diverged ? "DIVERGED " : "heads as undisturbed ",
                verified ? (damaged.empty() ? "verified" : "verified (damage found)")
                         : ("VERIFY FAILED: " + end.verify_problem + end.error).c_str(),
                lost_here ? ", COMMITTED LOST" : "", end.trained_twice ? ", TRAINED TWICE" : "");
    if (diverged) {
      for (const auto& [m, h] : calm_) {
        auto it = end.heads.find(m);
        if (it == end.heads.end()) {
          std::printf("    %s: missing\n", m.c_str());
        } else if (!(it->second == h)) {
          std::printf("    %s: v%lld step %lld %s, undisturbed v%lld step %lld %s\n", m.c_str(),
                      static_cast<long long>(it->second.version),
                      static_cast<long long>(it->second.step),
                      it->second.blob.substr(0, 12).c_str(), static_cast<long long>(h.version),
                      static_cast<long long>(h.step), h.blob.substr(0, 12).c_str());
        }
      }
    }
    std::fflush(stdout);
    const bool bad = diverged || !verified || lost_here || end.trained_twice;
    if (tmpfs && (bad || o_.keep)) {
      // The tmpfs goes with this run: keep a copy of its store.
      std::error_code ec;
      std::filesystem::copy(view, base, std::filesystem::copy_options::recursive, ec);
    }
    if (!bad && !o_.keep) {
      std::filesystem::remove_all(base);
      std::filesystem::remove_all(base + "-tmpfs");
      for (int i = 1; i <= incarnation; ++i) {
        std::filesystem::remove(base + "-" + std::to_string(i) + ".log");
        std::filesystem::remove(base + "-killonce-" + std::to_string(i));
      }
    }
  }

 private:
  std::vector<std::string> Args(const std::string& store) const {
    return {o_.scheduler, "run", config_, "--store", store, "--quiet"};
  }

  static bool ChildrenOfDead(pid_t pid) { return ChildrenOf(pid).empty(); }

  // The worker index a worker process serves, from its --segment argument
  // ("...-wN").
  static int WorkerIndexOfPid(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
    std::string cmd((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::vector<std::string> args;
    std::string cur;
    for (char ch : cmd) {
      if (ch == '\0') {
        args.push_back(cur);
        cur.clear();
      } else {
        cur += ch;
      }
    }
    for (size_t i = 0; i + 1 < args.size(); ++i) {
      if (args[i] == "--segment") {
        const size_t w = args[i + 1].rfind("-w");
        if (w != std::string::npos) return std::atoi(args[i + 1].c_str() + w + 2);
      }
    }
    return -1;
  }

  Options o_;
  std::vector<Kind> kinds_;
  std::vector<std::string> base_env_;
  std::string config_;
  int calm_results_ = 0;
  std::map<std::string, Head> calm_;
};

std::string DefaultScheduler() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    auto p = self.parent_path() / "ckpt-scheduler";
    if (access(p.c_str(), X_OK) == 0) return p.string();
  }
  return "ckpt-scheduler";
}

int Main(int argc, char** argv) {
  CLI::App app{"ckpt-chaos: fault injection against real ckpt-scheduler runs"};
  Options o;
  std::string kinds;
  app.add_option("--runs", o.runs, "chaos runs (default 3)")->check(CLI::Range(1, 100000));
  app.add_option("--seed", o.seed, "seed of the fault plan (default 1)");
  app.add_option("--faults-per-run", o.faults_per_run, "faults planned per run (default 6)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--kinds", kinds, "comma-separated fault kinds (default: all)");
  int tmpfs_mib = 256;
  app.add_option("--tmpfs-mib", tmpfs_mib,
                 "size of the tmpfs of a run with disk_full, in MiB (default 256)")
      ->check(CLI::Range(16, 65536));
  app.add_option("--dir", o.dir, "work directory (default: a new one under $TMPDIR)");
  app.add_option("--scheduler", o.scheduler, "ckpt-scheduler (default: beside ckpt-chaos)");
  app.add_option("--population", o.population, "members (default 6)")->check(CLI::Range(2, 64));
  app.add_option("--intervals", o.intervals, "intervals (default 6)")->check(CLI::Range(1, 100));
  app.add_option("--workers", o.workers, "CPU workers (default 2)")->check(CLI::Range(1, 8));
  app.add_option("--run-timeout-s", o.run_timeout_s, "a run failing after this (default 600)");
  app.add_flag("--keep", o.keep, "keep the stores and logs of runs that checked out");
  CLI11_PARSE(app, argc, argv);
  o.tmpfs_bytes = static_cast<uint64_t>(tmpfs_mib) << 20;
  std::stringstream ks(kinds);
  for (std::string k; std::getline(ks, k, ',');) {
    bool known = false;
    for (Kind kind : kAllKinds) known = known || k == KindName(kind);
    if (!known) {
      std::fprintf(stderr, "ckpt-chaos: unknown fault kind '%s'\n", k.c_str());
      return 2;
    }
    o.kinds.push_back(k);
  }
  if (o.scheduler.empty()) o.scheduler = DefaultScheduler();
  if (o.dir.empty()) {
    std::string tmpl =
        std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/ckpt-chaos-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) {
      std::fprintf(stderr, "ckpt-chaos: cannot make a work directory\n");
      return 1;
    }
    o.dir = tmpl;
  }
  std::filesystem::create_directories(o.dir);
  std::printf("ckpt-chaos: seed %llu, %d runs, work directory %s\n",
              static_cast<unsigned long long>(o.seed), o.runs, o.dir.c_str());
  std::fflush(stdout);
  ChaosRunner runner(o);
  if (!runner.has_kinds()) {
    std::fprintf(stderr, "ckpt-chaos: no fault kind left to inject\n");
    return 77;  // ctest's skip
  }
  if (!runner.Calm()) return 1;
  std::mt19937_64 rng(o.seed);
  Totals t;
  for (int r = 0; r < o.runs; ++r) runner.Run(r, rng, &t);
  json faults = json::object();
  int total = 0;
  for (Kind k : kAllKinds) {
    faults[KindName(k)] = t.faults[KindName(k)];
    total += t.faults[KindName(k)];
  }
  json out{{"seed", o.seed},
           {"runs", t.runs},
           {"faults_injected", faults},
           {"faults_total", total},
           {"committed_lost", t.committed_lost},
           {"runs_diverged", t.runs_diverged},
           {"verify_failures", t.verify_failures},
           {"trained_twice", t.trained_twice},
           {"members_lost", t.members_lost},
           {"max_recovery_s", t.max_recovery_s},
           {"max_recovery_kind", t.max_recovery_kind}};
  std::printf("%s\n", out.dump().c_str());
  const bool ok = t.committed_lost == 0 && t.runs_diverged == 0 && t.verify_failures == 0 &&
                  t.trained_twice == 0 && t.members_lost == 0;
  if (ok && !o.keep) std::filesystem::remove_all(o.dir);
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace ckpt::chaos

int main(int argc, char** argv) { return ckpt::chaos::Main(argc, argv); }
