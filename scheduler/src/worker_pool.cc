#include "worker_pool.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/base/visible_devices.h"
#include "ckpt/ipc/fusion_mode.h"
#include "ckpt/scheduler/scheduler.h"
#include "log.h"
#include "trace.h"

namespace ckpt::scheduler {

namespace asio = boost::asio;
using std::chrono::milliseconds;

namespace {

// kCommitted, kEvaluated, kFailed, kCommitError, kBadResult: the answer to a
// task the handle no longer holds in flight.
bool IsTaskOutcome(WorkerEvent::Kind kind) {
  switch (kind) {
    case WorkerEvent::Kind::kCommitted:
    case WorkerEvent::Kind::kEvaluated:
    case WorkerEvent::Kind::kFailed:
    case WorkerEvent::Kind::kCommitError:
    case WorkerEvent::Kind::kBadResult:
      return true;
    case WorkerEvent::Kind::kHello:
    case WorkerEvent::Kind::kStats:
    case WorkerEvent::Kind::kLost:
    case WorkerEvent::Kind::kConfigureRefused:
      return false;
  }
  return false;
}

// A HELLO's or STATS' mode: none before the first CONFIGURE (""), else a
// ipc::FusionMode name; a name this version does not know (a newer
// worker's) is logged and read as none.
std::optional<ipc::FusionMode> WireMode(const std::string& wire, size_t worker) {
  if (wire.empty()) return std::nullopt;
  auto mode = ipc::ParseFusionMode(wire);
  if (!mode.ok()) {
    Logger().warn("worker {}: {}", worker, mode.status().message());
    return std::nullopt;
  }
  return *mode;
}

// The listener's refusals, logged at most kRefusalsLogged per interval; the
// rest are counted and summed up by the first refusal of a later interval.
// Used on the listener's thread alone.
class RefusalLog {
 public:
  static constexpr int kRefusalsLogged = 10;
  static constexpr std::chrono::seconds kInterval{10};

  void Refused(const std::string& peer, const ckpt::Status& why) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ >= kInterval) {
      if (hidden_ > 0) {
        Logger().warn(
            "refused {} more worker connection(s) in the last {} s (not logged one by "
            "one; the latest from {}: {})",
            hidden_, kInterval.count(), last_peer_, last_why_);
      }
      start_ = now;
      logged_ = 0;
      hidden_ = 0;
    }
    if (logged_ < kRefusalsLogged) {
      ++logged_;
      Logger().warn("refused a worker connection from {}: {}", peer, why.ToString());
      return;
    }
    ++hidden_;
    last_peer_ = peer;
    last_why_ = why.ToString();
  }

 private:
  std::chrono::steady_clock::time_point start_{};
  int logged_ = 0;
  uint64_t hidden_ = 0;
  std::string last_peer_;
  std::string last_why_;
};

// What a remote worker may send before its handle takes it over (a HELLO, say;
// WorkerHandle::AllowReceive from then on): records without a state.
ckpt::Status PendingReceiveLimit(ipc::RecordType type, uint64_t bytes) {
  const bool small = type == ipc::RecordType::kHello || type == ipc::RecordType::kStats ||
                     type == ipc::RecordType::kFailed;
  if (small && bytes <= ipc::kMaxMessageJsonBytes) return ckpt::Status::OK();
  return ckpt::Status::ResourceExhausted(std::string("a ") + ipc::RecordTypeName(type) + " of " +
                                         std::to_string(bytes) +
                                         " bytes before the worker was taken on");
}

}  // namespace

std::vector<records::DeviceConfig> ExpandDevices(const std::vector<records::DeviceConfig>& in) {
  std::vector<records::DeviceConfig> out;
  for (const auto& d : in) {
    std::vector<std::string> names;
    if (d.device == "auto") {
      // Counted here, not by asking CUDA: the scheduler links no CUDA and
      // must not create a context. Workers inherit this environment, so
      // "cuda:K" is the K-th device CUDA shows them.
      const int gpus = base::VisibleGpuCount(base::DriverGpuCount(),
                                             std::getenv(base::kCudaVisibleDevicesVariable));
      if (gpus == 0) names.push_back("cpu");
      for (int g = 0; g < gpus; ++g) names.push_back("cuda:" + std::to_string(g));
    } else {
      names.push_back(d.device);
    }
    for (const auto& n : names) {
      for (int c = 0; c < d.count; ++c) {
        records::DeviceConfig one = d;
        one.device = n;
        one.count = 1;
        out.push_back(one);
      }
    }
  }
  return out;
}

