// Trainer: the adapter between ckpt's Status world and LibTorch. Every
// c10::Error (and std::exception) thrown below a public entry point is caught
// in this file and becomes a Status / fail code.
#include "ckpt/model/trainer.h"

#include <caffe2/serialize/read_adapter_interface.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <thread>

#include "ckpt/format/model_names.h"
#include "ckpt/format/regular_file.h"
#include "ckpt/ipc/sha256.h"
#include "model_internal.h"

#if defined(CKPT_WITH_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ckpt::model {

Trainer::~Trainer() = default;

namespace internal {
namespace {

// A TorchScript file's bytes as PyTorch's archive reader reads them, in place
// (an istringstream would copy them: C++17's takes its string by reference).
class BytesReadAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesReadAdapter(std::string bytes) : bytes_(std::move(bytes)) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::string bytes_;
};

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// The first line of a LibTorch message (the rest is a C++ backtrace).
std::string Brief(const std::exception& e) {
  std::string s = e.what();
  auto nl = s.find('\n');
  return nl == std::string::npos ? s : s.substr(0, nl);
}

void SetFailure(MemberOutcome* out, ipc::FailureCode code, Status status) {
  out->status = std::move(status);
  out->fail_code = code;
}

// Everything a training call does on the calling thread before touching
// tensors: intra-op threads and, on a GPU, the thread's own stream.
class ThreadScope {
 public:
  explicit ThreadScope(const Context& ctx) {
    SetThreadIntraOpThreads(ctx.options.intra_op_threads);
#if defined(CKPT_WITH_CUDA)
    if (ctx.device.is_cuda()) {
      thread_local std::optional<c10::cuda::CUDAStream> stream;
      if (!stream || stream->device_index() != ctx.device.index()) {
        stream = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, ctx.device.index());
      }
      guard_.emplace(*stream);
    }
#endif
  }

 private:
#if defined(CKPT_WITH_CUDA)
  std::optional<c10::cuda::CUDAStreamGuard> guard_;
#endif
};

// Index of the first non-finite value of `losses` (one scalar or [K] tensor
// per step) for member column `k`, or -1.
int64_t FirstNonFinite(const at::Tensor& host_losses, int64_t k) {
  const int64_t steps = host_losses.size(0);
  const int64_t width = host_losses.dim() == 2 ? host_losses.size(1) : 1;
  const float* p = host_losses.data_ptr<float>();
  for (int64_t s = 0; s < steps; ++s) {
    if (!std::isfinite(p[s * width + k])) return s;
  }
  return -1;
}

double MeanLoss(const at::Tensor& host_losses, int64_t k) {
  const int64_t steps = host_losses.size(0);
  if (steps == 0) return 0;
  const int64_t width = host_losses.dim() == 2 ? host_losses.size(1) : 1;
  const float* p = host_losses.data_ptr<float>();
  double sum = 0;
  for (int64_t s = 0; s < steps; ++s) sum += p[s * width + k];
  return sum / static_cast<double>(steps);
}

// TrainerOptions::touch_null_intervals: moves the first element of the
// first floating-point tensor by 1e-6 (many ULPs of any weight in use).
void TouchOneWeight(MemberTensors* m) {
  torch::NoGradGuard no_grad;  // parameters are leaves that require grad
  for (at::Tensor& t : m->tensors) {
    if (t.is_floating_point() && t.numel() > 0) {
      t.view({-1}).narrow(0, 0, 1).add_(1e-6);
      return;
    }
  }
}

// Checks the trained state and losses of one member and fills `out`.
void FinishMember(const Context& ctx, MemberTensors* m, const at::Tensor& host_losses, int64_t k,
                  int64_t start_step, MemberOutcome* out) {
  const int64_t bad = FirstNonFinite(host_losses, k);
  if (bad >= 0) {
    SetFailure(out, ipc::FailureCode::kNonFinite,
               Status::Aborted("member " + m->member + ": non-finite training loss at step " +
                               std::to_string(start_step + bad + 1)));
    return;
  }
  if (ctx.options.touch_null_intervals && host_losses.size(0) == 0) TouchOneWeight(m);
  Status finite = CheckFinite(ctx, *m, "after training");
  if (!finite.ok()) {
    SetFailure(out, ipc::FailureCode::kNonFinite, finite);
    return;
  }
  auto enc = EncodeMember(ctx, *m);
  if (!enc.ok()) {
    SetFailure(out, ipc::FailureCode::kInternal, enc.status());
    return;
  }
  OutcomeAccess::SetState(out, std::move(enc).value());
  out->train_loss = MeanLoss(host_losses, k);
  out->step = m->step;
}

at::Tensor StackLosses(const Context& ctx, const std::vector<at::Tensor>& losses) {
  if (losses.empty()) return at::zeros({0}, at::kFloat);
  return CopyToHost(ctx, at::stack(losses).to(at::kFloat));
}

