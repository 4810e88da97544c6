// WorkerPool: the scheduler's worker processes, one per expanded device entry
// (private to ckpt::scheduler). It spawns them (WorkerHandle), reaps them,
// restarts a lost one after a backoff, gives up on one that keeps dying, and
// reports what its workers say to a listener on the event loop.
//
// Remote workers (StartListening): with `listen` set the pool also accepts
// `ckpt-worker --connect` workers on a TcpListener (ckpt/ipc/tcp_channel.h),
// which authenticates each connection asynchronously on its own thread, each
// with a deadline, and posts each authenticated channel to the event loop,
// where it becomes one more worker entry ("r<N>", labelled by its address)
// that takes tasks after its HELLO like any other. A lost remote worker is a loss like
// any other (its unfinished tasks go back to the listener) but is not
// restarted: whoever launched it may connect again, as new workers may at any
// time. While listening, OnAllGivenUp is never reported: the run waits for
// workers to connect.
//
// Supervision: a worker that dies, hangs (heartbeat; or, before it has
// attached to its ring, no HELLO within StartDeadline) or breaks its ring is
// lost: its handle is stopped, its unfinished tasks go to the listener to be
// requeued, and it is restarted after a delay that doubles per restart up to
// max_restart_backoff and starts again from restart_backoff after a healthy
// uptime. After max_restarts restarts it is given up on; when every worker is,
// the listener hears OnAllGivenUp.
//
// Ownership: the pool owns its handles and timers; the store, io_context and
// listener must outlive it.
// Thread-safety: every method runs on the event loop (the io_context's
// thread); handle callbacks are posted there, and events of a previous
// incarnation of a worker are dropped.
#ifndef CKPT_SCHEDULER_WORKER_POOL_H_
#define CKPT_SCHEDULER_WORKER_POOL_H_

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/tcp_channel.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/summary.h"
#include "dispatcher.h"
#include "worker_handle.h"

