// The scheduler's metric families, registered in one prometheus-cpp registry,
// and the series that updates create in them for each experiment and worker.
//
// Create registers every family (ckpt/metrics/metrics.h lists them, less the
// samplers'); the update methods are Metrics' own (metrics.h says what each
// records), except that a worker's start and exit concern only its series
// here. At most max_experiments experiments and max_workers workers get
// series: an update naming one more is dropped, counted in
// ckpt_metrics_dropped_updates_total and logged once.
//
// Thread-safety: every method may be called from any thread. One mutex guards
// the series maps; prometheus-cpp guards the values, and a scrape holds its
// mutexes only while it copies them.
#ifndef CKPT_METRICS_SRC_FAMILIES_H_
#define CKPT_METRICS_SRC_FAMILIES_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "ckpt/base/status.h"
#include "ckpt/metrics/metrics.h"
#include "log_callback.h"

namespace ckpt::metrics {

class Families {
 public:
  // Registers every family in a new registry, with the bounds of `options`;
  // `log` receives the first dropped update. Internal ("metrics registry: ...")
  // when prometheus-cpp refuses a family.
  static StatusOr<std::unique_ptr<Families>> Create(const MetricsOptions& options, LogFn log);
  Families(const Families&) = delete;
  Families& operator=(const Families&) = delete;

  // The registry holding every family, for the listener to serve.
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  void IntervalCommitted(std::string_view experiment, std::string_view device, double seconds,
                         uint64_t samples);
  void SetMemberCounts(std::string_view experiment, const MemberCounts& counts);
  void Exploited(std::string_view experiment);
  void MemberFailed(std::string_view experiment, ipc::FailureCode reason);
  void SetScores(std::string_view experiment, format::MetricKind metric, double best,
                 double median);
  void ForgetExperiment(std::string_view experiment);
  void StoreOperation(StoreOp op, double seconds, uint64_t bytes);
  // Counts a start of `worker` (a restart after its first) and resets its
  // running totals. Returns false when the worker gets no series (over
  // max_workers): the samplers must not report it either.
  bool WorkerStarted(std::string_view worker, std::string_view device);
  // Removes the gauges of `worker`'s process; its counters stay.
  void WorkerExited(std::string_view worker, std::string_view device);
  void SetWorkerStats(std::string_view worker, std::string_view device, const WorkerStats& stats);
  void SetRingStats(std::string_view worker, std::string_view device, const RingStats& stats);
  void RingSendObserved(std::string_view worker, std::string_view device, double seconds);
  void RemoteSlotsCapped() { remote_slots_capped_->Increment(); }
  void RemoteTaskTimedOut() { remote_task_timeouts_->Increment(); }

 private:
  using Counter = prometheus::Counter;
  using Gauge = prometheus::Gauge;
  using Histogram = prometheus::Histogram;
  template <typename T>
  using Family = prometheus::Family<T>;

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
  // A key of two strings looked up by two string_views, without a copy.
  struct PairLess {
    using is_transparent = void;
    template <typename A, typename B>
    bool operator()(const A& a, const B& b) const {
      return std::pair<std::string_view, std::string_view>(a.first, a.second) <
             std::pair<std::string_view, std::string_view>(b.first, b.second);
    }
  };

  Families(const MetricsOptions& options, LogFn log);
  // Creates the registry and its families; throws what prometheus-cpp throws.
  void Register();

  ExperimentSeries* Experiment(std::string_view experiment);               // REQUIRES: mu_ held
  WorkerSeries* Worker(std::string_view worker, std::string_view device);  // REQUIRES: mu_ held
  void Dropped(std::string_view what);                                     // REQUIRES: mu_ held
  void RemoveWorkerGauges(WorkerSeries* w);                                // REQUIRES: mu_ held

  const size_t max_experiments_;
  const size_t max_workers_;
  const LogFn log_;
  std::shared_ptr<prometheus::Registry> registry_;

  // Families, registered once by Register and owned by registry_.
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
  Counter* remote_slots_capped_ = nullptr;
  Counter* remote_task_timeouts_ = nullptr;
  // The store families have one series per op, made by Register: no lookup per update.
  std::array<Histogram*, kStoreOpCount> store_op_seconds_{};
  std::array<Counter*, kStoreOpCount> store_op_bytes_{};

  std::mutex mu_;
  std::map<std::string, ExperimentSeries, std::less<>> experiments_;  // GUARDED_BY(mu_)
  std::map<std::pair<std::string, std::string>, WorkerSeries, PairLess>
      workers_;               // GUARDED_BY(mu_)
  bool logged_drop_ = false;  // GUARDED_BY(mu_)
};

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_FAMILIES_H_