namespace {

// An executable regular file at `path`, else why not.
Status CheckExecutable(const std::filesystem::path& path, const std::string& what) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound(what + " " + path.string() + " does not exist");
  }
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(what + " " + path.string() + " is a directory");
  }
  if (access(path.c_str(), X_OK) != 0) {
    return Status::InvalidArgument(what + " " + path.string() +
                                   " is not executable: " + std::strerror(errno));
  }
  return Status::OK();
}

// `name` (no '/') in the directories of $PATH, as execvp would find it.
std::optional<std::filesystem::path> SearchPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string_view rest = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  while (true) {
    const size_t colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    if (dir.empty()) dir = ".";
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    std::error_code ec;
    if (std::filesystem::is_regular_file(p, ec) && access(p.c_str(), X_OK) == 0) return p;
    if (colon == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(colon + 1);
  }
}

// `configured` as a path (with a '/') or a name on $PATH; `origin` says where
// it was set, for the error.
StatusOr<std::string> ResolveConfigured(const std::string& configured, const std::string& origin) {
  const std::string what = "worker binary (" + origin + ")";
  std::filesystem::path p = configured;
  if (configured.find('/') == std::string::npos) {
    auto found = SearchPath(configured);
    if (!found) return Status::NotFound(what + " " + configured + " is not on PATH");
    p = *found;
  }
  CKPT_RETURN_IF_ERROR(CheckExecutable(p, what));
  std::error_code ec;
  auto absolute = std::filesystem::absolute(p, ec);
  return ec ? p.string() : absolute.lexically_normal().string();
}

}  // namespace

StatusOr<std::string> FindWorkerBinary(const std::string& configured) {
  if (!configured.empty()) return ResolveConfigured(configured, "--worker or [workers] binary");
  if (const char* env = std::getenv("CKPT_WORKER"); env != nullptr && *env) {
    return ResolveConfigured(env, "CKPT_WORKER");
  }
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const char* rel : {"ckpt-worker", "../bin/ckpt-worker", "../lib/ckpt/ckpt-worker"}) {
      auto p = self.parent_path() / rel;
      if (access(p.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(p, ec).string();
    }
  }
  if (auto on_path = SearchPath("ckpt-worker")) return on_path->string();
  return Status::NotFound("no ckpt-worker beside " +
                          (ec ? std::string("this program") : self.string()) +
                          " (nor in ../bin or ../lib/ckpt) nor on PATH; give its path with "
                          "--worker, [workers] binary or CKPT_WORKER");
}

milliseconds NextRestartDelay(milliseconds previous, Clock::duration uptime,
                              const records::SupervisionOptions& s) {
  if (uptime >= s.healthy_reset) previous = milliseconds(0);
  if (previous.count() == 0) return s.restart_backoff;
  return std::min(previous * 2, s.max_restart_backoff);
}

milliseconds RemoteTaskDeadline(std::vector<Clock::duration> durations, double factor,
                                milliseconds floor) {
  using Ms = std::chrono::duration<double, std::milli>;
  if (durations.empty()) {
    return std::chrono::duration_cast<milliseconds>(Ms(floor) * (factor + 1));
  }
  const auto mid = durations.begin() + static_cast<std::ptrdiff_t>(durations.size() / 2);
  std::nth_element(durations.begin(), mid, durations.end());
  return std::chrono::duration_cast<milliseconds>(Ms(*mid) * factor) + floor;
}

milliseconds StartDeadline(const records::SupervisionOptions& s) {
  return std::max(s.heartbeat_timeout, milliseconds(30000));
}