namespace ckpt::scheduler {

using Clock = std::chrono::steady_clock;

// Device entries with `count` and "auto" expanded: one entry per worker.
// "auto" is one worker per GPU this process's CUDA would show (the NVIDIA
// driver's GPUs, /proc/driver/nvidia/gpus or /dev/nvidiaN, narrowed by
// CUDA_VISIBLE_DEVICES), else the CPU; `count` workers each.
std::vector<records::DeviceConfig> ExpandDevices(const std::vector<records::DeviceConfig>& devices);

// The delay before restarting a worker that was lost after `uptime`, whose
// previous delay was `previous` (0: none yet).
std::chrono::milliseconds NextRestartDelay(std::chrono::milliseconds previous,
                                           Clock::duration uptime,
                                           const records::SupervisionOptions& s);

// How long a started worker may take to say HELLO: its heartbeat only starts
// once it has attached to its ring, so one that hangs while loading (or is
// stopped) before that is noticed by this deadline alone. The heartbeat
// timeout, and never under 30 s (loading LibTorch on a busy machine).
std::chrono::milliseconds StartDeadline(const records::SupervisionOptions& s);

class WorkerPoolListener {
 public:
  virtual ~WorkerPoolListener() = default;
  // A worker said HELLO: it has capacity for tasks.
  virtual void OnWorkerReady(size_t worker) = 0;
  // A task's outcome (kCommitted, kEvaluated, kFailed, kCommitError, kBadResult) or a
  // refused CONFIGURE (kConfigureRefused), from the worker's current
  // incarnation, with the worker's device in event.device. The worker's busy
  // count is already decremented.
  virtual void OnTaskEvent(size_t worker, WorkerEvent event) = 0;
  // A worker (on `device`) was lost; `unfinished` are the tasks it was given
  // and never reported (to requeue). `given_up`: it will not be restarted.
  virtual void OnWorkerLost(size_t worker, const std::string& device, const std::string& reason,
                            std::vector<Task> unfinished, bool given_up) = 0;
  // Every worker has been given up on.
  virtual void OnAllGivenUp(const std::string& last_reason) = 0;
};

// Remote workers connected at once, by default (WorkerPoolOptions).
inline constexpr int kDefaultMaxRemoteWorkers = 64;
// The most tasks one worker may run at once, whatever its HELLO offers.
inline constexpr int kMaxWorkerSlots = 256;
// A worker whose RESULTs fail result_check.h this many times in a row is
// dropped as lost (a local one is restarted, a remote one's connection
// closed): a broken or lying worker must not keep taking intervals forever.
inline constexpr int kMaxBadResultsInRow = 3;

struct WorkerPoolOptions {
  // Expanded device entries (ExpandDevices), one worker each. Required.
  std::vector<records::DeviceConfig> devices;
  // Path of ckpt-worker (FindWorkerBinary). Required.
  std::string binary;
  // Segment name prefix; worker i uses "<instance>-w<i>". Required.
  std::string instance;
  // Bytes of each ring. Default: kDefaultRingBytes.
  size_t ring_bytes = records::kDefaultRingBytes;
  records::SupervisionOptions supervision;
  // Where worker starts, exits, STATS and ring figures go; nullptr: nowhere.
  metrics::Metrics* metrics = nullptr;
  // "HOST:PORT" to accept remote workers on (port 0: ephemeral); "" = none.
  // Default: "".
  std::string listen;
  // The secret remote workers must prove they hold; created (0600) when
  // absent. Required with listen. Default: "".
  std::string secret_file;
  // Where the bound address is written ("HOST:PORT\n"); "" = nowhere.
  // Default: "".
  std::string address_file;
  // Remote workers connected at once; one more is closed at once (logged).
  // A lost one releases its channel and threads; its entry (index, device
  // name) stays so that logs and commits name one connection each.
  // Default: kDefaultMaxRemoteWorkers.
  int max_remote_workers = kDefaultMaxRemoteWorkers;
  // The largest record a remote worker may send (and be sent): the store's
  // blob limit plus room for the record's other fields. Default: the default
  // store's (ipc::kDefaultTcpMaxMessageBytes).
  size_t max_message_bytes = ipc::kDefaultTcpMaxMessageBytes;
  // Bytes the received messages of every remote worker may hold together
  // (ipc::ReceiveBudget; records::RemoteWorkersConfig::remote_memory_bytes).
  // Default: 2 GiB.
  uint64_t remote_memory_bytes = uint64_t{2048} << 20;
  // The most slots a remote worker is given, whatever its HELLO offers.
  // Default: 64.
  int max_remote_slots = 64;
  // A remote worker's task unanswered past task_timeout_factor x the median
  // training interval seen plus task_timeout_floor (none seen yet: the floor
  // x (factor + 1)) loses the worker (RemoteTaskDeadline). Defaults: 10, 60 s.
  double task_timeout_factor = 10;
  std::chrono::milliseconds task_timeout_floor{60000};
};

// How long a remote worker's task may go unanswered, from the training
// intervals seen so far (`durations`, any order; empty: none yet).
std::chrono::milliseconds RemoteTaskDeadline(std::vector<Clock::duration> durations, double factor,
                                             std::chrono::milliseconds floor);

// The training intervals whose durations RemoteTaskDeadline is given: the
// latest this many.
inline constexpr size_t kIntervalsRemembered = 255;

class WorkerPool : public TaskSink {
 public:
  WorkerPool(boost::asio::io_context& io, store::Store* store, WorkerPoolOptions options,
             WorkerPoolListener* listener);
  ~WorkerPool();

  // Registers the CONFIGURE of experiment `exp`, which its workers are sent
  // before its first TRAIN. REQUIRES: before any task of `exp` is Sent.
  void AddExperiment(const std::string& exp, ipc::Configure configure) {
    configures_.Add(exp, std::move(configure));
  }

  // Spawns every worker; one that fails to start is handled as lost.
  void StartAll();
  // With options.listen set: loads (or creates) the secret file, binds the
  // listener, logs "listening for workers on HOST:PORT", writes the address
  // file and starts accepting. OK and nothing when listen is "". Errors:
  // FailedPrecondition for a secret file that is too open or short,
  // InvalidArgument / Unavailable for an address that cannot be bound, IOError
  // for the address file.
  ckpt::Status StartListening();
  // Reaps exited children (on SIGCHLD); their loss is reported.
  void Reap();

  // The ready worker with the most free capacity, counting `per_slot`
  // in-flight tasks per slot; -1 when none has room.
  int PickFree(int per_slot) const override;
  // Hands a task to worker `i`. REQUIRES: PickFree returned i.
  void Send(size_t i, Task task) override;

