// SchedulerImpl's creation, run and stop (scheduler_impl.h).
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
#include <optional>

#include "ckpt/base/kill_point.h"
#include "ckpt/ipc/channel.h"
#include "log.h"
#include "scheduler_impl.h"
#include "submit_checks.h"
#include "trace.h"

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

}  // namespace

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
  po.remote_memory_bytes = options_.remote.remote_memory_bytes;
  po.max_remote_slots = options_.remote.max_remote_slots;
  po.task_timeout_factor = options_.remote.task_timeout_factor;
  po.task_timeout_floor = options_.remote.task_timeout_floor;
  po.address_file = (std::filesystem::path(options_.store_path) / "workers.addr").string();
  pool_ = std::make_unique<WorkerPool>(io_, store_.get(), po, this);
  for (const auto& [id, entry] : entries_) pool_->AddExperiment(id, entry.configure);
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
      // The model and data allowlists hold for a resumed experiment as for a
      // submitted one (the lists may have changed since): judged before the
      // files are opened, as the control server's submit does.
      Status s = toml.status();
      if (s.ok()) {
        auto config = PrepareSubmission(options_.control, text, x.id);
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
  so.blob_log = options.blob_log;
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
