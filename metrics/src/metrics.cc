// The prometheus-cpp adapter: the one file of ckpt that includes prometheus-cpp
// (and civetweb through it). Its exceptions are caught here and become a Status.
#include "ckpt/metrics/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/metric_family.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/logging/logging.h"
#include "nvml_sampler.h"
#include "process_sampler.h"

namespace ckpt::metrics {

std::string_view StoreOpName(StoreOp op) {
  switch (op) {
    case StoreOp::kCommitResult:
      return "commit_result";
    case StoreOp::kReadHeadBlob:
      return "read_head_blob";
    case StoreOp::kExploit:
      return "exploit";
    case StoreOp::kSetMemberState:
      return "set_member_state";
    case StoreOp::kAppendEvent:
      return "append_event";
    case StoreOp::kRestore:
      return "restore";
    case StoreOp::kFlush:
      return "flush";
  }
  return "unknown";
}

namespace {

using prometheus::ClientMetric;
using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Upper bounds start, start*factor, ..., count of them.
std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> b;
  double v = start;
  for (int i = 0; i < count; ++i, v *= factor) b.push_back(v);
  return b;
}

// Interval: 5 ms .. ~11 min. Store: 10 us .. ~10 s. Ring send: 1 us .. ~8 s.
const std::vector<double>& IntervalBuckets() {
  static const std::vector<double> b = ExponentialBuckets(0.005, 2, 18);
  return b;
}
const std::vector<double>& StoreBuckets() {
  static const std::vector<double> b = ExponentialBuckets(1e-5, 2, 21);
  return b;
}
const std::vector<double>& RingBuckets() {
  static const std::vector<double> b = ExponentialBuckets(1e-6, 2, 24);
  return b;
}

// Adds what `total` grew by since `*last` to `counter`; a total below the last
// one is a new process or channel counting from zero.
void AddFromTotal(Counter* counter, uint64_t total, uint64_t* last) {
  const uint64_t delta = total >= *last ? total - *last : total;
  *last = total;
  if (delta > 0) counter->Increment(static_cast<double>(delta));
}

template <typename T>
void RemoveSeries(Family<T>* family, T** series) {
  if (*series != nullptr) family->Remove(*series);
  *series = nullptr;
}

// A key of two strings looked up by two string_views, without a copy.
struct PairLess {
  using is_transparent = void;
  template <typename A, typename B>
  bool operator()(const A& a, const B& b) const {
    return std::pair<std::string_view, std::string_view>(a.first, a.second) <
           std::pair<std::string_view, std::string_view>(b.first, b.second);
  }
};

// "HOST:PORT" with a numeric IPv4 host. IPv6 is refused: Debian's civetweb,
// which prometheus-cpp serves with, is built without it.
struct ListenAddress {
  sockaddr_in addr{};
};

StatusOr<ListenAddress> ParseListen(const std::string& listen) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("metrics listen address \"" + listen + "\": " + why);
  };
  if (!listen.empty() && listen.front() == '[') {
    return bad("IPv6 is not supported by the HTTP server (civetweb built without it)");
  }
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return bad("expected HOST:PORT with a numeric IPv4 host (127.0.0.1:9464, 0.0.0.0:9464)");
  }
  const std::string port_text = listen.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535) {
    return bad("port must be a number in 0..65535");
  }
  const std::string host = listen.substr(0, colon);
  ListenAddress out;
  out.addr.sin_family = AF_INET;
  out.addr.sin_port = htons(static_cast<uint16_t>(std::stoi(port_text)));
  if (inet_pton(AF_INET, host.c_str(), &out.addr.sin_addr) != 1) {
    return bad("host must be a numeric IPv4 address");
  }
  return out;
}

// Why binding `a` fails now (strerror), or "" when it would succeed. Binds as
// the listener does (SO_REUSEADDR), so a port in TIME_WAIT is not reported
// busy, and closes at once without listening.
std::string BindProbe(const ListenAddress& a) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("socket: ") + std::strerror(errno);
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string why;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.addr), sizeof(a.addr)) != 0) {
    why = std::strerror(errno);
  }
  ::close(fd);
  return why;
}

