// ckpt-chaos: runs real `ckpt-scheduler run` experiments and attacks them with
// faults at moments drawn from a seed, then checks that nothing was lost.
//
//   ckpt-chaos --runs N --seed S [--faults-per-run K] [--kinds a,b] [--dir DIR]
//
// One undisturbed run of the experiment gives the reference heads; each chaos
// run then trains the same experiment (synchronous PBT with a fixed seed is
// deterministic) in a store of its own while faults are injected, paced by the
// run's progress (the results in the scheduler's structured trace,
// CKPT_TRACE_FILE: scheduler/src/trace.h), never by wall time. Every commit
// the scheduler acknowledged in that trace goes into a ledger; after each
// scheduler death each must be in the store exactly (same version, same
// blob) or superseded by a later version of its member. After each run: the
// final heads must equal the reference's, the store must verify, and the
// store's event log must show every member training each interval exactly
// once. Every planned fault kind must have been injected at least its share
// (half of its planned count, rounded down), and at least one fault in all.
// The last line on stdout is one JSON object with the figures (see
// tests/chaos/README.md).
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
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../scheduler/src/trace.h"
#include "../integration/process_util.h"
#include "../integration/run_heads.h"
#include "ckpt/base/kill_point.h"
#include "ckpt/records/events.h"
#include "ckpt/records/member_record.h"
#include "ckpt/records/status.h"
#include "ckpt/store/store.h"

namespace ckpt::chaos {
namespace {

namespace trace = scheduler::trace;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using testing::Child;
using testing::ChildrenOf;  // live (not zombie) direct children
using testing::Head;

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
  kHostileWorker,
};
constexpr Kind kAllKinds[] = {
    Kind::kWorkerSigkill,    Kind::kWorkerSigstop,      Kind::kSchedulerSigkill,
    Kind::kSchedulerSigterm, Kind::kSchedulerKillPoint, Kind::kWorkerKillPoint,
    Kind::kCorruptBlob,      Kind::kDiskFull,           Kind::kHostileWorker};

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
    case Kind::kHostileWorker:
      return "hostile_worker";
  }
  return "?";
}

// The least number of faults of a kind planned `planned` times that a run of
// ckpt-chaos must have injected: half. Some planned faults cannot land (a
// kill point the rest of the run does not reach, no member fit to damage, a
// full disk that no commit meets before the run ends), so not all.
int Share(int planned) { return planned / 2; }

// Kill points a scheduler passes on every commit (scheduler/src/experiment.cc
// and the store's write path), on every exploit at a barrier, and a worker
// passes on every member-interval (worker/src/worker_loop.cc); named in
// ckpt/base/kill_point.h.
namespace kp = base::kill_points;
const std::vector<std::string> kCommitPoints = {kp::kCommitBeforeWrite, kp::kCommitAfterWrite,
                                                kp::kSchedulerCommitted};
// With the blob log (the default) the store also passes its points on each commit.
const std::vector<std::string> kBlobLogCommitPoints = {
    kp::kBlobBeforeSync, kp::kBlobAfterSync, kp::kCommitBeforeWrite, kp::kCommitAfterWrite,
    kp::kSchedulerCommitted};
const std::vector<std::string> kExploitPoints = {kp::kSchedulerExploited, kp::kExploitBeforeWrite,
                                                 kp::kExploitAfterWrite};
const std::vector<std::string> kWorkerPoints(kp::kWorkerPoints.begin(), kp::kWorkerPoints.end());

// Follows a file as it grows: each complete line once, stamped with when it
// was first seen.
class LineFollower {
 public:
  explicit LineFollower(std::string path) : path_(std::move(path)) {}
  struct Line {
    Clock::time_point seen;
    std::string text;
  };
  // The lines appended since the last call.
  std::vector<Line> Poll() {
    std::vector<Line> out;
    std::ifstream in(path_, std::ios::binary);
    if (!in) return out;
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    offset_ += chunk.size();
    partial_ += chunk;
    const auto now = Clock::now();
    size_t start = 0;
    for (size_t nl = partial_.find('\n'); nl != std::string::npos;
         nl = partial_.find('\n', start)) {
      out.push_back(Line{now, partial_.substr(start, nl - start)});
      start = nl + 1;
    }
    partial_.erase(0, start);
    return out;
  }

 private:
  std::string path_;
  size_t offset_ = 0;
  std::string partial_;
};

// One line of the scheduler's trace (scheduler/src/trace.h).
struct TraceEvent {
  Clock::time_point seen;
  std::string ev;
  json j;
  bool Is(const char* name) const { return ev == name; }
};

std::vector<TraceEvent> PollTrace(LineFollower* f) {
  std::vector<TraceEvent> out;
  for (auto& line : f->Poll()) {
    json j = json::parse(line.text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object() || !j.contains("ev")) {
      std::printf("  trace: not a trace line: %s\n", line.text.c_str());
      continue;
    }
    out.push_back(TraceEvent{line.seen, j.value("ev", ""), std::move(j)});
  }
  return out;
}

// Every commit the scheduler acknowledged (its trace's committed and
// exploited lines), checked against a store at rest: each must be there
// exactly (the manifest of that version, with that blob for a trained
// result), or superseded (gone while the member's head is a later version:
// retention keeps only the newest versions).
class Ledger {
 public:
  void Add(const TraceEvent& e) {
    if (e.Is(trace::kCommitted)) {
      acked_[e.j.value("member", "")][e.j.value("version", int64_t{0})] = e.j.value("blob", "");
    } else if (e.Is(trace::kExploited)) {
      acked_[e.j.value("member", "")][e.j.value("version", int64_t{0})] = "";
    } else {
      return;
    }
    ++count_;
  }
  int count() const { return count_; }

  // The acknowledged commits the store at `path` lacks, one line each.
  std::vector<std::string> Missing(const std::string& path, const std::string& exp) const {
    std::vector<std::string> missing;
    store::StoreOptions o;
    o.path = path;
    auto s = store::Store::Open(o);
    if (!s.ok()) return {"cannot open the store: " + s.status().ToString()};
    auto members = (*s)->ListMembers(exp);
    if (!members.ok()) return {"cannot list members: " + members.status().ToString()};
    std::map<std::string, int64_t> head;
    for (const auto& m : *members) head[m.member] = m.version;
    for (const auto& [member, versions] : acked_) {
      auto listed = (*s)->ListVersions(exp, member);
      std::map<int64_t, std::string> stored;
      if (listed.ok()) {
        for (const auto& v : *listed) stored[v.version] = v.blob.Hex();
      }
      for (const auto& [version, blob] : versions) {
        auto it = stored.find(version);
        const std::string what = member + " v" + std::to_string(version);
        if (it == stored.end()) {
          if (head[member] <= version) {
            missing.push_back(what + " was acknowledged; the head is v" +
                              std::to_string(head[member]));
          }
        } else if (!blob.empty() && it->second != blob) {
          missing.push_back(what + " was acknowledged with blob " + blob.substr(0, 12) +
                            "; the store has " + it->second.substr(0, 12));
        }
      }
    }
    return missing;
  }

