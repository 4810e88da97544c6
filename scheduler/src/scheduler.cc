// The scheduler's event loop: it glues the units together and owns nothing
// but their lifecycle. Experiments decide (experiment.h), the worker pool
// supervises processes (worker_pool.h), the dispatcher assigns work
// (dispatcher.h), progress renders (progress.h); this file routes events
// between them, handles signals and the control verbs, and stops cleanly.
#include "ckpt/scheduler/scheduler.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>

#include "ckpt/base/kill_point.h"
#include "ckpt/format/checksum.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/metrics/metrics.h"
#include "ckpt/scheduler/policy.h"
#include "ckpt/store/store.h"
#include "control_server.h"
#include "control_target.h"
#include "dispatcher.h"
#include "experiment.h"
#include "experiment_store.h"
#include "log.h"
#include "progress.h"
#include "store_health.h"
#include "trace.h"
#include "worker_pool.h"

namespace ckpt::scheduler {
namespace {

namespace asio = boost::asio;
using std::chrono::milliseconds;

// "ckpt-" + 10 hex digits (the default instance) + "-w" + worker index.
bool IsDefaultSegmentName(const std::string& name) {
  constexpr size_t kHex = 10;
  if (name.size() < 5 + kHex + 3 || name.compare(0, 5, "ckpt-") != 0) return false;
  for (size_t i = 5; i < 5 + kHex; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  if (name.compare(5 + kHex, 2, "-w") != 0) return false;
  for (size_t i = 5 + kHex + 2; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

// One submitted experiment: its logic and the store adapter it writes through.
struct Entry {
  std::unique_ptr<StoreExperimentIo> io;
  std::unique_ptr<Experiment> experiment;
  bool announced_end = false;  // its end was printed and counted
  uint64_t state_bytes = 0;    // largest state committed in this run
};

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

metrics::MemberCounts CountMembers(const Experiment& e) {
  metrics::MemberCounts c;
  for (const auto& m : e.members()) {
    switch (m.state.status) {
      case records::MemberStatus::kIdle:
        ++c.idle;
        break;
      case records::MemberStatus::kQueued:
        ++c.queued;
        break;
      case records::MemberStatus::kRunning:
        ++c.running;
        break;
      case records::MemberStatus::kDone:
        ++c.done;
        break;
      case records::MemberStatus::kStopped:
        ++c.stopped;
        break;
      case records::MemberStatus::kFailed:
        ++c.failed;
        break;
    }
  }
  return c;
}

class SchedulerImpl : public Scheduler, public ControlTarget, public WorkerPoolListener {
 public:
  SchedulerImpl(const SchedulerOptions& options, std::unique_ptr<store::Store> store,
                std::unique_ptr<metrics::Metrics> metrics)
      : options_(options),
        store_(std::move(store)),
        metrics_(std::move(metrics)),
        signals_(io_),
        sigchld_(io_, SIGCHLD),
        sighup_(io_),
        tick_(io_),
        grace_timer_(io_),
        store_health_(
            store_.get(), options.store_path, &io_, [this] { OnStoreWritable(); },
            [this](const Status& s) { OnStoreBroken(s); }),
        progress_(options.progress) {
    if (options_.instance.empty()) {
      std::string abs = std::filesystem::absolute(options_.store_path).lexically_normal().string();
      options_.instance = "ckpt-" + HexU64(Xxh3_64(abs.data(), abs.size())).substr(0, 10);
    }
  }

  ~SchedulerImpl() override {
    if (pool_) pool_->StopAll(false);
  }

  store::Store* store() override { return store_.get(); }

  Status Submit(const records::ExperimentConfig& config) override;
  Status Run() override;
  void RequestStop() override {
    asio::post(io_, [this] { BeginStop("stop requested"); });
  }
  StatusOr<ExperimentSummary> Summary(const std::string& exp) override;
  int64_t WorkersPeakRssBytes() const override { return pool_ ? pool_->PeakRssBytes() : 0; }

  // ControlTarget (event loop thread).
  boost::asio::io_context& io() override { return io_; }
  StatusOr<std::string> SubmitToml(const std::string& toml, const std::string& origin) override;
  std::vector<ExperimentSummary> ListExperiments() override;
  StatusOr<ExperimentSummary> ExperimentStatus(const std::string& exp) override {
    return Summary(exp);
  }
  std::vector<WorkerStatus> DeviceStatus() override;
  std::string StorePath() override { return options_.store_path; }
  Status Pause(const std::string& exp) override;
  Status Resume(const std::string& exp) override;
  Status Stop(const std::string& exp) override;
  StatusOr<int64_t> Restore(const std::string& exp, const std::string& member,
                            int64_t version) override;
  Status Pin(const std::string& exp, const std::string& member, int64_t version) override {
    if (Find(exp) == nullptr) return Status::NotFound("experiment " + exp);
    return store_->Pin(exp, member, version);
  }
  Status Unpin(const std::string& exp, const std::string& member, int64_t version) override {
    if (Find(exp) == nullptr) return Status::NotFound("experiment " + exp);
    return store_->Unpin(exp, member, version);
  }
  void Shutdown(const std::string& why) override { BeginStop(why); }

  // WorkerPoolListener (event loop thread).
  void OnWorkerReady(size_t worker) override { Dispatch(); }
  void OnTaskEvent(size_t worker, WorkerEvent ev) override;
  void OnWorkerLost(size_t worker, const std::string& reason, std::vector<Task> unfinished,
                    bool given_up) override;
  void OnAllGivenUp(const std::string& last_reason) override;

 private:
  StatusOr<ipc::Configure> ConfigureFor(const std::string& exp);
  Status RunLoop();
  void Dispatch();
  // After anything that may have ended an experiment: announce it once, and
  // stop a `run` when every experiment has ended.
  void AfterChange();
  void BeginStop(const std::string& why);
  void MaybeFinishStop();
  void ShutdownWorkers(bool graceful);
  void Tick();
  void OnReload();
  void PrintProgress(bool force_line);
  // Gauges that are cheaper to sample once a second than to keep on every
  // event (members by state, scores, ring occupancy).
  void ReportMetrics();
  // Hands StoreHealth the running experiments' head states (population x
  // largest state seen) when `bytes`, a state just committed to `entry`,
  // raises that estimate.
  void NoteStateSize(Entry& entry, uint64_t bytes);
  // The store takes writes again after a full disk (StoreHealth): what it
  // refused is redone and dispatch resumes.
  void OnStoreWritable();
  // The store refuses every write (StoreHealth::BrokenForGood): stop, and
  // make Run() return the error.
  void OnStoreBroken(const Status& s);
  Experiment* Find(const std::string& id) {
    auto it = entries_.find(id);
    return it == entries_.end() ? nullptr : it->second.experiment.get();
  }
  std::vector<Experiment*> InOrder() {
    std::vector<Experiment*> out;
    for (const auto& id : order_) out.push_back(entries_[id].experiment.get());
    return out;
  }
  bool AllEnded() const {
    for (const auto& [id, e] : entries_) {
      if (!e.experiment->ended()) return false;
    }
    return true;
  }

  SchedulerOptions options_;
  std::unique_ptr<store::Store> store_;
  // Declared before the pool and the experiments, which report to it.
  std::unique_ptr<metrics::Metrics> metrics_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::signal_set sigchld_;
  asio::signal_set sighup_;
  asio::steady_timer tick_;
  asio::steady_timer grace_timer_;
  StoreHealth store_health_;
  std::unique_ptr<WorkerPool> pool_;
  Dispatcher dispatcher_;
  Progress progress_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  std::mutex configs_mu_;
  std::map<std::string, records::ExperimentConfig> configs_;  // GUARDED_BY(configs_mu_)
  bool stopping_ = false;
  bool finished_ = false;
  Status run_status_;
  std::unique_ptr<ControlServer> control_;
};

Status SchedulerImpl::Submit(const records::ExperimentConfig& config) {
  const std::string& id = config.name;
  if (entries_.count(id)) return Status::AlreadyExists("experiment " + id + " already submitted");
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<Policy> policy, Policy::Create(config));
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
  } else if (existing.status().IsNotFound()) {
    CKPT_RETURN_IF_ERROR(CreateExperimentRecords(store_.get(), config));
  } else {
    return existing.status();
  }
  CKPT_ASSIGN_OR_RETURN(std::vector<Member> members, LoadMembers(store_.get(), config));
  if (existing.ok()) {
    if (status == records::ExperimentStatus::kPaused) {
      Logger().info("experiment {} is paused", id);
    } else if (status == records::ExperimentStatus::kRunning) {
      Logger().info("resuming experiment {} from {}", id, options_.store_path);
    }
  }
  if (status == records::ExperimentStatus::kRunning) {
    CKPT_RETURN_IF_ERROR(store_->SetExperimentStatus(id, "running"));
  }
  Entry entry;
  entry.io =
      std::make_unique<StoreExperimentIo>(store_.get(), id, options_.kill_point, metrics_.get());
  ExperimentOptions eo;
  eo.max_member_failures = options_.supervision.max_member_failures;
  eo.final_eval_top = options_.final_eval_top;
  eo.run_ahead = options_.run_ahead;
  entry.experiment = std::make_unique<Experiment>(config, std::move(policy), std::move(members),
                                                  status, eo, entry.io.get(), Clock::now());
  entry.announced_end = entry.experiment->ended();
  {
    std::lock_guard<std::mutex> lock(configs_mu_);
    configs_[id] = config;
  }
  order_.push_back(id);
  Experiment* e = entry.experiment.get();
  entries_[id] = std::move(entry);
  // Queue what can run now; a stored run may also end here (its last barrier
  // had been applied before a crash).
  e->Start();
  return Status::OK();
}

StatusOr<ipc::Configure> SchedulerImpl::ConfigureFor(const std::string& exp) {
  // Called from sender threads.
  std::lock_guard<std::mutex> lock(configs_mu_);
  auto it = configs_.find(exp);
  if (it == configs_.end()) return Status::NotFound("experiment " + exp + " is not known");
  const records::ExperimentConfig& c = it->second;
  ipc::Configure m;
  m.experiment = c.name;
  m.model_spec = c.model_spec;
  m.dataset = c.dataset;
  m.dataset_path = c.dataset_path;
  m.data_format = std::string(format::DatasetFormatName(c.data_format));
  if (c.data_format != format::DatasetFormat::kIdx) {
    m.val_size = c.tensor_data.val_size;
    m.classes = c.tensor_data.classes;
    m.data_mean = c.tensor_data.mean;
    m.data_std = c.tensor_data.std;
  }
  if (c.loss) m.loss = std::string(format::LossKindName(*c.loss));
  if (c.metric) m.metric = std::string(format::MetricKindName(*c.metric));
  m.augment = format::AugmentationNames(c.augment);
  m.optimizer = std::string(format::OptimizerKindName(c.optimizer));
  m.batch_size = c.batch_size;
  m.eval_size = c.eval_size;
  m.seed = c.seed;
  return m;
}

void SchedulerImpl::Dispatch() {
  if (stopping_ || !pool_) return;
  for (const auto& [id, entry] : entries_) {
    if (store_health_.waiting_for_space()) break;
    if (entry.experiment->WaitingForStore()) {
      store_health_.WaitForSpace(id + ": " + entry.experiment->store_refusal());
    }
  }
  if (store_health_.waiting_for_space()) return;
  dispatcher_.Dispatch(pool_.get(), InOrder(), Clock::now());
}

void SchedulerImpl::NoteStateSize(Entry& entry, uint64_t bytes) {
  if (bytes <= entry.state_bytes) return;
  entry.state_bytes = bytes;
  uint64_t total = 0;
  for (const auto& [id, x] : entries_) {
    if (!x.experiment->ended()) {
      total += x.state_bytes * static_cast<uint64_t>(x.experiment->config().population);
    }
  }
  store_health_.SizeForHeadStates(total);
}

void SchedulerImpl::OnTaskEvent(size_t worker, WorkerEvent ev) {
  if (ev.kind == WorkerEvent::Kind::kConfigureRefused) {
    if (Experiment* e = Find(ev.exp)) {
      e->OnConfigureRefused("worker " + std::to_string(worker) + ": " + ev.reason);
    }
  } else if (Experiment* e = Find(ev.task.exp)) {
    const WorkItem& item = ev.task;
    switch (ev.kind) {
      case WorkerEvent::Kind::kCommitted:
        if (metrics_) {
          metrics_->IntervalCommitted(
              e->id(), pool_->devices()[worker].device, SecondsSince(ev.task.dispatched),
              static_cast<uint64_t>(std::max<int64_t>(0, ev.result.samples)));
        }
        NoteStateSize(entries_[e->id()], ev.result.state.size);
        e->OnCommitted(item, ev.version, ev.result.step, ev.result.val_score, ev.result.samples,
                       Clock::now());
        if (!ev.record_status.ok()) e->OnRecordRefused(item.member, ev.record_status);
        break;
      case WorkerEvent::Kind::kEvaluated:
        e->OnEvaluated(item, ev.result.test_score);
        break;
      case WorkerEvent::Kind::kFailed:
        if (metrics_) metrics_->MemberFailed(e->id(), ev.code);
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/false);
        break;
      case WorkerEvent::Kind::kBadResult:
        // The worker's fault, not the member's: counted, rerun, not charged.
        if (metrics_) metrics_->MemberFailed(e->id(), ipc::FailureCode::kBadResult);
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/true);
        break;
      case WorkerEvent::Kind::kCommitError: {
        if (ev.commit_status == StatusCode::kResourceExhausted) {
          // A full disk is no fault of the member: the interval reruns from
          // its committed head once the store has space again.
          if (metrics_) metrics_->MemberFailed(e->id(), ipc::FailureCode::kStoreFull);
          e->OnReturned(item);
          store_health_.WaitForSpace(ev.reason);
          break;
        }
        const bool moved = ev.commit_status == StatusCode::kAborted;
        if (!moved && store_health_.BrokenForGood()) {
          // The store's fault, not the member's: the interval reruns from
          // its committed head once ckpt is restarted on a reopened store.
          e->OnReturned(item);
          break;
        }
        if (metrics_ && !moved) {
          metrics_->MemberFailed(e->id(), ipc::FailureCode::kCommitError);
        }
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/moved);
        break;
      }
      default:
        break;
    }
  }
  AfterChange();
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnStoreWritable() {
  for (auto& [id, entry] : entries_) entry.experiment->RetryDeferred();
  AfterChange();
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnWorkerLost(size_t worker, const std::string& reason,
                                 std::vector<Task> unfinished, bool given_up) {
  for (const Task& t : unfinished) {
    Experiment* e = Find(t.exp);
    if (e == nullptr) continue;
    if (metrics_ && !t.eval_only && !e->ended()) {
      metrics_->MemberFailed(e->id(), ipc::FailureCode::kWorkerLost);
    }
    e->OnReturned(t);
  }
  const auto& device = pool_->devices()[worker].device;
  for (const auto& id : order_) {
    (void)store_->AppendEvent(id, records::EncodeEvent(records::WorkerLostEvent{
                                      given_up && !stopping_, static_cast<int64_t>(worker), device,
                                      reason, static_cast<int64_t>(unfinished.size())}));
  }
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnStoreBroken(const Status& s) {
  if (run_status_.ok()) {
    run_status_ = Status(s.code(),
                         "the store refuses every write, so ckpt stopped; start it "
                         "again to reopen the store (what it committed is kept): " +
                             s.message());
  }
  BeginStop("the store refuses every write");
}

void SchedulerImpl::OnAllGivenUp(const std::string& last_reason) {
  run_status_ = Status::Unavailable("every worker was given up on; last: " + last_reason);
  BeginStop("no workers left");
}

void SchedulerImpl::AfterChange() {
  bool any_ended = false;
  for (auto& [id, entry] : entries_) {
    if (entry.experiment->ended() && !entry.announced_end) {
      entry.announced_end = true;
      any_ended = true;
      trace::Ended(id, records::ExperimentStatusName(entry.experiment->status()));
    }
  }
  if (!any_ended) return;
  PrintProgress(true);
  if (AllEnded() && !options_.serve) BeginStop("all experiments ended");
}

void SchedulerImpl::BeginStop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  if (pool_) pool_->Drain();
  if (options_.notify) options_.notify("STOPPING=1");
  // No new requests while stopping; the socket goes away with the server.
  if (control_) control_->Close();
  if (why != "all experiments ended") Logger().info("stopping: {}", why);
  grace_timer_.expires_after(options_.supervision.grace);
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished_) return;
    Logger().warn(
        "grace period over: abandoning in-flight intervals (they rerun from committed heads)");
    ShutdownWorkers(false);
  });
  MaybeFinishStop();
}

