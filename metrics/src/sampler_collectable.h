// The samplers' families, collected when a scrape (or Metrics::RenderText)
// asks for them: /proc for this process and the announced workers (the
// ckpt_scheduler_*, ckpt_host_cpus and ckpt_worker_{cpu,resident} families),
// NVML for the GPUs (ckpt_gpu_*, absent without NVML). Nothing samples between
// collections.
//
// Thread-safety: announcements (AddWorker, RemoveWorker) come from the
// scheduler's threads, Collect from the listener's. A mutex guards the
// announced workers; it is never held while a sampler reads /proc or NVML, so
// an announcement never waits for a scrape.
#ifndef CKPT_METRICS_SRC_SAMPLER_COLLECTABLE_H_
#define CKPT_METRICS_SRC_SAMPLER_COLLECTABLE_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/metrics/metrics.h"
#include "log_callback.h"
#include "nvml_sampler.h"

namespace ckpt::metrics {

class SamplerCollectable : public prometheus::Collectable {
 public:
  // `nvml` null: no GPU families. `log` receives a collection that failed.
  SamplerCollectable(std::unique_ptr<NvmlSampler> nvml, LogFn log);

  // From now on `worker` on `device` is sampled as process `pid` (replacing
  // its earlier pid, if any).
  void AddWorker(std::string_view worker, std::string_view device, pid_t pid);
  // `worker` on `device` is no longer sampled.
  void RemoveWorker(std::string_view worker, std::string_view device);

  // One NVML sample of every visible GPU; empty without NVML.
  std::vector<GpuFigures> SampleGpus() const;

  // Every sampler's families. A scrape thread is a thread root: a failure is
  // logged and yields no families, nothing escapes into civetweb.
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  struct WorkerProcess {
    std::string worker;
    std::string device;
    pid_t pid;
    // Start time of `pid` at its first sample (0: not sampled yet), so that a
    // reused pid is never reported as this worker.
    uint64_t start_ticks;
  };
  using WorkersByPid = std::map<pid_t, const WorkerProcess*>;

  std::vector<prometheus::MetricFamily> CollectOrThrow() const;
  // Appends the workers' process families; returns the workers sampled.
  WorkersByPid AppendWorkerFamilies(const std::vector<WorkerProcess>& workers,
                                    std::vector<prometheus::MetricFamily>* out) const;
  // Appends the GPU families; a GPU process gets a series when it is in `ours`.
  void AppendGpuFamilies(const WorkersByPid& ours,
                         std::vector<prometheus::MetricFamily>* out) const;
  void RememberStart(const WorkerProcess& sampled, uint64_t start_ticks) const;

  const std::unique_ptr<NvmlSampler> nvml_;
  const LogFn log_;
  mutable std::mutex mu_;
  mutable std::vector<WorkerProcess> workers_;  // GUARDED_BY(mu_)
};

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_SAMPLER_COLLECTABLE_H_