ClientMetric Sample(double value, MetricType type, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric m;
  m.label = std::move(labels);
  if (type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

MetricFamily MakeFamily(const char* name, const char* help, MetricType type) {
  MetricFamily f;
  f.name = name;
  f.help = help;
  f.type = type;
  return f;
}

using LogFn = std::function<void(LogLevel, const std::string&)>;

// MetricsOptions::log, or the process's logger (ckpt/logging/logging.h)
// when it is empty.
LogFn LogOrDefault(const LogFn& log) {
  if (log) return log;
  return [](LogLevel level, const std::string& line) {
    switch (level) {
      case LogLevel::kInfo:
        logging::Logger().info("{}", line);
        break;
      case LogLevel::kWarning:
        logging::Logger().warn("{}", line);
        break;
      case LogLevel::kError:
        logging::Logger().error("{}", line);
        break;
    }
  };
}

// The samplers, run when a scrape (or RenderText) collects: /proc for this
// process and the announced workers, NVML for the GPUs. Announcements come
// from the scheduler's threads; Collect from the listener's.
class SamplerCollectable : public prometheus::Collectable {
 public:
  SamplerCollectable(std::unique_ptr<NvmlSampler> nvml, LogFn log)
      : nvml_(std::move(nvml)), log_(std::move(log)) {}

  void AddWorker(std::string_view worker, std::string_view device, pid_t pid) {
    std::lock_guard<std::mutex> lock(mu_);
    for (WorkerProcess& w : workers_) {
      if (w.worker == worker && w.device == device) {
        w.pid = pid;
        w.start_ticks = 0;
        return;
      }
    }
    workers_.push_back(WorkerProcess{std::string(worker), std::string(device), pid, 0});
  }

  std::vector<GpuFigures> SampleGpus() const {
    std::vector<GpuFigures> out;
    if (nvml_ == nullptr) return out;
    for (const GpuSample& g : nvml_->Sample()) {
      out.push_back(GpuFigures{g.device, g.utilization, g.memory_used_bytes, g.memory_total_bytes});
    }
    return out;
  }

  void RemoveWorker(std::string_view worker, std::string_view device) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = workers_.begin(); it != workers_.end(); ++it) {
      if (it->worker == worker && it->device == device) {
        workers_.erase(it);
        return;
      }
    }
  }

  // A scrape thread is a thread root: nothing may escape into civetweb.
  std::vector<MetricFamily> Collect() const override {
    try {
      return CollectOrThrow();
    } catch (const std::exception& e) {
      log_(LogLevel::kError, std::string("metrics: sampler collection failed: ") + e.what());
      return {};
    }
  }

 private:
  struct WorkerProcess {
    std::string worker;
    std::string device;
    pid_t pid;
    // Start time of `pid` at its first sample (0: not sampled yet), so that a
    // reused pid is never reported as this worker.
    uint64_t start_ticks;
  };

  std::vector<MetricFamily> CollectOrThrow() const {
    std::vector<MetricFamily> out;
    const auto self = SampleProcess(::getpid());
    if (self.ok()) {
      out.push_back(MakeFamily("ckpt_scheduler_cpu_seconds_total",
                               "User and system CPU time of the scheduler process, in seconds.",
                               MetricType::Counter));
      out.back().metric.push_back(Sample(self->cpu_seconds, MetricType::Counter));
      out.push_back(MakeFamily("ckpt_scheduler_resident_memory_bytes",
                               "Resident memory of the scheduler process, in bytes.",
                               MetricType::Gauge));
      out.back().metric.push_back(
          Sample(static_cast<double>(self->resident_bytes), MetricType::Gauge));
    }
    out.push_back(
        MakeFamily("ckpt_host_cpus", "CPUs the scheduler process may run on.", MetricType::Gauge));
    out.back().metric.push_back(Sample(HostCpus(), MetricType::Gauge));

    std::vector<WorkerProcess> workers;
    {
      std::lock_guard<std::mutex> lock(mu_);
      workers = workers_;
    }
    MetricFamily cpu = MakeFamily("ckpt_worker_cpu_seconds_total",
                                  "User and system CPU time of a worker process, in seconds.",
                                  MetricType::Counter);
    MetricFamily rss =
        MakeFamily("ckpt_worker_resident_memory_bytes",
                   "Resident memory of a worker process, in bytes.", MetricType::Gauge);
    std::map<pid_t, const WorkerProcess*> by_pid;
    for (const WorkerProcess& w : workers) {
      const auto s =
          w.start_ticks == 0 ? SampleProcess(w.pid) : SampleProcessStartedAt(w.pid, w.start_ticks);
      if (!s.ok()) continue;
      if (w.start_ticks == 0) RememberStart(w, s->start_ticks);
      by_pid[w.pid] = &w;
      std::vector<ClientMetric::Label> labels{{"device", w.device}, {"worker", w.worker}};
      cpu.metric.push_back(Sample(s->cpu_seconds, MetricType::Counter, labels));
      rss.metric.push_back(
          Sample(static_cast<double>(s->resident_bytes), MetricType::Gauge, labels));
    }
    out.push_back(std::move(cpu));
    out.push_back(std::move(rss));

    if (nvml_ != nullptr) {
      MetricFamily util = MakeFamily(
          "ckpt_gpu_utilization_ratio",
          "Fraction of NVML's last sample period in which a kernel ran on the GPU (0..1).",
          MetricType::Gauge);
      MetricFamily used =
          MakeFamily("ckpt_gpu_memory_used_bytes", "GPU memory in use by all processes, in bytes.",
                     MetricType::Gauge);
      MetricFamily total =
          MakeFamily("ckpt_gpu_memory_total_bytes", "GPU memory, in bytes.", MetricType::Gauge);
      MetricFamily proc =
          MakeFamily("ckpt_gpu_process_memory_bytes",
                     "GPU memory held by a worker process, in bytes.", MetricType::Gauge);
      for (const GpuSample& g : nvml_->Sample()) {
        std::vector<ClientMetric::Label> labels{{"device", g.device}};
        if (g.utilization) util.metric.push_back(Sample(*g.utilization, MetricType::Gauge, labels));
        if (g.memory_used_bytes) {
          used.metric.push_back(
              Sample(static_cast<double>(*g.memory_used_bytes), MetricType::Gauge, labels));
        }
        if (g.memory_total_bytes) {
          total.metric.push_back(
              Sample(static_cast<double>(*g.memory_total_bytes), MetricType::Gauge, labels));
        }
        for (const GpuProcessSample& p : g.processes) {
          auto it = by_pid.find(static_cast<pid_t>(p.pid));
          if (it == by_pid.end()) continue;  // not one of ours
          proc.metric.push_back(Sample(static_cast<double>(p.used_bytes), MetricType::Gauge,
                                       {{"device", g.device}, {"worker", it->second->worker}}));
        }
      }
      out.push_back(std::move(util));
      out.push_back(std::move(used));
      out.push_back(std::move(total));
      out.push_back(std::move(proc));
    }
    return out;
  }

  void RememberStart(const WorkerProcess& sampled, uint64_t start_ticks) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (WorkerProcess& w : workers_) {
      if (w.worker == sampled.worker && w.device == sampled.device && w.pid == sampled.pid &&
          w.start_ticks == 0) {
        w.start_ticks = start_ticks;
      }
    }
  }

  const std::unique_ptr<NvmlSampler> nvml_;
  const LogFn log_;
  mutable std::mutex mu_;
  mutable std::vector<WorkerProcess> workers_;  // GUARDED_BY(mu_)
};

}  // namespace