class TrainerImpl final : public Trainer {
 public:
  explicit TrainerImpl(std::unique_ptr<Context> ctx) : ctx_(std::move(ctx)) {}
  ~TrainerImpl() override {
    // Work a failed call left queued (an exception skips its interval's
    // final wait) may still read the tensors and pinned ranges freed below.
    SynchronizeDevice();
    UnpinAll();
  }

  MemberOutcome TrainPlain(const MemberTask& task) override { return Plain(task, true); }

  std::vector<MemberOutcome> TrainFused(const std::vector<MemberTask>& tasks) override {
    if (!SupportsFusion()) {
      std::vector<MemberOutcome> out;
      for (const auto& t : tasks) out.push_back(TrainPlain(t));
      return out;
    }
    return Fused(tasks, true);
  }

  bool SupportsFusion() const override { return !ctx_->spec.is_torchscript(); }

  StatusOr<ModeChoice> ChooseMode(const ModeProbe& probe) override;

  Status PinHostMemory(const void* base, size_t bytes) override;

  std::shared_ptr<const UploadedState> Upload(const MemberTask& task) override;

  DeviceMemory GetDeviceMemory() const override {
    DeviceMemory m;
#if defined(CKPT_WITH_CUDA)
    if (ctx_->device.is_cuda()) {
      try {
        c10::cuda::CUDAGuard guard(ctx_->device.index());
        size_t free_bytes = 0, total_bytes = 0;
        if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
          m.total_bytes = static_cast<int64_t>(total_bytes);
        }
        auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(ctx_->device.index());
        m.allocated_bytes = stats.allocated_bytes[0].current;
      } catch (const std::exception&) {
      }
      return m;
    }
#endif
    m.total_bytes = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
    return m;
  }

  DeviceTraffic GetDeviceTraffic() const override {
    const TrafficCounters& c = ctx_->traffic;
    DeviceTraffic t;
    t.to_device_copies = c.to_device_copies.load(std::memory_order_relaxed);
    t.to_device_bytes = c.to_device_bytes.load(std::memory_order_relaxed);
    t.to_host_copies = c.to_host_copies.load(std::memory_order_relaxed);
    t.to_host_bytes = c.to_host_bytes.load(std::memory_order_relaxed);
    t.waits = c.waits.load(std::memory_order_relaxed);
    t.staged_copies = c.staged_copies.load(std::memory_order_relaxed);
    return t;
  }

  const std::string& device() const override { return ctx_->device_name; }
  const TrainerOptions& options() const override { return ctx_->options; }
  const DatasetSplits& dataset() const override { return *ctx_->data; }

  size_t ApproxStateBytes() const override {
    size_t bytes = 8 + 1024;
    for (const auto& t : ctx_->layout) {
      bytes += static_cast<size_t>(t.numel()) * format::DTypeSize(t.dtype) + 160 + t.name.size();
    }
    return bytes;
  }

 private:
  MemberOutcome Plain(const MemberTask& task, bool evaluate);
  std::vector<MemberOutcome> Fused(const std::vector<MemberTask>& tasks, bool evaluate);
  // Trains one fused group of loaded members.
  void FusedGroup(std::vector<MemberTensors>& states, const std::vector<size_t>& which,
                  const std::vector<MemberTask>& tasks, bool evaluate,
                  std::vector<MemberOutcome>* out);
  // Samples per second of `slots` threads running `body` until `seconds` pass.
  double Measure(int slots, double seconds,
                 const std::function<int64_t(int slot, int round)>& body);

  void UnpinAll();
  // Waits for everything queued on ctx_->device, errors ignored; nothing on the CPU.
  void SynchronizeDevice();

  std::unique_ptr<Context> ctx_;
  std::mutex pinned_mu_;
  std::vector<std::pair<const char*, size_t>> pinned_;  // GUARDED_BY(pinned_mu_)
};

// The host ranges registered with CUDA, process-wide: cudaHostRegister is
// the process's (a second registration of the same pages fails "already
// registered"), while every Trainer of an experiment pins the worker's one
// segment. A range is registered by its first holder that trains on a GPU and
// unregistered when its last holder lets go.
class PinnedRanges {
 public:
  static PinnedRanges& Get() {
    static PinnedRanges* ranges = new PinnedRanges();  // never destroyed: Trainers may outlive exit
    return *ranges;
  }

  // Takes a reference to [begin, begin + bytes) for a Trainer on `device`.
  Status Acquire(const char* begin, size_t bytes, const at::Device& device) {
    std::lock_guard<std::mutex> lock(mu_);
    Range* range = nullptr;
    for (Range& r : ranges_) {
      if (r.begin == begin && r.bytes == bytes) {
        range = &r;
      } else if (begin < r.begin + r.bytes && r.begin < begin + bytes) {
        return Status::InvalidArgument(
            "PinHostMemory: range overlaps another one registered in this process");
      }
    }
    if (range == nullptr) {
      ranges_.push_back(Range{begin, bytes});
      range = &ranges_.back();
    }
    if (device.is_cuda() && !range->registered) {
      Status s = Register(begin, bytes, device);
      if (!s.ok()) {
        if (range->references == 0) ranges_.pop_back();
        return s;
      }
      range->registered = true;
      range->device = device.index();
    }
    ++range->references;
    return Status::OK();
  }

