#include "families.h"

#include <exception>
#include <variant>
#include <vector>

namespace ckpt::metrics {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

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

// The builder of a family of the slot's type.
auto BuilderFor(Family<Counter>** /*slot*/) { return prometheus::BuildCounter(); }
auto BuilderFor(Family<Gauge>** /*slot*/) { return prometheus::BuildGauge(); }
auto BuilderFor(Family<Histogram>** /*slot*/) { return prometheus::BuildHistogram(); }

// A family to register, and where its pointer goes.
struct FamilySpec {
  std::variant<Family<Counter>**, Family<Gauge>**, Family<Histogram>**> slot;
  const char* name;
  const char* help;
};

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

Gauge* EnsureGauge(Family<Gauge>* family, Gauge** gauge, std::string_view worker,
                   std::string_view device) {
  if (*gauge == nullptr) {
    *gauge = &family->Add({{"worker", std::string(worker)}, {"device", std::string(device)}});
  }
  return *gauge;
}

}  // namespace

StatusOr<std::unique_ptr<Families>> Families::Create(const MetricsOptions& options, LogFn log) {
  std::unique_ptr<Families> families(new Families(options, std::move(log)));
  try {
    families->Register();
  } catch (const std::exception& e) {
    return Status::Internal(std::string("metrics registry: ") + e.what());
  }
  return families;
}

Families::Families(const MetricsOptions& options, LogFn log)
    : max_experiments_(options.max_experiments),
      max_workers_(options.max_workers),
      log_(std::move(log)) {}

void Families::Register() {
  registry_ = std::make_shared<prometheus::Registry>();
  // In registration order, which is the order within each type of the exposition.
  const FamilySpec families[] = {
      {&interval_seconds_, "ckpt_interval_duration_seconds",
       "Wall time of a member-interval, from dispatch to the committed result."},
      {&trained_samples_, "ckpt_trained_samples_total",
       "Training samples of committed member-intervals."},
      {&exploits_, "ckpt_exploits_total", "PBT exploits: a member took a better member's weights."},
      {&failures_, "ckpt_member_failures_total", "Member-intervals that failed, by reason."},
      {&members_, "ckpt_members", "Members of an experiment in each scheduling state."},
      {&best_score_, "ckpt_best_score", "Best member score of the population (higher is better)."},
      {&median_score_, "ckpt_median_score", "Median member score of the population."},
      {&store_seconds_, "ckpt_store_operation_duration_seconds",
       "Duration of a checkpoint store operation."},
      {&store_bytes_, "ckpt_store_bytes_total",
       "Bytes written or read by checkpoint store operations."},
      {&worker_samples_, "ckpt_worker_samples_total",
       "Training samples a worker trained (its STATS records)."},
      {&slots_, "ckpt_worker_slots", "Training slots of a worker."},
      {&slots_busy_, "ckpt_worker_slots_busy", "Training slots of a worker that hold a member."},
      {&fused_, "ckpt_worker_fused",
       "1 when the worker trains members fused as one wide model, 0 plain."},
      {&allocated_, "ckpt_worker_allocator_allocated_bytes",
       "Device allocator memory a worker's tensors occupy, in bytes."},
      {&reserved_, "ckpt_worker_allocator_reserved_bytes",
       "Device allocator memory a worker holds, in bytes."},
      {&restarts_, "ckpt_worker_restarts_total", "Starts of a worker after its first."},
      {&ring_send_seconds_, "ckpt_ring_send_duration_seconds",
       "Time to write one record into a worker's request ring, waits included."},
      {&ring_used_, "ckpt_ring_used_bytes", "Bytes in flight on a worker's request ring."},
      {&ring_capacity_, "ckpt_ring_capacity_bytes",
       "Part of a worker's request ring in use (its window), in bytes."},
      {&ring_bad_, "ckpt_ring_bad_records_total", "Records from a worker rejected as corrupt."},
      {&ring_bytes_, "ckpt_ring_bytes_total",
       "Record bytes moved through a worker's rings, by direction."},
  };
  for (const FamilySpec& spec : families) {
    std::visit(
        [&](auto slot) {
          *slot = &BuilderFor(slot).Name(spec.name).Help(spec.help).Register(*registry_);
        },
        spec.slot);
  }
  dropped_ = &prometheus::BuildCounter()
                  .Name("ckpt_metrics_dropped_updates_total")
                  .Help(
                      "Updates dropped because they named one experiment or worker more "
                      "than the configured bound.")
                  .Register(*registry_)
                  .Add({});
  remote_slots_capped_ =
      &prometheus::BuildCounter()
           .Name("ckpt_remote_slots_capped_total")
           .Help("HELLOs of connected workers that offered more slots than max_remote_slots.")
           .Register(*registry_)
           .Add({});
  remote_task_timeouts_ =
      &prometheus::BuildCounter()
           .Name("ckpt_remote_task_timeouts_total")
           .Help("Connected workers lost because an interval ran past its deadline.")
           .Register(*registry_)
           .Add({});
  for (int i = 0; i < kStoreOpCount; ++i) {
    const std::string op(StoreOpName(static_cast<StoreOp>(i)));
    store_op_seconds_[i] = &store_seconds_->Add({{"op", op}}, StoreBuckets());
    store_op_bytes_[i] = &store_bytes_->Add({{"op", op}});
  }
}

