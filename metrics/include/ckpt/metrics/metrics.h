// ckpt::metrics::Metrics: the Prometheus metrics of one ckpt scheduler process.
//
// One Metrics per scheduler, owned by the caller (Open returns it). It owns a
// registry of metric families (registered once, at Open), an HTTP listener that serves them as the
// Prometheus text format on GET /metrics, and two samplers that run when a scrape asks for their
// figures, on the listener's thread:
//   - the process sampler reads /proc for the CPU seconds and resident memory
//     of this process and of every worker process announced with WorkerStarted;
//   - the GPU sampler reads NVML, opened at run time with
//     dlopen("libnvidia-ml.so.1"), so neither the build nor a CPU host needs
//     the driver. Without NVML (no library, no driver, no device) the ckpt_gpu_*
//     families are absent, gpu_status() says why, and Open logs that reason in
//     one line (MetricsOptions::log).
//
// The scheduler reports what it sees (intervals committed, worker STATS,
// members by state, exploits, failures, store and ring figures) through the
// plain methods below, outside the training step. Counters named *_total only
// go up: methods that take a running total (a worker's samples, a channel's
// bytes) add the difference to the previous total, and a total that went down
// (the worker restarted, the channel was recreated) counts as a fresh start.
//
// Families (every name has the ckpt_ prefix, base units, _total on counters):
//   labels {experiment, device}:
//     ckpt_interval_duration_seconds    histogram  a member-interval, dispatch to commit
//     ckpt_trained_samples_total        counter    samples of committed intervals
//   labels {experiment}:
//     ckpt_exploits_total               counter    PBT exploits
//     ckpt_best_score                   gauge      best member score (higher is better)
//     ckpt_median_score                 gauge      median member score
//                                                  (both labelled metric="accuracy" |
//                                                  "neg_mse" | "r2": what the score is)
//   labels {experiment, state}:  state: records::MemberStatusName (ckpt/records/status.h)
//     ckpt_members                      gauge      members in each state
//   labels {experiment, reason}: reason: ipc::FailureCodeName of the member failure
//                                codes (ckpt/ipc/failure_code.h)
//     ckpt_member_failures_total        counter    member-intervals that failed
//   labels {op}: op in StoreOp
//     ckpt_store_operation_duration_seconds  histogram
//     ckpt_store_bytes_total            counter    bytes the operation wrote or read
//   labels {worker, device}:
//     ckpt_worker_samples_total         counter    samples trained (from STATS)
//     ckpt_worker_slots                 gauge      training slots
//     ckpt_worker_slots_busy            gauge      slots training a member
//     ckpt_worker_fused                 gauge      1 when the worker trains fused, 0 plain
//     ckpt_worker_allocator_allocated_bytes  gauge device allocator memory in tensors
//     ckpt_worker_allocator_reserved_bytes   gauge device allocator memory held
//     ckpt_worker_restarts_total        counter    starts after the first
//     ckpt_worker_cpu_seconds_total     counter    user + system CPU (process sampler)
//     ckpt_worker_resident_memory_bytes gauge      RSS (process sampler)
//     ckpt_ring_send_duration_seconds   histogram  writing one record into the request ring
//     ckpt_ring_used_bytes              gauge      bytes in flight on the request ring
//     ckpt_ring_capacity_bytes          gauge      request ring's window (grows with its records)
//     ckpt_ring_bad_records_total       counter    records rejected as corrupt
//   labels {worker, device, direction}: direction "to_worker" | "from_worker"
//     ckpt_ring_bytes_total             counter    record bytes moved
//   no labels:
//     ckpt_scheduler_cpu_seconds_total  counter    this process (process sampler)
//     ckpt_scheduler_resident_memory_bytes  gauge  this process (process sampler)
//     ckpt_host_cpus                    gauge      CPUs this process may run on
//     ckpt_metrics_dropped_updates_total  counter  updates over the bounds below
//     ckpt_remote_slots_capped_total    counter    HELLOs of connected workers offering more
//                                                  than [workers] max_remote_slots (clamped)
//     ckpt_remote_task_timeouts_total   counter    connected workers lost to an interval past
//                                                  its deadline (its intervals requeued)
//   labels {device} (GPU sampler; absent without NVML):
//     ckpt_gpu_utilization_ratio        gauge      busy fraction of the last sample period
//     ckpt_gpu_memory_used_bytes        gauge
//     ckpt_gpu_memory_total_bytes       gauge
//   labels {device, worker} (GPU sampler; absent without NVML):
//     ckpt_gpu_process_memory_bytes     gauge      a worker process's own GPU memory
//                                                  (NVML names processes by the host's
//                                                  pids: a scheduler inside a container's
//                                                  PID namespace gets no series)
//
// GET /metrics also carries prometheus-cpp's own exposer_* families (scrapes,
// bytes served, request latency); RenderText() does not.
//
// Labels are bounded: experiment, device and worker are names the scheduler
// chose from its configuration; op, state, reason and direction come from the
// enums below. A member or version never becomes a label. As a guard against a
// caller that passes one anyway, at most MetricsOptions::max_experiments
// experiments and max_workers workers get series; updates naming one more are
// dropped (ckpt_metrics_dropped_updates_total counts them) and logged once.
//
// GPU devices are labelled "cuda:N". N is the CUDA ordinal the scheduler's
// workers see when CUDA_DEVICE_ORDER=PCI_BUS_ID (NVML's order): with
// CUDA_VISIBLE_DEVICES set in this process, its k-th entry (an NVML index or a
// GPU UUID) is "cuda:k" and devices not listed are not reported.
//
// Thread-safety: every method may be called from any thread, concurrently with
// each other and with scrapes. An update takes the metrics' own mutex and, to
// create a series or observe a histogram, a prometheus-cpp mutex that a scrape
// holds only while it copies values; it never waits for I/O, the samplers (a
// scrape stuck in NVML included) or an HTTP client. Scrapes are served by the
// listener's own threads. Counter updates cost tens of nanoseconds
// (`ckpt-bench metrics`).
#ifndef CKPT_METRICS_METRICS_H_
#define CKPT_METRICS_METRICS_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/task.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/records/status.h"