class Metrics::Impl {
 public:
  explicit Impl(const MetricsOptions& options)
      : options_(options), log_(LogOrDefault(options.log)) {}

  ~Impl() {
    // The listener goes first, so no scrape runs while the rest is destroyed.
    exposer_.reset();
  }

  Status Init();

  int port() const { return port_; }
  const std::string& gpu_status() const { return gpu_status_; }
  std::vector<GpuFigures> SampleGpus() const { return samplers_->SampleGpus(); }
  std::string RenderText() const;

  void IntervalCommitted(std::string_view experiment, std::string_view device, double seconds,
                         uint64_t samples);
  void SetMemberCounts(std::string_view experiment, const MemberCounts& counts);
  void Exploited(std::string_view experiment);
  void MemberFailed(std::string_view experiment, ipc::FailureCode reason);
  void SetScores(std::string_view experiment, format::MetricKind metric, double best,
                 double median);
  void ForgetExperiment(std::string_view experiment);
  void StoreOperation(StoreOp op, double seconds, uint64_t bytes);
  void WorkerStarted(std::string_view worker, std::string_view device, pid_t pid);
  void WorkerExited(std::string_view worker, std::string_view device);
  void SetWorkerStats(std::string_view worker, std::string_view device, const WorkerStats& stats);
  void SetRingStats(std::string_view worker, std::string_view device, const RingStats& stats);
  void RingSendObserved(std::string_view worker, std::string_view device, double seconds);