 private:
  std::map<std::string, std::map<int64_t, std::string>> acked_;
  int count_ = 0;
};

struct StoreCheck {
  bool opened = false;
  std::string error;
  std::map<std::string, Head> heads;
  bool verified = false;
  std::string verify_problem;
  std::vector<std::string> verify_problems;
  // From the event log: (member, interval) pairs with more than one
  // "trained" commit (a fall-back's retraining excepted), or with none.
  int trained_twice = 0;
  int intervals_missing = 0;
  int fallbacks = 0;  // "corrupt_state" events: members that fell back
  // "trained" commits by a worker that is not one of the scheduler's own
  // (index `local_workers` or above: a remote one, i.e. the forger).
  int hostile_commits = 0;
};

// Whether the store at `path` (at rest) records `exp` as done.
bool StoredAsDone(const std::string& path, const std::string& exp) {
  store::StoreOptions o;
  o.path = path;
  auto s = store::Store::Open(o);
  if (!s.ok()) return false;
  auto info = (*s)->GetExperiment(exp);
  return info.ok() &&
         info->status == records::ExperimentStatusName(records::ExperimentStatus::kDone);
}

StoreCheck CheckStore(const std::string& path, const std::string& exp, int intervals,
                      int local_workers) {
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
  for (const auto& m : *members) {
    c.heads[m.member] = Head{m.version, m.step, m.blob ? m.blob->Hex() : "", m.hparams};
  }
  // The event log keeps every commit's event (retention deletes versions,
  // not events). A member that fell back from a damaged head retrains the
  // intervals since its intact version: those are expected twice.
  auto events = (*s)->ListEvents(exp, 0, 1 << 20);
  if (!events.ok()) {
    c.error = events.status().ToString();
    return c;
  }
  std::map<std::string, int> fell_back;
  std::map<std::string, std::map<int, int>> trained;
  for (const auto& e : *events) {
    const auto event = records::DecodeEvent(e.json, "event " + std::to_string(e.seq));
    if (!event.ok()) continue;
    if (const auto* fell = std::get_if<records::CorruptStateEvent>(&*event)) {
      ++fell_back[fell->member];
      ++c.fallbacks;
    } else if (const auto* t = std::get_if<records::TrainedEvent>(&*event)) {
      ++trained[t->member][t->interval];
      if (t->worker >= local_workers) ++c.hostile_commits;
    }
  }
  for (const auto& m : *members) {
    for (int i = 1; i <= intervals; ++i) {
      const int n = trained[m.member][i];
      if (n > 1 + fell_back[m.member]) ++c.trained_twice;
      if (n == 0) ++c.intervals_missing;
    }
  }
  auto report = (*s)->Verify();
  c.verified = report.ok() && report->ok();
  if (!report.ok()) {
    c.verify_problem = report.status().ToString();
  } else {
    c.verify_problems = report->problems;
    if (!report->ok()) c.verify_problem = report->problems[0];
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
    std::map<std::string, int> ahead_of;  // marks in the members' records
    int decided = -1;
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
      // A member that ran ahead of barrier g counts at g: past a victim's
      // interval only once that barrier was decided, so that no exploit can
      // still copy the damaged blob before it is found (an exploit shares the
      // donor's blob, and the exploited member then falls back to its own
      // older version: a different run).
      auto record = records::DecodeMemberRecord(m.state, exp, m.member);
      const bool ahead = record.ok() && record->ahead();
      // Marked and not yet past its barrier (the interval it was given is
      // still to be committed): it trains before any exploit can copy it.
      if (ahead && std::max(interval, record->interval) == record->ahead_of) {
        ahead_of[m.member] = record->ahead_of;
      }
      // The record's interval may lag its head's by one (a crash between
      // the commit and the record), an exploit head has none: the larger.
      const int at = std::max(interval, record.ok() ? record->interval : 0);
      const int counted = ahead ? record->ahead_of : at;
      // Barriers up to `decided` were decided (the scheduler's rule,
      // Experiment::SyncGeneration): a mark at or below it is stale.
      decided = std::max(decided, counted - 1);
      max_interval = std::max(max_interval, counted);
    }
    std::set<std::string> running_ahead;
    for (const auto& [member, g] : ahead_of) {
      if (g > decided) running_ahead.insert(member);
    }
    std::vector<const store::MemberHead*> fit;
    for (const auto& m : *members) {
      const int iv = interval_of.count(m.member) ? interval_of[m.member] : -1;
      // iv > 1: an older trained version exists to fall back to. A member
      // given an interval ahead of a barrier is never that barrier's donor,
      // and trains that interval (finding the damage) before the next one;
      // once it committed it, it waits at the next barrier like the others.
      if (m.blob && iv > 1 && iv < intervals &&
          (iv < max_interval || running_ahead.count(m.member) > 0) &&
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
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::directory_iterator(path)) {
    if (entry.path().extension() == ".blob") files.push_back(entry.path());
  }
  // The blob log's segments (the default; RocksDB's blob files: --no-blob-log).
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(path + "/blob-log", ec)) {
    if (entry.path().extension() == ".seg") files.push_back(entry.path());
  }
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (size_t at = content.find(needle); at != std::string::npos;
         at = content.find(needle, at + 1)) {
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
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
  // Appended to: a refill takes what the store freed since without first
  // giving back what the ballast holds.
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
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
  std::string forging_worker;  // tests/scheduler/forging_worker.cc
  bool keep = false;
  // The schedulers keep states in the store's own blob log (their default);
  // false: --no-blob-log, RocksDB's blob files.
  bool blob_log = true;
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
  std::map<std::string, int> planned;
  std::map<std::string, int> faults;
  int commits_acknowledged = 0;
  int committed_lost = 0;
  int runs_diverged = 0;
  int verify_failures = 0;
  int trained_twice = 0;
  int intervals_missing = 0;
  int members_lost = 0;
  int hostile_commits = 0;
  double max_recovery_s = 0;
  std::string max_recovery_kind;
};

// The experiment file. With `secret_file`, the scheduler also accepts remote
// workers on an ephemeral loopback port (its address in <store>/workers.addr)
// that prove they hold that secret: the door a hostile worker comes in by.
std::string ExperimentToml(const Options& o, const std::string& secret_file = "") {
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
  if (!secret_file.empty()) {
    os << "[workers]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"" << secret_file << "\"\n";
  }
  return os.str();
}

// The worker index a worker process serves, from its --segment argument
// ("...-wN").
int WorkerIndexOfPid(pid_t pid) {
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

// What every run shares: the options, the experiment file, the environment,
// the kinds to draw from, and the undisturbed run's figures.
struct Setup {
  Options o;
  std::vector<Kind> kinds;
  std::vector<std::string> base_env;  // without CKPT_KILL_AT / CKPT_TRACE_FILE
  std::string config;
  std::string config_listening;  // the same experiment, listening for remote workers
  std::string secret;            // theirs (the scheduler creates it)
  int calm_results = 0;
  std::map<std::string, Head> calm;

  std::vector<std::string> Args(const std::string& store, bool listening = false) const {
    std::vector<std::string> args = {o.scheduler, "run", listening ? config_listening : config,
                                     "--store",   store, "--quiet"};
    if (!o.blob_log) args.push_back("--no-blob-log");
    return args;
  }
};

// One chaos run, in steps: Plan, PrepareStore, then per scheduler incarnation
// Start, Watch (the trace paces the planned faults) and End (its exit status,
// then the ledger against the store at rest), and Finish (the final store
// against the undisturbed run), which adds the run's figures to the totals.
class ChaosRun {
 public:
  ChaosRun(const Setup& s, int run, std::mt19937_64* rng)
      : s_(s), run_(run), rng_(*rng), base_(s.o.dir + "/run" + std::to_string(run)) {}

  void Execute(Totals* totals) {
    totals_ = totals;
    std::filesystem::remove_all(base_);
    Plan();
    listening_ = std::any_of(plan_.begin(), plan_.end(),
                             [](const Fault& f) { return f.kind == Kind::kHostileWorker; });
    PrepareStore();
    trace_path_ = base_ + "-trace.jsonl";
    std::filesystem::remove(trace_path_);
    trace_ = std::make_unique<LineFollower>(trace_path_);
    start_ = Clock::now();
    while (!finished_ && !failed_) {
      if (damage_next_) DamageAtRest();
      if (SecondsSince(start_) > s_.o.run_timeout_s) {
        std::printf("  run %d: not finished after %.0f s\n", run_, s_.o.run_timeout_s);
        failed_ = true;
        break;
      }
      Start();
      Watch();
      End();
    }
    Finish();
  }

 private:
  struct Fault {
    int at;  // results of local workers (summed over incarnations) before it is due
    Kind kind;
  };
  struct Pending {  // a recovery clock
    bool active = false;
    Clock::time_point since;
    Kind kind = Kind::kSchedulerSigkill;
  };

  // The last count of results at which a fault of kind `k` is planned. A
  // signal may come at any result but the last few; the other kinds land on
  // something still to come in training (a commit or an exploit to reach, a
  // write to refuse, a task to answer, a member's next interval to read the
  // damaged blob), so they fall among the results that commit (a member-
  // interval each; the rest are the final evaluation's) and not at the last
  // few of those: planned later, they could only go uninjected.
  int LastAt(Kind k) const {
    const int commits = std::min(s_.calm_results, s_.o.population * s_.o.intervals);
    switch (k) {
      case Kind::kWorkerSigkill:
      case Kind::kWorkerSigstop:
      case Kind::kSchedulerSigkill:
      case Kind::kSchedulerSigterm:
        return std::max(1, s_.calm_results - 3);
      case Kind::kHostileWorker:
        // A forger is sent a task only while more are queued than the local
        // workers hold: not once the last generation is handed out.
        return std::max(1, commits - s_.o.population);
      case Kind::kSchedulerKillPoint:
      case Kind::kWorkerKillPoint:
      case Kind::kCorruptBlob:
      case Kind::kDiskFull:
        break;
    }
    return std::max(1, commits - 3);
  }

  // The faults of this run, at increasing counts of results.
  void Plan() {
    for (int i = 0; i < s_.o.faults_per_run; ++i) {
      const Kind kind = s_.kinds[rng_() % s_.kinds.size()];
      const int at = 1 + static_cast<int>(rng_() % static_cast<uint64_t>(LastAt(kind)));
      plan_.push_back(Fault{at, kind});
    }
    std::sort(plan_.begin(), plan_.end(), [](const auto& a, const auto& b) { return a.at < b.at; });
    std::string text;
    for (const auto& f : plan_) {
      text += " " + std::string(KindName(f.kind)) + "@" + std::to_string(f.at);
      ++totals_->planned[KindName(f.kind)];
    }
    std::printf("run %d:%s\n", run_, text.c_str());
    std::fflush(stdout);
  }

  // A run with a full disk keeps its store on a small tmpfs of its own:
  // `store_` is the path the schedulers see, `view_` the harness's. When the
  // tmpfs cannot be mounted the run goes on and its disk_full faults stay
  // planned and not injected (the share check at the end sees them).
  void PrepareStore() {
    store_ = view_ = base_;
    if (std::none_of(plan_.begin(), plan_.end(),
                     [](const Fault& f) { return f.kind == Kind::kDiskFull; })) {
      return;
    }
    const std::string mnt = base_ + "-tmpfs";
    tmpfs_ = std::make_unique<PrivateTmpfs>(mnt, s_.o.tmpfs_bytes);
    if (tmpfs_->ok()) {
      store_ = mnt + "/store";
      view_ = tmpfs_->Outside(store_);
      ballast_ = tmpfs_->Outside(mnt + "/ballast");
      return;
    }
    std::printf(
        "run %d: cannot mount a tmpfs in a private mount namespace: its disk_full "
        "faults are not injected\n",
        run_);
    tmpfs_.reset();
    plan_.erase(std::remove_if(plan_.begin(), plan_.end(),
                               [](const Fault& f) { return f.kind == Kind::kDiskFull; }),
                plan_.end());
  }

  void Injected(Kind k) { ++faults_[KindName(k)]; }

  void DamageAtRest() {
    damage_next_ = false;
    const std::string hex = DamageAHeadBlob(view_, "chaos", s_.o.intervals, rng_);
    if (!hex.empty()) {
      damaged_.insert(hex);
      Injected(Kind::kCorruptBlob);
      std::printf("  damaged blob %s on disk\n", hex.substr(0, 12).c_str());
    } else {
      // Too early (no member past its second interval) or no head of its
      // own: the same fault again 1-3 results on. Not a generation (the
      // population's size) on: where a member fits depends on how far the
      // generation is (none is past another right after a barrier; the last
      // to train one may be its exploit's pair, whose blob is shared), and a
      // retry a generation on would meet the same place in the next one.
      PlanAgain(Kind::kCorruptBlob, results_before_ + 1 + static_cast<int>(rng_() % 3),
                "no member fit to damage");
    }
  }

  // A fault that could not land plans itself again at `at` results, while
  // that is within its kind's part of the run (LastAt); `what` says why, on
  // a line of its own.
  void PlanAgain(Kind kind, int at, const char* what) {
    if (at > LastAt(kind)) {
      std::printf("  %s\n", what);
      return;
    }
    auto it = std::find_if(plan_.begin() + static_cast<std::ptrdiff_t>(next_), plan_.end(),
                           [at](const Fault& f) { return f.at > at; });
    plan_.insert(it, Fault{at, kind});
    std::printf("  %s: again at %d results\n", what, at);
  }

  // A scheduler incarnation, with the kill point due now armed in its
  // environment.
  void Start() {
    ++incarnation_;
    std::vector<std::string> env = s_.base_env;
    env.push_back(std::string(trace::kEnv) + "=" + trace_path_);
    armed_scheduler_point_ = armed_worker_point_ = false;
    if (next_ < plan_.size() && (plan_[next_].kind == Kind::kSchedulerKillPoint ||
                                 plan_[next_].kind == Kind::kWorkerKillPoint)) {
      const std::string armed = DrawKillPoint(plan_[next_]);
      armed_scheduler_point_ = plan_[next_].kind == Kind::kSchedulerKillPoint;
      armed_worker_point_ = !armed_scheduler_point_;
      // N commits, or N exploits: the next barrier (a generation's results)
      // makes up to a quantile of the population's worth; a worker's N-th
      // member-interval, with the workers taking turns, N of each.
      const int n = std::stoi(armed.substr(armed.rfind(':') + 1));
      const bool at_exploit = std::find(kExploitPoints.begin(), kExploitPoints.end(),
                                        armed.substr(0, armed.rfind(':'))) != kExploitPoints.end();
      armed_wait_results_ = armed_worker_point_ ? n * s_.o.workers + 1
                            : at_exploit        ? n * s_.calm_results / s_.o.intervals + 1
                                                : n + 1;
      env.push_back("CKPT_KILL_AT=" + armed);
      // One worker kill per arming, not one per worker incarnation.
      const std::string once = base_ + "-killonce-" + std::to_string(incarnation_);
      std::filesystem::remove(once);
      env.push_back("CKPT_KILL_ONCE=" + once);
      ++next_;
      std::printf("  incarnation %d: CKPT_KILL_AT=%s\n", incarnation_, armed.c_str());
    }
    log_ = base_ + "-" + std::to_string(incarnation_) + ".log";
    std::filesystem::remove(log_);
    std::function<bool()> join_tmpfs;
    if (tmpfs_) {
      // setns() into a mount namespace moves the working directory to its
      // root: relative paths need it back.
      const std::string ns = "/proc/" + std::to_string(tmpfs_->pid()) + "/ns/mnt";
      const std::string cwd = std::filesystem::current_path().string();
      join_tmpfs = [ns, cwd] {
        const int fd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNS) != 0 || chdir(cwd.c_str()) != 0) {
          std::perror("ckpt-chaos: entering the store's mount namespace");
          return false;
        }
        return true;
      };
    }
    // The address file is the incarnation's own: not the last one's port.
    std::filesystem::remove(view_ + "/workers.addr");
    child_ = std::make_unique<Child>(s_.Args(store_, listening_), log_, env, join_tmpfs);
    results_now_ = 0;
    ended_done_ = false;
    we_killed_ = false;
    stopped_.clear();
  }

  // A kill point reached from where it is armed: a few commits or
  // member-intervals on; an exploit point only while barriers are still ahead
  // (past the last one, a commit point instead).
  std::string DrawKillPoint(const Fault& f) {
    if (f.kind == Kind::kWorkerKillPoint) {
      return kWorkerPoints[rng_() % kWorkerPoints.size()] + ":" + std::to_string(1 + rng_() % 4);
    }
    // The last barrier's result: the commits (not the final evaluation's
    // results) of every interval but the last. An exploit point is drawn only
    // with a barrier still ahead of the results so far (a fault may come
    // later than planned).
    const int commits = std::min(s_.calm_results, s_.o.population * s_.o.intervals);
    const int last_barrier = commits * (s_.o.intervals - 1) / s_.o.intervals;
    const bool exploit = std::max(f.at, results_before_) + 2 < last_barrier && rng_() % 2 == 0;
    const auto& points =
        exploit ? kExploitPoints : (s_.o.blob_log ? kBlobLogCommitPoints : kCommitPoints);
    // A commit point's N within the commits left (the last few results are
    // the final evaluation's, which commit nothing).
    const int left = s_.calm_results - results_before_ - results_now_;
    const int max_n = exploit ? 2 : std::clamp(left / 4, 1, 4);
    return points[rng_() % points.size()] + ":" + std::to_string(1 + rng_() % max_n);
  }

  void Watch() {
    while (child_->Running()) {
      for (const auto& e : PollTrace(trace_.get())) OnTrace(e);
      // The store frees space as retention's dead blob files are deleted, and
      // its next writes may fit there: the ballast takes it back as it
      // appears, so that the disk stays full until a write is refused.
      if (ballast_in_ && SecondsSince(ballast_refilled_) > 0.005) {
        FillWithBallast(ballast_);
        ballast_refilled_ = Clock::now();
      }
      if (ballast_in_ && SecondsSince(ballast_since_) > 60) {
        std::printf("  disk full: no write refused within 60 s; ballast removed\n");
        RemoveBallast();
      }
      if (!paused_.empty() && SecondsSince(hostile_.since) > kMaxPauseS) {
        std::printf("  hostile worker: no hello within %.1f s; local workers resumed\n",
                    kMaxPauseS);
        ResumeWorkers();
      }
      if (!InjectDue()) break;
      std::this_thread::sleep_for(milliseconds(5));
    }
  }

  void OnTrace(const TraceEvent& e) {
    ledger_.Add(e);
    // The run's clock: results of its own workers. A hostile worker's
    // forged RESULTs (up to 6 per forger) are not progress, and counted they
    // made later faults due early and windows (LastAt) close before the
    // training they need was over.
    if (e.Is(trace::kResult) && e.j.value("worker", -1) < s_.o.workers) {
      ++results_now_;
      if (scheduler_fault_.active) {
        Recovered(scheduler_fault_, e.seen);
        scheduler_fault_.active = false;
      }
      auto it = worker_fault_.find(e.j.value("worker", -1));
      if (it != worker_fault_.end()) {
        Recovered(it->second, e.seen);
        worker_fault_.erase(it);
      }
    } else if (e.Is(trace::kStoreFull) && ballast_in_) {
      // A commit or an exploit was refused for want of space: free it.
      RemoveBallast();
      Injected(Kind::kDiskFull);
      disk_fault_ = Pending{true, ballast_since_, Kind::kDiskFull};
      std::printf("  disk full: the store refused a write after %.1f s; ballast removed\n",
                  std::chrono::duration<double>(e.seen - ballast_since_).count());
    } else if (e.Is(trace::kStoreWritable) && disk_fault_.active) {
      Recovered(disk_fault_, e.seen);
      disk_fault_.active = false;
    } else if (e.Is(kp::kTraceEvent)) {
      // A worker at its armed kill point (a scheduler's is seen in its exit
      // status).
      if (e.j.value("point", "").rfind("worker.", 0) == 0) {
        Injected(Kind::kWorkerKillPoint);
        armed_worker_point_ = false;
      }
    } else if (e.Is(trace::kEnded)) {
      const auto status = records::ParseExperimentStatus(e.j.value("status", ""));
      if (e.j.value("exp", "") == "chaos" && status.ok() &&
          *status == records::ExperimentStatus::kDone) {
        ended_done_ = true;
      }
    } else if (e.Is(trace::kBadResult)) {
      if (hostile_.active) {
        Injected(Kind::kHostileWorker);
        hostile_.active = false;
        std::printf("  hostile worker: its first forgery refused %.1f s after it started (%s)\n",
                    std::chrono::duration<double>(e.seen - hostile_.since).count(),
                    e.j.value("member", "").c_str());
      }
    } else if (e.Is(trace::kHello) && e.j.value("worker", -1) >= s_.o.workers) {
      if (!paused_.empty()) {
        std::printf("  hostile worker: said hello %.2f s after it started\n",
                    std::chrono::duration<double>(e.seen - hostile_.since).count());
      }
      ResumeWorkers();
    } else if (e.Is(trace::kLost) && e.j.value("worker", -1) >= s_.o.workers) {
      // A remote worker: the forger, dropped for its refused RESULTs.
      std::printf("  hostile worker %d dropped: %s\n", e.j.value("worker", -1),
                  e.j.value("reason", "").c_str());
    } else if (e.Is(trace::kLost)) {
      const int w = e.j.value("worker", -1);
      // A loss the harness did not cause directly (a worker kill point): its
      // recovery counts from when it was seen.
      if (w >= 0 && worker_fault_.count(w) == 0) {
        worker_fault_[w] = Pending{true, e.seen, Kind::kWorkerKillPoint};
      }
    }
  }

  void Recovered(const Pending& p, Clock::time_point at) {
    const double s = std::chrono::duration<double>(at - p.since).count();
    std::printf("  %s: recovered in %.1f s\n", KindName(p.kind), s);
    if (s > totals_->max_recovery_s) {
      totals_->max_recovery_s = s;
      totals_->max_recovery_kind = KindName(p.kind);
    }
  }

  void RemoveBallast() {
    std::filesystem::remove(ballast_);
    ballast_in_ = false;
  }

  // Injects the next planned fault when it is due. False when this
  // incarnation is over (the harness killed the scheduler).
  bool InjectDue() {
    // While the disk is full, and until the scheduler has written again, no
    // other fault is injected: a scheduler restarted on a full disk could not
    // open its store, and one already waiting for space would not report a
    // second full disk.
    if (ballast_in_ || disk_fault_.active || next_ >= plan_.size() ||
        results_before_ + results_now_ < plan_[next_].at) {
      return true;
    }
    // A kill point armed in this incarnation fires only when the run reaches
    // it (the N-th commit or exploit from its start, a worker's N-th
    // member-interval): the next fault waits the results that takes (a
    // worker's, until it fired), or one due soon after would end the
    // incarnation first and the point would go uninjected (CI saw 1 of 4).
    if ((armed_scheduler_point_ || armed_worker_point_) && results_now_ < armed_wait_results_) {
      return true;
    }
    // A forger not yet read: the next fault waits until one of its forgeries
    // was refused, or two generations (it is sent tasks at the next barrier
    // at the latest), or it may end the incarnation before the forger was
    // sent a task (CI: a forger started 1 result before a scheduler kill,
    // three times in one run, none read).
    if (hostile_.active && results_now_ < hostile_wait_results_) return true;
    const Kind k = plan_[next_].kind;
    switch (k) {
      case Kind::kDiskFull: {
        const uint64_t bytes = FillWithBallast(ballast_);
        ballast_in_ = true;
        ballast_since_ = ballast_refilled_ = Clock::now();
        std::printf("  disk full: %.1f MB of ballast\n", static_cast<double>(bytes) / 1e6);
        ++next_;
        return true;
      }
      case Kind::kCorruptBlob:
        // The damage is done between incarnations, on a store at rest.
        KillScheduler(SIGKILL, Kind::kSchedulerSigkill);
        damage_next_ = true;
        ++next_;
        return false;
      case Kind::kSchedulerKillPoint:
      case Kind::kWorkerKillPoint:
        // Armed at the next start: end this incarnation now.
        KillScheduler(SIGKILL, Kind::kSchedulerSigkill);
        return false;
      case Kind::kSchedulerSigkill:
      case Kind::kSchedulerSigterm:
        // SIGTERM not before the scheduler's signal handlers are set: once
        // this incarnation has a result.
        if (k == Kind::kSchedulerSigterm && results_now_ == 0) return true;
        KillScheduler(k == Kind::kSchedulerSigkill ? SIGKILL : SIGTERM, k);
        ++next_;
        return false;
      case Kind::kWorkerSigkill:
      case Kind::kWorkerSigstop:
        HitWorker(k);
        return true;
      case Kind::kHostileWorker:
        // Once this incarnation has published its address, and once the
        // forger already connected (if any) has had a forgery refused: a
        // second one due meanwhile waits rather than replace it unread.
        if (hostile_.active) return true;
        if (StartForger()) ++next_;
        return true;
    }
    return true;
  }

  // A hostile worker: forging_worker holds the secret, connects over TLS like
  // `ckpt-worker --connect`, and answers each TRAIN with a forged RESULT (a
  // score of 1e308, INT64_MAX samples, a step past the one asked, a NaN loss,
  // a state of another layout, the state it was sent untrained). Injected
  // once the scheduler has refused one (its trace's bad_result); it lives
  // until the incarnation ends. Each must be refused: the run must end with
  // the undisturbed heads and no commit by a remote worker (hostile_commits).
  bool StartForger() {
    std::ifstream in(view_ + "/workers.addr");
    std::string addr;
    if (!in || !std::getline(in, addr) || addr.empty()) return false;
    StopForger();
    ++forgers_;
    forger_ = std::make_unique<Child>(
        std::vector<std::string>{s_.o.forging_worker, addr, s_.secret, "results"},
        base_ + "-forger-" + std::to_string(forgers_) + ".log", s_.base_env);
    hostile_ = Pending{true, Clock::now(), Kind::kHostileWorker};
    hostile_wait_results_ = results_now_ + 2 * s_.o.population;
    std::printf("  hostile worker: a forging worker connects to %s\n", addr.c_str());
    // From its start to its first task (a process, TCP, TLS, HELLO, then a
    // task queued beyond what the local workers hold) a fast host's run goes
    // on by a generation or more (0.1 s on an AMD EPYC of family 25, where a
    // generation takes 36 ms): one started near the last generation could
    // find it handed out. The local workers wait for its hello, stopped, at
    // most kMaxPauseS (under the heartbeat timeout, 2 s).
    for (pid_t w : ChildrenOf(child_->pid())) {
      if (!stopped_.count(w) && kill(w, SIGSTOP) == 0) paused_.insert(w);
    }
    return true;
  }

  void ResumeWorkers() {
    for (pid_t w : paused_) kill(w, SIGCONT);
    paused_.clear();
  }

  void StopForger() {
    ResumeWorkers();
    if (!forger_) return;
    kill(forger_->pid(), SIGKILL);
    forger_->Wait();
    forger_.reset();
    if (hostile_.active) {
      // Its scheduler went (a fault, or the run's end) before it was sent a
      // task: a forger for a later incarnation.
      hostile_.active = false;
      PlanAgain(Kind::kHostileWorker, results_before_ + results_now_ + 1,
                "hostile worker: none of its RESULTs was read before it went");
    }
  }

  void KillScheduler(int sig, Kind k) {
    kill(child_->pid(), sig);
    we_killed_ = true;
    Injected(k);
    scheduler_fault_ = Pending{true, Clock::now(), k};
  }

  // A worker fault falls on a working process: it waits until every worker
  // is up (a restart may be under way).
  void HitWorker(Kind k) {
    std::vector<pid_t> live;
    for (pid_t w : ChildrenOf(child_->pid())) {
      if (!stopped_.count(w)) live.push_back(w);
    }
    if (static_cast<int>(live.size()) < s_.o.workers) return;
    std::this_thread::sleep_for(milliseconds(rng_() % 30));
    const pid_t victim = live[rng_() % live.size()];
    const int index = WorkerIndexOfPid(victim);
    if (kill(victim, k == Kind::kWorkerSigkill ? SIGKILL : SIGSTOP) == 0) {
      Injected(k);
      if (k == Kind::kWorkerSigstop) stopped_.insert(victim);
      if (index >= 0) worker_fault_[index] = Pending{true, Clock::now(), k};
    }
    ++next_;
  }

  // The incarnation's end: its exit status says whether it finished, was
  // killed by the harness or an armed kill point, or failed; then, with its
  // workers gone, every acknowledged commit must be in the store.
  void End() {
    const int st = child_->Wait();
    for (const auto& e : PollTrace(trace_.get())) OnTrace(e);
    StopForger();
    results_before_ += results_now_;
    const bool refused_open = RefusedToOpenOnTheFullDisk(st);
    if (ballast_in_) {
      // Another fault (or the run's end) came first: the full disk later.
      std::printf("  disk full: the scheduler ended before a write was refused; ballast removed\n");
      RemoveBallast();
      PlanAgain(Kind::kDiskFull, results_before_ + 1, "disk full: not met");
    }
    disk_fault_.active = false;
    const bool killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    if (we_killed_ && WIFSIGNALED(st) && WTERMSIG(st) == SIGTERM) {
      // Not expected: SIGTERM stops it gracefully.
      std::printf("  incarnation %d: died of SIGTERM instead of stopping\n", incarnation_);
    }
    if (we_killed_ && armed_scheduler_point_) {
      // The harness ended the incarnation (the next fault was due) before
      // the scheduler reached its armed point (an exploit point while the
      // run-ahead results kept a barrier open, on a loaded machine): arm one
      // again, as a disk that did not fill is planned again.
      PlanAgain(Kind::kSchedulerKillPoint, results_before_ + 1,
                "scheduler kill point: not reached");
    }
    if (killed && !we_killed_) {
      if (armed_scheduler_point_) {
        Injected(Kind::kSchedulerKillPoint);
        scheduler_fault_ = Pending{true, Clock::now(), Kind::kSchedulerKillPoint};
      } else {
        std::printf("  incarnation %d: killed by SIGKILL with no cause; log %s\n", incarnation_,
                    log_.c_str());
        failed_ = true;
      }
    } else if (!killed && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
      // An incarnation that finds the experiment done in the store exits at
      // once without tracing its end: the one before was killed after it
      // stored the end (a fault held back by a full disk until the final
      // evaluation's writes went through, due at that moment).
      finished_ = ended_done_ || StoredAsDone(view_, "chaos");
    } else if (!killed && !refused_open) {
      std::printf("  incarnation %d: exit status %d; log %s\n", incarnation_,
                  WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log_.c_str());
      failed_ = true;
    }
    // Workers die with their scheduler (parent-death signal, which a stopped
    // worker takes too); wait until they have.
    for (int i = 0; i < 200 && !ChildrenOf(child_->pid()).empty(); ++i) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    child_.reset();
    CheckLedger("after incarnation " + std::to_string(incarnation_));
  }

  // An incarnation started while the ballast still fills the disk (a kill
  // came before the store refused a write) may fail to open its store:
  // RocksDB appends to its MANIFEST at open. That is the store refusing a
  // write for want of space, a clear error and nothing lost: the fault is met,
  // the ballast removed, and the next incarnation's first result its
  // recovery. True when `st` and the incarnation's log say so.
  bool RefusedToOpenOnTheFullDisk(int st) {
    if (!ballast_in_ || !WIFEXITED(st) || WEXITSTATUS(st) == 0) return false;
    std::ifstream in(log_);
    const std::string log((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (log.find("ResourceExhausted: store") == std::string::npos ||
        log.find("No space left on device") == std::string::npos) {
      return false;
    }
    RemoveBallast();
    Injected(Kind::kDiskFull);
    if (!scheduler_fault_.active) scheduler_fault_ = Pending{true, ballast_since_, Kind::kDiskFull};
    std::printf("  disk full: the store refused to open after %.1f s; ballast removed\n",
                SecondsSince(ballast_since_));
    return true;
  }

  void CheckLedger(const std::string& when) {
    for (const auto& m : ledger_.Missing(view_, "chaos")) {
      std::printf("  COMMITTED LOST %s: %s\n", when.c_str(), m.c_str());
      ++lost_;
    }
  }

  void Finish() {
    const StoreCheck end = CheckStore(view_, "chaos", s_.o.intervals, s_.o.workers);
    // A member that fell back from a damaged head has more versions than in
    // the undisturbed run: its head must hold the same state (blob, step,
    // hyperparameters), under a later version number. Only for that member.
    std::set<std::string> fell_back;
    if (end.fallbacks > 0) fell_back = FellBack();
    bool heads_differ = end.heads.size() != s_.calm.size();
    for (const auto& [m, h] : s_.calm) {
      auto it = end.heads.find(m);
      if (it == end.heads.end()) {
        heads_differ = true;
        continue;
      }
      Head got = it->second;
      if (fell_back.count(m) && got.version >= h.version) got.version = h.version;
      if (!(got == h)) heads_differ = true;
    }
    const bool diverged = failed_ || !end.opened || heads_differ;
    // Verify must find the blobs damaged on purpose, and nothing else.
    bool verified = end.opened && (end.verify_problem.empty() || !end.verify_problems.empty());
    for (const auto& p : end.verify_problems) {
      bool expected = false;
      for (const auto& hex : damaged_) expected = expected || p.find(hex) != std::string::npos;
      if (!expected) verified = false;
    }
    int members_lost = 0;
    for (const auto& [m, h] : s_.calm) {
      if (!end.heads.count(m)) ++members_lost;
    }
    Totals& t = *totals_;
    ++t.runs;
    for (const auto& [k, n] : faults_) t.faults[k] += n;
    t.commits_acknowledged += ledger_.count();
    t.committed_lost += lost_;
    t.runs_diverged += diverged ? 1 : 0;
    t.verify_failures += verified ? 0 : 1;
    t.trained_twice += end.trained_twice;
    t.intervals_missing += end.intervals_missing;
    t.members_lost += members_lost;
    t.hostile_commits += end.hostile_commits;
    int injected = 0;
    for (const auto& [k, n] : faults_) injected += n;
    std::printf(
        "  run %d: %d faults, %d incarnations, %d commits acknowledged, %.1f s: %s%s%s%s%s%s\n",
        run_, injected, incarnation_, ledger_.count(), SecondsSince(start_),
        diverged ? "DIVERGED " : "heads as undisturbed ",
        verified ? (damaged_.empty() ? "verified" : "verified (damage found)")
                 : ("VERIFY FAILED: " + end.verify_problem + end.error).c_str(),
        lost_ ? ", COMMITTED LOST" : "", end.trained_twice ? ", TRAINED TWICE" : "",
        end.intervals_missing ? ", INTERVALS MISSING" : "",
        end.hostile_commits ? ", A HOSTILE WORKER'S RESULT COMMITTED" : "");
    if (diverged) PrintDivergence(end);
    std::fflush(stdout);
    const bool bad = diverged || !verified || lost_ || end.trained_twice || end.intervals_missing ||
                     end.hostile_commits;
    if (tmpfs_ && (bad || s_.o.keep)) {
      // The tmpfs goes with this run: keep a copy of its store.
      std::error_code ec;
      std::filesystem::copy(view_, base_, std::filesystem::copy_options::recursive, ec);
    }
    tmpfs_.reset();
    if (!bad && !s_.o.keep) {
      std::filesystem::remove_all(base_);
      std::filesystem::remove_all(base_ + "-tmpfs");
      std::filesystem::remove(trace_path_);
      for (int i = 1; i <= incarnation_; ++i) {
        std::filesystem::remove(base_ + "-" + std::to_string(i) + ".log");
        std::filesystem::remove(base_ + "-killonce-" + std::to_string(i));
      }
      for (int i = 1; i <= forgers_; ++i) {
        std::filesystem::remove(base_ + "-forger-" + std::to_string(i) + ".log");
      }
    }
  }

  // The members with a "corrupt_state" event (a fall-back from a damaged head).
  std::set<std::string> FellBack() const {
    std::set<std::string> out;
    store::StoreOptions o;
    o.path = view_;
    auto s = store::Store::Open(o);
    if (!s.ok()) return out;
    auto events = (*s)->ListEvents("chaos", 0, 1 << 20);
    if (!events.ok()) return out;
    for (const auto& e : *events) {
      const auto event = records::DecodeEvent(e.json, "event " + std::to_string(e.seq));
      if (!event.ok()) continue;
      if (const auto* fell = std::get_if<records::CorruptStateEvent>(&*event)) {
        out.insert(fell->member);
      }
    }
    return out;
  }

  void PrintDivergence(const StoreCheck& end) const {
    for (const auto& [m, h] : s_.calm) {
      auto it = end.heads.find(m);
      if (it == end.heads.end()) {
        std::printf("    %s: missing\n", m.c_str());
      } else if (!(it->second == h)) {
        std::printf("    %s: v%lld step %lld %s, undisturbed v%lld step %lld %s\n", m.c_str(),
                    static_cast<long long>(it->second.version),
                    static_cast<long long>(it->second.step), it->second.blob.substr(0, 12).c_str(),
                    static_cast<long long>(h.version), static_cast<long long>(h.step),
                    h.blob.substr(0, 12).c_str());
      }
    }
  }

  const Setup& s_;
  const int run_;
  std::mt19937_64& rng_;
  const std::string base_;  // logs, trace and kill-once files; the store unless on a tmpfs
  Totals* totals_ = nullptr;
  std::vector<Fault> plan_;
  size_t next_ = 0;
  std::unique_ptr<PrivateTmpfs> tmpfs_;
  std::string store_, view_, ballast_;
  std::string trace_path_;
  std::unique_ptr<LineFollower> trace_;
  Ledger ledger_;
  Clock::time_point start_;
  int incarnation_ = 0;
  bool finished_ = false;
  bool ended_done_ = false;  // this incarnation traced experiment chaos ended done
  bool failed_ = false;
  int lost_ = 0;
  std::map<std::string, int> faults_;
  // The current incarnation.
  std::unique_ptr<Child> child_;
  std::string log_;
  int results_before_ = 0;  // in earlier incarnations
  int results_now_ = 0;
  bool we_killed_ = false;
  bool armed_scheduler_point_ = false;
  bool armed_worker_point_ = false;  // until a worker reached it
  int armed_wait_results_ = 0;       // results the armed point may take to be reached
  std::set<pid_t> stopped_;
  // Recovery clocks: per worker index, for the scheduler, for a full disk.
  std::map<int, Pending> worker_fault_;
  Pending scheduler_fault_;
  Pending disk_fault_;
  bool damage_next_ = false;
  std::set<std::string> damaged_;  // blob ids damaged on purpose
  bool ballast_in_ = false;
  Clock::time_point ballast_since_;
  Clock::time_point ballast_refilled_;
  // Hostile workers: whether the run's schedulers listen for remote workers
  // (a hostile_worker fault is planned), the forger of this incarnation, and
  // its clock until its first refused RESULT.
  bool listening_ = false;
  std::unique_ptr<Child> forger_;
  int forgers_ = 0;
  Pending hostile_;
  int hostile_wait_results_ = 0;  // results the next fault waits for the forger
  // Local workers stopped until the forger's hello.
  static constexpr double kMaxPauseS = 1.0;
  std::set<pid_t> paused_;
};

class ChaosRunner {
 public:
  explicit ChaosRunner(Options o) {
    s_.o = std::move(o);
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::strncmp(*e, "CKPT_KILL_AT=", 13) != 0 &&
          std::strncmp(*e, trace::kEnv, std::strlen(trace::kEnv)) != 0) {
        s_.base_env.emplace_back(*e);
      }
    }
    for (const auto& k : s_.o.kinds) {
      for (Kind kind : kAllKinds) {
        if (k == KindName(kind)) s_.kinds.push_back(kind);
      }
    }
    if (s_.kinds.empty()) {
      for (Kind k : kAllKinds) s_.kinds.push_back(k);
    }
    // A full disk needs a tmpfs in a private mount namespace: root only.
    if (geteuid() != 0 && std::count(s_.kinds.begin(), s_.kinds.end(), Kind::kDiskFull)) {
      std::printf(
          "ckpt-chaos: not root, so no disk_full faults (they need a tmpfs mounted in a "
          "private mount namespace)\n");
      s_.kinds.erase(std::remove(s_.kinds.begin(), s_.kinds.end(), Kind::kDiskFull),
                     s_.kinds.end());
    }
    if (access(s_.o.forging_worker.c_str(), X_OK) != 0 &&
        std::count(s_.kinds.begin(), s_.kinds.end(), Kind::kHostileWorker)) {
      std::printf("ckpt-chaos: no forging_worker at '%s', so no hostile_worker faults\n",
                  s_.o.forging_worker.c_str());
      s_.kinds.erase(std::remove(s_.kinds.begin(), s_.kinds.end(), Kind::kHostileWorker),
                     s_.kinds.end());
    }
  }

  bool has_kinds() const { return !s_.kinds.empty(); }

  // The reference run. False (with the reason printed) when it fails.
  bool Calm() {
    s_.config = s_.o.dir + "/chaos.toml";
    std::ofstream(s_.config) << ExperimentToml(s_.o);
    s_.secret = s_.o.dir + "/chaos.secret";
    s_.config_listening = s_.o.dir + "/chaos-listening.toml";
    std::ofstream(s_.config_listening) << ExperimentToml(s_.o, s_.secret);
    const std::string store = s_.o.dir + "/calm";
    std::filesystem::remove_all(store);
    const std::string log = s_.o.dir + "/calm.log";
    const std::string trace_path = s_.o.dir + "/calm-trace.jsonl";
    std::filesystem::remove(log);
    std::filesystem::remove(trace_path);
    std::vector<std::string> env = s_.base_env;
    env.push_back(std::string(trace::kEnv) + "=" + trace_path);
    const auto t0 = Clock::now();
    Child c(s_.Args(store), log, env);
    if (!c.WaitFor(milliseconds(static_cast<int64_t>(s_.o.run_timeout_s * 1000)))) {
      std::fprintf(stderr, "ckpt-chaos: the undisturbed run did not finish; log %s\n", log.c_str());
      return false;
    }
    const int st = c.Wait();
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      std::fprintf(stderr, "ckpt-chaos: the undisturbed run failed; log %s\n", log.c_str());
      return false;
    }
    LineFollower f(trace_path);
    for (const auto& e : PollTrace(&f)) s_.calm_results += e.Is(trace::kResult) ? 1 : 0;
    StoreCheck check = CheckStore(store, "chaos", s_.o.intervals, s_.o.workers);
    if (!check.opened || !check.verified ||
        check.heads.size() != static_cast<size_t>(s_.o.population) || s_.calm_results == 0 ||
        check.trained_twice != 0 || check.intervals_missing != 0) {
      std::fprintf(stderr,
                   "ckpt-chaos: the undisturbed run does not check: %s %s (%d results traced, "
                   "%d intervals trained twice, %d missing)\n",
                   check.error.c_str(), check.verify_problem.c_str(), s_.calm_results,
                   check.trained_twice, check.intervals_missing);
      return false;
    }
    s_.calm = check.heads;
    std::printf("undisturbed run: %d results in %.1f s\n", s_.calm_results, SecondsSince(t0));
    std::fflush(stdout);
    return true;
  }

  void Run(int run, std::mt19937_64& rng, Totals* totals) {
    ChaosRun(s_, run, &rng).Execute(totals);
  }

 private:
  Setup s_;
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

