// Scheduler: runs experiments of a population over per-device workers.
//
// It keeps every member in the store, spawns and supervises one ckpt-worker
// process per configured device, hands member-intervals to workers through
// their shared-memory rings, commits what comes back, and asks each
// experiment's policy what a member does next.
//
// Units (scheduler/src): `experiment` (the PBT logic of one experiment: members,
// generations, barrier, policy calls; no threads or I/O of its own),
// `experiment_store` (its records in the store), `worker_pool` (spawn, reap,
// heartbeat, backoff, restart, give up), `worker_handle` (one worker's process,
// ring and threads), `dispatcher`, `progress` (terminal and log lines), and
// this event loop that glues them (scheduler.cc).
//
// Threads: one event loop (Boost.Asio io_context, the thread that calls Run)
// owns all scheduling state; each worker has a sender and a receiver thread
// that do the bulk disk work: reading a member's blob into the ring, and
// committing a result (blob, manifest, head, event; then its state record).
// The loop itself does only small metadata writes, each one RocksDB WriteBatch
// (unsynced unless sync_interval_commits): exploit manifests (no blob bytes),
// state records of stopped and failed members, events, experiment status; and
// the synced control writes of the control API (submit, restore, pin).
//
// Crash safety: every result is committed before the loop hears of it; an
// experiment's scheduling state (interval counts, exploit marks) is derived
// at start from its members' heads and manifests, so re-running resumes
// exactly where the committed state stands. In synchronous mode decisions are
// pure functions of the committed generation, so an interrupted run ends with
// the same heads as an uninterrupted one.
//
// Thread-safety: Create, Submit and Run from one thread; RequestStop from any
// thread or a signal handler context of Asio.
#ifndef CKPT_SCHEDULER_SCHEDULER_H_
#define CKPT_SCHEDULER_SCHEDULER_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::store {
class Store;
}

namespace ckpt::scheduler {

// The control socket of `serve` (see control_client.h for the protocol).
struct ControlOptions {
  // Socket path; its directory is created 0750 when missing. Default: "" (no socket).
  std::string socket_path;
  // Users and groups (names or numeric ids) whose processes may connect,
  // besides the scheduler's own user. A group counts as the peer's gid or as
  // any group of the peer's user in the group database (getgrouplist, looked
  // up as it connects). Default: none.
  std::vector<std::string> allowed_users;
  std::vector<std::string> allowed_groups;
  // Users (names or numeric ids) who may change any experiment and shut the
  // service down; root and the scheduler's own user always may. Any other
  // allowed user may submit, read everything (status, list) and change
  // (pause, resume, stop, restore, pin, unpin) only the experiments it
  // submitted (their records keep the submitter's uid). Default: none.
  std::vector<std::string> admins;
  // Longest request line accepted. Default: 1 MiB.
  size_t max_request_bytes = size_t{1} << 20;
  // Connections served at once; more are refused with an error. Default: 64.
  int max_clients = 64;
  // A connection idle (or stalled mid-line) this long is closed. Default: 30 s.
  std::chrono::milliseconds client_idle_timeout{30000};
  // A submission is validated (its TOML parsed, its model file hashed, its
  // data file mapped and validated whole) on a thread of its own, off the
  // event loop; past this bound the submitter is answered ResourceExhausted
  // naming it and nothing is created. At most 2 validations run at once.
  // Default: 20 s (below the 30 s a ControlClient waits for a reply).
  std::chrono::milliseconds submit_validation_timeout{20000};
  // Test seam: called on the validation thread before each submission is
  // validated (a test holds it there to see the loop answer meanwhile).
  std::function<void()> before_validation;
  // Test seam: when set, used instead of SO_PEERCRED to get a peer's uid and gid.
  std::function<bool(int fd, uint32_t* uid, uint32_t* gid)> peer_credentials;
  // When set, a submitted experiment's TorchScript model must lie in one of
  // these directories (records::CheckModelFileAllowed); the service sets it
  // from allowed_model_dirs. Default: unset (any file the scheduler can read).
  std::optional<std::vector<std::string>> allowed_model_dirs;
  // When set, a submitted experiment's [data] path must lie in one of these
  // directories (records::CheckDataPathAllowed); the service sets it from
  // allowed_data_dirs. Default: unset (any file the scheduler can read).
  std::optional<std::vector<std::string>> allowed_data_dirs;
};

struct SchedulerOptions {
  // Store directory. Required.
  std::string store_path;
  // Workers to run. Default: one "cpu" worker.
  std::vector<records::DeviceConfig> devices = {records::DeviceConfig{}};
  // Path of ckpt-worker. Default: "" = FindWorkerBinary's.
  std::string worker_binary;
  // Prefix of the workers' shared-memory segment names. Default: "" =
  // "ckpt-<hash of the store path>".
  std::string instance;
  // Bytes of each ring, the most its memory grows to (records::
  // kDefaultRingBytes). Default: 64 MiB.
  size_t ring_bytes = records::kDefaultRingBytes;
  // Prometheus endpoint "HOST:PORT" (numeric IPv4; ckpt::metrics), "" for
  // none. `run` takes an experiment file's `metrics`, `serve` its file's.
  // Default: "" (none).
  std::string metrics;
  // When the endpoint cannot be bound: true, Run fails (Unavailable naming the
  // address; the service); false, one warning and the run goes on without
  // metrics (`run`, where a second run on the same host is common).
  // Default: false.
  bool metrics_required = false;
  // Worker restarts, heartbeat, member failures and the stop grace.
  // Defaults: as in SupervisionOptions. `run` takes an experiment file's
  // [supervision]; `serve` its file's [workers] and grace_s.
  records::SupervisionOptions supervision;
  // Workers on other hosts: with `listen` set, Run accepts authenticated
  // `ckpt-worker --connect` workers at any time (logged "listening for workers
  // on HOST:PORT", the address written to <store_path>/workers.addr) and does
  // not end for want of workers; with `local` false it spawns none of
  // `devices`. `run` takes an experiment file's [workers] (and its flags);
  // `serve` its file's. Default: none (local workers only).
  records::RemoteWorkersConfig remote;
  // Members evaluated on the test split when an experiment ends. Default: 5.
  int final_eval_top = 5;
  // Sync mode: members certain to continue start their next interval before
  // the barrier, with the same decisions (ExperimentOptions::run_ahead).
  // Default: true.
  bool run_ahead = true;
  // Progress output (nullptr: none). Lines are rewritten in place on a TTY.
  // Default: stdout.
  FILE* progress = stdout;
  // Sync writes of interval results. Default: false.
  bool sync_interval_commits = false;
  // The store keeps new states in its own blob log
  // (store::StoreOptions::blob_log); false keeps them in RocksDB's blob files.
  // Default: true.
  bool blob_log = true;
  // Service mode: keep running when every experiment has ended, resume every
  // unfinished experiment of the store at start, serve the control socket.
  // Default: false (`run`: stop when the submitted experiments end).
  bool serve = false;
  // serve: the control socket.
  ControlOptions control;
  // serve: SIGHUP asks this for the new control options (the service re-reads
  // its file); what cannot change at run time is reported, not applied.
  std::function<StatusOr<ControlOptions>()> reload;
  // serve: service-manager notifications ("READY=1", "STOPPING=1",
  // "STATUS=..."), e.g. sd_notify. Default: none.
  std::function<void(const std::string&)> notify;
  // Fault-injection seam for crash tests: called at named points of the
  // engine ("scheduler.committed" after an interval's commit and state record,
  // "scheduler.exploited" between an exploit and its state record) and handed
  // to the store for its own points. Default: none. ckpt-scheduler sets it from
  // CKPT_KILL_AT=POINT:N (SIGKILL itself at the Nth time POINT is reached).
  std::function<void(std::string_view point)> kill_point;
};

// SchedulerOptions::kill_point from $CKPT_KILL_AT ("POINT:N": SIGKILL this
// process the Nth time POINT is reached): empty when the variable is unset;
// InvalidArgument quoting it when it is malformed.
StatusOr<std::function<void(std::string_view)>> KillPointFromEnvironment();

class Scheduler {
 public:
  virtual ~Scheduler() = default;