void Families::Dropped(std::string_view what) {
  dropped_->Increment();
  if (!logged_drop_) {
    logged_drop_ = true;
    log_(LogLevel::kWarning,
         "metrics: " + std::string(what) + " is over the configured bound (max_experiments " +
             std::to_string(max_experiments_) + ", max_workers " + std::to_string(max_workers_) +
             "); its updates are dropped and counted in ckpt_metrics_dropped_updates_total");
  }
}

Families::ExperimentSeries* Families::Experiment(std::string_view experiment) {
  auto it = experiments_.find(experiment);
  if (it != experiments_.end()) return &it->second;
  if (experiments_.size() >= max_experiments_) {
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

Families::WorkerSeries* Families::Worker(std::string_view worker, std::string_view device) {
  auto it = workers_.find(std::pair<std::string_view, std::string_view>(worker, device));
  if (it != workers_.end()) return &it->second;
  if (workers_.size() >= max_workers_) {
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

void Families::RemoveWorkerGauges(WorkerSeries* w) {
  RemoveSeries(slots_, &w->slots);
  RemoveSeries(slots_busy_, &w->slots_busy);
  RemoveSeries(fused_, &w->fused);
  RemoveSeries(allocated_, &w->allocated);
  RemoveSeries(reserved_, &w->reserved);
  RemoveSeries(ring_used_, &w->ring_used);
  RemoveSeries(ring_capacity_, &w->ring_capacity);
}

void Families::IntervalCommitted(std::string_view experiment, std::string_view device,
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

void Families::SetMemberCounts(std::string_view experiment, const MemberCounts& counts) {
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

void Families::Exploited(std::string_view experiment) {
  std::lock_guard<std::mutex> lock(mu_);
  if (ExperimentSeries* e = Experiment(experiment)) e->exploits->Increment();
}

void Families::MemberFailed(std::string_view experiment, ipc::FailureCode reason) {
  // An interval the worker abandoned (told to stop) counts as internal; a
  // refused CONFIGURE is the experiment's, not a member's.
  if (reason == ipc::FailureCode::kAborted) reason = ipc::FailureCode::kInternal;
  if (static_cast<int>(reason) >= ipc::kMemberFailureCodeCount) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (ExperimentSeries* e = Experiment(experiment)) {
    e->failures[static_cast<int>(reason)]->Increment();
  }
}

void Families::SetScores(std::string_view experiment, format::MetricKind metric, double best,
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

void Families::ForgetExperiment(std::string_view experiment) {
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

void Families::StoreOperation(StoreOp op, double seconds, uint64_t bytes) {
  const int i = static_cast<int>(op);
  if (i < 0 || i >= kStoreOpCount) return;
  store_op_seconds_[i]->Observe(seconds);
  if (bytes > 0) store_op_bytes_[i]->Increment(static_cast<double>(bytes));
}

bool Families::WorkerStarted(std::string_view worker, std::string_view device) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSeries* w = Worker(worker, device);
  if (w == nullptr) return false;
  if (w->started) w->restarts->Increment();
  w->started = true;
  // A new process and a new channel count from zero.
  w->last_samples_total = 0;
  w->last_to_worker = 0;
  w->last_from_worker = 0;
  w->last_bad = 0;
  return true;
}

void Families::WorkerExited(std::string_view worker, std::string_view device) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(std::pair<std::string_view, std::string_view>(worker, device));
  if (it != workers_.end()) RemoveWorkerGauges(&it->second);
}

void Families::SetWorkerStats(std::string_view worker, std::string_view device,
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

void Families::SetRingStats(std::string_view worker, std::string_view device,
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

void Families::RingSendObserved(std::string_view worker, std::string_view device, double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  WorkerSeries* w = Worker(worker, device);
  if (w == nullptr) return;
  if (w->ring_send_seconds == nullptr) {
    w->ring_send_seconds = &ring_send_seconds_->Add(
        {{"worker", std::string(worker)}, {"device", std::string(device)}}, RingBuckets());
  }
  w->ring_send_seconds->Observe(seconds);
}

}  // namespace ckpt::metrics
