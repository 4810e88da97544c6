#include "worker_handle.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>

#include "ckpt/format/checkpoint.h"
#include "log.h"
#include "trace.h"

namespace ckpt::scheduler {

using std::chrono::milliseconds;

std::shared_ptr<const StateLayout> StateLayouts::Find(const std::string& exp) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_exp_.find(exp);
  return it == by_exp_.end() ? nullptr : it->second;
}

std::shared_ptr<const StateLayout> StateLayouts::Establish(const std::string& exp,
                                                           StateLayout layout) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& known = by_exp_[exp];
  if (!known) known = std::make_shared<const StateLayout>(std::move(layout));
  return known;
}

void StateLayouts::RememberCommitted(const std::string& exp, const std::string& member,
                                     Header header) {
  std::lock_guard<std::mutex> lock(mu_);
  committed_[{exp, member}] = std::move(header);
}

std::optional<StateLayouts::Header> StateLayouts::Committed(const std::string& exp,
                                                            const std::string& member,
                                                            const BlobId& blob) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = committed_.find({exp, member});
  if (it == committed_.end() || it->second.blob != blob) return std::nullopt;
  return it->second;
}

void StateLayouts::NoteStateBytes(const std::string& exp, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t& known = state_bytes_[exp];
  known = std::max(known, bytes);
}

uint64_t StateLayouts::StateBytes(const std::string& exp) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = state_bytes_.find(exp);
  return it == state_bytes_.end() ? 0 : it->second;
}

void ConfigureMessages::Add(const std::string& exp, ipc::Configure message) {
  auto shared = std::make_shared<const ipc::Configure>(std::move(message));
  std::lock_guard<std::mutex> lock(mu_);
  by_exp_[exp] = std::move(shared);
}

StatusOr<std::shared_ptr<const ipc::Configure>> ConfigureMessages::Find(
    const std::string& exp) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_exp_.find(exp);
  if (it == by_exp_.end()) return Status::NotFound("experiment " + exp + " is not known");
  return it->second;
}

int64_t WorkerSpec::MaxHelloSlots() const {
  if (segment.empty()) return kMaxHelloSlots;
  return std::min<int64_t>(kMaxHelloSlots, int64_t{std::max(1, device.slots)} *
                                               int64_t{std::max(1, device.fusion_width)});
}

WorkerHandle::WorkerHandle(const WorkerSpec& spec, store::Store* store, Callback on_event)
    : spec_(spec), store_(store), on_event_(std::move(on_event)) {}

StatusOr<std::unique_ptr<WorkerHandle>> WorkerHandle::Start(const WorkerSpec& spec,
                                                            store::Store* store,
                                                            Callback on_event) {
  std::unique_ptr<WorkerHandle> h(new WorkerHandle(spec, store, std::move(on_event)));
  ipc::ChannelOptions options;
  options.ring_bytes = spec.ring_bytes;
  options.heartbeat_timeout = spec.heartbeat_timeout;
  // A previous incarnation's segment was removed by its Stop; one left by a
  // dead scheduler is reclaimed by Create, a live owner's is refused.
  CKPT_ASSIGN_OR_RETURN(h->channel_, ipc::Channel::Create(spec.segment, options));
  CKPT_RETURN_IF_ERROR(h->Spawn());
  h->sender_ = std::thread([p = h.get()] { p->SendLoop(); });
  h->receiver_ = std::thread([p = h.get()] { p->ReceiveLoop(); });
  return h;
}

std::unique_ptr<WorkerHandle> WorkerHandle::Adopt(const WorkerSpec& spec,
                                                  std::unique_ptr<ipc::Channel> channel,
                                                  store::Store* store, Callback on_event) {
  std::unique_ptr<WorkerHandle> h(new WorkerHandle(spec, store, std::move(on_event)));
  h->channel_ = std::move(channel);
  h->channel_->SetReceiveLimit(
      [p = h.get()](ipc::RecordType type, uint64_t bytes) { return p->AllowReceive(type, bytes); });
  h->sender_ = std::thread([p = h.get()] { p->SendLoop(); });
  h->receiver_ = std::thread([p = h.get()] { p->ReceiveLoop(); });
  return h;
}

Status WorkerHandle::Spawn() {
  std::vector<std::string> args = {spec_.binary,
                                   "--segment",
                                   spec_.segment,
                                   "--device",
                                   spec_.device.device,
                                   "--slots",
                                   std::to_string(spec_.device.slots),
                                   "--fusion",
                                   ipc::FusionModeName(spec_.device.fusion),
                                   "--fusion-width",
                                   std::to_string(spec_.device.fusion_width),
                                   "--intra-op-threads",
                                   std::to_string(spec_.device.intra_op_threads)};
  if (spec_.device.tf32) args.push_back("--tf32");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (access(spec_.binary.c_str(), X_OK) != 0) {
    return Status::NotFound("worker binary " + spec_.binary +
                            " is not executable: " + std::strerror(errno));
  }
  // The environment is built before fork: setenv in the child of a threaded
  // process is not async-signal-safe (it takes a lock and may allocate; another
  // thread may have held either at fork, and the child would hang).
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "CUDA_MODULE_LOADING=", 20) != 0) env.emplace_back(*e);
  }
  env.push_back("CUDA_MODULE_LOADING=LAZY");
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return Status::IOError(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    // The worker dies with its scheduler; it also watches the scheduler's
    // heartbeat, but this needs no polling.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  pid_ = pid;
  return Status::OK();
}