 private:
  struct DeviceSeries {
    Histogram* interval_seconds = nullptr;
    Counter* trained_samples = nullptr;
  };
  // Series of one experiment. Counters exist from the experiment's first
  // update, at 0, so that rate() and increase() see their first increment.
  struct ExperimentSeries {
    Counter* exploits = nullptr;
    std::array<Counter*, ipc::kMemberFailureCodeCount> failures{};
    std::array<Gauge*, records::kMemberStatusCount> members{};  // from the first SetMemberCounts
    Gauge* best = nullptr;                                      // from the first SetScores
    Gauge* median = nullptr;
    std::map<std::string, DeviceSeries, std::less<>> devices;
  };
  struct WorkerSeries {
    Counter* samples = nullptr;
    uint64_t last_samples_total = 0;
    Counter* restarts = nullptr;
    bool started = false;
    Counter* ring_to_worker = nullptr;
    uint64_t last_to_worker = 0;
    Counter* ring_from_worker = nullptr;
    uint64_t last_from_worker = 0;
    Counter* ring_bad = nullptr;
    uint64_t last_bad = 0;
    // Gauges of a live process: created by its first report, removed at exit.
    Gauge* slots = nullptr;
    Gauge* slots_busy = nullptr;
    Gauge* fused = nullptr;
    Gauge* allocated = nullptr;
    Gauge* reserved = nullptr;
    Gauge* ring_used = nullptr;
    Gauge* ring_capacity = nullptr;
    Histogram* ring_send_seconds = nullptr;  // from the first RingSendObserved
  };

  ExperimentSeries* Experiment(std::string_view experiment);               // REQUIRES: mu_ held
  WorkerSeries* Worker(std::string_view worker, std::string_view device);  // REQUIRES: mu_ held
  void Dropped(std::string_view what);                                     // REQUIRES: mu_ held
  Gauge* EnsureGauge(Family<Gauge>* family, Gauge** gauge, std::string_view worker,
                     std::string_view device);
  void RemoveWorkerGauges(WorkerSeries* w);

  const MetricsOptions options_;
  const LogFn log_;
  std::string gpu_status_;
  int port_ = 0;
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<SamplerCollectable> samplers_;

  // Families, registered once by Init and owned by registry_.
  Family<Histogram>* interval_seconds_ = nullptr;
  Family<Counter>* trained_samples_ = nullptr;
  Family<Counter>* exploits_ = nullptr;
  Family<Counter>* failures_ = nullptr;
  Family<Gauge>* members_ = nullptr;
  Family<Gauge>* best_score_ = nullptr;
  Family<Gauge>* median_score_ = nullptr;
  Family<Histogram>* store_seconds_ = nullptr;
  Family<Counter>* store_bytes_ = nullptr;
  Family<Counter>* worker_samples_ = nullptr;
  Family<Gauge>* slots_ = nullptr;
  Family<Gauge>* slots_busy_ = nullptr;
  Family<Gauge>* fused_ = nullptr;
  Family<Gauge>* allocated_ = nullptr;
  Family<Gauge>* reserved_ = nullptr;
  Family<Counter>* restarts_ = nullptr;
  Family<Histogram>* ring_send_seconds_ = nullptr;
  Family<Gauge>* ring_used_ = nullptr;
  Family<Gauge>* ring_capacity_ = nullptr;
  Family<Counter>* ring_bad_ = nullptr;
  Family<Counter>* ring_bytes_ = nullptr;
  Counter* dropped_ = nullptr;
  // The store families have one series per op, made by Init: no lookup per update.
  std::array<Histogram*, kStoreOpCount> store_op_seconds_{};
  std::array<Counter*, kStoreOpCount> store_op_bytes_{};

  std::mutex mu_;
  std::map<std::string, ExperimentSeries, std::less<>> experiments_;  // GUARDED_BY(mu_)
  std::map<std::pair<std::string, std::string>, WorkerSeries, PairLess>
      workers_;               // GUARDED_BY(mu_)
  bool logged_drop_ = false;  // GUARDED_BY(mu_)

  // Declared last, destroyed first (and reset explicitly by ~Impl).
  std::unique_ptr<prometheus::Exposer> exposer_;
};

