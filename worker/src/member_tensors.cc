// Member state <-> checkpoint blob, initialisation, finiteness, and the
// per-call helpers shared by plain and fused training.
#include <omp.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "model_internal.h"

namespace ckpt::model {
namespace internal {

// The new state of a member, on the host, ready to be written into a buffer.
class EncodedState {
 public:
  std::vector<at::Tensor> host;  // keeps the bytes the writer references alive
  format::CheckpointMeta meta;
  format::CheckpointWriter writer;  // prepared (checksums computed) before it is shared
  size_t size = 0;
};

namespace {

std::string ShapeString(at::IntArrayRef shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return ShapeString(at::IntArrayRef(shape));
}

at::ScalarType ScalarTypeOf(format::DType dtype) {
  switch (dtype) {
    case format::DType::kF64:
      return at::kDouble;
    case format::DType::kF32:
      return at::kFloat;
    case format::DType::kF16:
      return at::kHalf;
    case format::DType::kBF16:
      return at::kBFloat16;
    case format::DType::kI64:
      return at::kLong;
    case format::DType::kI32:
      return at::kInt;
    case format::DType::kI16:
      return at::kShort;
    case format::DType::kI8:
      return at::kChar;
    case format::DType::kU8:
      return at::kByte;
    case format::DType::kBool:
      return at::kBool;
  }
  return at::kFloat;
}

Failure Fail(ipc::FailureCode code, Status status) { return Failure{std::move(status), code}; }

// Fresh model tensors of a spec model: PyTorch's default initialisation
// (uniform in +-1/sqrt(fan_in) for conv/linear weight and bias; BatchNorm
// weight 1, bias 0, running mean 0, running var 1), drawn in layout order
// from one generator seeded with init_seed.
void InitSpecModel(const Context& ctx, at::Generator& gen, std::vector<at::Tensor>* t) {
  const auto& layers = ctx.spec.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    const LayerTensors& lt = ctx.layer_tensors[i];
    if (l.kind == LayerKind::kConv2d || l.kind == LayerKind::kLinear) {
      at::Tensor& w = (*t)[lt.weight];
      const double fan_in = static_cast<double>(w.numel() / w.size(0));
      const double bound = 1.0 / std::sqrt(fan_in);
      w.uniform_(-bound, bound, gen);
      if (lt.bias >= 0) (*t)[lt.bias].uniform_(-bound, bound, gen);
    } else if (l.kind == LayerKind::kBatchNorm2d) {
      (*t)[lt.weight].fill_(1);
      (*t)[lt.bias].zero_();
      (*t)[lt.running_mean].zero_();
      (*t)[lt.running_var].fill_(1);
      (*t)[lt.num_batches_tracked].zero_();
    }
  }
}

// Fresh model tensors of a TorchScript model: every parameter of rank >= 2 is
// drawn uniform in +-1/sqrt(fan_in), a rank-1 parameter whose sibling
// "<prefix>.weight" has rank >= 2 likewise with that fan_in; other
// parameters and all buffers keep the values saved in the file.
void InitScriptModel(const Context& ctx, at::Generator& gen, std::vector<at::Tensor>* t) {
  std::map<std::string, at::Tensor> saved;
  {
    std::lock_guard<std::mutex> lock(ctx.script_mu);
    for (const auto& p : ctx.script->named_parameters(true)) saved[p.name] = p.value.detach();
    for (const auto& b : ctx.script->named_buffers(true)) saved[b.name] = b.value.detach();
  }
  for (size_t i = 0; i < ctx.model_tensors.size(); ++i) {
    const TensorSpec& spec = ctx.model_tensors[i];
    at::Tensor& dst = (*t)[i];
    double fan_in = 0;
    if (spec.trainable && spec.shape.size() >= 2) {
      fan_in = static_cast<double>(spec.numel() / spec.shape[0]);
    } else if (spec.trainable && spec.shape.size() == 1) {
      const auto dot = spec.name.rfind('.');
      const std::string weight =
          (dot == std::string::npos ? std::string() : spec.name.substr(0, dot + 1)) + "weight";
      auto it = ctx.index.find(weight);
      if (it != ctx.index.end() && ctx.layout[it->second].shape.size() >= 2) {
        fan_in =
            static_cast<double>(ctx.layout[it->second].numel() / ctx.layout[it->second].shape[0]);
      }
    }
    if (fan_in > 0) {
      const double bound = 1.0 / std::sqrt(fan_in);
      dst.uniform_(-bound, bound, gen);
    } else {
      dst.copy_(saved.at(spec.name));
    }
  }
}

// The dropout hyperparameter needs a dropout layer of a layer list to set.
Status CheckDropoutHparam(const Context& ctx, const Hyperparameters& hp) {
  if (!hp.dropout) return Status::OK();
  if (!ctx.script) {
    for (const LayerSpec& l : ctx.spec.layers()) {
      if (l.kind == LayerKind::kDropout) return Status::OK();
    }
  }
  return Status::InvalidArgument(
      ctx.script ? "hyperparameter \"dropout\": a TorchScript model's dropout cannot be set"
                 : "hyperparameter \"dropout\": the model has no dropout layer to set");
}

// A member being loaded by LoadMember: `who` names it in errors; `host`
// receives its tensors in layout order, on the CPU.
struct MemberLoad {
  const Context& ctx;
  const MemberTask& task;
  const std::string& who;
  MemberTensors* st;
  std::vector<at::Tensor>* host;
};

// Sets st->hp to the task's hyperparameters over `base`.
std::optional<Failure> SetHparams(const MemberLoad& load,
                                  const std::map<std::string, double>& base) {
  auto hp = ResolveHyperparameters(load.ctx.optimizer, base, load.task.hparams);
  if (!hp.ok()) return Fail(ipc::FailureCode::kBadRequest, hp.status().WithPrefix(load.who));
  load.st->hp = *hp;
  if (Status d = CheckDropoutHparam(load.ctx, load.st->hp); !d.ok()) {
    return Fail(ipc::FailureCode::kBadRequest, d.WithPrefix(load.who));
  }
  return std::nullopt;
}

// A fresh member: tensors initialised from task.init_seed, step 0.
std::optional<Failure> InitMember(const MemberLoad& load) {
  const Context& ctx = load.ctx;
  MemberTensors* st = load.st;
  std::vector<at::Tensor>& host = *load.host;
  if (auto failure = SetHparams(load, {})) return failure;
  for (size_t i = 0; i < host.size(); ++i) {
    host[i] = HostTensor(ctx, ctx.layout[i].shape, ScalarTypeOf(ctx.layout[i].dtype)).zero_();
  }
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(load.task.init_seed);
  if (ctx.spec.is_torchscript()) {
    InitScriptModel(ctx, gen, &host);
  } else {
    InitSpecModel(ctx, gen, &host);
  }
  st->adam_step = 0;
  st->step = 0;
  st->data_seed = MemberDataSeed(ctx.options.seed, load.task.init_seed);
  st->data_cursor = 0;
  return std::nullopt;
}

// Copies the checkpoint's tensors into host: exactly the layout's, each with
// its dtype, shape and byte count.
std::optional<Failure> CopyStoredTensors(const MemberLoad& load,
                                         const format::CheckpointView& view) {
  const Context& ctx = load.ctx;
  const std::string& who = load.who;
  std::vector<at::Tensor>& host = *load.host;
  for (const auto& tv : view.tensors()) {
    if (ctx.index.count(tv.name) == 0) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(who + ": unexpected tensor " + tv.name +
                                     " (not in the model spec's layout)"));
    }
  }
  for (size_t i = 0; i < host.size(); ++i) {
    const TensorSpec& spec = ctx.layout[i];
    const format::TensorView* tv = view.Find(spec.name);
    if (tv == nullptr) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(who + ": missing tensor " + spec.name));
    }
    if (tv->dtype != spec.dtype) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(who + ": tensor " + spec.name + " has dtype " +
                                     std::string(format::DTypeName(tv->dtype)) + ", expected " +
                                     std::string(format::DTypeName(spec.dtype))));
    }
    if (tv->shape != spec.shape) {
      return Fail(
          ipc::FailureCode::kBadState,
          Status::Corruption(who + ": tensor " + spec.name + " has shape " +
                             ShapeString(tv->shape) + ", expected " + ShapeString(spec.shape)));
    }
    const at::ScalarType dtype = ScalarTypeOf(spec.dtype);
    if (tv->nbytes != static_cast<size_t>(spec.numel()) * at::elementSize(dtype)) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(who + ": tensor " + spec.name + " byte count mismatch"));
    }
    if (!ctx.device.is_cpu() && tv->nbytes > 0) {
      // The blob's bytes themselves: CopyToDevice copies from them (a DMA when
      // they are pinned), with no host copy of its own.
      host[i] = at::from_blob(const_cast<uint8_t*>(tv->data), spec.shape, dtype);
      continue;
    }
    host[i] = HostTensor(ctx, spec.shape, dtype);
    if (tv->nbytes > 0) std::memcpy(host[i].data_ptr(), tv->data, tv->nbytes);
  }
  return std::nullopt;
}

