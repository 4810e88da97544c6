// WorkerHandle: one ckpt-worker child process, its shared-memory channel and
// the two threads that talk to it (private to ckpt::scheduler); or a remote
// worker that connected over TCP (Adopt: no process of ours, only its
// channel).
//
// The sender thread writes CONFIGURE (once per experiment) and TRAIN records,
// reading each member's state from the store straight into the request ring
// (worker_send.cc). The receiver thread reads RESULT / FAILED / STATS / HELLO
// records; a RESULT is checked and committed to the store from that thread
// (disk work off the event loop; worker_commit.cc), the ring space released,
// and only then is the event loop told (`on_event`). Spawning, supervision
// and the receiver's dispatch are worker_handle.cc's.
//
// Ownership: the Scheduler owns handles; a handle owns its process until Stop.
// The commit of a RESULT is followed by the member's state record
// (Task::state_after with the result's score): one encoder, EncodeMemberRecord.
//
// Untrusted workers: a RESULT is committed only if it answers its task
// (CheckResult, result_check.h: score in the metric's range, step, samples,
// loss, the state's layout). One that does not is the worker's fault, never
// the member's: it is logged with the worker's index and device (a remote
// worker's device names its address), counted as
// ckpt_member_failures_total{reason="bad_result"}, nothing of it is
// committed, and the interval reruns from the committed head without a
// failure charged to the member (reported as kCommitError with code
// kBadResult and commit_status kAborted, the path of a head that moved). A
// HELLO offering slots outside 1..MaxHelloSlots is a bad HELLO: the worker is
// lost.
//
// Failure containment: an exception escaping either thread (none is expected:
// every library call returns a Status) is caught at the thread's root, logged,
// counted, and reported as the loss of the worker, which is then restarted.
//
// Thread-safety: Enqueue, TakeUnfinished and Stop may be called from any one
// thread (the event loop); callbacks run on the handle's own threads.
#ifndef CKPT_SCHEDULER_WORKER_HANDLE_H_
#define CKPT_SCHEDULER_WORKER_HANDLE_H_

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/ipc/messages.h"
#include "ckpt/metrics/metrics.h"
#include "ckpt/scheduler/policy.h"
#include "ckpt/store/store.h"
#include "experiment.h"
#include "result_check.h"

namespace ckpt::scheduler {

// Seconds from `t0` to now (for the metrics' latency figures).
inline double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// One member-interval sent to a worker: the experiment's work item, with the
// task id the worker's answer carries and the experiment it belongs to.
struct Task : WorkItem {
  uint64_t id = 0;
  std::string exp;
  Clock::time_point dispatched{};  // for the interval duration histogram
  ResultRules rules;               // what the experiment's results must show
  // Set by the sender thread before the TRAIN is written: the step and the
  // layout of the state it sent (0 and null for an initialisation, or a
  // state whose header did not parse: the worker refuses that one).
  int64_t sent_step = 0;
  std::shared_ptr<const StateLayout> sent_layout;
  // The sent state's data seed and cursor (its header's), when one was sent
  // and its header is known.
  std::optional<uint64_t> sent_data_seed;
  uint64_t sent_data_cursor = 0;
  // Set when the task is sent: the size of the state its RESULT should
  // carry (the sent state's; for an initialisation, the largest state of
  // the experiment seen so far); 0 when none is known yet.
  uint64_t expected_state_bytes = 0;
};

// The state layout of each experiment, as far as the scheduler has seen one
// (result_check.h: every state of an experiment has one layout): the first
// one of a state a sender read from the store or of a result accepted.
// And, per member, what the header of the state it last committed said (its
// blob id, ckpt.step and layout), so that sending that state on needs no
// parse of its header again. Shared by a pool's handles; thread-safe.
class StateLayouts {
 public:
  // The experiment's layout; null when none was seen yet.
  std::shared_ptr<const StateLayout> Find(const std::string& exp) const;
  // Records `layout` as the experiment's unless it has one; returns the
  // experiment's layout after the call.
  std::shared_ptr<const StateLayout> Establish(const std::string& exp, StateLayout layout);