Status Metrics::Impl::Init() {
  if (options_.http_threads < 1) {
    return Status::InvalidArgument("metrics http_threads must be >= 1, not " +
                                   std::to_string(options_.http_threads));
  }
  std::optional<ListenAddress> address;
  if (!options_.listen.empty()) {
    CKPT_ASSIGN_OR_RETURN(address, ParseListen(options_.listen));
    if (std::string why = BindProbe(*address); !why.empty()) {
      return Status::Unavailable("metrics listener " + options_.listen + ": cannot bind: " + why);
    }
  }

  std::unique_ptr<NvmlSampler> nvml;
  if (!options_.gpu) {
    gpu_status_ = "NVML disabled by options";
  } else {
    auto opened = NvmlSampler::Open(options_.nvml_library);
    if (opened.ok()) {
      nvml = std::move(*opened);
    } else {
      gpu_status_ = opened.status().message();
      log_(LogLevel::kInfo, "metrics: no GPU metrics (ckpt_gpu_* absent): " + gpu_status_);
    }
  }

  try {
    registry_ = std::make_shared<prometheus::Registry>();
    samplers_ = std::make_shared<SamplerCollectable>(std::move(nvml), log_);
    auto& r = *registry_;
    interval_seconds_ =
        &prometheus::BuildHistogram()
             .Name("ckpt_interval_duration_seconds")
             .Help("Wall time of a member-interval, from dispatch to the committed result.")
             .Register(r);
    trained_samples_ = &prometheus::BuildCounter()
                            .Name("ckpt_trained_samples_total")
                            .Help("Training samples of committed member-intervals.")
                            .Register(r);
    exploits_ = &prometheus::BuildCounter()
                     .Name("ckpt_exploits_total")
                     .Help("PBT exploits: a member took a better member's weights.")
                     .Register(r);
    failures_ = &prometheus::BuildCounter()
                     .Name("ckpt_member_failures_total")
                     .Help("Member-intervals that failed, by reason.")
                     .Register(r);
    members_ = &prometheus::BuildGauge()
                    .Name("ckpt_members")
                    .Help("Members of an experiment in each scheduling state.")
                    .Register(r);
    best_score_ = &prometheus::BuildGauge()
                       .Name("ckpt_best_score")
                       .Help("Best member score of the population (higher is better).")
                       .Register(r);
    median_score_ = &prometheus::BuildGauge()
                         .Name("ckpt_median_score")
                         .Help("Median member score of the population.")
                         .Register(r);
    store_seconds_ = &prometheus::BuildHistogram()
                          .Name("ckpt_store_operation_duration_seconds")
                          .Help("Duration of a checkpoint store operation.")
                          .Register(r);
    store_bytes_ = &prometheus::BuildCounter()
                        .Name("ckpt_store_bytes_total")
                        .Help("Bytes written or read by checkpoint store operations.")
                        .Register(r);
    worker_samples_ = &prometheus::BuildCounter()
                           .Name("ckpt_worker_samples_total")
                           .Help("Training samples a worker trained (its STATS records).")
                           .Register(r);
    slots_ = &prometheus::BuildGauge()
                  .Name("ckpt_worker_slots")
                  .Help("Training slots of a worker.")
                  .Register(r);
    slots_busy_ = &prometheus::BuildGauge()
                       .Name("ckpt_worker_slots_busy")
                       .Help("Training slots of a worker that hold a member.")
                       .Register(r);
    fused_ = &prometheus::BuildGauge()
                  .Name("ckpt_worker_fused")
                  .Help("1 when the worker trains members fused as one wide model, 0 plain.")
                  .Register(r);
    allocated_ = &prometheus::BuildGauge()
                      .Name("ckpt_worker_allocator_allocated_bytes")
                      .Help("Device allocator memory a worker's tensors occupy, in bytes.")
                      .Register(r);
    reserved_ = &prometheus::BuildGauge()
                     .Name("ckpt_worker_allocator_reserved_bytes")
                     .Help("Device allocator memory a worker holds, in bytes.")
                     .Register(r);
    restarts_ = &prometheus::BuildCounter()
                     .Name("ckpt_worker_restarts_total")
                     .Help("Starts of a worker after its first.")
                     .Register(r);
    ring_send_seconds_ =
        &prometheus::BuildHistogram()
             .Name("ckpt_ring_send_duration_seconds")
             .Help("Time to write one record into a worker's request ring, waits included.")
             .Register(r);
    ring_used_ = &prometheus::BuildGauge()
                      .Name("ckpt_ring_used_bytes")
                      .Help("Bytes in flight on a worker's request ring.")
                      .Register(r);
    ring_capacity_ = &prometheus::BuildGauge()
                          .Name("ckpt_ring_capacity_bytes")
                          .Help("Part of a worker's request ring in use (its window), in bytes.")
                          .Register(r);
    ring_bad_ = &prometheus::BuildCounter()
                     .Name("ckpt_ring_bad_records_total")
                     .Help("Records from a worker rejected as corrupt.")
                     .Register(r);
    ring_bytes_ = &prometheus::BuildCounter()
                       .Name("ckpt_ring_bytes_total")
                       .Help("Record bytes moved through a worker's rings, by direction.")
                       .Register(r);
    dropped_ = &prometheus::BuildCounter()
                    .Name("ckpt_metrics_dropped_updates_total")
                    .Help(
                        "Updates dropped because they named one experiment or worker more "
                        "than the configured bound.")
                    .Register(r)
                    .Add({});
    for (int i = 0; i < kStoreOpCount; ++i) {
      const std::string op(StoreOpName(static_cast<StoreOp>(i)));
      store_op_seconds_[i] = &store_seconds_->Add({{"op", op}}, StoreBuckets());
      store_op_bytes_[i] = &store_bytes_->Add({{"op", op}});
    }
  } catch (const std::exception& e) {
    return Status::Internal(std::string("metrics registry: ") + e.what());
  }

  if (address) {
    try {
      exposer_ = std::make_unique<prometheus::Exposer>(
          std::vector<std::string>{"listening_ports", options_.listen, "num_threads",
                                   std::to_string(options_.http_threads)});
      exposer_->RegisterCollectable(registry_);
      exposer_->RegisterCollectable(samplers_);
      const std::vector<int> ports = exposer_->GetListeningPorts();
      if (ports.empty()) {
        return Status::Unavailable("metrics listener " + options_.listen + ": no listening port");
      }
      port_ = ports.front();
    } catch (const std::exception& e) {
      exposer_.reset();
      // The probe above passed; say what the system says now, if anything.
      const std::string why = BindProbe(*address);
      return Status::Unavailable("metrics listener " + options_.listen +
                                 ": cannot listen: " + (why.empty() ? e.what() : why));
    }
  }
  return Status::OK();
}