  // Drops a reference; the last one unregisters the range.
  // REQUIRES: nothing queued on any device still copies from or to it.
  void Release(const char* begin) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = ranges_.begin(); it != ranges_.end(); ++it) {
      if (it->begin != begin || --it->references > 0) continue;
      if (it->registered) Unregister(it->begin, it->device);
      ranges_.erase(it);
      return;
    }
  }

  int References(const void* begin) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Range& r : ranges_) {
      if (r.begin == begin) return r.references;
    }
    return 0;
  }

 private:
  struct Range {
    const char* begin;
    size_t bytes;
    int references = 0;
    bool registered = false;      // with cudaHostRegister
    c10::DeviceIndex device = 0;  // the device current when it was registered
  };

  // Not run on a GPU yet: written and compiled (CKPT_WITH_CUDA) without one.
  static Status Register(const char* begin, size_t bytes, const at::Device& device) {
#if defined(CKPT_WITH_CUDA)
    c10::cuda::CUDAGuard guard(device.index());
    // Portable: pinned for every CUDA context of the process, not only the
    // current device's. The segment is a MAP_SHARED file mapping, which
    // cudaHostRegister accepts (it locks the pages it maps).
    cudaError_t rc = cudaHostRegister(const_cast<char*>(begin), bytes, cudaHostRegisterPortable);
    if (rc != cudaSuccess) {
      (void)cudaGetLastError();  // so that a later check does not see this error again
      return Status::Unavailable(std::string("cudaHostRegister of ") + std::to_string(bytes) +
                                 " bytes: " + cudaGetErrorString(rc));
    }
    return Status::OK();
#else
    (void)begin;
    (void)bytes;
    (void)device;
    return Status::Unavailable("this build's LibTorch has no CUDA");
#endif
  }

  static void Unregister(const char* begin, c10::DeviceIndex device) {
#if defined(CKPT_WITH_CUDA)
    c10::cuda::CUDAGuard guard(device);
    if (cudaHostUnregister(const_cast<char*>(begin)) != cudaSuccess) (void)cudaGetLastError();
#else
    (void)begin;
    (void)device;
#endif
  }

  mutable std::mutex mu_;
  std::list<Range> ranges_;  // GUARDED_BY(mu_); a list: Acquire keeps a pointer across push_back
};

Status TrainerImpl::PinHostMemory(const void* base, size_t bytes) {
  if (base == nullptr || bytes == 0) {
    return Status::InvalidArgument("PinHostMemory: empty range");
  }
  const char* begin = static_cast<const char*>(base);
  std::lock_guard<std::mutex> lock(pinned_mu_);
  for (const auto& [b, n] : pinned_) {
    if (begin < b + n && b < begin + bytes) {
      return Status::InvalidArgument("PinHostMemory: range overlaps one this Trainer pinned");
    }
  }
  CKPT_RETURN_IF_ERROR(PinnedRanges::Get().Acquire(begin, bytes, ctx_->device));
  pinned_.emplace_back(begin, bytes);
  return Status::OK();
}

void TrainerImpl::SynchronizeDevice() {
#if defined(CKPT_WITH_CUDA)
  if (!ctx_->device.is_cuda()) return;
  c10::cuda::CUDAGuard guard(ctx_->device.index());
  if (cudaDeviceSynchronize() != cudaSuccess) (void)cudaGetLastError();
#endif
}

void TrainerImpl::UnpinAll() {
  std::lock_guard<std::mutex> lock(pinned_mu_);
  // The caller synchronized the device: no copy from a range is pending.
  for (const auto& [b, n] : pinned_) PinnedRanges::Get().Release(b);
  pinned_.clear();
}

std::shared_ptr<const UploadedState> TrainerImpl::Upload(const MemberTask& task) {
  const Context& ctx = *ctx_;
  auto up = std::make_shared<UploadedState>();
  const std::string who = "member " + task.member;
  try {
    ThreadScope scope(ctx);
    MemberTask plain = task;
    plain.uploaded = nullptr;
    up->failure = LoadMember(ctx, plain, &up->state);
    WaitForDevice(ctx);  // the copies read task.state: done before the caller lets it go
  } catch (const c10::OutOfMemoryError& e) {
    up->failure =
        Failure{Status::ResourceExhausted(who + ": " + Brief(e)), ipc::FailureCode::kOutOfMemory};
  } catch (const std::exception& e) {
    up->failure =
        Failure{Status::Internal(who + ": upload: " + Brief(e)), ipc::FailureCode::kInternal};
  }
  if (up->failure) {
    up->state = MemberTensors();
    SynchronizeDevice();  // copies queued before the failure may still read task.state
  }
  return up;
}