  struct Header {
    BlobId blob;
    int64_t step = 0;
    std::shared_ptr<const StateLayout> layout;
    uint64_t data_seed = 0;
    uint64_t data_cursor = 0;
  };
  // The member's state `blob` was committed with this header (replacing what
  // was remembered of the member).
  void RememberCommitted(const std::string& exp, const std::string& member, Header header);
  // What the member's last commit said, when that commit was of `blob`
  // (nullopt otherwise: a head an exploit or an import set, or none seen).
  std::optional<Header> Committed(const std::string& exp, const std::string& member,
                                  const BlobId& blob) const;
  // A state of `bytes` of experiment `exp` was sent or committed.
  void NoteStateBytes(const std::string& exp, uint64_t bytes);
  // The largest state of `exp` noted; 0 when none.
  uint64_t StateBytes(const std::string& exp) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const StateLayout>> by_exp_;  // GUARDED_BY(mu_)
  std::map<std::pair<std::string, std::string>, Header> committed_;   // GUARDED_BY(mu_)
  std::map<std::string, uint64_t> state_bytes_;                       // GUARDED_BY(mu_)
};

// The CONFIGURE of each experiment the scheduler runs, registered by the
// scheduler (WorkerPool::AddExperiment) before it dispatches any of its tasks
// and read by the handles' sender threads before an experiment's first TRAIN
// to a worker: the settings flow one way, down, never asked back for.
// Shared by a pool's handles; thread-safe.
class ConfigureMessages {
 public:
  // Registers (or replaces) the CONFIGURE of `exp`.
  void Add(const std::string& exp, ipc::Configure message);
  // NotFound naming `exp` when it was never registered.
  StatusOr<std::shared_ptr<const ipc::Configure>> Find(const std::string& exp) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const ipc::Configure>> by_exp_;  // GUARDED_BY(mu_)
};

// The slots a HELLO may offer: at least 1, at most what a ckpt-worker can
// say (--slots up to 256, times --fusion-width up to 1024 when fused), and
// for a worker we spawned, at most its --slots x --fusion-width. The pool
// uses at most kMaxWorkerSlots of them (worker_pool.h).
inline constexpr int64_t kMaxHelloSlots = int64_t{256} * 1024;

// What a connected worker may send, checked at each message's first frame
// header before any of it is buffered (ipc::ReceiveLimit): a HELLO, STATS or
// FAILED (JSON alone) of at most ipc::kMaxMessageJsonBytes; a RESULT of at
// most the largest expected state among its tasks in flight
// (Task::expected_state_bytes; the store's blob limit while none is known)
// plus kResultSlackBytes; nothing of any other type. Anything else breaks its
// connection: the worker is lost.
inline constexpr uint64_t kResultSlackBytes = uint64_t{2} << 20;  // its JSON; the state's metadata

// What the receiver reports to the event loop.
struct WorkerEvent {
  // kConfigureRefused: the worker could not set up experiment `exp` (its
  // FAILED record with task id 0 and code kConfigureRefused).
  enum class Kind {
    kHello,
    kCommitted,
    kEvaluated,
    kFailed,
    kCommitError,
    kStats,
    kLost,
    kConfigureRefused,
    // The worker's RESULT did not answer its task (result_check.h): nothing
    // committed; the interval reruns from the committed head and the member
    // is not charged. `reason` says what was wrong.
    kBadResult
  };
  Kind kind = Kind::kLost;
  Task task;            // kCommitted, kEvaluated, kFailed, kCommitError, kBadResult
  int64_t version = 0;  // kCommitted
  ipc::Result result;   // kCommitted / kEvaluated (state: data null, size kept)
  ipc::Hello hello;     // kHello
  ipc::Stats stats;     // kStats
  // kFailed: the worker's; kCommitError: kCommitError, or kBadResult for a
  // RESULT that CheckResult refused (with commit_status kAborted: nothing was
  // committed, and like a head that moved the member is not charged).
  ipc::FailureCode code = ipc::FailureCode::kInternal;
  StatusCode commit_status = StatusCode::kOk;  // kCommitError: why the store refused
  // kCommitted: the store's answer to the member's state record written
  // after the commit (a refusal for want of space is written again later:
  // Experiment::OnRecordRefused).
  Status record_status;
  std::string reason;  // kFailed / kCommitError / kLost / kConfigureRefused
  std::string exp;     // kConfigureRefused
  // The worker's device entry ("cpu", "cuda:0", "r0@ADDRESS"), set by the
  // pool as it reports the event up, so that its listener never asks back.
  std::string device;
};

struct WorkerSpec {
  int index = 0;     // position in the pool
  std::string name;  // metrics label: "w<index>"
  records::DeviceConfig device;
  std::string binary;   // path of ckpt-worker
  std::string segment;  // shm name; "" for a remote worker
  size_t ring_bytes = records::kDefaultRingBytes;
  std::chrono::milliseconds heartbeat_timeout{10000};
  // A remote worker's largest RESULT while the state it carries is not
  // known yet (the store's blob limit and the record's fields).
  uint64_t max_message_bytes = 0;
  // Where store and ring timings go (thread-safe); nullptr: nowhere.
  metrics::Metrics* metrics = nullptr;
  // The experiments' state layouts, shared by the pool's handles; nullptr:
  // none kept (an initialised member's first state is then checked for
  // everything but its layout).
  StateLayouts* layouts = nullptr;
  // The experiments' CONFIGUREs (the pool's). Required.
  const ConfigureMessages* configures = nullptr;