std::string Metrics::Impl::RenderText() const {
  std::vector<MetricFamily> families = registry_->Collect();
  std::vector<MetricFamily> sampled = samplers_->Collect();
  families.insert(families.end(), std::make_move_iterator(sampled.begin()),
                  std::make_move_iterator(sampled.end()));
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::Impl::Dropped(std::string_view what) {
  dropped_->Increment();
  if (!logged_drop_) {
    logged_drop_ = true;
    log_(LogLevel::kWarning,
         "metrics: " + std::string(what) + " is over the configured bound (max_experiments " +
             std::to_string(options_.max_experiments) + ", max_workers " +
             std::to_string(options_.max_workers) +
             "); its updates are dropped and counted in ckpt_metrics_dropped_updates_total");
  }
}

Metrics::Impl::ExperimentSeries* Metrics::Impl::Experiment(std::string_view experiment) {
  auto it = experiments_.find(experiment);
  if (it != experiments_.end()) return &it->second;
  if (experiments_.size() >= options_.max_experiments) {
    Dropped("experiment \"" + std::string(experiment) + "\"");
    return nullptr;
  }
  const std::string name(experiment);
  ExperimentSeries& e = experiments_[name];
  e.exploits = &exploits_->Add({{"experiment", name}});
  for (int i = 0; i < ipc::kMemberFailureCodeCount; ++i) {
    e.failures[i] = &failures_->Add(
        {{"experiment", name}, {"reason", ipc::FailureCodeName(static_cast<ipc::FailureCode>(i))}});
  }
  return &e;
}

Metrics::Impl::WorkerSeries* Metrics::Impl::Worker(std::string_view worker,
                                                   std::string_view device) {
  auto it = workers_.find(std::pair<std::string_view, std::string_view>(worker, device));
  if (it != workers_.end()) return &it->second;
  if (workers_.size() >= options_.max_workers) {
    Dropped("worker \"" + std::string(worker) + "\" on \"" + std::string(device) + "\"");
    return nullptr;
  }
  const std::string w(worker), d(device);
  WorkerSeries& s = workers_[{w, d}];
  const prometheus::Labels labels{{"worker", w}, {"device", d}};
  s.samples = &worker_samples_->Add(labels);
  s.restarts = &restarts_->Add(labels);
  s.ring_bad = &ring_bad_->Add(labels);
  s.ring_to_worker = &ring_bytes_->Add({{"worker", w}, {"device", d}, {"direction", "to_worker"}});
  s.ring_from_worker =
      &ring_bytes_->Add({{"worker", w}, {"device", d}, {"direction", "from_worker"}});
  return &s;
}

Gauge* Metrics::Impl::EnsureGauge(Family<Gauge>* family, Gauge** gauge, std::string_view worker,
                                  std::string_view device) {
  if (*gauge == nullptr) {
    *gauge = &family->Add({{"worker", std::string(worker)}, {"device", std::string(device)}});
  }
  return *gauge;
}

void Metrics::Impl::RemoveWorkerGauges(WorkerSeries* w) {
  RemoveSeries(slots_, &w->slots);
  RemoveSeries(slots_busy_, &w->slots_busy);
  RemoveSeries(fused_, &w->fused);
  RemoveSeries(allocated_, &w->allocated);
  RemoveSeries(reserved_, &w->reserved);
  RemoveSeries(ring_used_, &w->ring_used);
  RemoveSeries(ring_capacity_, &w->ring_capacity);
}

void Metrics::Impl::IntervalCommitted(std::string_view experiment, std::string_view device,
                                      double seconds, uint64_t samples) {
  std::lock_guard<std::mutex> lock(mu_);
  ExperimentSeries* e = Experiment(experiment);
  if (e == nullptr) return;
  auto it = e->devices.find(device);
  if (it == e->devices.end()) {
    const prometheus::Labels labels{{"experiment", std::string(experiment)},
                                    {"device", std::string(device)}};
    DeviceSeries d;
    d.interval_seconds = &interval_seconds_->Add(labels, IntervalBuckets());
    d.trained_samples = &trained_samples_->Add(labels);
    it = e->devices.emplace(std::string(device), d).first;
  }
  it->second.interval_seconds->Observe(seconds);
  if (samples > 0) it->second.trained_samples->Increment(static_cast<double>(samples));
}

void Metrics::Impl::SetMemberCounts(std::string_view experiment, const MemberCounts& counts) {
  std::lock_guard<std::mutex> lock(mu_);
  ExperimentSeries* e = Experiment(experiment);
  if (e == nullptr) return;
  const std::array<int64_t, records::kMemberStatusCount> values{
      counts.idle, counts.queued, counts.running, counts.done, counts.stopped, counts.failed};
  for (int i = 0; i < records::kMemberStatusCount; ++i) {
    if (e->members[i] == nullptr) {
      e->members[i] = &members_->Add(
          {{"experiment", std::string(experiment)},
           {"state", records::MemberStatusName(static_cast<records::MemberStatus>(i))}});
    }
    e->members[i]->Set(static_cast<double>(values[i]));
  }
}

void Metrics::Impl::Exploited(std::string_view experiment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ExperimentSeries* e = Experiment(experiment)) e->exploits->Increment();
}