WorkerPool::WorkerPool(asio::io_context& io, store::Store* store, WorkerPoolOptions options,
                       WorkerPoolListener* listener)
    : io_(io), store_(store), options_(std::move(options)), listener_(listener) {
  for (size_t i = 0; i < options_.devices.size(); ++i) {
    auto w = std::make_unique<Worker>();
    w->spec.index = static_cast<int>(i);
    w->spec.device = options_.devices[i];
    w->spec.binary = options_.binary;
    w->spec.segment = options_.instance + "-w" + std::to_string(i);
    w->spec.ring_bytes = options_.ring_bytes;
    w->spec.heartbeat_timeout = options_.supervision.heartbeat_timeout;
    w->spec.name = "w" + std::to_string(i);
    w->spec.metrics = options_.metrics;
    w->spec.layouts = &layouts_;
    w->spec.configures = &configures_;
    workers_.push_back(std::move(w));
  }
  devices_ = options_.devices;
}

WorkerPool::~WorkerPool() {
  StopListening();
  if (deadline_timer_) deadline_timer_->cancel();
  for (auto& w : workers_) {
    if (w->restart_timer) w->restart_timer->cancel();
    if (w->hello_timer) w->hello_timer->cancel();
    if (w->handle) w->handle->Stop(false, milliseconds(0));
  }
}

void WorkerPool::StartAll() {
  for (size_t i = 0; i < workers_.size(); ++i) Start(i);
}

void WorkerPool::Start(size_t i) {
  Worker& w = *workers_[i];
  const uint64_t inc = ++w.incarnation;
  auto h = WorkerHandle::Start(w.spec, store_, [this, i, inc](WorkerEvent ev) {
    asio::post(io_,
               [this, i, inc, ev = std::move(ev)]() mutable { OnEvent(i, inc, std::move(ev)); });
  });
  w.started = Clock::now();
  w.ready = false;
  w.capacity = 0;
  w.busy = 0;
  if (!h.ok()) {
    Logger().error("worker {} ({}) failed to start: {}", i, w.spec.device.device,
                   h.status().ToString());
    OnLost(i, h.status().ToString());
    return;
  }
  w.handle = std::move(*h);
  if (options_.metrics) {
    options_.metrics->WorkerStarted(w.spec.name, w.spec.device.device, w.handle->pid());
  }
  ArmHelloTimer(i, inc);
}

void WorkerPool::ArmHelloTimer(size_t i, uint64_t inc) {
  Worker& w = *workers_[i];
  const milliseconds deadline = StartDeadline(options_.supervision);
  w.hello_timer = std::make_unique<asio::steady_timer>(io_, deadline);
  w.hello_timer->async_wait([this, i, inc, deadline](const boost::system::error_code& ec) {
    Worker& o = *workers_[i];
    if (ec || stopped_ || inc != o.incarnation || o.handle == nullptr || o.ready) return;
    const std::string who =
        o.remote ? o.spec.device.device : "pid " + std::to_string(o.handle->pid());
    OnLost(i, "worker " + std::to_string(i) + " (" + who + ") did not say HELLO within " +
                  std::to_string(deadline.count() / 1000) +
                  " s of its start (hung or stopped while starting)");
  });
}