// forging_worker (tests/scheduler), where this build put it.
std::string DefaultForgingWorker() {
#ifdef CKPT_FORGING_WORKER_BIN
  return CKPT_FORGING_WORKER_BIN;
#else
  return "";
#endif
}

// Prints the totals as a JSON line (and why they fail, above it); the exit
// status: 0 when every check held, 1 otherwise.
int Report(const Options& o, const Totals& t) {
  json faults = json::object(), planned = json::object();
  int total = 0;
  // Every kind that was planned must have landed at least its share.
  std::vector<std::string> short_of_share;
  for (Kind k : kAllKinds) {
    const auto count = [k](const std::map<std::string, int>& m) {
      const auto it = m.find(KindName(k));
      return it == m.end() ? 0 : it->second;
    };
    const int p = count(t.planned), n = count(t.faults);
    faults[KindName(k)] = n;
    planned[KindName(k)] = p;
    total += n;
    if (p > 0 && n < Share(p)) {
      short_of_share.push_back(std::string(KindName(k)) + ": " + std::to_string(n) + " of " +
                               std::to_string(p) + " planned, at least " +
                               std::to_string(Share(p)) + " needed");
    }
  }
  json out{{"seed", o.seed},
           {"runs", t.runs},
           {"faults_planned", planned},
           {"faults_injected", faults},
           {"faults_total", total},
           {"commits_acknowledged", t.commits_acknowledged},
           {"committed_lost", t.committed_lost},
           {"runs_diverged", t.runs_diverged},
           {"verify_failures", t.verify_failures},
           {"trained_twice", t.trained_twice},
           {"intervals_missing", t.intervals_missing},
           {"members_lost", t.members_lost},
           {"hostile_commits", t.hostile_commits},
           {"max_recovery_s", t.max_recovery_s},
           {"max_recovery_kind", t.max_recovery_kind}};
  for (const auto& s : short_of_share) {
    std::printf("ckpt-chaos: FAILED: too few faults injected of %s\n", s.c_str());
  }
  if (total == 0) std::printf("ckpt-chaos: FAILED: no fault was injected\n");
  std::printf("%s\n", out.dump().c_str());
  const bool ok = t.committed_lost == 0 && t.runs_diverged == 0 && t.verify_failures == 0 &&
                  t.trained_twice == 0 && t.intervals_missing == 0 && t.members_lost == 0 &&
                  t.hostile_commits == 0 && short_of_share.empty() && total > 0;
  if (ok && !o.keep) std::filesystem::remove_all(o.dir);
  return ok ? 0 : 1;
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
  o.forging_worker = DefaultForgingWorker();
  app.add_option("--forging-worker", o.forging_worker,
                 "forging_worker, the hostile worker (default: this build's)");
  app.add_option("--population", o.population, "members (default 6)")->check(CLI::Range(2, 64));
  app.add_option("--intervals", o.intervals, "intervals (default 6)")->check(CLI::Range(1, 100));
  app.add_option("--workers", o.workers, "CPU workers (default 2)")->check(CLI::Range(1, 8));
  app.add_option("--run-timeout-s", o.run_timeout_s, "a run failing after this (default 600)");
  app.add_flag("--keep", o.keep, "keep the stores and logs of runs that checked out");
  app.add_flag("--blob-log,!--no-blob-log", o.blob_log,
               "schedulers keep states in the store's blob log, and the blob log's kill "
               "points join the commit points (the default); --no-blob-log: RocksDB's blob "
               "files");
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
  return Report(o, t);
}

}  // namespace
}  // namespace ckpt::chaos

int main(int argc, char** argv) { return ckpt::chaos::Main(argc, argv); }