void Metrics::Impl::MemberFailed(std::string_view experiment, ipc::FailureCode reason) {
  // An interval the worker abandoned (told to stop) counts as internal; a
  // refused CONFIGURE is the experiment's, not a member's.
  if (reason == ipc::FailureCode::kAborted) reason = ipc::FailureCode::kInternal;
  if (static_cast<int>(reason) >= ipc::kMemberFailureCodeCount) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (ExperimentSeries* e = Experiment(experiment)) {
    e->failures[static_cast<int>(reason)]->Increment();
  }
}

void Metrics::Impl::SetScores(std::string_view experiment, format::MetricKind metric, double best,
                              double median) {
  std::lock_guard<std::mutex> lock(mu_);
  ExperimentSeries* e = Experiment(experiment);
  if (e == nullptr) return;
  if (e->best == nullptr) {
    const std::map<std::string, std::string> labels = {
        {"experiment", std::string(experiment)},
        {"metric", std::string(format::MetricKindName(metric))}};
    e->best = &best_score_->Add(labels);
    e->median = &median_score_->Add(labels);
  }
  e->best->Set(best);
  e->median->Set(median);
}

void Metrics::Impl::ForgetExperiment(std::string_view experiment) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = experiments_.find(experiment);
  if (it == experiments_.end()) return;
  ExperimentSeries& e = it->second;
  RemoveSeries(exploits_, &e.exploits);
  for (Counter*& c : e.failures) RemoveSeries(failures_, &c);
  for (Gauge*& g : e.members) RemoveSeries(members_, &g);
  RemoveSeries(best_score_, &e.best);
  RemoveSeries(median_score_, &e.median);
  for (auto& [device, d] : e.devices) {
    RemoveSeries(interval_seconds_, &d.interval_seconds);
    RemoveSeries(trained_samples_, &d.trained_samples);
  }
  experiments_.erase(it);
}

void Metrics::Impl::StoreOperation(StoreOp op, double seconds, uint64_t bytes) {
  const int i = static_cast<int>(op);
  if (i < 0 || i >= kStoreOpCount) return;
  store_op_seconds_[i]->Observe(seconds);
  if (bytes > 0) store_op_bytes_[i]->Increment(static_cast<double>(bytes));
}

void Metrics::Impl::WorkerStarted(std::string_view worker, std::string_view device, pid_t pid) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    WorkerSeries* w = Worker(worker, device);
    if (w == nullptr) return;
    if (w->started) w->restarts->Increment();
    w->started = true;
    // A new process and a new channel count from zero.
    w->last_samples_total = 0;
    w->last_to_worker = 0;
    w->last_from_worker = 0;
    w->last_bad = 0;
  }
  samplers_->AddWorker(worker, device, pid);
}

void Metrics::Impl::WorkerExited(std::string_view worker, std::string_view device) {
  samplers_->RemoveWorker(worker, device);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(std::pair<std::string_view, std::string_view>(worker, device));
  if (it != workers_.end()) RemoveWorkerGauges(&it->second);
}

