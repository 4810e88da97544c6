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
namespace {

using std::chrono::milliseconds;

// The FAILED code a worker gives, with task id 0, when it cannot set up an
// experiment from its CONFIGURE (worker_loop.cc).

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

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

int64_t WorkerSpec::MaxHelloSlots() const {
  if (segment.empty()) return kMaxHelloSlots;
  return std::min<int64_t>(kMaxHelloSlots, int64_t{std::max(1, device.slots)} *
                                               int64_t{std::max(1, device.fusion_width)});
}

WorkerHandle::WorkerHandle(const WorkerSpec& spec, store::Store* store,
                           std::function<StatusOr<ipc::Configure>(const std::string&)> configure,
                           Callback on_event)
    : spec_(spec),
      store_(store),
      configure_(std::move(configure)),
      on_event_(std::move(on_event)) {}

StatusOr<std::unique_ptr<WorkerHandle>> WorkerHandle::Start(
    const WorkerSpec& spec, store::Store* store,
    std::function<StatusOr<ipc::Configure>(const std::string&)> configure, Callback on_event) {
  std::unique_ptr<WorkerHandle> h(
      new WorkerHandle(spec, store, std::move(configure), std::move(on_event)));
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

std::unique_ptr<WorkerHandle> WorkerHandle::Adopt(
    const WorkerSpec& spec, std::unique_ptr<ipc::Channel> channel, store::Store* store,
    std::function<StatusOr<ipc::Configure>(const std::string&)> configure, Callback on_event) {
  std::unique_ptr<WorkerHandle> h(
      new WorkerHandle(spec, store, std::move(configure), std::move(on_event)));
  h->channel_ = std::move(channel);
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

void WorkerHandle::SendLoopBody() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_.load() || !queue_.empty(); });
      if (stopping_.load()) return;
      task = queue_.front();
      queue_.pop_front();
      in_flight_[task.id] = task;
    }
    Status s = SendTask(task);
    Logger().trace("worker {}: sent TRAIN task {} {}/{}: {}", spec_.index, task.id, task.exp,
                   task.member, s.ToString());
    if (!s.ok()) {
      if (stopping_.load()) return;
      ReportLost("sending " + task.member + ": " + s.ToString());
      return;
    }
  }
}

