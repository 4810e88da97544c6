#include "sampler_collectable.h"

#include <unistd.h>

#include <exception>
#include <utility>

#include "process_sampler.h"

namespace ckpt::metrics {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

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

// This process's CPU and memory (absent when /proc refuses them) and the CPUs
// it may run on.
void AppendSchedulerFamilies(std::vector<MetricFamily>* out) {
  const auto self = SampleProcess(::getpid());
  if (self.ok()) {
    out->push_back(MakeFamily("ckpt_scheduler_cpu_seconds_total",
                              "User and system CPU time of the scheduler process, in seconds.",
                              MetricType::Counter));
    out->back().metric.push_back(Sample(self->cpu_seconds, MetricType::Counter));
    out->push_back(MakeFamily("ckpt_scheduler_resident_memory_bytes",
                              "Resident memory of the scheduler process, in bytes.",
                              MetricType::Gauge));
    out->back().metric.push_back(
        Sample(static_cast<double>(self->resident_bytes), MetricType::Gauge));
  }
  out->push_back(
      MakeFamily("ckpt_host_cpus", "CPUs the scheduler process may run on.", MetricType::Gauge));
  out->back().metric.push_back(Sample(HostCpus(), MetricType::Gauge));
}

}  // namespace

SamplerCollectable::SamplerCollectable(std::unique_ptr<NvmlSampler> nvml, LogFn log)
    : nvml_(std::move(nvml)), log_(std::move(log)) {}

void SamplerCollectable::AddWorker(std::string_view worker, std::string_view device, pid_t pid) {
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

void SamplerCollectable::RemoveWorker(std::string_view worker, std::string_view device) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = workers_.begin(); it != workers_.end(); ++it) {
    if (it->worker == worker && it->device == device) {
      workers_.erase(it);
      return;
    }
  }
}

std::vector<GpuFigures> SamplerCollectable::SampleGpus() const {
  std::vector<GpuFigures> out;
  if (nvml_ == nullptr) return out;
  for (const GpuSample& g : nvml_->Sample()) {
    out.push_back(GpuFigures{g.device, g.utilization, g.memory_used_bytes, g.memory_total_bytes});
  }
  return out;
}

std::vector<MetricFamily> SamplerCollectable::Collect() const {
  try {
    return CollectOrThrow();
  } catch (const std::exception& e) {
    log_(LogLevel::kError, std::string("metrics: sampler collection failed: ") + e.what());
    return {};
  }
}

std::vector<MetricFamily> SamplerCollectable::CollectOrThrow() const {
  std::vector<MetricFamily> out;
  AppendSchedulerFamilies(&out);
  std::vector<WorkerProcess> workers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    workers = workers_;
  }
  const WorkersByPid by_pid = AppendWorkerFamilies(workers, &out);
  if (nvml_ != nullptr) AppendGpuFamilies(by_pid, &out);
  return out;
}

SamplerCollectable::WorkersByPid SamplerCollectable::AppendWorkerFamilies(
    const std::vector<WorkerProcess>& workers, std::vector<MetricFamily>* out) const {
  MetricFamily cpu =
      MakeFamily("ckpt_worker_cpu_seconds_total",
                 "User and system CPU time of a worker process, in seconds.", MetricType::Counter);
  MetricFamily rss =
      MakeFamily("ckpt_worker_resident_memory_bytes",
                 "Resident memory of a worker process, in bytes.", MetricType::Gauge);
  WorkersByPid by_pid;
  for (const WorkerProcess& w : workers) {
    const auto s =
        w.start_ticks == 0 ? SampleProcess(w.pid) : SampleProcessStartedAt(w.pid, w.start_ticks);
    if (!s.ok()) continue;
    if (w.start_ticks == 0) RememberStart(w, s->start_ticks);
    by_pid[w.pid] = &w;
    std::vector<ClientMetric::Label> labels{{"device", w.device}, {"worker", w.worker}};
    cpu.metric.push_back(Sample(s->cpu_seconds, MetricType::Counter, labels));
    rss.metric.push_back(Sample(static_cast<double>(s->resident_bytes), MetricType::Gauge, labels));
  }
  out->push_back(std::move(cpu));
  out->push_back(std::move(rss));
  return by_pid;
}

void SamplerCollectable::AppendGpuFamilies(const WorkersByPid& ours,
                                           std::vector<MetricFamily>* out) const {
  MetricFamily util =
      MakeFamily("ckpt_gpu_utilization_ratio",
                 "Fraction of NVML's last sample period in which a kernel ran on the GPU (0..1).",
                 MetricType::Gauge);
  MetricFamily used =
      MakeFamily("ckpt_gpu_memory_used_bytes", "GPU memory in use by all processes, in bytes.",
                 MetricType::Gauge);
  MetricFamily total =
      MakeFamily("ckpt_gpu_memory_total_bytes", "GPU memory, in bytes.", MetricType::Gauge);
  MetricFamily proc =
      MakeFamily("ckpt_gpu_process_memory_bytes", "GPU memory held by a worker process, in bytes.",
                 MetricType::Gauge);
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
      auto it = ours.find(static_cast<pid_t>(p.pid));
      if (it == ours.end()) continue;  // not one of ours
      proc.metric.push_back(Sample(static_cast<double>(p.used_bytes), MetricType::Gauge,
                                   {{"device", g.device}, {"worker", it->second->worker}}));
    }
  }
  out->push_back(std::move(util));
  out->push_back(std::move(used));
  out->push_back(std::move(total));
  out->push_back(std::move(proc));
}

void SamplerCollectable::RememberStart(const WorkerProcess& sampled, uint64_t start_ticks) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (WorkerProcess& w : workers_) {
    if (w.worker == sampled.worker && w.device == sampled.device && w.pid == sampled.pid &&
        w.start_ticks == 0) {
      w.start_ticks = start_ticks;
    }
  }
}

}  // namespace ckpt::metrics