MemberOutcome TrainerImpl::Plain(const MemberTask& task, bool evaluate) {
  const Context& ctx = *ctx_;
  MemberOutcome out;
  out.member = task.member;
  out.mode = ipc::FusionMode::kPlain;
  try {
    ThreadScope scope(ctx);
    auto t0 = Clock::now();
    MemberTensors m;
    if (auto failure = LoadMember(ctx, task, &m)) {
      SetFailure(&out, failure->code, failure->status);
      return out;
    }
    std::optional<torch::jit::Module> script;
    if (ctx.spec.is_torchscript()) {
      auto bound = BindScript(ctx, m);
      if (!bound.ok()) {
        SetFailure(&out, ipc::FailureCode::kInternal, bound.status());
        return out;
      }
      script = std::move(bound).value();
    }
    out.pack_s = Seconds(t0);

    t0 = Clock::now();
    const int64_t start_step = m.step;
    std::vector<at::Tensor> losses;
    Status trained = TrainPlainSteps(ctx, &m, script ? &*script : nullptr, task.steps, &losses);
    if (!trained.ok()) {
      SetFailure(&out,
                 trained.IsAborted() ? ipc::FailureCode::kAborted : ipc::FailureCode::kInternal,
                 trained);
      return out;
    }
    at::Tensor host_losses = StackLosses(ctx, losses);
    const bool finite_loss = FirstNonFinite(host_losses, 0) < 0;
    const auto eval_start = Clock::now();
    if (evaluate && finite_loss) {
      torch::jit::Module* sm = script ? &*script : nullptr;
      const int64_t val = std::min<int64_t>(ctx.options.eval_size, ctx.validation.count);
      if (val > 0)
        out.val_score =
            Score(ctx, ctx.validation, EvaluatePlain(ctx, m, sm, ctx.validation, val), val);
      if (task.eval_test && ctx.test.count > 0) {
        out.test_score = Score(ctx, ctx.test, EvaluatePlain(ctx, m, sm, ctx.test, ctx.test.count),
                               ctx.test.count);
      }
    }
    out.eval_s = Seconds(eval_start);
    out.compute_s = Seconds(t0);
    out.samples = static_cast<int64_t>(losses.size()) * ctx.options.batch_size;

    t0 = Clock::now();
    FinishMember(ctx, &m, host_losses, 0, start_step, &out);
    out.unpack_s = Seconds(t0);
    if (!out.ok()) {
      out.val_score = format::kNotEvaluated;
      out.test_score = format::kNotEvaluated;
    }
  } catch (const c10::OutOfMemoryError& e) {
    SetFailure(&out, ipc::FailureCode::kOutOfMemory,
               Status::ResourceExhausted("member " + task.member + ": " + Brief(e)));
  } catch (const c10::Error& e) {
    SetFailure(&out, ipc::FailureCode::kInternal,
               Status::Internal("member " + task.member + ": " + Brief(e)));
  } catch (const std::bad_alloc& e) {
    SetFailure(&out, ipc::FailureCode::kOutOfMemory,
               Status::ResourceExhausted("member " + task.member + ": host memory exhausted"));
  } catch (const std::exception& e) {
    SetFailure(&out, ipc::FailureCode::kInternal,
               Status::Internal("member " + task.member + ": " + Brief(e)));
  }
  return out;
}

std::vector<MemberOutcome> TrainerImpl::Fused(const std::vector<MemberTask>& tasks, bool evaluate) {
  const Context& ctx = *ctx_;
  std::vector<MemberOutcome> out(tasks.size());
  std::vector<MemberTensors> states(tasks.size());
  std::map<int64_t, std::vector<size_t>> groups;  // steps -> members
  for (size_t i = 0; i < tasks.size(); ++i) {
    out[i].member = tasks[i].member;
    out[i].mode = ipc::FusionMode::kFused;
  }
  try {
    ThreadScope scope(ctx);
    for (size_t i = 0; i < tasks.size(); ++i) {
      auto t0 = Clock::now();
      if (auto failure = LoadMember(ctx, tasks[i], &states[i])) {
        SetFailure(&out[i], failure->code, failure->status);
        continue;
      }
      out[i].pack_s = Seconds(t0);
      groups[tasks[i].steps].push_back(i);
    }
    for (const auto& [steps, which] : groups) FusedGroup(states, which, tasks, evaluate, &out);
  } catch (const c10::OutOfMemoryError& e) {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (out[i].ok() && out[i].state_size() == 0) {
        SetFailure(
            &out[i], ipc::FailureCode::kOutOfMemory,
            Status::ResourceExhausted("member " + tasks[i].member + " (fused): " + Brief(e)));
      }
    }
  } catch (const std::exception& e) {
    for (size_t i = 0; i < tasks.size(); ++i) {
      if (out[i].ok() && out[i].state_size() == 0) {
        SetFailure(&out[i], ipc::FailureCode::kInternal,
                   Status::Internal("member " + tasks[i].member + " (fused): " + Brief(e)));
      }
    }
  }
  return out;
}