ckpt::Status WorkerPool::StartListening() {
  if (options_.listen.empty()) {
    // An address left by an earlier run that listened is no longer true.
    std::error_code ec;
    if (!options_.address_file.empty()) std::filesystem::remove(options_.address_file, ec);
    return ckpt::Status::OK();
  }
  if (options_.secret_file.empty()) {
    return ckpt::Status::InvalidArgument("listening for workers on " + options_.listen +
                                         " needs a secret file");
  }
  auto secret = ipc::LoadSecretFile(options_.secret_file);
  if (secret.status().IsNotFound()) {
    CKPT_RETURN_IF_ERROR(ipc::CreateSecretFile(options_.secret_file));
    Logger().info("created secret file {} (mode 0600): give it to the workers' hosts",
                  options_.secret_file);
    secret = ipc::LoadSecretFile(options_.secret_file);
  }
  if (!secret.ok()) return secret.status();
  ipc::TcpOptions to;
  to.channel.heartbeat_timeout = options_.supervision.heartbeat_timeout;
  to.channel.ring_bytes = options_.ring_bytes;
  to.channel.max_message_bytes = options_.max_message_bytes;
  budget_ = std::make_shared<ipc::ReceiveBudget>(options_.remote_memory_bytes);
  to.budget = budget_;
  to.receive_limit = PendingReceiveLimit;
  // On the listener's thread: a peer may cause one refusal per connection, so
  // the log says the first few of each interval and then how many more.
  auto log = std::make_shared<RefusalLog>();
  to.on_refused = [log](const std::string& peer, const ckpt::Status& why) {
    log->Refused(peer, why);
  };
  // From the listener's thread onto the event loop.
  to.on_accepted = [this](ipc::Accepted accepted) {
    auto shared = std::make_shared<ipc::Accepted>(std::move(accepted));
    asio::post(io_, [this, shared] { AddRemote(std::move(*shared)); });
  };
  CKPT_ASSIGN_OR_RETURN(listener_socket_, ipc::TcpListener::Listen(options_.listen, *secret, to));
  const std::string address = listener_socket_->address();
  Logger().info("listening for workers on {}", address);
  ArmDeadlineTimer();
  if (!options_.address_file.empty()) {
    const std::string tmp = options_.address_file + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << address << "\n";
      if (!out.flush()) {
        return ckpt::Status::IOError("writing the workers' address to " + tmp);
      }
    }
    std::error_code ec;
    std::filesystem::rename(tmp, options_.address_file, ec);
    if (ec) {
      return ckpt::Status::IOError("writing the workers' address to " + options_.address_file +
                                   ": " + ec.message());
    }
  }
  return ckpt::Status::OK();
}

void WorkerPool::StopListening() {
  // Joins the listener's thread: no connection is handed over after this.
  if (listener_socket_) listener_socket_->Close();
}

void WorkerPool::ArmDeadlineTimer() {
  if (!deadline_timer_) deadline_timer_ = std::make_unique<asio::steady_timer>(io_);
  deadline_timer_->expires_after(std::chrono::seconds(1));
  deadline_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec || stopped_) return;
    CheckRemoteDeadlines();
    ArmDeadlineTimer();
  });
}

void WorkerPool::CheckRemoteDeadlines() {
  const milliseconds deadline =
      RemoteTaskDeadline(intervals_, options_.task_timeout_factor, options_.task_timeout_floor);
  const auto now = Clock::now();
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = *workers_[i];
    if (!w.remote || !w.handle) continue;
    const std::optional<Task> oldest = w.handle->OldestTask();
    if (!oldest || now - oldest->dispatched <= deadline) continue;
    if (options_.metrics) options_.metrics->RemoteTaskTimedOut();
    const double ran = std::chrono::duration<double>(now - oldest->dispatched).count();
    OnLost(i, fmt::format("its interval of {}/{} (task {}) went unanswered for {:.1f} s, past the "
                          "deadline of {:.1f} s ({} x the median interval, {} seen, + {:.1f} s); "
                          "its intervals go to other workers",
                          oldest->exp, oldest->member, oldest->id, ran, deadline.count() / 1000.0,
                          options_.task_timeout_factor, intervals_.size(),
                          options_.task_timeout_floor.count() / 1000.0));
  }
}

size_t WorkerPool::RemoteEntry() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& o = *workers_[i];
    if (o.remote && !o.handle) {
      // A fresh entry: only the incarnation carries on, so that the events
      // still queued for the lost connection are told apart.
      auto w = std::make_unique<Worker>();
      w->incarnation = o.incarnation;
      workers_[i] = std::move(w);
      return i;
    }
  }
  workers_.push_back(std::make_unique<Worker>());
  devices_.emplace_back();
  return workers_.size() - 1;
}