  // The most slots this worker's HELLO may offer (kMaxHelloSlots for a
  // remote worker).
  int64_t MaxHelloSlots() const;
};

class WorkerHandle {
 public:
  using Callback = std::function<void(WorkerEvent)>;

  // Spawns the worker process on a new segment and starts both threads.
  static StatusOr<std::unique_ptr<WorkerHandle>> Start(const WorkerSpec& spec, store::Store* store,
                                                       Callback on_event);
  // Takes over the authenticated channel of a remote worker (ckpt-worker
  // --connect; ckpt/ipc/tcp_channel.h) and starts both threads. There is no
  // process: pid() is -1, Stop closes the connection (after SHUTDOWN when
  // graceful) and kills nothing.
  static std::unique_ptr<WorkerHandle> Adopt(const WorkerSpec& spec,
                                             std::unique_ptr<ipc::Channel> channel,
                                             store::Store* store, Callback on_event);
  ~WorkerHandle();

  void Enqueue(Task task);
  // Closes the channel, kills the process (SIGKILL unless `graceful`, then
  // SHUTDOWN and a wait of `grace`), joins the threads. Idempotent.
  void Stop(bool graceful, std::chrono::milliseconds grace);
  // After Stop: the tasks sent or queued that were not reported back.
  std::vector<Task> TakeUnfinished();
  // Of the tasks sent or queued and not reported back, the one dispatched
  // first (Task::dispatched); nullopt when none.
  std::optional<Task> OldestTask() const;

  pid_t pid() const { return pid_; }
  // VmHWM of the live process, 0 when it is gone.
  int64_t PeakRssBytes() const;
  const WorkerSpec& spec() const { return spec_; }
  ipc::ChannelStats ChannelStats() const;
  // Called by the event loop when waitpid reaped this process.
  void MarkExited(int wait_status);
  bool exited() const { return exited_.load(); }

 private:
  WorkerHandle(const WorkerSpec& spec, store::Store* store, Callback on_event);
  Status Spawn();
  void SendLoop();
  void ReceiveLoop();
  void SendLoopBody();
  void ReceiveLoopBody();
  Status SendTask(const Task& task);
  void HandleResult(const ipc::Received& rec);
  // CheckResult for `task`, and for an initialised member's first state the
  // experiment's layout (established by this result when none is known).
  // For a training result, sets `*view` to the verified parse of its state
  // and `*layout` to its layout (shared with the expected one).
  Status CheckAgainstTask(const Task& task, const ipc::Result& r,
                          std::optional<format::CheckpointView>* view,
                          std::shared_ptr<const StateLayout>* layout) const;
  // A RESULT that does not answer its task: logged, counted, reported.
  void RefuseResult(WorkerEvent e, const Status& why);
  // "worker 3 (r0@10.0.0.7:41234)".
  std::string Name() const;
  // A remote worker's ipc::ReceiveLimit (see kResultSlackBytes).
  Status AllowReceive(ipc::RecordType type, uint64_t bytes) const;
  // "worker N (pid P) killed by signal S" or "... exited with status X".
  std::string ExitDescription(int wait_status) const;
  void ReportLost(const std::string& reason);

  const WorkerSpec spec_;
  store::Store* const store_;
  const Callback on_event_;
  std::unique_ptr<ipc::Channel> channel_;
  pid_t pid_ = -1;
  std::atomic<bool> exited_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> lost_reported_{false};

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;              // GUARDED_BY(mu_)
  std::map<uint64_t, Task> in_flight_;  // GUARDED_BY(mu_): sent, not reported
  std::set<std::string> configured_;    // sender thread only

  std::thread sender_;
  std::thread receiver_;
  bool stopped_ = false;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_WORKER_HANDLE_H_
