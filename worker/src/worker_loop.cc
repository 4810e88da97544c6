#include "ckpt/worker/worker_loop.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/base/kill_point.h"
#include "ckpt/base/visible_devices.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/ipc/messages.h"
#include "ckpt/ipc/tcp_channel.h"
#include "ckpt/logging/logging.h"
#include "ckpt/logging/trace_file.h"
#include "ckpt/model/trainer.h"
#include "kill_points.h"
#include "phase_times.h"

namespace ckpt::worker {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Lines go to the process's logger (ckpt/logging/logging.h); CKPT_TRACE=1
// adds one line per record received and sent.
using logging::Logger;

// CKPT_WORKER_PHASES=1: at exit, one stderr line "ckpt-worker phases: {JSON}"
// (phase_times.h). For finding where the time goes.
const bool kPhases = [] {
  const char* v = std::getenv("CKPT_WORKER_PHASES");
  return v != nullptr && *v == '1';
}();

// CKPT_TOUCH_NULL_INTERVALS=1: 0-step intervals change one weight
// (TrainerOptions::touch_null_intervals), for `ckpt-bench population`'s null
// runs with changing states.
const bool kTouchNullIntervals = [] {
  const char* v = std::getenv("CKPT_TOUCH_NULL_INTERVALS");
  return v != nullptr && *v == '1';
}();

struct Job {
  uint64_t task_id = 0;
  std::string experiment;
  std::string member;  // the member's name within the experiment
  // Copied out of the ring, so the ring is released at once; empty on a GPU,
  // where task.uploaded holds the state on the device.
  std::vector<uint8_t> state;
  model::MemberTask task;
};

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int64_t RssBytes() {
  std::ifstream in("/proc/self/statm");
  long long pages_total = 0, pages_rss = 0;
  in >> pages_total >> pages_rss;
  return static_cast<int64_t>(pages_rss) * sysconf(_SC_PAGESIZE);
}

class WorkerLoop {
 public:
  WorkerLoop(const WorkerOptions& options, std::unique_ptr<ipc::Channel> channel)
      : options_(options),
        name_(options.connect.empty() ? options.segment : "tcp:" + options.connect),
        channel_(std::move(channel)) {}

  Status Run();

 private:
  template <typename M>
  Status SendMessage(ipc::RecordType type, const M& m);
  // `mode`: the one in effect since the last CONFIGURE; none before the first.
  Status SendHello(std::optional<ipc::FusionMode> mode);
  // FAILED for the task `task_id` of `member` of `experiment` (task id 0 and
  // no member: the experiment's CONFIGURE was refused).
  void SendFailed(uint64_t task_id, const std::string& experiment, const std::string& member,
                  ipc::FailureCode code, const std::string& reason);
  void SendOutcome(const Job& job, const model::MemberOutcome& o);
  // SendOutcome, with the outcome's phases and the send counted in phases_.
  void SendTimed(const Job& job, const model::MemberOutcome& o);
  Status HandleConfigure(const ipc::Received& rec);
  void HandleTrain(const ipc::Received& rec);
  void SlotLoop();
  void StatsLoop();
  void SlotLoopBody();
  void StatsLoopBody();
  // Thread root: an escaping exception is logged and the process exits with
  // status 70 (EX_SOFTWARE) at once: the scheduler sees the worker lost and
  // restarts it, its members rerun from their committed heads; never a hang.
  void RunThreadRoot(const char* name, void (WorkerLoop::*body)());
  void StopThreads();

  const WorkerOptions options_;
  const std::string name_;  // in messages: the segment, or "tcp:HOST:PORT"
  std::unique_ptr<ipc::Channel> channel_;
  std::mutex send_mu_;  // the result ring has one producer