void WorkerPool::AddRemote(ipc::Accepted accepted) {
  if (stopped_ || draining_) return;  // the channel closes as it goes
  // A lost remote worker's entry holds no channel, thread or buffer (OnLost
  // let its handle go); only its index stays, so that events and commits
  // keep naming one connection each. The live ones are capped.
  size_t live = 0;
  for (const auto& o : workers_) {
    if (o->remote && o->handle) ++live;
  }
  if (live >= static_cast<size_t>(std::max(0, options_.max_remote_workers))) {
    // Logged for the first few, then every 100th: a flood must not flood the log.
    if (remotes_turned_away_++ < 10 || remotes_turned_away_ % 100 == 0) {
      Logger().warn(
          "closed the connection of a worker from {}: {} remote workers are connected already "
          "(max_remote); {} turned away so far",
          accepted.peer, live, remotes_turned_away_);
    }
    return;  // the channel closes as it goes
  }
  const size_t i = RemoteEntry();
  Worker* w = workers_[i].get();
  w->remote = true;
  w->peer = accepted.peer;
  w->spec.index = static_cast<int>(i);
  w->spec.name = "r" + std::to_string(remotes_++);
  w->spec.device.device = w->spec.name + "@" + accepted.peer;
  w->spec.heartbeat_timeout = options_.supervision.heartbeat_timeout;
  w->spec.metrics = options_.metrics;
  w->spec.layouts = &layouts_;
  w->spec.configures = &configures_;
  w->spec.max_message_bytes = options_.max_message_bytes;
  const uint64_t inc = ++w->incarnation;
  w->started = Clock::now();
  // Each event names this connection's device: its entry may be another
  // connection's by the time a late one is handled.
  w->handle = WorkerHandle::Adopt(w->spec, std::move(accepted.channel), store_,
                                  [this, i, inc, device = w->spec.device.device](WorkerEvent ev) {
                                    ev.device = device;
                                    asio::post(io_, [this, i, inc, ev = std::move(ev)]() mutable {
                                      OnEvent(i, inc, std::move(ev));
                                    });
                                  });
  Logger().info("worker {} ({}) connected from {}", i, w->spec.name, accepted.peer);
  if (options_.metrics) options_.metrics->WorkerStarted(w->spec.name, w->spec.device.device, 0);
  devices_[i] = w->spec.device;
  ArmHelloTimer(i, inc);
}