// Sets st->adam_step from the stored optim.*.step tensors, which must hold
// one whole count (non-finite ones are left to the finiteness check).
std::optional<Failure> ReadAdamStep(const MemberLoad& load) {
  const Context& ctx = load.ctx;
  const std::vector<at::Tensor>& host = *load.host;
  bool first = true;
  for (const auto& tr : ctx.trainables) {
    const double s = host[tr.step].item<float>();
    if (!std::isfinite(s)) continue;  // reported by the finiteness check below
    if (s < 0 || s != std::floor(s)) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(load.who + ": tensor " + ctx.layout[tr.step].name +
                                     " is not a step count"));
    }
    if (!first && s != load.st->adam_step) {
      return Fail(ipc::FailureCode::kBadState,
                  Status::Corruption(load.who + ": tensor " + ctx.layout[tr.step].name +
                                     " differs from the other parameters' step"));
    }
    load.st->adam_step = s;
    first = false;
  }
  return std::nullopt;
}

// A member restored from the task's checkpoint blob.
std::optional<Failure> RestoreMember(const MemberLoad& load) {
  const Context& ctx = load.ctx;
  const MemberTask& task = load.task;
  const std::string& who = load.who;
  MemberTensors* st = load.st;
  if (task.state == nullptr) {
    return Fail(ipc::FailureCode::kBadRequest,
                Status::InvalidArgument(who + ": state size without bytes"));
  }
  auto view = format::ParseCheckpoint(task.state, task.state_size);
  if (!view.ok()) return Fail(ipc::FailureCode::kBadState, view.status().WithPrefix(who));
  const format::CheckpointMeta& meta = view->meta();
  if (!meta.optimizer.empty() && meta.optimizer != OptimizerKindName(ctx.optimizer)) {
    return Fail(ipc::FailureCode::kBadState,
                Status::InvalidArgument(who + ": checkpoint holds " + meta.optimizer +
                                        " state, this worker trains with " +
                                        std::string(OptimizerKindName(ctx.optimizer))));
  }
  auto stored = ResolveHyperparameters(ctx.optimizer, meta.hparams, {});
  if (!stored.ok())
    return Fail(ipc::FailureCode::kBadState, stored.status().WithPrefix(who + ": checkpoint"));
  if (auto failure = SetHparams(load, meta.hparams)) return failure;
  if (meta.step < 0) {
    return Fail(ipc::FailureCode::kBadState,
                Status::Corruption(who + ": negative step in checkpoint"));
  }
  st->step = meta.step;
  st->data_seed = meta.data_seed;
  st->data_cursor = meta.data_cursor;
  st->extra = meta.extra;
  if (auto failure = CopyStoredTensors(load, *view)) return failure;
  if (ctx.optimizer != OptimizerKind::kSgd) return ReadAdamStep(load);
  return std::nullopt;
}

}  // namespace