void TrainerImpl::FusedGroup(std::vector<MemberTensors>& states, const std::vector<size_t>& which,
                             const std::vector<MemberTask>& tasks, bool evaluate,
                             std::vector<MemberOutcome>* out) {
  const Context& ctx = *ctx_;
  const int64_t steps = tasks[which.front()].steps;
  std::vector<MemberTensors*> members;
  std::vector<int64_t> start_steps;
  bool eval_test = false;
  for (size_t i : which) {
    members.push_back(&states[i]);
    start_steps.push_back(states[i].step);
    eval_test = eval_test || tasks[i].eval_test;
  }
  const double k = static_cast<double>(which.size());
  FusedResult result;
  double pack_s = 0, unpack_s = 0, compute_s = 0, eval_s = 0;
  Status s = TrainFusedGroup(ctx, members, steps, evaluate, evaluate && eval_test, &result, &pack_s,
                             &unpack_s, &compute_s, &eval_s);
  if (!s.ok()) {
    for (size_t i : which) {
      SetFailure(&(*out)[i],
                 s.IsAborted() ? ipc::FailureCode::kAborted : ipc::FailureCode::kInternal,
                 s.WithPrefix("member " + tasks[i].member));
    }
    return;
  }
  at::Tensor host_losses = StackLosses(ctx, result.losses);
  for (size_t j = 0; j < which.size(); ++j) {
    MemberOutcome& o = (*out)[which[j]];
    auto t1 = Clock::now();
    FinishMember(ctx, members[j], host_losses, static_cast<int64_t>(j), start_steps[j], &o);
    o.unpack_s = unpack_s / k + Seconds(t1);
    o.pack_s += pack_s / k;
    o.compute_s = compute_s / k;
    o.eval_s = eval_s / k;
    if (!o.ok()) continue;
    o.samples = steps * ctx.options.batch_size;
    if (!result.score_val.empty()) {
      const int64_t val = std::min<int64_t>(ctx.options.eval_size, ctx.validation.count);
      o.val_score = Score(ctx, ctx.validation, result.score_val[j], val);
    }
    if (tasks[which[j]].eval_test && !result.score_test.empty()) {
      o.test_score = Score(ctx, ctx.test, result.score_test[j], ctx.test.count);
    }
  }
}

double TrainerImpl::Measure(int slots, double seconds,
                            const std::function<int64_t(int slot, int round)>& body) {
  std::atomic<int64_t> samples{0};
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> threads;
  for (int slot = 0; slot < slots; ++slot) {
    threads.emplace_back([&, slot] {
      for (int round = 0; Clock::now() < deadline; ++round) samples += body(slot, round);
    });
  }
  for (auto& t : threads) t.join();
  const double elapsed = Seconds(start);
  return elapsed > 0 ? static_cast<double>(samples.load()) / elapsed : 0;
}

StatusOr<ModeChoice> TrainerImpl::ChooseMode(const ModeProbe& probe) {
  if (probe.slots < 1 || probe.fusion_width < 1 || !(probe.seconds > 0)) {
    return Status::InvalidArgument("ChooseMode: slots and fusion_width must be >= 1, seconds > 0");
  }
  constexpr int64_t kProbeSteps = 4;
  std::atomic<bool> failed{false};
  std::string failure;
  std::mutex failure_mu;
  auto note = [&](const MemberOutcome& o) {
    if (o.ok()) return;
    std::lock_guard<std::mutex> lock(failure_mu);
    if (!failed.exchange(true)) failure = o.status.ToString();
  };
  auto plain = [&](int slot, int round) -> int64_t {
    MemberTask t;
    t.member = "probe" + std::to_string(slot);
    t.init_seed = static_cast<uint64_t>(slot * 100003 + round);
    t.steps = kProbeSteps;
    MemberOutcome o = Plain(t, false);
    note(o);
    return o.samples;
  };
  auto fused = [&](int slot, int round) -> int64_t {
    std::vector<MemberTask> tasks(static_cast<size_t>(probe.fusion_width));
    for (size_t k = 0; k < tasks.size(); ++k) {
      tasks[k].member = "probe" + std::to_string(slot) + "." + std::to_string(k);
      tasks[k].init_seed = static_cast<uint64_t>(slot * 100003 + round * 1009 + k);
      tasks[k].steps = kProbeSteps;
    }
    int64_t n = 0;
    for (const auto& o : Fused(tasks, false)) {
      note(o);
      n += o.samples;
    }
    return n;
  };
  ModeChoice choice;
  plain(0, -1);  // warm-up: lazy initialisation of kernels and allocator
  choice.plain_samples_s = Measure(probe.slots, probe.seconds, plain);
  if (SupportsFusion()) {
    fused(0, -1);
    choice.fused_samples_s = Measure(probe.slots, probe.seconds, fused);
  }
  if (failed.load()) return Status::Internal("ChooseMode: probe training failed: " + failure);
  choice.mode = choice.fused_samples_s > choice.plain_samples_s ? ipc::FusionMode::kFused
                                                                : ipc::FusionMode::kPlain;
  return choice;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s;
}