  // The scheduler is stopping: a worker lost from now on is not restarted.
  void Drain() { draining_ = true; }
  // Stops every worker (graceful: SHUTDOWN, then up to 2 s) and cancels
  // restarts. Idempotent.
  void StopAll(bool graceful);

  // Hands each live worker's channel figures to the metrics (on the tick).
  void ReportRingStats() const;

  std::vector<WorkerStatus> Status() const;
  size_t size() const { return workers_.size(); }
  // Sum over every worker process run of its peak resident set.
  int64_t PeakRssBytes() const;
  // One entry per worker index: the configured devices, then one per remote
  // worker connected (device "r<N>@ADDRESS"). A remote worker's entry is
  // reused by a later connection once it was lost, so the list holds at
  // most the devices plus the most remote workers ever connected at once.
  const std::vector<records::DeviceConfig>& devices() const { return devices_; }
  // The remote memory budget, while listening (null otherwise).
  const ipc::ReceiveBudget* remote_budget() const { return budget_.get(); }

 private:
  struct Worker {
    WorkerSpec spec;
    std::unique_ptr<WorkerHandle> handle;
    uint64_t incarnation = 0;
    bool ready = false;
    int capacity = 0;
    int busy = 0;
    int restarts = 0;
    std::chrono::milliseconds backoff{0};
    Clock::time_point started;
    bool given_up = false;
    std::unique_ptr<boost::asio::steady_timer> restart_timer;
    std::unique_ptr<boost::asio::steady_timer> hello_timer;  // StartDeadline
    double samples_per_s = 0;
    int bad_results_in_row = 0;           // kBadResult events since its last commit
    int64_t rss_bytes = 0;                // last STATS
    int64_t device_memory_bytes = 0;      // last STATS: the device allocator's
    std::optional<ipc::FusionMode> mode;  // the worker's HELLO/STATS mode
    int64_t peak_rss_total = 0;           // over this worker's incarnations
    bool remote = false;                  // connected over TCP; never restarted
    std::string peer;                     // remote: "ADDRESS:PORT"
  };

  void Start(size_t i);
  void ArmHelloTimer(size_t i, uint64_t incarnation);
  // On the event loop: a remote worker authenticated by the listener; closed
  // at once past max_remote_workers.
  void AddRemote(ipc::Accepted accepted);
  void StopListening();
  // Every second while listening: loses each remote worker holding a task
  // past RemoteTaskDeadline.
  void ArmDeadlineTimer();
  void CheckRemoteDeadlines();
  // The entry for a new remote connection: a lost remote worker's, else a new one.
  size_t RemoteEntry();
  void OnEvent(size_t i, uint64_t incarnation, WorkerEvent ev);
  void OnLost(size_t i, const std::string& reason);
  // A training interval took `d`, dispatch to commit.
  void NoteInterval(Clock::duration d);
  // Reports a task event of worker `i` to the listener, with its device (the
  // event's own when set).
  void ForwardTaskEvent(size_t i, WorkerEvent ev);

  boost::asio::io_context& io_;
  store::Store* const store_;
  const WorkerPoolOptions options_;
  WorkerPoolListener* const listener_;
  // Shared by every handle (WorkerSpec::layouts, ::configures): outlive them.
  StateLayouts layouts_;
  ConfigureMessages configures_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::vector<records::DeviceConfig> devices_;  // devices() for every entry of workers_
  bool draining_ = false;
  bool stopped_ = false;
  int remotes_ = 0;                   // remote workers ever connected: the N of "r<N>"
  uint64_t remotes_turned_away_ = 0;  // past max_remote_workers

  // Its thread authenticates connections and posts them to io_.
  std::unique_ptr<ipc::TcpListener> listener_socket_;
  std::shared_ptr<ipc::ReceiveBudget> budget_;  // the remote workers' (null: not listening)
  std::unique_ptr<boost::asio::steady_timer> deadline_timer_;
  // The latest training intervals' durations, dispatch to commit (at most
  // kIntervalsRemembered; the oldest replaced first at interval_next_).
  std::vector<Clock::duration> intervals_;
  size_t interval_next_ = 0;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_WORKER_POOL_H_