std::optional<Failure> LoadMember(const Context& ctx, const MemberTask& task, MemberTensors* st) {
  if (task.uploaded != nullptr) {
    if (task.uploaded->failure) return task.uploaded->failure;
    *st = task.uploaded->state;
    for (const at::Tensor& t : st->tensors) UseOnThisStream(ctx, t);
    return std::nullopt;
  }
  st->member = task.member;
  const std::string who = "member " + (task.member.empty() ? std::string("?") : task.member);
  if (task.steps < 0) {
    return Fail(ipc::FailureCode::kBadRequest,
                Status::InvalidArgument(who + ": steps must be >= 0"));
  }
  const size_t n = ctx.layout.size();
  std::vector<at::Tensor> host(n);
  const MemberLoad load{ctx, task, who, st, &host};
  if (auto failure = task.state_size == 0 ? InitMember(load) : RestoreMember(load)) {
    return failure;
  }

  st->tensors.resize(n);
  for (size_t i = 0; i < n; ++i) {
    at::Tensor t = CopyToDevice(ctx, host[i]);
    if (ctx.layout[i].trainable) t.requires_grad_(true);
    st->tensors[i] = std::move(t);
  }
  Status finite = CheckFinite(ctx, *st, "in the given state");
  if (!finite.ok()) return Fail(ipc::FailureCode::kNonFinite, finite);
  return std::nullopt;
}