WorkerHandle::~WorkerHandle() { Stop(false, milliseconds(0)); }

void WorkerHandle::Enqueue(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void WorkerHandle::SendLoop() {
  try {
    SendLoopBody();
  } catch (const std::exception& e) {
    CountRootException();
    Logger().error("worker {} sender thread: unexpected exception: {}", spec_.index, e.what());
    ReportLost(std::string("sender thread failed: ") + e.what());
  } catch (...) {
    CountRootException();
    Logger().error("worker {} sender thread: unexpected non-standard exception", spec_.index);
    ReportLost("sender thread failed");
  }
}

void WorkerHandle::ReceiveLoop() {
  try {
    ReceiveLoopBody();
  } catch (const std::exception& e) {
    CountRootException();
    Logger().error("worker {} receiver thread: unexpected exception: {}", spec_.index, e.what());
    ReportLost(std::string("receiver thread failed: ") + e.what());
  } catch (...) {
    CountRootException();
    Logger().error("worker {} receiver thread: unexpected non-standard exception", spec_.index);
    ReportLost("receiver thread failed");
  }
}

void WorkerHandle::ReceiveLoopBody() {
  while (!stopping_.load()) {
    auto rec = channel_->Receive(ipc::DeadlineIn(milliseconds(200)));
    if (!rec.ok()) {
      if (rec.status().IsResourceExhausted()) continue;
      if (stopping_.load()) return;
      ReportLost(rec.status().ToString());
      return;
    }
    switch (rec->type) {
      case ipc::RecordType::kResult:
        HandleResult(*rec);
        break;
      case ipc::RecordType::kFailed: {
        auto f = ipc::DecodeFailed(rec->payload, rec->size);
        channel_->Release();
        if (!f.ok()) {
          ReportLost("bad FAILED record: " + f.status().ToString());
          return;
        }
        WorkerEvent e;
        const ipc::FailureCode code = f->code;
        if (f->task_id == 0 && code == ipc::FailureCode::kConfigureRefused) {
          e.kind = WorkerEvent::Kind::kConfigureRefused;
          e.exp = f->experiment;
          e.reason = f->reason;
          on_event_(std::move(e));
          break;
        }
        e.kind = WorkerEvent::Kind::kFailed;
        {
          std::lock_guard<std::mutex> lock(mu_);
          auto it = in_flight_.find(f->task_id);
          if (it == in_flight_.end()) break;  // not ours (or already requeued)
          e.task = it->second;
          in_flight_.erase(it);
        }
        e.code = code;
        e.reason = f->reason;
        on_event_(std::move(e));
        break;
      }
      case ipc::RecordType::kHello: {
        auto h = ipc::DecodeHello(rec->payload, rec->size);
        channel_->Release();
        if (!h.ok()) {
          ReportLost("bad HELLO record: " + h.status().ToString());
          return;
        }
        if (h->slots < 1 || h->slots > spec_.MaxHelloSlots()) {
          ReportLost("bad HELLO record: slots " + std::to_string(h->slots) + " outside 1.." +
                     std::to_string(spec_.MaxHelloSlots()));
          return;
        }
        WorkerEvent e;
        e.kind = WorkerEvent::Kind::kHello;
        e.hello = *h;
        on_event_(std::move(e));
        break;
      }
      case ipc::RecordType::kStats: {
        auto st = ipc::DecodeStats(rec->payload, rec->size);
        channel_->Release();
        if (st.ok()) {
          WorkerEvent e;
          e.kind = WorkerEvent::Kind::kStats;
          e.stats = *st;
          on_event_(std::move(e));
        }
        break;
      }
      default:
        channel_->Release();
        break;
    }
  }
}

Status WorkerHandle::AllowReceive(ipc::RecordType type, uint64_t bytes) const {
  const std::string what =
      std::string("a ") + ipc::RecordTypeName(type) + " of " + std::to_string(bytes) + " bytes";
  switch (type) {
    case ipc::RecordType::kHello:
    case ipc::RecordType::kStats:
    case ipc::RecordType::kFailed:
      if (bytes <= ipc::kMaxMessageJsonBytes) return Status::OK();
      return Status::ResourceExhausted(what + " is above the " +
                                       std::to_string(ipc::kMaxMessageJsonBytes) +
                                       " bytes a record without a state may take");
    case ipc::RecordType::kResult: {
      uint64_t cap = ipc::kMaxMessageJsonBytes;  // a RESULT that answers nothing in flight
      {
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& [id, task] : in_flight_) {
          const uint64_t state =
              task.expected_state_bytes > 0 ? task.expected_state_bytes : spec_.max_message_bytes;
          cap = std::max(cap, state + kResultSlackBytes);
        }
      }
      if (bytes <= cap) return Status::OK();
      return Status::ResourceExhausted(what + " is above the " + std::to_string(cap) +
                                       " bytes its tasks in flight allow (their state plus " +
                                       std::to_string(kResultSlackBytes) + ")");
    }
    default:
      return Status::InvalidArgument(what + ": a worker never sends that type");
  }
}