// Fills ctx->model_tensors from the loaded TorchScript module and checks that
// it maps a batch of inputs to [batch, num_classes] logits.
Status InspectScript(Context* ctx) {
  torch::jit::Module& module = *ctx->script;
  for (const auto& p : module.named_parameters(true)) {
    if (p.value.scalar_type() != at::kFloat) {
      return Status::InvalidArgument("TorchScript parameter " + p.name + " is not float32");
    }
    ctx->model_tensors.push_back(
        {p.name, format::DType::kF32, p.value.sizes().vec(), /*trainable=*/true});
  }
  for (const auto& b : module.named_buffers(true)) {
    format::DType dtype;
    if (b.value.scalar_type() == at::kFloat) {
      dtype = format::DType::kF32;
    } else if (b.value.scalar_type() == at::kLong) {
      dtype = format::DType::kI64;
    } else {
      return Status::InvalidArgument("TorchScript buffer " + b.name +
                                     " is neither float32 nor int64");
    }
    ctx->model_tensors.push_back({b.name, dtype, b.value.sizes().vec(), /*trainable=*/false});
  }
  if (ctx->model_tensors.empty()) {
    return Status::InvalidArgument("TorchScript module has no parameters");
  }
  at::NoGradGuard no_grad;
  torch::jit::Module probe = module.clone();
  probe.eval();
  const int64_t n = std::min<int64_t>(2, ctx->validation.count);
  at::Tensor x = Normalize(*ctx, ctx->validation.x.slice(0, 0, n));
  torch::jit::IValue y = probe.forward({x});
  const int64_t outputs = ctx->data->num_outputs();
  if (!y.isTensor() || y.toTensor().dim() != 2 || y.toTensor().size(0) != n ||
      y.toTensor().size(1) != outputs) {
    return Status::InvalidArgument("TorchScript module must map [N, " +
                                   ShapeText(ctx->data->sample_shape) + "] inputs to [N, " +
                                   std::to_string(outputs) + "] outputs");
  }
  return Status::OK();
}

at::ScalarType TorchType(format::DType dtype) {
  switch (dtype) {
    case format::DType::kU8:
      return at::kByte;
    case format::DType::kF16:
      return at::kHalf;
    case format::DType::kI64:
      return at::kLong;
    default:
      return at::kFloat;
  }
}

DeviceSplit ToDevice(const Context& ctx, const DataSplit& set) {
  DeviceSplit split;
  split.count = set.count;
  const DatasetSplits& data = *ctx.data;
  std::vector<int64_t> x_shape = {set.count};
  x_shape.insert(x_shape.end(), data.sample_shape.begin(), data.sample_shape.end());
  at::Tensor x = at::from_blob(const_cast<void*>(set.x), x_shape, TorchType(data.x_dtype));
  at::Tensor y = at::from_blob(const_cast<void*>(set.y), {set.count, data.target_width},
                               TorchType(data.y_dtype));
  // U8 and F32 rows stay where the (shared, immutable) dataset holds them on
  // the CPU; F16 becomes F32 once.
  if (data.x_dtype == format::DType::kF16) x = x.to(at::kFloat);
  split.x = ctx.device.is_cpu() ? x : x.to(ctx.device);
  if (data.target == format::TargetKind::kClasses) {
    split.y = y.view({set.count}).to(ctx.device, at::kLong);
  } else {
    split.y = ctx.device.is_cpu() ? y : y.to(ctx.device);
  }
  return split;
}

Status CheckBatchOptions(const TrainerOptions& options) {
  if (options.batch_size < 1) return Status::InvalidArgument("batch_size must be >= 1");
  if (options.eval_size < 0) return Status::InvalidArgument("eval_size must be >= 0");
  if (options.eval_batch_size < 1) return Status::InvalidArgument("eval_batch_size must be >= 1");
  if (options.intra_op_threads < 1) return Status::InvalidArgument("intra_op_threads must be >= 1");
  return Status::OK();
}

// Sets ctx->device and device_name from options.device: InvalidArgument for
// a malformed name, Unavailable for a GPU this process cannot use.
Status OpenDevice(Context* ctx) {
  const TrainerOptions& options = ctx->options;
  std::string device = options.device == "cuda" ? "cuda:0" : options.device;
  if (device != "cpu" && device.rfind("cuda:", 0) != 0) {
    return Status::InvalidArgument("unknown device \"" + options.device +
                                   "\" (expected cpu, cuda or cuda:N)");
  }
  try {
    ctx->device = at::Device(device);
  } catch (const c10::Error& e) {
    return Status::InvalidArgument("bad device \"" + options.device + "\": " + Brief(e));
  }
  if (ctx->device.is_cuda()) {
#if defined(CKPT_WITH_CUDA)
    if (!torch::cuda::is_available() ||
        ctx->device.index() >= static_cast<int>(torch::cuda::device_count())) {
      return Status::Unavailable("device " + device + " is not available");
    }
#else
    return Status::Unavailable("this build's LibTorch has no CUDA; device " + device +
                               " is not available");
#endif
  }
  ctx->device_name = device;
#if defined(CKPT_WITH_CUDA)
  if (ctx->device.is_cuda()) {
    at::globalContext().setAllowTF32CuDNN(options.allow_tf32);
    at::globalContext().setAllowTF32CuBLAS(options.allow_tf32);
  }
#endif
  return Status::OK();
}