namespace {

// True when no float of p[0, n) is a NaN or an infinity (exponent bits all
// ones). Blocks of a fixed length, which GCC vectorizes at -O2; the scalar
// std::isfinite loop it replaces took ~120 us per LeNet-5 state, 20% of the
// CPU of a null interval. Cloned for AVX-512 and AVX2 (chosen at load time by
// the CPU): the SSE2 baseline still took 7% of a null interval's CPU.
__attribute__((target_clones("avx512f", "avx2", "default"))) bool AllFinite(const float* p,
                                                                            int64_t n) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr int64_t kBlock = 64;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    uint32_t u[kBlock];
    std::memcpy(u, p + i, sizeof u);
    uint32_t bad = 0;
    for (int64_t j = 0; j < kBlock; ++j) {
      bad |= static_cast<uint32_t>((u[j] & kExponent) == kExponent);
    }
    if (bad != 0) return false;
  }
  for (; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, p + i, sizeof u);
    if ((u & kExponent) == kExponent) return false;
  }
  return true;
}

}  // namespace

Status CheckFinite(const Context& ctx, const MemberTensors& st, const char* when) {
  auto fail = [&](size_t i) {
    return Status::Aborted("member " + st.member + ": tensor " + ctx.layout[i].name +
                           " is not finite " + when + " (step " + std::to_string(st.step) + ")");
  };
  // Host tensors are scanned directly: at::isfinite is several full passes.
  std::vector<at::Tensor> flags;
  std::vector<size_t> which;
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const at::Tensor& t = st.tensors[i];
    if (!at::isFloatingType(t.scalar_type())) continue;
    if (t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous()) {
      if (!AllFinite(t.data_ptr<float>(), t.numel())) return fail(i);
      continue;
    }
    flags.push_back(at::isfinite(t.detach()).all());
    which.push_back(i);
  }
  if (flags.empty()) return Status::OK();
  at::Tensor all = CopyToHost(ctx, at::stack(flags));
  const bool* ok = all.data_ptr<bool>();
  for (size_t j = 0; j < which.size(); ++j) {
    if (!ok[j]) return fail(which[j]);
  }
  return Status::OK();
}

StatusOr<std::shared_ptr<EncodedState>> EncodeMember(const Context& ctx, const MemberTensors& st) {
  auto enc = std::make_shared<EncodedState>();
  enc->meta.model_spec = ctx.options.model_spec;
  enc->meta.optimizer = std::string(OptimizerKindName(ctx.optimizer));
  enc->meta.hparams = HyperparameterMap(ctx.optimizer, st.hp);
  enc->meta.step = st.step;
  enc->meta.data_seed = st.data_seed;
  enc->meta.data_cursor = st.data_cursor;
  enc->meta.extra = st.extra;
  enc->writer.SetMeta(enc->meta);
  enc->host.reserve(st.tensors.size());
  // All copies queued, then one wait: the writer reads the bytes only after it.
  for (const at::Tensor& t : st.tensors) enc->host.push_back(CopyToHostAsync(ctx, t.detach()));
  WaitForDevice(ctx);
  for (size_t i = 0; i < st.tensors.size(); ++i) {
    const at::Tensor& t = enc->host[i];
    const TensorSpec& spec = ctx.layout[i];
    CKPT_RETURN_IF_ERROR(
        enc->writer.AddTensor(spec.name, spec.dtype, spec.shape, t.data_ptr(), t.nbytes()));
  }
  enc->size = enc->writer.EncodedSize();
  return enc;
}

void DrawDropoutMask(uint64_t data_seed, int64_t step, size_t layer, double p,
                     const at::Tensor& out) {
  uint64_t s = data_seed ^ (0xD1B54A32D192ED03ull * (static_cast<uint64_t>(step) + 1)) ^
               (0x8CB92BA72F3D8DD7ull * (static_cast<uint64_t>(layer) + 1));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(SplitMix64(&s));
  out.bernoulli_(1.0 - p, gen).div_(1.0 - p);
}

at::Tensor Normalize(const Context& ctx, const at::Tensor& raw) {
  // A float32 split is the dataset itself: scale into a new tensor.
  at::Tensor x = raw.scalar_type() == at::kFloat ? raw.clone() : raw.to(at::kFloat);
  if (ctx.uniform_norm) return x.mul_(ctx.scale).add_(ctx.shift);
  return x.mul_(ctx.scale_t).add_(ctx.shift_t);
}