  std::mutex mu_;
  std::condition_variable cv_;        // slot threads wait here for jobs
  std::condition_variable stats_cv_;  // the stats thread waits here for stop_
  std::deque<Job> jobs_;              // GUARDED_BY(mu_)
  struct Experiment {
    std::shared_ptr<model::Trainer> trainer;
    bool fused = false;
  };
  std::map<std::string, Experiment> experiments_;   // GUARDED_BY(mu_)
  ipc::FusionMode mode_ = ipc::FusionMode::kPlain;  // GUARDED_BY(mu_): the last CONFIGURE's
  bool stop_ = false;                               // GUARDED_BY(mu_)
  std::atomic<bool> cancel_{false};
  std::atomic<int> busy_{0};
  std::atomic<uint64_t> samples_{0};
  std::atomic<double> last_compute_s_{0};  // of the last member-interval (kill points)
  std::vector<std::thread> threads_;
  const Clock::time_point started_ = Clock::now();
  PhaseTimes phases_;
};

template <typename M>
Status WorkerLoop::SendMessage(ipc::RecordType type, const M& m) {
  std::vector<uint8_t> buf(ipc::EncodedSize(m));
  CKPT_RETURN_IF_ERROR(ipc::Encode(m, buf.data(), buf.size()));
  std::lock_guard<std::mutex> lock(send_mu_);
  while (true) {
    Status s = channel_->Send(type, buf.data(), buf.size(), ipc::DeadlineIn(milliseconds(500)));
    if (!s.IsResourceExhausted()) return s;
  }
}

Status WorkerLoop::SendHello(std::optional<ipc::FusionMode> mode) {
  ipc::Hello h;
  h.device = options_.device;
  h.pid = getpid();
  h.fusion = options_.fusion != ipc::FusionMode::kPlain;
  h.mode = mode ? ipc::FusionModeName(*mode) : "";
  h.version = "ckpt-worker 0.1";
  // Capacity: members the scheduler may have outstanding here. A fused slot
  // takes a group of K.
  h.slots = options_.slots * (mode == ipc::FusionMode::kFused ? options_.fusion_width : 1);
  // The device's memory (messages.h): the GPU's on a GPU, RAM on the CPU.
  h.memory_bytes = model::DeviceTotalMemoryBytes(options_.device);
  return SendMessage(ipc::RecordType::kHello, h);
}

void WorkerLoop::SendFailed(uint64_t task_id, const std::string& experiment,
                            const std::string& member, ipc::FailureCode code,
                            const std::string& reason) {
  ipc::Failed f;
  f.task_id = task_id;
  f.experiment = experiment;
  f.member = member;
  f.code = code;
  f.reason = reason;
  (void)SendMessage(ipc::RecordType::kFailed, f);
}

void WorkerLoop::SendOutcome(const Job& job, const model::MemberOutcome& o) {
  const uint64_t task_id = job.task_id;
  if (!o.ok()) {
    SendFailed(task_id, job.experiment, job.member, o.fail_code, o.status.message());
    return;
  }
  ipc::Result r;
  r.task_id = task_id;
  r.experiment = job.experiment;
  r.member = job.member;
  r.step = o.step;
  r.train_loss = o.train_loss;
  r.val_score = o.val_score;
  r.test_score = o.test_score;
  r.samples = o.samples;
  r.compute_s = o.compute_s;
  r.state.size = o.state_size();
  const size_t size = ipc::EncodedSize(r);
  Status encoded;
  {
    std::lock_guard<std::mutex> lock(send_mu_);
    // The new state is encoded straight into the result ring.
    StatusOr<ipc::Reservation> res = Status::Unavailable("no reservation");
    do {
      res = channel_->Reserve(ipc::RecordType::kResult, size, ipc::DeadlineIn(milliseconds(500)));
    } while (!res.ok() && res.status().IsResourceExhausted());
    if (!res.ok()) {
      // The scheduler is gone (the receive loop notices) or the ring is broken.
      Logger().error("ckpt-worker {}: RESULT of task {} not sent: {}", name_, task_id,
                     res.status().ToString());
      return;
    }
    auto offset = ipc::EncodeHeaderOnly(r, res->data, res->size);
    WorkerKillPoints().At(base::kill_points::kWorkerEncode);
    encoded = offset.ok() ? o.EncodeStateTo(res->data + *offset, r.state.size) : offset.status();
    if (encoded.ok()) {
      Status c;
      do {
        c = channel_->Commit(*res, ipc::DeadlineIn(milliseconds(500)));
      } while (c.IsResourceExhausted());
      Logger().log(c.ok() ? spdlog::level::trace : spdlog::level::warn,
                   "ckpt-worker {}: sent RESULT task {}: {}", name_, task_id, c.ToString());
      if (c.ok()) WorkerKillPoints().At(base::kill_points::kWorkerResultSent);
      return;
    }
    channel_->Abandon();
  }
  SendFailed(task_id, job.experiment, job.member, ipc::FailureCode::kInternal,
             "encoding the new state: " + encoded.ToString());
}

void WorkerLoop::SendTimed(const Job& job, const model::MemberOutcome& o) {
  phases_.Add(PhaseTimes::kDecode, o.pack_s);
  phases_.Add(PhaseTimes::kTrain, o.compute_s - o.eval_s);
  phases_.Add(PhaseTimes::kEvaluate, o.eval_s);
  phases_.Add(PhaseTimes::kEncode, o.unpack_s);
  const auto start = Clock::now();
  SendOutcome(job, o);
  phases_.Add(PhaseTimes::kSend, Since(start));
  phases_.Member();
  phases_.FirstResult(Since(started_));
}

Status WorkerLoop::HandleConfigure(const ipc::Received& rec) {
  const auto start = Clock::now();
  auto c = ipc::DecodeConfigure(rec.payload, rec.size);
  channel_->Release();
  if (!c.ok()) return c.status();
  model::TrainerOptions t;
  t.device = options_.device;
  t.model_spec = c->model_spec;
  t.model_sha256 = c->model_sha256;
  t.optimizer = c->optimizer;
  t.batch_size = c->batch_size;
  t.eval_size = c->eval_size;
  t.dataset = c->dataset;
  t.dataset_path = c->dataset_path;
  t.tensor_data = c->tensor_data;
  t.loss = c->loss;
  t.metric = c->metric;
  t.augment = c->augment;
  t.intra_op_threads = options_.intra_op_threads;
  t.allow_tf32 = options_.allow_tf32;
  t.seed = c->seed;
  t.cancel = &cancel_;
  t.touch_null_intervals = kTouchNullIntervals;
  auto trainer = model::Trainer::Create(t);
  if (!trainer.ok()) {
    Logger().error("ckpt-worker {}: CONFIGURE {}: {}", name_, c->experiment,
                   trainer.status().ToString());
    // The scheduler ends the experiment at once with this reason (task id 0,
    // no member); its TRAINs here fail as not configured.
    SendFailed(0, c->experiment, "", ipc::FailureCode::kConfigureRefused,
               trainer.status().ToString());
    return Status::OK();
  }
  using ipc::FusionMode;
  FusionMode mode = options_.fusion == FusionMode::kFused ? FusionMode::kFused : FusionMode::kPlain;
  if (options_.fusion == FusionMode::kAuto && (*trainer)->SupportsFusion()) {
    model::ModeProbe probe;
    probe.slots = options_.slots;
    probe.fusion_width = options_.fusion_width;
    probe.seconds = options_.probe_seconds;
    auto choice = (*trainer)->ChooseMode(probe);
    if (choice.ok()) {
      mode = choice->mode;
      Logger().info(
          "ckpt-worker {}: {}: plain {:.0f} samples/s, fused(K={}) {:.0f} samples/s -> {}",
          options_.device, c->experiment, choice->plain_samples_s, options_.fusion_width,
          choice->fused_samples_s, ipc::FusionModeName(mode));
    }
  }
  if (!(*trainer)->SupportsFusion()) mode = FusionMode::kPlain;
  if ((*trainer)->device() != "cpu") {
    // The segment is registered once per process, shared by the experiments'
    // Trainers: TRAIN states then go from the ring to the device by DMA.
    const ipc::PayloadPart shm = channel_->SharedMemory();
    if (shm.data != nullptr) {
      Status pinned = (*trainer)->PinHostMemory(shm.data, shm.size);
      if (!pinned.ok()) {
        Logger().warn("ckpt-worker {}: {}: states are staged through pageable memory: {}", name_,
                      c->experiment, pinned.ToString());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    experiments_[c->experiment] = Experiment{std::shared_ptr<model::Trainer>(std::move(*trainer)),
                                             mode == FusionMode::kFused};
    mode_ = mode;
  }
  phases_.Configure(Since(start));
  return SendHello(mode);
}

void WorkerLoop::HandleTrain(const ipc::Received& rec) {
  auto t = ipc::DecodeTrain(rec.payload, rec.size);
  if (!t.ok()) {
    channel_->Release();
    // Without a task id nothing can be answered; the record is counted.
    Logger().error("ckpt-worker {}: malformed TRAIN: {}", name_, t.status().ToString());
    return;
  }
  Logger().trace("ckpt-worker {}: got TRAIN task {} {}/{}", name_, t->task_id, t->experiment,
                 t->member);
  WorkerKillPoints().At(base::kill_points::kWorkerDecode);
  const auto start = Clock::now();
  Job job;
  job.task_id = t->task_id;
  job.experiment = t->experiment;
  job.member = t->member;
  // The trainer names the member in its messages as "exp/member".
  job.task.member = t->experiment + "/" + t->member;
  job.task.init_seed = t->init_seed;
  job.task.hparams = t->hparams;
  job.task.steps = t->steps;
  job.task.eval_test = t->eval_test;
  std::shared_ptr<model::Trainer> trainer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = experiments_.find(job.experiment);
    if (it != experiments_.end()) trainer = it->second.trainer;
  }
  if (trainer != nullptr && trainer->device() != "cpu" && t->state.size > 0) {
    // On a GPU the state goes from the ring to the device (a DMA from the
    // pinned segment), with no host copy; Upload waits for the copies, so
    // the record can be released after it.
    job.task.state = t->state.data;
    job.task.state_size = t->state.size;
    job.task.uploaded = trainer->Upload(job.task);
    job.task.state = nullptr;
    job.task.state_size = 0;
  } else {
    job.state.assign(t->state.data, t->state.data + t->state.size);
  }
  channel_->Release();
  phases_.Add(PhaseTimes::kReceive, Since(start));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (experiments_.count(job.experiment) == 0) {
      SendFailed(
          job.task_id, job.experiment, job.member, ipc::FailureCode::kBadRequest,
          "no CONFIGURE for experiment '" + job.experiment + "' of member " + job.task.member);
      return;
    }
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void WorkerLoop::RunThreadRoot(const char* name, void (WorkerLoop::*body)()) {
  std::string what;
  try {
    (this->*body)();
    return;
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
    what = "a non-standard exception";
  }
  Logger().critical("ckpt-worker {}: {} thread failed: {}; exiting", name_, name, what);
  _exit(70);
}

void WorkerLoop::SlotLoop() { RunThreadRoot("slot", &WorkerLoop::SlotLoopBody); }

void WorkerLoop::StatsLoop() { RunThreadRoot("stats", &WorkerLoop::StatsLoopBody); }

void WorkerLoop::SlotLoopBody() {
  while (true) {
    std::vector<Job> group;
    std::shared_ptr<model::Trainer> trainer;
    bool fused = false;
    {
      const auto wait_start = Clock::now();
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      phases_.Add(PhaseTimes::kIdle, Since(wait_start));
      if (stop_) return;
      group.push_back(std::move(jobs_.front()));
      jobs_.pop_front();
      const auto& e = experiments_[group[0].experiment];
      trainer = e.trainer;
      fused = e.fused;
      if (fused) {
        // A fused group: members of the same experiment and step count.
        for (auto it = jobs_.begin();
             it != jobs_.end() && static_cast<int>(group.size()) < options_.fusion_width;) {
          if (it->experiment == group[0].experiment && it->task.steps == group[0].task.steps) {
            group.push_back(std::move(*it));
            it = jobs_.erase(it);
          } else {
            ++it;
          }
        }
      }
    }
    busy_.fetch_add(1);
    for (auto& j : group) {
      j.task.state = j.state.data();
      j.task.state_size = j.state.size();
    }
    WorkerKillPoints().AtAfter(base::kill_points::kWorkerTrain, 0.5 * last_compute_s_.load());
    if (fused && group.size() > 1) {
      std::vector<model::MemberTask> tasks;
      for (const auto& j : group) tasks.push_back(j.task);
      auto outcomes = trainer->TrainFused(tasks);
      for (size_t i = 0; i < group.size(); ++i) {
        if (outcomes[i].ok()) samples_.fetch_add(static_cast<uint64_t>(outcomes[i].samples));
        if (outcomes[i].ok()) last_compute_s_.store(outcomes[i].compute_s);
        SendTimed(group[i], outcomes[i]);
      }
    } else {
      for (const auto& j : group) {
        auto o = trainer->TrainPlain(j.task);
        if (o.ok()) samples_.fetch_add(static_cast<uint64_t>(o.samples));
        if (o.ok()) last_compute_s_.store(o.compute_s);
        SendTimed(j, o);
      }
    }
    busy_.fetch_sub(1);
  }
}

void WorkerLoop::StatsLoopBody() {
  uint64_t last = 0;
  auto last_t = Clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (!stats_cv_.wait_for(lock, milliseconds(1000), [&] { return stop_; })) {
    ipc::Stats s;
    s.mode = ipc::FusionModeName(mode_);
    std::shared_ptr<model::Trainer> any;
    if (!experiments_.empty()) any = experiments_.begin()->second.trainer;
    lock.unlock();
    const auto now = Clock::now();
    const uint64_t total = samples_.load();
    const double dt = std::chrono::duration<double>(now - last_t).count();
    s.samples_total = total;
    s.samples_per_s = dt > 0 ? static_cast<double>(total - last) / dt : 0;
    s.slots = options_.slots;
    s.slots_busy = busy_.load();
    s.allocator_bytes = any ? any->GetDeviceMemory().allocated_bytes : 0;
    s.rss_bytes = RssBytes();
    last = total;
    last_t = now;
    (void)SendMessage(ipc::RecordType::kStats, s);
    lock.lock();
  }
}

void WorkerLoop::StopThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  stats_cv_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

Status WorkerLoop::Run() {
  CKPT_RETURN_IF_ERROR(SendHello(std::nullopt));
  for (int i = 0; i < options_.slots; ++i) threads_.emplace_back([this] { SlotLoop(); });
  threads_.emplace_back([this] { StatsLoop(); });
  Status result;
  while (true) {
    auto rec = channel_->Receive(ipc::DeadlineIn(milliseconds(500)));
    if (!rec.ok()) {
      if (rec.status().IsResourceExhausted()) continue;
      if (rec.status().IsCorruption()) {
        Logger().error("ckpt-worker {}: rejected a record: {}", name_, rec.status().ToString());
        continue;
      }
      result = rec.status();
      break;
    }
    if (rec->type == ipc::RecordType::kTrain) {
      HandleTrain(*rec);
    } else if (rec->type == ipc::RecordType::kConfigure) {
      Status s = HandleConfigure(*rec);
      if (!s.ok()) Logger().error("ckpt-worker {}: bad CONFIGURE: {}", name_, s.ToString());
    } else if (rec->type == ipc::RecordType::kShutdown) {
      channel_->Release();
      WorkerKillPoints().At(base::kill_points::kWorkerShutdown);
      break;
    } else {
      channel_->Release();
    }
  }
  // On shutdown, unfinished members are abandoned: the scheduler reruns them
  // from their committed heads.
  cancel_.store(true);
  StopThreads();
  channel_->Close();
  if (kPhases) Logger().info("ckpt-worker phases: {}", phases_.ToJson());
  return result;
}

}  // namespace

namespace {

// "auto": the first GPU CUDA shows this process (a Slurm task is given its
// own GPU as device 0) when it shows one, counted as the scheduler counts
// them (base::DriverGpuCount narrowed by CUDA_VISIBLE_DEVICES), else the CPU.
std::string ResolveDevice(const std::string& device) {
  if (device != "auto") return device;
  const int gpus =
      base::VisibleGpuCount(base::DriverGpuCount(), std::getenv(base::kCudaVisibleDevicesVariable));
  return gpus > 0 ? "cuda:0" : "cpu";
}

// Connects to the scheduler at options.connect, retrying while nothing
// answers there (it may not be up yet, or be restarting) for connect_timeout.
StatusOr<std::unique_ptr<ipc::Channel>> ConnectToScheduler(const WorkerOptions& options,
                                                           const ipc::ChannelOptions& co) {
  CKPT_ASSIGN_OR_RETURN(std::string secret, ipc::LoadSecretFile(options.secret_file));
  ipc::TcpOptions to;
  to.channel = co;
  // A record from the scheduler is at most a state the store takes.
  to.channel.max_message_bytes = std::min(co.max_message_bytes, ipc::kDefaultTcpMaxMessageBytes);
  const auto until = std::chrono::steady_clock::now() + options.connect_timeout;
  auto backoff = std::chrono::milliseconds(100);
  bool told = false;
  while (true) {
    auto ch = ipc::TcpChannel::Connect(options.connect, secret, to);
    // Only an unreachable scheduler is worth waiting for; a failed TLS
    // handshake (another secret) or a bad address will not get better.
    if (ch.ok() || !ch.status().IsUnavailable()) return ch;
    if (!told) {
      told = true;
      Logger().warn("ckpt-worker tcp:{}: {}; retrying for up to {} s", options.connect,
                    ch.status().message(), options.connect_timeout.count() / 1000);
    }
    if (std::chrono::steady_clock::now() + backoff >= until) {
      return Status::Unavailable("no scheduler reachable at " + options.connect + " within " +
                                 std::to_string(options.connect_timeout.count() / 1000) +
                                 " s: " + ch.status().message());
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(2000));
  }
}

}  // namespace

Status RunWorker(const WorkerOptions& options_in) {
  WorkerOptions options = options_in;
  if (options.segment.empty() == options.connect.empty()) {
    return Status::InvalidArgument("give exactly one of a segment and a scheduler to connect to");
  }
  if (!options.connect.empty() && options.secret_file.empty()) {
    return Status::InvalidArgument("connecting to " + options.connect + " needs a secret file");
  }
  options.device = ResolveDevice(options.device);
  ipc::ChannelOptions co;
  co.heartbeat_timeout = options.heartbeat_timeout;
  std::unique_ptr<ipc::Channel> channel;
  if (options.connect.empty()) {
    CKPT_ASSIGN_OR_RETURN(channel, ipc::Channel::Open(options.segment, co));
  } else {
    CKPT_ASSIGN_OR_RETURN(channel, ConnectToScheduler(options, co));
  }
  WorkerLoop loop(options, std::move(channel));
  return loop.Run();
}

}  // namespace ckpt::worker