std::string WorkerHandle::Name() const {
  return "worker " + std::to_string(spec_.index) + " (" + spec_.device.device + ")";
}

void WorkerHandle::ReportLost(const std::string& reason) {
  if (lost_reported_.exchange(true)) return;
  WorkerEvent e;
  e.kind = WorkerEvent::Kind::kLost;
  e.reason = reason;
  on_event_(std::move(e));
}

std::string WorkerHandle::ExitDescription(int wait_status) const {
  std::string why = "worker " + std::to_string(spec_.index) + " (pid " + std::to_string(pid_) + ")";
  if (WIFSIGNALED(wait_status))
    return why + " killed by signal " + std::to_string(WTERMSIG(wait_status));
  return why + " exited with status " + std::to_string(WEXITSTATUS(wait_status));
}

void WorkerHandle::MarkExited(int wait_status) {
  exited_.store(true);
  ReportLost(ExitDescription(wait_status));
}

void WorkerHandle::Stop(bool graceful, std::chrono::milliseconds grace) {
  if (stopped_) return;
  stopped_ = true;
  // The channel's reader may outlive this handle's state: it no longer asks it.
  if (channel_) {
    channel_->SetReceiveLimit(
        [](ipc::RecordType, uint64_t) { return Status::Aborted("the worker is being stopped"); });
  }
  if (graceful && channel_ && !exited_.load()) {
    ipc::Shutdown s{"scheduler stopping"};
    std::vector<uint8_t> buf(ipc::EncodedSize(s));
    if (ipc::Encode(s, buf.data(), buf.size()).ok()) {
      (void)channel_->Send(ipc::RecordType::kShutdown, buf.data(), buf.size(),
                           ipc::DeadlineIn(milliseconds(200)));
    }
  }
  stopping_.store(true);
  cv_.notify_all();
  if (channel_) channel_->Close();
  if (sender_.joinable()) sender_.join();
  if (receiver_.joinable()) receiver_.join();
  if (pid_ > 0 && !exited_.load()) {
    const auto until = std::chrono::steady_clock::now() + (graceful ? grace : milliseconds(0));
    int status = 0;
    while (true) {
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        exited_.store(true);
        // A crash at exit is said: the pool no longer reports losses.
        if (r == pid_ && graceful && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
          Logger().warn("{} ended abnormally while the scheduler stopped: {}", Name(),
                        ExitDescription(status));
        }
        break;
      }
      if (std::chrono::steady_clock::now() >= until) {
        if (graceful) {
          Logger().warn("{} did not exit within {} ms of SHUTDOWN; killed", Name(), grace.count());
        }
        kill(pid_, SIGKILL);
        if (waitpid(pid_, &status, 0) == pid_ || errno == ECHILD) exited_.store(true);
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
  }
  if (channel_ && !spec_.segment.empty()) (void)ipc::Channel::Remove(spec_.segment);
}

std::vector<Task> WorkerHandle::TakeUnfinished() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Task> out;
  for (auto& [id, t] : in_flight_) out.push_back(std::move(t));
  for (auto& t : queue_) out.push_back(std::move(t));
  in_flight_.clear();
  queue_.clear();
  return out;
}

std::optional<Task> WorkerHandle::OldestTask() const {
  std::lock_guard<std::mutex> lock(mu_);
  const Task* oldest = nullptr;
  for (const auto& [id, t] : in_flight_) {
    if (oldest == nullptr || t.dispatched < oldest->dispatched) oldest = &t;
  }
  for (const auto& t : queue_) {
    if (oldest == nullptr || t.dispatched < oldest->dispatched) oldest = &t;
  }
  if (oldest == nullptr) return std::nullopt;
  return *oldest;
}

int64_t WorkerHandle::PeakRssBytes() const {
  if (pid_ <= 0 || exited_.load()) return 0;
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

ipc::ChannelStats WorkerHandle::ChannelStats() const {
  return channel_ ? channel_->Stats() : ipc::ChannelStats{};
}

}  // namespace ckpt::scheduler
