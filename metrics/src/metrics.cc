// Metrics and its Impl, which owns the three parts of metrics/src, ckpt's
// prometheus-cpp adapter: the registry's families (families.h), the samplers
// (sampler_collectable.h) and the HTTP listener that serves both
// (listener.h). Each part catches prometheus-cpp's exceptions: the families
// and the listener return them as a Status, the samplers log them.
#include "ckpt/metrics/metrics.h"

#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/logging/logging.h"
#include "families.h"
#include "listener.h"
#include "log_callback.h"
#include "nvml_sampler.h"
#include "sampler_collectable.h"

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

}  // namespace

class Metrics::Impl {
 public:
  explicit Impl(const MetricsOptions& options)
      : options_(options), log_(LogOrDefault(options.log)) {}

  ~Impl() {
    // The listener goes first, so no scrape runs while the rest is destroyed.
    listener_.reset();
  }

  Status Init();

  int port() const { return listener_ == nullptr ? 0 : listener_->port(); }
  const std::string& gpu_status() const { return gpu_status_; }
  std::vector<GpuFigures> SampleGpus() const { return samplers_->SampleGpus(); }
  std::string RenderText() const;

  // Every update but a worker's start and exit goes to the families alone.
  Families& families() { return *families_; }
  void WorkerStarted(std::string_view worker, std::string_view device, pid_t pid);
  void WorkerExited(std::string_view worker, std::string_view device);

 private:
  // The GPU sampler, or null with gpu_status_ saying why.
  std::unique_ptr<NvmlSampler> OpenNvml();

  const MetricsOptions options_;
  const LogFn log_;
  std::string gpu_status_;
  std::shared_ptr<SamplerCollectable> samplers_;
  std::unique_ptr<Families> families_;
  // Declared last, destroyed first (and reset explicitly by ~Impl).
  std::unique_ptr<Listener> listener_;
};

Status Metrics::Impl::Init() {
  if (options_.http_threads < 1) {
    return Status::InvalidArgument("metrics http_threads must be >= 1, not " +
                                   std::to_string(options_.http_threads));
  }
  std::optional<ListenAddress> address;
  if (!options_.listen.empty()) {
    CKPT_ASSIGN_OR_RETURN(address, CheckListenAddress(options_.listen));
  }
  samplers_ = std::make_shared<SamplerCollectable>(OpenNvml(), log_);
  CKPT_ASSIGN_OR_RETURN(families_, Families::Create(options_, log_));
  if (address) {
    const std::vector<std::weak_ptr<prometheus::Collectable>> served{families_->registry(),
                                                                     samplers_};
    CKPT_ASSIGN_OR_RETURN(listener_, Listener::Start(options_, *address, served));
  }
  return Status::OK();
}

std::unique_ptr<NvmlSampler> Metrics::Impl::OpenNvml() {
  if (!options_.gpu) {
    gpu_status_ = "NVML disabled by options";
    return nullptr;
  }
  auto opened = NvmlSampler::Open(options_.nvml_library);
  if (!opened.ok()) {
    gpu_status_ = opened.status().message();
    log_(LogLevel::kInfo, "metrics: no GPU metrics (ckpt_gpu_* absent): " + gpu_status_);
    return nullptr;
  }
  return std::move(*opened);
}

std::string Metrics::Impl::RenderText() const {
  std::vector<prometheus::MetricFamily> families = families_->registry()->Collect();
  std::vector<prometheus::MetricFamily> sampled = samplers_->Collect();
  families.insert(families.end(), std::make_move_iterator(sampled.begin()),
                  std::make_move_iterator(sampled.end()));
  return prometheus::TextSerializer().Serialize(families);
}

void Metrics::Impl::WorkerStarted(std::string_view worker, std::string_view device, pid_t pid) {
  if (families_->WorkerStarted(worker, device)) samplers_->AddWorker(worker, device, pid);
}

void Metrics::Impl::WorkerExited(std::string_view worker, std::string_view device) {
  samplers_->RemoveWorker(worker, device);
  families_->WorkerExited(worker, device);
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
  impl_->families().IntervalCommitted(experiment, device, seconds, samples);
}
void Metrics::SetMemberCounts(std::string_view experiment, const MemberCounts& counts) {
  impl_->families().SetMemberCounts(experiment, counts);
}
void Metrics::Exploited(std::string_view experiment) { impl_->families().Exploited(experiment); }
void Metrics::RemoteSlotsCapped() { impl_->families().RemoteSlotsCapped(); }
void Metrics::RemoteTaskTimedOut() { impl_->families().RemoteTaskTimedOut(); }
void Metrics::MemberFailed(std::string_view experiment, ipc::FailureCode reason) {
  impl_->families().MemberFailed(experiment, reason);
}
void Metrics::SetScores(std::string_view experiment, format::MetricKind metric, double best,
                        double median) {
  impl_->families().SetScores(experiment, metric, best, median);
}
void Metrics::ForgetExperiment(std::string_view experiment) {
  impl_->families().ForgetExperiment(experiment);
}
void Metrics::StoreOperation(StoreOp op, double seconds, uint64_t bytes) {
  impl_->families().StoreOperation(op, seconds, bytes);
}
void Metrics::WorkerStarted(std::string_view worker, std::string_view device, pid_t pid) {
  impl_->WorkerStarted(worker, device, pid);
}
void Metrics::WorkerExited(std::string_view worker, std::string_view device) {
  impl_->WorkerExited(worker, device);
}
void Metrics::SetWorkerStats(std::string_view worker, std::string_view device,
                             const WorkerStats& stats) {
  impl_->families().SetWorkerStats(worker, device, stats);
}
void Metrics::SetRingStats(std::string_view worker, std::string_view device,
                           const RingStats& stats) {
  impl_->families().SetRingStats(worker, device, stats);
}
void Metrics::RingSendObserved(std::string_view worker, std::string_view device, double seconds) {
  impl_->families().RingSendObserved(worker, device, seconds);
}

}  // namespace ckpt::metrics