// Sets ctx->data from the options' dataset and checks that the batch size,
// loss, metric and augmentation fit it.
Status LoadData(Context* ctx) {
  const TrainerOptions& options = ctx->options;
  if (options.data) {
    ctx->data = options.data;
  } else if (options.tensor_data) {
    CKPT_ASSIGN_OR_RETURN(ctx->data, LoadTensorDataset(*options.tensor_data));
  } else {
    CKPT_ASSIGN_OR_RETURN(ctx->data, LoadDataset(options.dataset, options.dataset_path));
  }
  const DatasetSplits& data = *ctx->data;
  if (data.train.count < options.batch_size) {
    return Status::InvalidArgument("batch_size " + std::to_string(options.batch_size) +
                                   " exceeds the train split's " +
                                   std::to_string(data.train.count) + " rows");
  }
  ctx->loss = options.loss.value_or(format::DefaultLoss(data.target));
  ctx->metric = options.metric.value_or(format::DefaultMetric(data.target));
  const char* target_text =
      data.target == format::TargetKind::kClasses ? "class labels" : "float targets";
  if (format::TargetOf(ctx->loss) != data.target) {
    return Status::InvalidArgument("loss " + std::string(format::LossKindName(ctx->loss)) +
                                   " does not fit " + data.name + ", whose y holds " + target_text);
  }
  if (format::TargetOf(ctx->metric) != data.target) {
    return Status::InvalidArgument("metric " + std::string(format::MetricKindName(ctx->metric)) +
                                   " does not fit " + data.name + ", whose y holds " + target_text);
  }
  if (options.augment.any() && data.sample_shape.size() != 3) {
    return Status::InvalidArgument("augment needs [N, C, H, W] images; " + data.name +
                                   " holds [N, F] features");
  }
  return Status::OK();
}

// Sets ctx's scalar normalization pair, and uniform_norm false when the
// channels' differ (PlaceData then puts per-channel tensors on the device).
void ChooseNormalization(Context* ctx) {
  const DatasetSplits& data = *ctx->data;
  ctx->uniform_norm = true;
  for (size_t c = 1; c < data.scale.size(); ++c) {
    if (data.scale[c] != data.scale[0] || data.shift[c] != data.shift[0]) ctx->uniform_norm = false;
  }
  ctx->scale = data.scale.empty() ? 1.0 : data.scale[0];
  ctx->shift = data.shift.empty() ? 0.0 : data.shift[0];
}

// Puts the per-channel normalization tensors and the splits on ctx->device.
void PlaceData(Context* ctx) {
  const DatasetSplits& data = *ctx->data;
  if (!ctx->uniform_norm) {
    std::vector<int64_t> shape(data.sample_shape.size() + 1, 1);
    shape[1] = data.channels();
    std::vector<float> scale(data.scale.begin(), data.scale.end());
    std::vector<float> shift(data.shift.begin(), data.shift.end());
    ctx->scale_t = at::tensor(scale, at::kFloat).view(shape).to(ctx->device);
    ctx->shift_t = at::tensor(shift, at::kFloat).view(shape).to(ctx->device);
  }
  ctx->train = ToDevice(*ctx, data.train);
  ctx->validation = ToDevice(*ctx, data.validation);
  ctx->test = ToDevice(*ctx, data.test);
}

// Loads and inspects the spec's TorchScript file onto ctx->device.
Status LoadScript(Context* ctx) {
  const std::string& path = ctx->spec.torchscript_path();
  // Opened once (no final symlink, no FIFO or device, bounded size) and
  // loaded from the bytes read through that descriptor: the file checked
  // is the file loaded.
  CKPT_ASSIGN_OR_RETURN(
      std::string bytes,
      format::ReadRegularFile(path, format::kMaxTorchScriptFileBytes, "TorchScript file"));
  const std::string& want = ctx->options.model_sha256;
  if (!want.empty()) {
    // The scheduler hashed the file it judged when the experiment was
    // submitted: a file replaced since, or another host's copy, is refused
    // before any of its code is loaded.
    const std::string got = ipc::Sha256Hex(bytes);
    if (got != want) {
      return Status::InvalidArgument("TorchScript file " + path + " has SHA-256 " + got + ", not " +
                                     want +
                                     ", the file the scheduler checked when the experiment was "
                                     "submitted (it was replaced since, or this host's copy "
                                     "differs); refused");
    }
  }
  try {
    // Read in place: the file's bytes are held once while loading.
    ctx->script =
        torch::jit::load(std::make_shared<BytesReadAdapter>(std::move(bytes)), ctx->device);
  } catch (const c10::Error& e) {
    return Status::InvalidArgument("TorchScript file " + path + " does not load: " + Brief(e));
  }
  Status inspected = InspectScript(ctx);
  if (!inspected.ok()) return inspected.WithPrefix(path);
  return Status::OK();
}

