// SchedulerImpl: the control verbs of the control socket and the API
// (submit, pause, resume, stop, restore, status; scheduler_impl.h).
#include <string>
#include <utility>
#include <vector>

#include "ckpt/records/allowed_paths.h"
#include "ckpt/records/events.h"
#include "ckpt/scheduler/policy.h"
#include "configure_message.h"
#include "log.h"
#include "scheduler_impl.h"

namespace ckpt::scheduler {

Status SchedulerImpl::Submit(const records::ExperimentConfig& config) {
  return SubmitAs(config, std::nullopt);
}

Status SchedulerImpl::SubmitAs(const records::ExperimentConfig& config,
                               std::optional<uint32_t> submitter) {
  const std::string& id = config.name;
  if (entries_.count(id)) return Status::AlreadyExists("experiment " + id + " already submitted");
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, Policy::Create(config));
  std::string model_sha256 = config.model_sha256;
  if (model_sha256.empty()) {
    // `run` and the API: the TorchScript file is pinned now, by its path.
    CKPT_ASSIGN_OR_RETURN(model_sha256,
                          records::ModelFileSha256(config.model_spec, std::nullopt, id));
  }
  records::ExperimentStatus status = records::ExperimentStatus::kRunning;
  auto existing = store_->GetExperiment(id);
  if (existing.ok()) {
    auto stored = records::DecodeExperimentToml(existing->config_json, id);
    if (!stored.ok() || *stored != config.source) {
      return Status::InvalidArgument("experiment " + id + " exists in store " +
                                     options_.store_path +
                                     " with a different configuration; give it another name or "
                                     "use another store");
    }
    auto parsed = records::ParseExperimentStatus(existing->status);
    if (!parsed.ok()) {
      return Status::Corruption("experiment " + id +
                                ": stored status: " + parsed.status().message());
    }
    status = *parsed;
    // The experiment stays its first submitter's.
    submitter = StoredSubmitter(existing->config_json);
  } else if (existing.status().IsNotFound()) {
    CKPT_RETURN_IF_ERROR(CreateExperimentRecords(store_.get(), config, submitter));
  } else {
    return existing.status();
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<Member> members, LoadMembers(store_.get(), config));
  CKPT_ASSIGN_OR_RETURN(History history, LoadHistory(store_.get(), config, members));
  if (existing.ok()) {
    if (status == records::ExperimentStatus::kPaused) {
      Logger().info("experiment {} is paused", id);
    } else if (status == records::ExperimentStatus::kRunning) {
      Logger().info("resuming experiment {} from {}", id, options_.store_path);
    }
  }
  Entry entry;
  entry.io =
      std::make_unique<StoreExperimentIo>(store_.get(), id, options_.kill_point, metrics_.get());
  if (status == records::ExperimentStatus::kRunning) {
    CKPT_RETURN_IF_ERROR(entry.io->SetStatus(records::ExperimentStatus::kRunning));
  }
  ExperimentOptions eo;
  eo.max_member_failures = options_.supervision.max_member_failures;
  eo.final_eval_top = options_.final_eval_top;
  eo.run_ahead = options_.run_ahead;
  entry.experiment =
      std::make_unique<Experiment>(config, std::move(policy), std::move(members), status, eo,
                                   entry.io.get(), Clock::now(), std::move(history));
  entry.announced_end = entry.experiment->ended();
  entry.configure = ConfigureMessage(config);
  entry.configure.model_sha256 = model_sha256;
  entry.submitter = submitter;
  if (pool_) pool_->AddExperiment(id, entry.configure);
  order_.push_back(id);
  Experiment* e = entry.experiment.get();
  entries_[id] = std::move(entry);
  // Queue what can run now; a stored run may also end here (its last barrier
  // had been applied before a crash).
  e->Start();
  return Status::OK();
}

StatusOr<std::string> SchedulerImpl::SubmitConfig(const records::ExperimentConfig& config,
                                                  std::optional<uint32_t> submitter) {
  if (stopping_) return Status::Unavailable("the scheduler is stopping");
  CKPT_RETURN_IF_ERROR(SubmitAs(config, submitter));
  AfterChange();
  Dispatch();
  return config.name;
}

std::vector<WorkerStatus> SchedulerImpl::DeviceStatus() {
  std::vector<WorkerStatus> workers = pool_ ? pool_->Status() : std::vector<WorkerStatus>{};
  if (!metrics_) return workers;
  // NVML sees this host's GPUs: only local workers get their device's figures.
  const std::vector<metrics::GpuFigures> gpus = metrics_->SampleGpus();
  for (WorkerStatus& w : workers) {
    if (!w.host.empty()) continue;
    for (const metrics::GpuFigures& g : gpus) {
      if (g.device != w.device) continue;
      w.gpu_utilization = g.utilization;
      if (g.memory_used_bytes) w.gpu_memory_used_bytes = static_cast<int64_t>(*g.memory_used_bytes);
      if (g.memory_total_bytes) {
        w.gpu_memory_total_bytes = static_cast<int64_t>(*g.memory_total_bytes);
      }
    }
  }
  return workers;
}

std::vector<ExperimentSummary> SchedulerImpl::ListExperiments() {
  std::vector<ExperimentSummary> out;
  for (const auto& id : order_) {
    auto s = Summary(id);
    if (s.ok()) out.push_back(std::move(*s));
  }
  return out;
}

Status SchedulerImpl::Pause(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  return e->Pause();
}

Status SchedulerImpl::Resume(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  CKPT_RETURN_IF_ERROR(e->Resume());
  Dispatch();
  return Status::OK();
}

Status SchedulerImpl::Stop(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  CKPT_RETURN_IF_ERROR(e->Stop());
  AfterChange();
  return Status::OK();
}

StatusOr<int64_t> SchedulerImpl::Restore(const std::string& exp, const std::string& member,
                                         int64_t version) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  if (e->Find(member) < 0) return Status::NotFound("member " + member + " of experiment " + exp);
  const auto t0 = Clock::now();
  CKPT_ASSIGN_OR_RETURN(
      int64_t v,
      store_->Restore(exp, member, version,
                      records::EncodeEvent(records::RestoreEvent{member, version, 0, ""})));
  if (metrics_) metrics_->StoreOperation(metrics::StoreOp::kRestore, SecondsSince(t0), 0);
  CKPT_ASSIGN_OR_RETURN(store::MemberHead head, store_->GetMember(exp, member));
  CKPT_RETURN_IF_ERROR(e->OnRestored(member, v, head.hparams, head.step));
  return v;
}

StatusOr<ExperimentSummary> SchedulerImpl::Summary(const std::string& id) {
  Experiment* e = Find(id);
  if (e == nullptr) return Status::NotFound("experiment " + id + " was not submitted");
  ExperimentSummary s = e->Summary(Clock::now());
  s.store_path = options_.store_path;
  // After Run: an experiment that did not end was interrupted by the stop.
  if (finished_ && !e->ended()) s.status = records::ExperimentStatus::kStopped;
  return s;
}

}  // namespace ckpt::scheduler