void SchedulerImpl::MaybeFinishStop() {
  if (finished_) return;
  int in_flight = 0;
  for (const auto& [id, e] : entries_) in_flight += e.experiment->in_flight();
  if (in_flight > 0) return;
  ShutdownWorkers(true);
}

void SchedulerImpl::ShutdownWorkers(bool graceful) {
  if (finished_) return;
  finished_ = true;
  if (pool_) pool_->StopAll(graceful);
  tick_.cancel();
  grace_timer_.cancel();
  store_health_.Stop();
  sighup_.cancel();
  if (control_) control_->Close();
  signals_.cancel();
  sigchld_.cancel();
  ReportMetrics();
  const auto t0 = Clock::now();
  (void)store_->Flush();
  if (metrics_) metrics_->StoreOperation(metrics::StoreOp::kFlush, SecondsSince(t0), 0);
  io_.stop();
}

void SchedulerImpl::OnReload() {
  if (!options_.reload) {
    Logger().info("SIGHUP: nothing to reload");
    return;
  }
  auto next = options_.reload();
  if (!next.ok()) {
    Logger().warn("SIGHUP: reload failed, keeping the current settings: {}",
                  next.status().ToString());
    return;
  }
  std::string not_applied;
  if (control_) not_applied = control_->Reconfigure(*next);
  options_.control = *next;
  Logger().info("SIGHUP: reloaded users, groups and limits{}",
                not_applied.empty() ? std::string() : "; not applied: " + not_applied);
}