  // Opens the store (Unavailable naming the path when another process holds
  // it) and prepares the event loop. Workers start in Run.
  static StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerOptions& options);

  // Adds an experiment: created in the store when new, resumed from its
  // committed state when present with the same configuration (a different
  // configuration under the same name is InvalidArgument). Done experiments are
  // reported, not rerun. Corruption naming the experiment and member when a
  // stored member-state record is damaged.
  virtual Status Submit(const records::ExperimentConfig& config) = 0;

  // Runs until every submitted experiment has ended or RequestStop; then
  // stops the workers and returns. Errors: no worker could be started, or
  // every device was given up on (Unavailable naming the last reason);
  // Internal when the event loop caught an unexpected exception (logged; the
  // workers are stopped and the store flushed before returning).
  virtual Status Run() = 0;

  // Asks Run to stop gracefully (in-flight intervals finish within the grace).
  virtual void RequestStop() = 0;

  virtual StatusOr<ExperimentSummary> Summary(const std::string& exp) = 0;
  // Sum over every worker process this scheduler ran of its peak resident
  // set (VmHWM, read just before it was stopped).
  virtual int64_t WorkersPeakRssBytes() const = 0;
  virtual store::Store* store() = 0;
};

// Prints the table of best members (hyperparameters, validation and test
// accuracy) and where the store is.
void PrintSummary(const ExperimentSummary& summary, FILE* out);

// The ckpt-worker a scheduler starts, as an absolute path: `configured` when
// set, else $CKPT_WORKER (either a path, or a name looked up on $PATH), else
// one beside this executable (or in ../bin, ../lib/ckpt), else "ckpt-worker"
// on $PATH. Errors: NotFound (no such file, or nothing found; the message
// names the path or the places searched and where it was set),
// InvalidArgument (a directory, or not executable). For programs that start
// workers themselves (ckpt-bench's TCP workers), so that they start the same
// one.
StatusOr<std::string> FindWorkerBinary(const std::string& configured);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SCHEDULER_H_