void WorkerPool::OnEvent(size_t i, uint64_t inc, WorkerEvent ev) {
  Worker& w = *workers_[i];
  if (stopped_) {
    // Nothing is requeued any more, but a worker that dies now (reaped before
    // WorkerHandle::Stop could see its exit) is still said.
    if (ev.kind == WorkerEvent::Kind::kLost && inc == w.incarnation) {
      Logger().warn("worker {} ({}) lost while the scheduler stopped: {}", i, w.spec.device.device,
                    ev.reason);
    }
    return;
  }
  if (inc != w.incarnation || w.handle == nullptr) {
    // The worker was lost (dropped by the pool, or timed out) while this
    // event was queued. A task's outcome was taken out of the handle's
    // in-flight set before it was queued, so it is not among the tasks
    // OnLost requeued: delivered here, or its member would wait forever.
    if (IsTaskOutcome(ev.kind)) ForwardTaskEvent(i, std::move(ev));
    return;
  }
  switch (ev.kind) {
    case WorkerEvent::Kind::kLost:
      OnLost(i, ev.reason);
      return;
    case WorkerEvent::Kind::kHello:
      w.ready = true;
      w.rss_bytes = 0;  // a new process: nothing measured until its first STATS
      w.device_memory_bytes = 0;
      w.capacity = std::clamp(ev.hello.slots, 1, kMaxWorkerSlots);
      if (ev.hello.slots != w.capacity) {
        Logger().warn("worker {} ({}) offered {} slots; using {} (at least 1, at most {})", i,
                      w.spec.device.device, ev.hello.slots, w.capacity, kMaxWorkerSlots);
      }
      if (w.remote && w.capacity > options_.max_remote_slots) {
        Logger().warn(
            "worker {} ({}) offered {} slots; using {} ([workers] max_remote_slots, the most a "
            "remote worker is given)",
            i, w.spec.device.device, ev.hello.slots, options_.max_remote_slots);
        w.capacity = std::max(1, options_.max_remote_slots);
        if (options_.metrics) options_.metrics->RemoteSlotsCapped();
      }
      w.mode = WireMode(ev.hello.mode, i);
      trace::Hello(static_cast<int>(i), ev.hello.device);
      listener_->OnWorkerReady(i);
      return;
    case WorkerEvent::Kind::kStats:
      w.samples_per_s = ev.stats.samples_per_s;
      w.rss_bytes = ev.stats.rss_bytes;
      w.device_memory_bytes = ev.stats.allocator_bytes;
      w.mode = WireMode(ev.stats.mode, i);
      if (options_.metrics) {
        metrics::WorkerStats ws;
        ws.samples_total = ev.stats.samples_total;
        ws.slots = ev.stats.slots;
        ws.slots_busy = ev.stats.slots_busy;
        ws.fused = w.mode == ipc::FusionMode::kFused;
        // The worker reports the allocator's bytes in use (its caching
        // allocator on a GPU); it has no separate reserved figure.
        ws.allocator_allocated_bytes = ev.stats.allocator_bytes;
        options_.metrics->SetWorkerStats(w.spec.name, w.spec.device.device, ws);
      }
      return;
    case WorkerEvent::Kind::kConfigureRefused:
      ForwardTaskEvent(i, std::move(ev));
      return;
    default: {
      w.busy = std::max(0, w.busy - 1);
      if (ev.kind == WorkerEvent::Kind::kCommitted) {
        w.bad_results_in_row = 0;
        NoteInterval(Clock::now() - ev.task.dispatched);
      }
      const bool drop =
          ev.kind == WorkerEvent::Kind::kBadResult && ++w.bad_results_in_row >= kMaxBadResultsInRow;
      if (drop) {
        // Dropped before the event is handled, so that the interval it
        // requeues is not dispatched to this worker again.
        w.bad_results_in_row = 0;
        OnLost(i, std::to_string(kMaxBadResultsInRow) +
                      " RESULTs in a row did not answer their tasks (see the warnings above)");
      }
      ForwardTaskEvent(i, std::move(ev));
      return;
    }
  }
}

void WorkerPool::OnLost(size_t i, const std::string& reason) {
  Worker& w = *workers_[i];
  std::vector<Task> unfinished;
  if (w.handle) {
    w.peak_rss_total += w.handle->PeakRssBytes();
    w.handle->Stop(false, milliseconds(0));
    unfinished = w.handle->TakeUnfinished();
    w.handle.reset();
    if (options_.metrics) options_.metrics->WorkerExited(w.spec.name, w.spec.device.device);
  }
  w.ready = false;
  w.busy = 0;
  Logger().warn("worker {} ({}) lost: {}{}", i, w.spec.device.device, reason,
                unfinished.empty() ? std::string()
                                   : "; " + std::to_string(unfinished.size()) +
                                         " member(s) requeued from their committed heads");
  trace::Lost(static_cast<int>(i), reason);
  if (w.remote) {
    // Not ours to restart: its launcher may connect a new one.
    w.given_up = true;
    listener_->OnWorkerLost(i, w.spec.device.device, reason, std::move(unfinished), true);
    return;
  }
  if (stopped_ || draining_) {
    listener_->OnWorkerLost(i, w.spec.device.device, reason, std::move(unfinished), true);
    return;
  }
  w.backoff = NextRestartDelay(w.backoff, Clock::now() - w.started, options_.supervision);
  const bool given_up = ++w.restarts > options_.supervision.max_restarts;
  if (given_up) {
    w.given_up = true;
    Logger().error("giving up on worker {} ({}) after {} restarts", i, w.spec.device.device,
                   options_.supervision.max_restarts);
  } else {
    w.restart_timer = std::make_unique<asio::steady_timer>(io_, w.backoff);
    w.restart_timer->async_wait([this, i](const boost::system::error_code& ec) {
      if (!ec && !stopped_) Start(i);
    });
  }
  listener_->OnWorkerLost(i, w.spec.device.device, reason, std::move(unfinished), given_up);
  if (given_up) {
    const bool any =
        std::any_of(workers_.begin(), workers_.end(), [](const auto& o) { return !o->given_up; });
    // While listening, workers may still connect: the run waits for them.
    if (!any && !listener_socket_) listener_->OnAllGivenUp(reason);
  }
}