void Metrics::Impl::SetWorkerStats(std::string_view worker, std::string_view device,
                                   const WorkerStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSeries* w = Worker(worker, device);
  if (w == nullptr) return;
  AddFromTotal(w->samples, stats.samples_total, &w->last_samples_total);
  EnsureGauge(slots_, &w->slots, worker, device)->Set(static_cast<double>(stats.slots));
  EnsureGauge(slots_busy_, &w->slots_busy, worker, device)
      ->Set(static_cast<double>(stats.slots_busy));
  EnsureGauge(fused_, &w->fused, worker, device)->Set(stats.fused ? 1 : 0);
  if (stats.allocator_allocated_bytes) {
    EnsureGauge(allocated_, &w->allocated, worker, device)
        ->Set(static_cast<double>(*stats.allocator_allocated_bytes));
  } else {
    RemoveSeries(allocated_, &w->allocated);
  }
  if (stats.allocator_reserved_bytes) {
    EnsureGauge(reserved_, &w->reserved, worker, device)
        ->Set(static_cast<double>(*stats.allocator_reserved_bytes));
  } else {
    RemoveSeries(reserved_, &w->reserved);
  }
}

void Metrics::Impl::SetRingStats(std::string_view worker, std::string_view device,
                                 const RingStats& stats) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSeries* w = Worker(worker, device);
  if (w == nullptr) return;
  AddFromTotal(w->ring_to_worker, stats.bytes_to_worker_total, &w->last_to_worker);
  AddFromTotal(w->ring_from_worker, stats.bytes_from_worker_total, &w->last_from_worker);
  AddFromTotal(w->ring_bad, stats.bad_records_total, &w->last_bad);
  EnsureGauge(ring_used_, &w->ring_used, worker, device)
      ->Set(static_cast<double>(stats.used_bytes));
  EnsureGauge(ring_capacity_, &w->ring_capacity, worker, device)
      ->Set(static_cast<double>(stats.capacity_bytes));
}

void Metrics::Impl::RingSendObserved(std::string_view worker, std::string_view device,
                                     double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSeries* w = Worker(worker, device);
  if (w == nullptr) return;
  if (w->ring_send_seconds == nullptr) {
    w->ring_send_seconds = &ring_send_seconds_->Add(
        {{"worker", std::string(worker)}, {"device", std::string(device)}}, RingBuckets());
  }
  w->ring_send_seconds->Observe(seconds);
}

// --- Metrics: forwards to Impl ----------------------------------------------

StatusOr<std::unique_ptr<Metrics>> Metrics::Open(const MetricsOptions& options) {
  auto impl = std::make_unique<Impl>(options);
  CKPT_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

int Metrics::port() const { return impl_->port(); }
const std::string& Metrics::gpu_status() const { return impl_->gpu_status(); }
std::string Metrics::RenderText() const { return impl_->RenderText(); }
std::vector<GpuFigures> Metrics::SampleGpus() const { return impl_->SampleGpus(); }

void Metrics::IntervalCommitted(std::string_view experiment, std::string_view device,
                                double seconds, uint64_t samples) {
  impl_->IntervalCommitted(experiment, device, seconds, samples);
}
void Metrics::SetMemberCounts(std::string_view experiment, const MemberCounts& counts) {
  impl_->SetMemberCounts(experiment, counts);
}
void Metrics::Exploited(std::string_view experiment) { impl_->Exploited(experiment); }
void Metrics::MemberFailed(std::string_view experiment, ipc::FailureCode reason) {
  impl_->MemberFailed(experiment, reason);
}
void Metrics::SetScores(std::string_view experiment, format::MetricKind metric, double best,
                        double median) {
  impl_->SetScores(experiment, metric, best, median);
}
void Metrics::ForgetExperiment(std::string_view experiment) { impl_->ForgetExperiment(experiment); }
void Metrics::StoreOperation(StoreOp op, double seconds, uint64_t bytes) {
  impl_->StoreOperation(op, seconds, bytes);
}
void Metrics::WorkerStarted(std::string_view worker, std::string_view device, pid_t pid) {
  impl_->WorkerStarted(worker, device, pid);
}
void Metrics::WorkerExited(std::string_view worker, std::string_view device) {
  impl_->WorkerExited(worker, device);
}
void Metrics::SetWorkerStats(std::string_view worker, std::string_view device,
                             const WorkerStats& stats) {
  impl_->SetWorkerStats(worker, device, stats);
}
void Metrics::SetRingStats(std::string_view worker, std::string_view device,
                           const RingStats& stats) {
  impl_->SetRingStats(worker, device, stats);
}
void Metrics::RingSendObserved(std::string_view worker, std::string_view device, double seconds) {
  impl_->RingSendObserved(worker, device, seconds);
}

}  // namespace ckpt::metrics