void SchedulerImpl::Tick() {
  PrintProgress(false);
  ReportMetrics();
  store_health_.ReportBackgroundErrors(order_);
  tick_.expires_after(milliseconds(1000));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void SchedulerImpl::ReportMetrics() {
  if (!metrics_) return;
  if (pool_) pool_->ReportRingStats();
  for (Experiment* e : InOrder()) {
    metrics_->SetMemberCounts(e->id(), CountMembers(*e));
    std::vector<double> scores;
    for (const auto& m : e->members()) {
      if (std::isfinite(m.state.score)) scores.push_back(m.state.score);
    }
    std::sort(scores.begin(), scores.end());
    metrics_->SetScores(e->id(), e->config().Metric(),
                        scores.empty() ? std::nan("") : scores.back(),
                        scores.empty() ? std::nan("") : scores[scores.size() / 2]);
  }
}

void SchedulerImpl::PrintProgress(bool force_line) {
  std::vector<const Experiment*> all;
  for (Experiment* e : InOrder()) all.push_back(e);
  progress_.Print(all, Clock::now(), force_line);
}

Status SchedulerImpl::Run() {
  // With remote.local false only connected workers train.
  const auto devices = options_.remote.local ? ExpandDevices(options_.devices)
                                             : std::vector<records::DeviceConfig>{};
  if (devices.empty() && options_.remote.listen.empty()) {
    return Status::InvalidArgument("no devices configured and not listening for workers");
  }
  // Segments left in /dev/shm by schedulers that were killed, of any store:
  // names of the default shape, whose owner is gone.
  auto swept = ipc::Channel::RemoveStale(IsDefaultSegmentName);
  if (!swept.ok()) {
    Logger().warn("could not sweep stale shared-memory segments: {}", swept.status().ToString());
  } else if (!swept->empty()) {
    std::string names;
    for (const auto& n : *swept) names += (names.empty() ? "" : ", ") + n;
    Logger().info("removed {} shared-memory segment(s) of schedulers that died: {}", swept->size(),
                  names);
  }
  WorkerPoolOptions po;
  po.devices = devices;
  po.binary = options_.worker_binary;
  po.instance = options_.instance;
  po.ring_bytes = options_.ring_bytes;
  po.supervision = options_.supervision;
  po.metrics = metrics_.get();
  po.listen = options_.remote.listen;
  po.secret_file = options_.remote.secret_file;
  po.max_remote_workers = options_.remote.max_remote;
  po.address_file = (std::filesystem::path(options_.store_path) / "workers.addr").string();
  pool_ = std::make_unique<WorkerPool>(
      io_, store_.get(), po, [this](const std::string& exp) { return ConfigureFor(exp); }, this);
  CKPT_RETURN_IF_ERROR(pool_->StartListening());

  Status s;
  try {
    s = RunLoop();
  } catch (const std::exception& e) {
    CountRootException();
    Logger().critical("event loop: unexpected exception: {}; stopping the workers", e.what());
    s = Status::Internal(std::string("event loop failed: ") + e.what());
  } catch (...) {
    CountRootException();
    Logger().critical("event loop: unexpected non-standard exception; stopping the workers");
    s = Status::Internal("event loop failed with a non-standard exception");
  }
  if (!s.ok() && !finished_) {
    // Nothing committed is lost: in-flight intervals rerun from their heads.
    finished_ = true;
    pool_->StopAll(false);
    if (control_) control_->Close();
    (void)store_->Flush();
  }
  progress_.Close();
  return s;
}

Status SchedulerImpl::RunLoop() {
  signals_.add(SIGINT);
  signals_.add(SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [this, &on_signal](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        BeginStop(sig == SIGINT ? "interrupted (Ctrl-C)" : "terminated (SIGTERM)");
        signals_.async_wait(on_signal);
      };
  signals_.async_wait(on_signal);
  std::function<void(const boost::system::error_code&, int)> on_child =
      [this, &on_child](const boost::system::error_code& ec, int) {
        if (ec) return;
        pool_->Reap();
        sigchld_.async_wait(on_child);
      };
  sigchld_.async_wait(on_child);
  if (options_.serve) {
    // Every unfinished experiment of the store resumes; one that cannot is
    // reported and left as it is, and the others go on.
    CKPT_ASSIGN_OR_RETURN(auto stored, store_->ListExperiments());
    for (const auto& x : stored) {
      auto status = records::ParseExperimentStatus(x.status);
      if (Find(x.id) != nullptr || (status.ok() && *status != records::ExperimentStatus::kRunning &&
                                    *status != records::ExperimentStatus::kPaused)) {
        continue;
      }
      auto toml = records::DecodeExperimentToml(x.config_json, x.id);
      const std::string text = toml.ok() ? *toml : std::string();
      // The model allowlist holds for a resumed experiment as for a submitted
      // one (the list may have changed since): judged before the model file
      // is opened, as the control server's submit does.
      Status s = toml.status();
      if (s.ok() && options_.control.allowed_model_dirs) {
        auto unchecked = records::ParseExperimentConfig(text, x.id, records::FileChecks::kSkip);
        s = unchecked.ok() ? records::CheckModelFileAllowed(
                                 unchecked->model_spec, *options_.control.allowed_model_dirs, x.id)
                           : unchecked.status();
      }
      if (s.ok()) {
        auto config = records::ParseExperimentConfig(text, x.id);
        s = config.ok() ? Submit(*config) : config.status();
      }
      if (!s.ok()) {
        Logger().error("cannot resume experiment {}: {}", x.id, s.ToString());
        (void)store_->AppendEvent(x.id,
                                  records::EncodeEvent(records::ResumeFailedEvent{s.ToString()}));
      }
    }
  } else if (AllEnded()) {
    finished_ = true;
    return Status::OK();
  }
  // Declared at function scope: the handler re-arms itself with a reference
  // to it, so it must live as long as io_.run() below.
  std::function<void(const boost::system::error_code&, int)> on_hup =
      [this, &on_hup](const boost::system::error_code& ec, int) {
        if (ec) return;
        OnReload();
        sighup_.async_wait(on_hup);
      };
  if (options_.serve) {
    if (!options_.control.socket_path.empty()) {
      CKPT_ASSIGN_OR_RETURN(control_, ControlServer::Start(this, options_.control));
    }
    sighup_.add(SIGHUP);
    sighup_.async_wait(on_hup);
  }
  pool_->StartAll();
  for (auto& [id, entry] : entries_) entry.announced_end = entry.experiment->ended();
  if (options_.notify) options_.notify("READY=1");
  Tick();
  io_.run();
  return run_status_;
}

StatusOr<std::string> SchedulerImpl::SubmitToml(const std::string& toml,
                                                const std::string& origin) {
  if (stopping_) return Status::Unavailable("the scheduler is stopping");
  CKPT_ASSIGN_OR_RETURN(records::ExperimentConfig config,
                        records::ParseExperimentConfig(toml, origin));
  CKPT_RETURN_IF_ERROR(Submit(config));
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

}  // namespace

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& given) {
  if (given.store_path.empty()) return Status::InvalidArgument("store path is empty");
  SchedulerOptions options = given;
  // A worker binary that is not there is a mistake in the command or the
  // configuration, refused before the store is opened: restarting a worker
  // that cannot start would only fill the log.
  if (options.remote.local && !ExpandDevices(options.devices).empty()) {
    CKPT_ASSIGN_OR_RETURN(options.worker_binary, FindWorkerBinary(options.worker_binary));
  }
  std::error_code ec;
  const auto parent = std::filesystem::absolute(options.store_path).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) {
    return Status::IOError("cannot create " + parent.string() + " for the store: " + ec.message());
  }
  store::StoreOptions so;
  so.path = options.store_path;
  so.sync_interval_commits = options.sync_interval_commits;
  so.kill_point = options.kill_point;
  CKPT_ASSIGN_OR_RETURN(auto store, store::Store::Open(so));
  std::unique_ptr<metrics::Metrics> m;
  if (!options.metrics.empty()) {
    metrics::MetricsOptions mo;
    mo.listen = options.metrics;
    auto opened = metrics::Metrics::Open(mo);
    if (opened.ok()) {
      m = std::move(*opened);
      Logger().info("metrics on http://{}/metrics", options.metrics);
    } else if (options.metrics_required) {
      return opened.status().WithPrefix("metrics endpoint");
    } else {
      Logger().warn("no metrics endpoint: {}; the run goes on without one",
                    opened.status().ToString());
    }
  }
  return std::unique_ptr<Scheduler>(new SchedulerImpl(options, std::move(store), std::move(m)));
}

StatusOr<std::function<void(std::string_view)>> KillPointFromEnvironment() {
  CKPT_ASSIGN_OR_RETURN(std::optional<base::KillAt> at, base::KillAtFromEnvironment());
  if (!at) return std::function<void(std::string_view)>();
  auto hits = std::make_shared<std::atomic<int64_t>>(0);
  return std::function<void(std::string_view)>(
      [point = std::move(at->point), n = at->n, hits](std::string_view p) {
        if (p == point && hits->fetch_add(1) + 1 == n) raise(SIGKILL);
      });
}

}  // namespace ckpt::scheduler