void WorkerPool::NoteInterval(Clock::duration d) {
  if (intervals_.size() < kIntervalsRemembered) {
    intervals_.push_back(d);
    return;
  }
  intervals_[interval_next_] = d;
  interval_next_ = (interval_next_ + 1) % kIntervalsRemembered;
}

void WorkerPool::ForwardTaskEvent(size_t i, WorkerEvent ev) {
  if (ev.device.empty()) ev.device = workers_[i]->spec.device.device;
  listener_->OnTaskEvent(i, std::move(ev));
}

void WorkerPool::Reap() {
  for (auto& wp : workers_) {
    Worker& w = *wp;
    if (w.remote || !w.handle || w.handle->exited()) continue;
    int status = 0;
    if (waitpid(w.handle->pid(), &status, WNOHANG) == w.handle->pid()) {
      w.handle->MarkExited(status);  // reports kLost through the event path
    }
  }
}

int WorkerPool::PickFree(int per_slot) const {
  int best = -1;
  for (size_t i = 0; i < workers_.size(); ++i) {
    const Worker& w = *workers_[i];
    if (!w.handle || !w.ready || w.busy >= per_slot * w.capacity) continue;
    if (best < 0 || w.capacity - w.busy > workers_[best]->capacity - workers_[best]->busy) {
      best = static_cast<int>(i);
    }
  }
  return best;
}

void WorkerPool::Send(size_t i, Task task) {
  Worker& w = *workers_[i];
  CKPT_CHECK(w.handle != nullptr);
  ++w.busy;
  w.handle->Enqueue(std::move(task));
}

void WorkerPool::StopAll(bool graceful) {
  if (stopped_) return;
  stopped_ = true;
  StopListening();
  if (deadline_timer_) deadline_timer_->cancel();
  for (auto& w : workers_) {
    if (w->restart_timer) w->restart_timer->cancel();
    if (w->hello_timer) w->hello_timer->cancel();
    if (w->handle) {
      w->peak_rss_total += w->handle->PeakRssBytes();
      w->handle->Stop(graceful, milliseconds(2000));
    }
  }
}

void WorkerPool::ReportRingStats() const {
  if (!options_.metrics) return;
  for (const auto& w : workers_) {
    if (!w->handle) continue;
    const ipc::ChannelStats c = w->handle->ChannelStats();
    metrics::RingStats r;
    r.bytes_to_worker_total = c.bytes_sent;
    r.bytes_from_worker_total = c.bytes_received;
    r.bad_records_total = c.bad_records;
    r.used_bytes = c.send_ring_used;
    r.capacity_bytes = c.send_window_bytes;
    options_.metrics->SetRingStats(w->spec.name, w->spec.device.device, r);
  }
}

std::vector<WorkerStatus> WorkerPool::Status() const {
  std::vector<WorkerStatus> out;
  for (const auto& w : workers_) {
    WorkerStatus s;
    s.index = w->spec.index;
    s.device = w->spec.device.device;
    s.host = w->peer;
    s.pid = w->handle ? w->handle->pid() : 0;
    s.ready = w->ready;
    s.mode = w->mode;
    s.capacity = w->capacity;
    s.busy = w->busy;
    s.restarts = w->restarts;
    s.given_up = w->given_up;
    s.samples_per_s = w->samples_per_s;
    s.rss_bytes = w->rss_bytes;
    s.device_memory_bytes = w->device_memory_bytes;
    out.push_back(s);
  }
  return out;
}

int64_t WorkerPool::PeakRssBytes() const {
  int64_t sum = 0;
  for (const auto& w : workers_) sum += w->peak_rss_total;
  return sum;
}

}  // namespace ckpt::scheduler