at::Tensor Augment(const Context& ctx, const at::Tensor& raw, const at::Tensor& offsets) {
  const int64_t rows = raw.size(0);
  const int64_t h = raw.size(2), w = raw.size(3), p = ctx.options.augment.crop_padding;
  const at::Tensor oy = offsets[0], ox = offsets[1], fl = offsets[2];  // [rows, 1] each
  const auto longs = at::TensorOptions().dtype(at::kLong).device(ctx.device);
  // Source row and column of each output pixel in the zero-padded image.
  at::Tensor ys = oy + at::arange(h, longs).view({1, h});  // [rows, h]
  at::Tensor cols = at::arange(w, longs).view({1, w});     // [1, w]
  cols = at::where(fl.eq(1), (w - 1) - cols, cols);        // mirrored columns
  at::Tensor xs = ox + cols;                               // [rows, w]
  at::Tensor padded = p > 0 ? at::constant_pad_nd(raw, {p, p, p, p}, 0) : raw;
  const int64_t c = raw.size(1), pw = w + 2 * p;
  at::Tensor by_row = padded.gather(2, ys.view({rows, 1, h, 1}).expand({rows, c, h, pw}));
  return by_row.gather(3, xs.view({rows, 1, 1, w}).expand({rows, c, h, w}));
}

void GatherBatch(const Context& ctx, const DeviceSplit& split, const at::Tensor& idx,
                 const at::Tensor& offsets, at::Tensor* x, at::Tensor* y) {
  at::Tensor raw = split.x.index_select(0, idx);
  if (offsets.defined()) raw = Augment(ctx, raw, offsets);
  *x = Normalize(ctx, raw);
  *y = split.y.index_select(0, idx);
}

at::Tensor ScoreSum(const Context& ctx, const at::Tensor& out, const at::Tensor& y) {
  const int64_t last = out.dim() - 1;
  if (ctx.metric == format::MetricKind::kAccuracy) {
    at::Tensor hit = out.argmax(last).eq(y);
    return (last == 2 ? hit.sum(1) : hit.sum()).to(at::kDouble);
  }
  at::Tensor err = (out - y).to(at::kDouble);
  err = err * err;
  return last == 2 ? err.flatten(1).sum(1) : err.sum();
}

double Score(const Context& ctx, const DeviceSplit& split, double sum, int64_t count) {
  if (count <= 0) return -1;
  switch (ctx.metric) {
    case format::MetricKind::kAccuracy:
      return sum / static_cast<double>(count);
    case format::MetricKind::kNegMse:
      return -sum / static_cast<double>(count * ctx.data->target_width);
    case format::MetricKind::kR2: {
      // SST about each output's mean over the same rows (format/task.h).
      at::Tensor y = split.y.narrow(0, 0, count).to(at::kDouble).reshape({count, -1});
      const double sst =
          CopyToHost(ctx, (y - y.mean(0, /*keepdim=*/true)).pow(2).sum()).item<double>();
      if (sst > 0) return 1 - sum / sst;
      return sum == 0 ? 1 : 0;
    }
  }
  return -1;
}

void SetThreadIntraOpThreads(int n) {
  thread_local int current = 0;
  if (current == n) return;
  // LibTorch initialises a thread's OpenMP count lazily on its first parallel
  // op; trigger that first so it cannot overwrite the value set here.
  at::get_num_threads();
  omp_set_num_threads(n);
  current = n;
}

}  // namespace internal

MemberOutcome::MemberOutcome() = default;
MemberOutcome::MemberOutcome(const MemberOutcome&) = default;
MemberOutcome::MemberOutcome(MemberOutcome&&) noexcept = default;
MemberOutcome& MemberOutcome::operator=(const MemberOutcome&) = default;
MemberOutcome& MemberOutcome::operator=(MemberOutcome&&) noexcept = default;
MemberOutcome::~MemberOutcome() = default;

const format::CheckpointMeta& MemberOutcome::state_meta() const {
  CKPT_CHECK(state_ != nullptr);
  return state_->meta;
}

size_t MemberOutcome::state_size() const { return state_ ? state_->size : 0; }

Status MemberOutcome::EncodeStateTo(void* dst, size_t size) const {
  if (!state_)
    return Status::FailedPrecondition("member " + member + ": no state (" + status.ToString() +
                                      ")");
  return state_->writer.EncodeTo(dst, size);
}

std::string MemberOutcome::EncodeState() const {
  if (!state_) return std::string();
  std::string out(state_->size, '\0');
  Status s = state_->writer.EncodeTo(out.data(), out.size());
  if (!s.ok()) return std::string();
  return out;
}

}  // namespace ckpt::model