// Sets ctx->model_tensors: a spec model's, whose outputs must match the
// dataset's, or the loaded TorchScript module's.
Status PrepareModel(Context* ctx) {
  if (ctx->spec.is_torchscript()) return LoadScript(ctx);
  const DatasetSplits& data = *ctx->data;
  if (ctx->spec.num_outputs() != data.num_outputs()) {
    return Status::InvalidArgument(
        "model spec's last layer has " + std::to_string(ctx->spec.num_outputs()) +
        " outputs, but " + data.name + " has " +
        (data.target == format::TargetKind::kClasses
             ? std::to_string(data.num_classes) + " classes"
             : std::to_string(data.target_width) + " targets per sample"));
  }
  ctx->model_tensors = ctx->spec.ModelTensors();
  return Status::OK();
}

// The set-up that runs LibTorch on the device; its exceptions become Internal.
Status SetUpOnDevice(Context* ctx) {
  try {
    ThreadScope scope(*ctx);
    PlaceData(ctx);
    return PrepareModel(ctx);
  } catch (const c10::Error& e) {
    return Status::Internal("trainer set-up: " + Brief(e));
  } catch (const std::exception& e) {
    return Status::Internal("trainer set-up: " + Brief(e));
  }
}

// Sets ctx->layout and the indexes into it: by name, per layer, per trainable.
Status IndexLayout(Context* ctx) {
  ctx->layout = StateLayout(ctx->model_tensors, ctx->optimizer);
  for (size_t i = 0; i < ctx->layout.size(); ++i) {
    if (!ctx->index.emplace(ctx->layout[i].name, static_cast<int>(i)).second) {
      return Status::InvalidArgument("model has two tensors named " + ctx->layout[i].name);
    }
  }
  auto find = [&](const std::string& name) {
    auto it = ctx->index.find(name);
    return it == ctx->index.end() ? -1 : it->second;
  };
  for (const LayerSpec& l : ctx->spec.layers()) {
    LayerTensors lt;
    if (!l.name.empty()) {
      lt.weight = find(l.name + ".weight");
      lt.bias = find(l.name + ".bias");
      lt.running_mean = find(l.name + ".running_mean");
      lt.running_var = find(l.name + ".running_var");
      lt.num_batches_tracked = find(l.name + ".num_batches_tracked");
    }
    ctx->layer_tensors.push_back(lt);
  }
  for (const TensorSpec& t : ctx->model_tensors) {
    if (!t.trainable) continue;
    TrainableSlots s;
    s.param = find(t.name);
    s.momentum_buffer = find("optim." + t.name + ".momentum_buffer");
    s.exp_avg = find("optim." + t.name + ".exp_avg");
    s.exp_avg_sq = find("optim." + t.name + ".exp_avg_sq");
    s.step = find("optim." + t.name + ".step");
    ctx->trainables.push_back(s);
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options) {
  auto ctx = std::make_unique<Context>();
  ctx->options = options;
  CKPT_RETURN_IF_ERROR(CheckBatchOptions(options));
  ctx->optimizer = options.optimizer;
  CKPT_RETURN_IF_ERROR(OpenDevice(ctx.get()));
  CKPT_RETURN_IF_ERROR(LoadData(ctx.get()));
  ChooseNormalization(ctx.get());
  CKPT_ASSIGN_OR_RETURN(ctx->spec, ModelSpec::Parse(options.model_spec, ctx->data->sample_shape));
  CKPT_RETURN_IF_ERROR(SetUpOnDevice(ctx.get()));
  CKPT_RETURN_IF_ERROR(IndexLayout(ctx.get()));
  return std::unique_ptr<Trainer>(new TrainerImpl(std::move(ctx)));
}

}  // namespace
}  // namespace internal

int64_t DeviceTotalMemoryBytes(const std::string& device) {
  if (device == "cpu") {
    return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  }
#if defined(CKPT_WITH_CUDA)
  try {
    const at::Device d(device == "cuda" ? std::string("cuda:0") : device);
    if (!d.is_cuda() || !torch::cuda::is_available() ||
        d.index() >= static_cast<int>(torch::cuda::device_count())) {
      return 0;
    }
    c10::cuda::CUDAGuard guard(d.index());
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return 0;
    }
    return static_cast<int64_t>(total_bytes);
  } catch (const std::exception&) {
    return 0;
  }
#else
  return 0;
#endif
}

int PinnedHostMemoryReferences(const void* base) {
  return internal::PinnedRanges::Get().References(base);
}

StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainerOptions& options) {
  return internal::Create(options);
}

}  // namespace ckpt::model