namespace ckpt::metrics {

// Levels of the library's few log lines.
enum class LogLevel { kInfo, kWarning, kError };

struct MetricsOptions {
  // "HOST:PORT" the HTTP listener binds, HOST a numeric IPv4 address
  // ("127.0.0.1:9464"; "0.0.0.0:9464" for every interface; IPv6 is refused,
  // the HTTP server being built without it). PORT 0 picks a free port (see
  // port()).
  // "" runs no listener: the registry still records, RenderText() still works.
  // A bare port is refused (InvalidArgument): the listener never binds every
  // interface unless the address says so. Default: "127.0.0.1:9464".
  std::string listen = "127.0.0.1:9464";
  // Threads serving scrapes. Default: 2. REQUIRES: >= 1.
  int http_threads = 2;
  // Sample GPUs through NVML. Default: true.
  bool gpu = true;
  // The NVML library dlopen()ed when `gpu`. Default: "libnvidia-ml.so.1".
  std::string nvml_library = "libnvidia-ml.so.1";
  // Experiments that get series; updates for more are dropped. Default: 64.
  size_t max_experiments = 64;
  // Workers that get series; updates for more are dropped. Default: 256.
  size_t max_workers = 256;
  // Receives the library's log lines: at Open, why there are no GPU
  // families (kInfo); the first update over max_experiments or max_workers
  // (kWarning); a sampler that failed during a scrape (kError). Called on the
  // thread that caused the line, possibly with the library's lock held: it
  // must not call into this Metrics. Default (empty): the process's logger
  // (ckpt/logging/logging.h).
  std::function<void(LogLevel level, const std::string& line)> log;
};

// Members of one experiment in each state.
struct MemberCounts {
  int64_t idle = 0;
  int64_t queued = 0;
  int64_t running = 0;
  int64_t done = 0;
  int64_t stopped = 0;
  int64_t failed = 0;
};

// A store operation, as labelled by the ckpt_store_* families {op}.
enum class StoreOp {
  kCommitResult,    // "commit_result"
  kReadHeadBlob,    // "read_head_blob"
  kExploit,         // "exploit"
  kSetMemberState,  // "set_member_state"
  kAppendEvent,     // "append_event"
  kRestore,         // "restore"
  kFlush,           // "flush"
};
inline constexpr int kStoreOpCount = 7;
std::string_view StoreOpName(StoreOp op);

// A worker's STATS record, as the scheduler decoded it.
struct WorkerStats {
  // Samples trained since the worker process started (a running total).
  uint64_t samples_total = 0;
  int64_t slots = 0;
  int64_t slots_busy = 0;
  bool fused = false;
  // Device allocator memory; nullopt when the worker does not report it (the
  // family then has no series for this worker).
  std::optional<int64_t> allocator_allocated_bytes;
  std::optional<int64_t> allocator_reserved_bytes;
};

// One GPU as NVML sees it now (Metrics::SampleGpus). Each figure is absent
// when NVML refuses it for the device.
struct GpuFigures {
  std::string device;                         // "cuda:K", by the CUDA ordinal the workers see
  std::optional<double> utilization;          // 0..1 over NVML's last sample period
  std::optional<uint64_t> memory_used_bytes;  // by every process on the GPU
  std::optional<uint64_t> memory_total_bytes;
};

// The scheduler's view of one worker's channel (ipc::ChannelStats).
struct RingStats {
  uint64_t bytes_to_worker_total = 0;    // running total since the channel was created
  uint64_t bytes_from_worker_total = 0;  // running total
  uint64_t bad_records_total = 0;        // running total
  uint64_t used_bytes = 0;               // in flight on the request ring now
  uint64_t capacity_bytes = 0;           // the request ring's window: what its records use
};

class Metrics {
 public:
  // Registers every family and, unless options.listen is "", starts the HTTP
  // listener. Returns InvalidArgument for a malformed listen address (naming
  // it) or http_threads < 1; Unavailable naming the address and the system's
  // reason when it cannot be bound (in use, not an address of this host, not
  // permitted); Internal for a failure inside prometheus-cpp.
  static StatusOr<std::unique_ptr<Metrics>> Open(const MetricsOptions& options);

