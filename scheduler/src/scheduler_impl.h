// SchedulerImpl: the scheduler's event loop (private to ckpt::scheduler). It
// glues the units together and owns nothing but their lifecycle: experiments
// decide (experiment.h), the worker pool supervises processes
// (worker_pool.h), the dispatcher assigns work (dispatcher.h), progress
// renders (progress.h). Its definitions are split by job:
//   scheduler.cc          creation, the run (signals, ticks, metrics, progress)
//                         and the graceful stop;
//   scheduler_events.cc   the workers' events routed to their experiments, and
//                         dispatch;
//   scheduler_control.cc  the control verbs (submit, pause, resume, stop,
//                         restore, status) of the control socket and the API.
// Events flow one way: the pool reports up (WorkerPoolListener), the
// scheduler commands down (AddExperiment, Send); the pool never asks the
// scheduler for anything.
//
// Thread-safety: every method runs on the event loop (io_'s one thread),
// except RequestStop (posts to it) and the accessors named thread-safe.
#ifndef CKPT_SCHEDULER_SCHEDULER_IMPL_H_
#define CKPT_SCHEDULER_SCHEDULER_IMPL_H_

#include <boost/asio.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/messages.h"
#include "ckpt/metrics/metrics.h"
#include "ckpt/scheduler/scheduler.h"
#include "ckpt/store/store.h"
#include "control_server.h"
#include "control_target.h"
#include "dispatcher.h"
#include "experiment.h"
#include "experiment_store.h"
#include "progress.h"
#include "store_health.h"
#include "worker_pool.h"

namespace ckpt::scheduler {

// One submitted experiment: its logic and the store adapter it writes through.
struct Entry {
  std::unique_ptr<StoreExperimentIo> io;
  std::unique_ptr<Experiment> experiment;
  ipc::Configure configure;    // what its workers are sent (the pool's copy)
  bool announced_end = false;  // its end was printed and counted
  uint64_t state_bytes = 0;    // largest state committed in this run
  // The control-socket user who submitted it (its record keeps the uid);
  // unset for `run` and for experiments stored before uids were recorded.
  std::optional<uint32_t> submitter;
};

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
    boost::asio::post(io_, [this] { BeginStop("stop requested"); });
  }
  StatusOr<ExperimentSummary> Summary(const std::string& exp) override;
  int64_t WorkersPeakRssBytes() const override { return pool_ ? pool_->PeakRssBytes() : 0; }

  // ControlTarget (event loop thread).
  boost::asio::io_context& io() override { return io_; }
  StatusOr<std::string> SubmitConfig(const records::ExperimentConfig& config,
                                     std::optional<uint32_t> submitter) override;
  StatusOr<std::optional<uint32_t>> Submitter(const std::string& exp) override {
    auto it = entries_.find(exp);
    if (it == entries_.end()) return Status::NotFound("experiment " + exp + " is not known");
    return it->second.submitter;
  }
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
  void OnWorkerLost(size_t worker, const std::string& device, const std::string& reason,
                    std::vector<Task> unfinished, bool given_up) override;
  void OnAllGivenUp(const std::string& last_reason) override;

 private:
  // Submit, recording `submitter` with a new experiment.
  Status SubmitAs(const records::ExperimentConfig& config, std::optional<uint32_t> submitter);
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
  boost::asio::io_context io_;
  boost::asio::signal_set signals_;
  boost::asio::signal_set sigchld_;
  boost::asio::signal_set sighup_;
  boost::asio::steady_timer tick_;
  boost::asio::steady_timer grace_timer_;
  StoreHealth store_health_;
  std::unique_ptr<WorkerPool> pool_;
  Dispatcher dispatcher_;
  Progress progress_;
  std::map<std::string, Entry> entries_;
  std::vector<std::string> order_;
  bool stopping_ = false;
  bool finished_ = false;
  Status run_status_;
  std::unique_ptr<ControlServer> control_;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SCHEDULER_IMPL_H_