Status WorkerHandle::SendTask(const Task& task) {
  if (configured_.count(task.exp) == 0) {
    CKPT_ASSIGN_OR_RETURN(ipc::Configure c, configure_(task.exp));
    std::vector<uint8_t> buf(ipc::EncodedSize(c));
    CKPT_RETURN_IF_ERROR(ipc::Encode(c, buf.data(), buf.size()));
    while (true) {
      Status s = channel_->Send(ipc::RecordType::kConfigure, buf.data(), buf.size(),
                                ipc::DeadlineIn(milliseconds(500)));
      if (s.ok()) break;
      if (!s.IsResourceExhausted() || stopping_.load()) return s;
    }
    configured_.insert(task.exp);
  }
  ipc::Train t;
  t.task_id = task.id;
  t.member = task.exp + "/" + task.member;
  t.version = task.head_version;
  t.steps = task.steps;
  t.eval_test = task.eval_only;
  t.init_seed = task.init_seed;
  t.hparams = task.hparams;
  store::PinnedBlob blob;
  if (task.head_version > 0) {
    // The worker verifies every tensor checksum; the store's read skips it.
    // Only this task changes the member's head until it is reported back.
    const auto t0 = std::chrono::steady_clock::now();
    auto b = store_->ReadHeadBlob(task.exp, task.member, /*verify=*/false);
    if (!b.ok()) return b.status().WithPrefix("member " + task.member);
    blob = std::move(*b);
    if (spec_.metrics) {
      spec_.metrics->StoreOperation(metrics::StoreOp::kReadHeadBlob, SecondsSince(t0), blob.size());
    }
    t.state.size = blob.size();
    // What the result is checked against: the header alone (the worker
    // verifies the tensors), as the member's last commit of this very blob
    // recorded it, else parsed here. A state that does not parse is sent as
    // before: the worker refuses it as bad_state, which the experiment handles.
    std::optional<StateLayouts::Header> header;
    if (spec_.layouts) header = spec_.layouts->Committed(task.exp, task.member, blob.id());
    if (!header) {
      format::ReadOptions header_only;
      header_only.verify_checksums = false;
      auto view = format::ParseCheckpoint(blob.data(), blob.size(), header_only);
      if (view.ok()) {
        header = StateLayouts::Header{blob.id(), view->meta().step,
                                      std::make_shared<const StateLayout>(LayoutOf(*view))};
        if (spec_.layouts && !spec_.layouts->Find(task.exp)) {
          (void)spec_.layouts->Establish(task.exp, *header->layout);
        }
      }
    }
    if (header) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_flight_.find(task.id);
      if (it != in_flight_.end()) {
        it->second.sent_step = header->step;
        it->second.sent_layout = std::move(header->layout);
      }
    }
  }
  // The encoded header and the store's pinned blob go as two parts, each
  // byte copied once into the ring (no staging, however large the state).
  CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> prefix, ipc::EncodeStatePrefix(t));
  const ipc::PayloadPart parts[2] = {{prefix.data(), prefix.size()}, {blob.data(), blob.size()}};
  const auto send_start = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  while (true) {
    Status s = channel_->SendParts(ipc::RecordType::kTrain, parts, 2,
                                   ipc::DeadlineIn(milliseconds(500)), &sent);
    if (s.ok()) {
      if (spec_.metrics) {
        spec_.metrics->RingSendObserved(spec_.name, spec_.device.device, SecondsSince(send_start));
      }
      return s;
    }
    if (!s.IsResourceExhausted() || stopping_.load()) return s;
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
        const ipc::FailureCode code = ipc::FailureCodeFromWorker(f->code);
        if (f->task_id == 0 && code == ipc::FailureCode::kConfigureRefused) {
          e.kind = WorkerEvent::Kind::kConfigureRefused;
          e.exp = f->member;
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

void WorkerHandle::HandleResult(const ipc::Received& rec) {
  auto r = ipc::DecodeResult(rec.payload, rec.size);
  if (!r.ok()) {
    channel_->Release();
    ReportLost("bad RESULT record: " + r.status().ToString());
    return;
  }
  WorkerEvent e;
  Logger().trace("worker {}: got RESULT task {}", spec_.index, r->task_id);
  trace::Result(static_cast<int>(spec_.index), r->task_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(r->task_id);
    if (it == in_flight_.end()) {
      channel_->Release();
      return;
    }
    e.task = it->second;
    in_flight_.erase(it);
  }
  e.result = *r;
  e.result.state = ipc::ByteSpan{nullptr, r->state.size};  // the ring's bytes are released
  // Checked while the state is still in the ring; the check's parse of it is
  // the store's validation too.
  std::optional<format::CheckpointView> view;
  std::shared_ptr<const StateLayout> layout;
  Status answers = CheckAgainstTask(e.task, *r, &view, &layout);
  if (!answers.ok()) {
    channel_->Release();
    RefuseResult(std::move(e), answers);
    return;
  }
  if (e.task.eval_only) {
    channel_->Release();
    e.kind = WorkerEvent::Kind::kEvaluated;
    on_event_(std::move(e));
    return;
  }
  store::CommitRequest c;
  c.exp = e.task.exp;
  c.member = e.task.member;
  c.expected_head_version = e.task.head_version;
  c.blob = r->state.data;
  c.blob_size = r->state.size;
  c.step = r->step;
  // The score twice: as the store ranks versions by it, and under the
  // metric's own name ("val_accuracy") for whoever reads the checkpoint.
  c.metrics = {{store::kScoreMetric, r->val_score},
               {format::SplitMetricName("val", e.task.rules.metric), r->val_score},
               {"train_loss", r->train_loss},
               {"interval", e.task.interval_after},
               {"samples", static_cast<double>(r->samples)},
               {"compute_s", r->compute_s}};
  c.hparams = e.task.hparams;
  c.event_json = records::EncodeEvent(
      records::TrainedEvent{e.task.interval_after, r->val_score, spec_.index, "", 0});
  c.verified = view ? &*view : nullptr;
  BlobId committed;
  c.committed_blob = &committed;
  const auto t0 = std::chrono::steady_clock::now();
  auto version = store_->CommitResult(c);
  view.reset();  // it points into the ring's bytes
  channel_->Release();
  if (spec_.metrics && version.ok()) {
    spec_.metrics->StoreOperation(metrics::StoreOp::kCommitResult, SecondsSince(t0), c.blob_size);
  }
  if (!version.ok()) {
    e.kind = WorkerEvent::Kind::kCommitError;
    e.code = ipc::FailureCode::kCommitError;
    e.commit_status = version.status().code();
    e.reason = version.status().ToString();
    on_event_(std::move(e));
    return;
  }
  if (spec_.layouts && layout) {
    spec_.layouts->RememberCommitted(c.exp, c.member, {committed, r->step, std::move(layout)});
  }
  if (trace::Enabled()) {
    trace::Committed(c.exp, c.member, *version, e.task.interval_after, committed.Hex());
  }
  // The head's state record follows the commit; a crash between the two is
  // reconciled from the head manifest at start-up.
  records::MemberRecord state = e.task.state_after;
  state.score = r->val_score;
  const Status saved =
      store_->SetMemberState(e.task.exp, e.task.member, records::EncodeMemberRecord(state));
  if (!saved.ok()) {
    Logger().error(
        "{}/{}: writing the state record after v{}: {} (reconciled from the head at "
        "the next start, or written again once the store has space)",
        e.task.exp, e.task.member, *version, saved.ToString());
  }
  e.kind = WorkerEvent::Kind::kCommitted;
  e.version = *version;
  e.record_status = saved;
  on_event_(std::move(e));
}

Status WorkerHandle::CheckAgainstTask(const Task& task, const ipc::Result& r,
                                      std::optional<format::CheckpointView>* view,
                                      std::shared_ptr<const StateLayout>* layout) const {
  SentTask sent;
  sent.member = task.exp + "/" + task.member;
  sent.worker = Name();
  sent.rules = task.rules;
  sent.steps = task.steps;
  sent.eval_only = task.eval_only;
  sent.start_step = task.sent_step;
  sent.layout = task.sent_layout;
  if (!sent.layout && spec_.layouts) sent.layout = spec_.layouts->Find(task.exp);
  StateLayout got;
  CKPT_RETURN_IF_ERROR(CheckResult(sent, r, &got, view));
  if (task.eval_only) return Status::OK();
  if (sent.layout) {
    *layout = sent.layout;  // CheckResult found them equal
    return Status::OK();
  }
  if (!spec_.layouts) {
    *layout = std::make_shared<const StateLayout>(std::move(got));
    return Status::OK();
  }
  // The experiment's first state seen: it becomes the reference, unless
  // another handle's result got there first.
  std::shared_ptr<const StateLayout> ref = spec_.layouts->Establish(task.exp, got);
  CKPT_RETURN_IF_ERROR(CompareLayouts("member " + sent.member + ", " + sent.worker, *ref, got));
  *layout = std::move(ref);
  return Status::OK();
}

void WorkerHandle::RefuseResult(WorkerEvent e, const Status& why) {
  Logger().warn(
      "{} sent a RESULT for task {} that does not answer it; nothing committed, the interval "
      "reruns from the committed head: {}",
      Name(), e.task.id, why.ToString());
  trace::BadResult(spec_.index, e.task.id, e.task.exp + "/" + e.task.member);
  e.kind = WorkerEvent::Kind::kBadResult;
  e.code = ipc::FailureCode::kBadResult;
  e.reason = why.ToString();
  on_event_(std::move(e));
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