  // Stops the listener (an in-progress scrape completes first). After a scrape
  // this takes up to 2 s: civetweb stops its threads on a 2-second poll.
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The port the listener is bound to (the chosen one when options.listen
  // asked for port 0); 0 when there is no listener.
  int port() const;
  // "" when the GPU sampler reads NVML; otherwise why it does not ("NVML
  // disabled by options", "dlopen libnvidia-ml.so.1: ...", "nvmlInit: ...",
  // "no NVML device visible").
  const std::string& gpu_status() const;

  // Every family, samplers included, in the Prometheus text exposition format
  // 0.0.4: what GET /metrics answers. Runs the samplers on the calling thread;
  // for tests and tools, not for the scheduler's event loop.
  std::string RenderText() const;

  // One NVML sample of every visible GPU, in "cuda:K" order; empty when
  // gpu_status() is not "" (no NVML). What `ckpt-tool workers` and `top` show
  // beside each local worker on a GPU. Any thread; a few NVML calls per GPU.
  std::vector<GpuFigures> SampleGpus() const;

  // --- per experiment -------------------------------------------------------
  // A member-interval of `experiment` trained on `device` was committed:
  // observes `seconds` (dispatch to commit) and adds `samples`.
  void IntervalCommitted(std::string_view experiment, std::string_view device, double seconds,
                         uint64_t samples);
  // Sets ckpt_members{experiment, state} for all six states.
  void SetMemberCounts(std::string_view experiment, const MemberCounts& counts);
  // One PBT exploit in `experiment`.
  void Exploited(std::string_view experiment);
  // One member-interval of `experiment` failed for `reason`.
  void MemberFailed(std::string_view experiment, ipc::FailureCode reason);
  // Best and median score of the population (NaN: no score yet), of the
  // experiment's `metric`.
  void SetScores(std::string_view experiment, format::MetricKind metric, double best,
                 double median);
  // Removes every series labelled with `experiment` (it was deleted or
  // finished in a long-running service), so that it no longer counts against
  // max_experiments.
  void ForgetExperiment(std::string_view experiment);

  // --- store ----------------------------------------------------------------
  // One store operation took `seconds` and wrote or read `bytes`.
  void StoreOperation(StoreOp op, double seconds, uint64_t bytes);

  // --- per worker -----------------------------------------------------------
  // Worker `worker` (on `device`) runs as process `pid`. From now on the
  // process sampler reports its CPU and memory and the GPU sampler its GPU
  // memory. The first start of a worker creates its restarts counter at 0;
  // every later start (a new pid for the same worker) counts one restart.
  // REQUIRES: pid > 0.
  void WorkerStarted(std::string_view worker, std::string_view device, pid_t pid);
  // Worker `worker`'s process is gone: the samplers stop reporting it and its
  // gauges (slots, allocator, ring occupancy) are removed; its counters stay.
  void WorkerExited(std::string_view worker, std::string_view device);
  // The figures of a STATS record of `worker`.
  void SetWorkerStats(std::string_view worker, std::string_view device, const WorkerStats& stats);
  // The figures of `worker`'s channel.
  void SetRingStats(std::string_view worker, std::string_view device, const RingStats& stats);
  // A connected worker's HELLO offered more slots than [workers]
  // max_remote_slots; it was given the cap.
  void RemoteSlotsCapped();
  // A connected worker was lost because one of its intervals ran past its
  // deadline ([workers] task_timeout_*).
  void RemoteTaskTimedOut();
  // Writing one record into `worker`'s request ring (reserve, copy, commit,
  // including any wait for space) took `seconds`.
  void RingSendObserved(std::string_view worker, std::string_view device, double seconds);

 private:
  class Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_METRICS_H_
