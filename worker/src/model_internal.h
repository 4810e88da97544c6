// Private to ckpt::model: the LibTorch side shared by the trainer's source
// files. Only worker/src includes this header (it pulls in LibTorch).
//
// A member's state on the device is a vector of tensors in StateLayout order
// (model tensors, then optimizer slots). Plain training computes on those
// tensors directly; fused training stacks K members' tensors into [K, ...]
// tensors ("packed") in the same order.
#ifndef CKPT_WORKER_SRC_MODEL_INTERNAL_H_
#define CKPT_WORKER_SRC_MODEL_INTERNAL_H_

#include <torch/script.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/task.h"
#include "ckpt/model/dataset.h"
#include "ckpt/model/hparams.h"
#include "ckpt/model/model_spec.h"
#include "ckpt/model/trainer.h"

namespace ckpt::model::internal {

// torch.optim.Adam's first-moment update is `exp_avg.lerp_(grad, 1 - beta1)`
// in PyTorch 2 (checked against 2.11) and `exp_avg.mul_(beta1).add_(grad,
// 1 - beta1)` in 1.13. The two round differently (~1e-7 a step), so the
// trainers follow the LibTorch they are built with, to match that version's
// torch.optim bit for bit.
inline constexpr bool kAdamFirstMomentLerp = TORCH_VERSION_MAJOR >= 2;

// Where a stateful layer's tensors sit in the layout; -1 for none.
struct LayerTensors {
  int weight = -1;
  int bias = -1;
  int running_mean = -1;
  int running_var = -1;
  int num_batches_tracked = -1;
};

// Per trainable tensor: its layout index and those of its optimizer slots.
struct TrainableSlots {
  int param = -1;
  int momentum_buffer = -1;  // SGD
  int exp_avg = -1;          // Adam/AdamW
  int exp_avg_sq = -1;
  int step = -1;
};

// A dataset split on the device.
struct DeviceSplit {
  at::Tensor x;  // [N, C, H, W] or [N, F]; u8 as stored, f16 and f32 as f32
  at::Tensor y;  // [N] i64 labels, or [N, T] f32 targets
  int64_t count = 0;
};

// Host <-> device traffic of one Trainer (Trainer::GetDeviceTraffic). Every
// copy between the host and ctx.device after Create (which places the
// dataset once, uncounted) and every wait for the device goes
// through CopyToDevice, CopyToHostAsync, CopyToHost and WaitForDevice, which
// count it here; on the CPU they copy and wait for nothing but count what a
// GPU run would do, so a CPU test can check how often training would wait.
struct TrafficCounters {
  std::atomic<int64_t> to_device_copies{0};
  std::atomic<int64_t> to_device_bytes{0};
  std::atomic<int64_t> to_host_copies{0};
  std::atomic<int64_t> to_host_bytes{0};
  std::atomic<int64_t> waits{0};
  std::atomic<int64_t> staged_copies{0};
};

// Everything a Trainer shares between calls. Immutable after Create, except
// the TorchScript template, which is cloned under script_mu.
struct Context {
  TrainerOptions options;
  ModelSpec spec;
  OptimizerKind optimizer = OptimizerKind::kSgd;
  at::Device device = at::Device(at::kCPU);
  std::string device_name;
  std::shared_ptr<const DatasetSplits> data;
  DeviceSplit train, validation, test;
  // Normalization: one scalar pair when every channel has the same (the
  // MNIST family), else [1, C, 1, 1] / [1, F] tensors on the device.
  bool uniform_norm = true;
  double scale = 1;
  double shift = 0;
  at::Tensor scale_t, shift_t;
  format::LossKind loss = format::LossKind::kCrossEntropy;
  format::MetricKind metric = format::MetricKind::kAccuracy;

  std::vector<TensorSpec> model_tensors;    // the model part of the layout
  std::vector<TensorSpec> layout;           // model tensors, then optimizer slots
  std::map<std::string, int> index;         // name -> layout index
  std::vector<LayerTensors> layer_tensors;  // per spec layer
  std::vector<TrainableSlots> trainables;

  mutable std::mutex script_mu;
  std::optional<torch::jit::Module> script;  // the loaded TorchScript module

  mutable TrafficCounters traffic;
};

// An empty host tensor to fill and hand to CopyToDevice, or to receive a
// CopyToHostAsync: page-locked (LibTorch's caching host allocator) when
// ctx.device is a GPU, so that the copy is a DMA queued on the calling
// thread's stream; ordinary memory on the CPU.
at::Tensor HostTensor(const Context& ctx, at::IntArrayRef shape, at::ScalarType dtype);

// `host` on ctx.device: queued on the calling thread's stream without waiting
// (non_blocking) from page-locked memory (`host` itself when pinned, else a
// page-locked staging copy of it); `host` itself on the CPU. The caching host
// allocator records an event with each copy from one of its blocks and hands
// the block out again only after the copy has ended, so `host` may be dropped
// at once; a pinned `host` kept by the caller must not be written before the
// next WaitForDevice.
at::Tensor CopyToDevice(const Context& ctx, const at::Tensor& host);

// A host copy of `t` (contiguous), queued on the calling thread's stream
// without waiting: valid only after the next WaitForDevice. `t` itself
// (contiguous) on the CPU.
at::Tensor CopyToHostAsync(const Context& ctx, const at::Tensor& t);

// CopyToHostAsync and WaitForDevice: `t`'s values on the host.
at::Tensor CopyToHost(const Context& ctx, const at::Tensor& t);

// Waits until the calling thread's stream has run everything queued on it.
void WaitForDevice(const Context& ctx);

// A member's state on the device, in layout order.
struct MemberTensors {
  std::string member;
  std::vector<at::Tensor> tensors;
  Hyperparameters hp;
  double adam_step = 0;  // the value every optim.*.step holds
  int64_t step = 0;
  uint64_t data_seed = 0;
  uint64_t data_cursor = 0;
  std::map<std::string, std::string> extra;
};

// A failure with its fail code.
struct Failure {
  Status status;
  ipc::FailureCode code = ipc::FailureCode::kInternal;
};

// A member's state on the device before its training call (Trainer::Upload).
class UploadedState {
 public:
  MemberTensors state;
  std::optional<Failure> failure;
};

// Builds `state` from `task`: takes task.uploaded's, or parses and validates
// the blob or initialises a fresh member; tensors end on ctx.device (copies
// possibly still queued: a GPU copies straight from the blob's bytes, which
// must stay valid until the next WaitForDevice). Returns a failure
// (bad-request, bad-state, non-finite) or std::nullopt on success.
std::optional<Failure> LoadMember(const Context& ctx, const MemberTask& task, MemberTensors* state);

// Marks `t` (on ctx.device) as used by the calling thread's stream, so that
// the caching allocator does not reuse its memory for another stream's
// allocations before this stream's work on it is done: for a tensor made on
// another thread (Upload). Nothing on the CPU.
void UseOnThisStream(const Context& ctx, const at::Tensor& t);

// Non-finite check of every tensor: Aborted naming the member and tensor.
Status CheckFinite(const Context& ctx, const MemberTensors& state, const char* when);

// Copies `state` to the host and prepares its blob (checksums computed here).
StatusOr<std::shared_ptr<EncodedState>> EncodeMember(const Context& ctx,
                                                     const MemberTensors& state);

// Lets the trainer attach an encoded state to an outcome.
struct OutcomeAccess {
  static void SetState(MemberOutcome* outcome, std::shared_ptr<EncodedState> state) {
    outcome->state_ = std::move(state);
  }
};

// Fills `out` (a contiguous float CPU tensor) with a dropout mask: 0 or
// 1 / (1 - p), from a CPU generator seeded from (data seed, step, layer), so
// a member's masks are the same plain or fused, on any device, and after a
// restore.
void DrawDropoutMask(uint64_t data_seed, int64_t step, size_t layer, double p,
                     const at::Tensor& out);

// The random inputs of a run of training steps of K members (K = 1 plain),
// drawn on the host before the steps that use them from each member's data
// seed, cursor and step (so a member draws the same numbers plain or fused, on
// the CPU or a GPU), and copied to the device with one transfer per kind and
// chunk of steps, so that the step loop neither copies nor waits: batch
// indices, augmentation offsets, dropout masks and (fused Adam) the per-step
// step size and bias correction columns. A chunk holds as many steps as fit
// kMaxStepDrawBytes (at least one); LeNet-5-sized intervals are one chunk.
class StepDraws {
 public:
  static constexpr int64_t kMaxStepDrawBytes = int64_t{64} << 20;

  // `members` stand at the first step of the run; fused draws masks for every
  // member where one member's dropout is > 0 (a mask of ones where it is 0).
  StepDraws(const Context& ctx, const std::vector<MemberTensors*>& members, bool fused,
            int64_t steps);

  // Makes step `s` of the run available, drawing the chunk that starts there
  // when it is past the current one.
  // REQUIRES: the members stand at step `s` of the run (step, cursor and
  // adam_step advanced by the caller).
  void Prepare(int64_t s);

  // Step s's batch indices [K * batch] on the device; member k's at k * batch.
  at::Tensor indices(int64_t s) const { return indices_.select(0, s - begin_); }
  // Step s's crop offsets and flips [3, K * batch, 1] (rows, columns, flip);
  // undefined without augmentation.
  at::Tensor offsets(int64_t s) const {
    return offsets_.defined() ? offsets_.select(0, s - begin_) : at::Tensor();
  }
  // Step s's dropout masks per spec layer (undefined where none): plain the
  // activation's shape; fused [B, K*C, H, W] or [K, B, F].
  std::vector<at::Tensor> masks(int64_t s) const;
  // Step s's fused Adam columns [K, 1]: -lr / bias_correction1 and
  // sqrt(bias_correction2) at each member's next Adam step.
  at::Tensor adam_neg_step(int64_t s) const { return adam_.select(0, s - begin_).select(0, 0); }
  at::Tensor adam_bc2_sqrt(int64_t s) const { return adam_.select(0, s - begin_).select(0, 1); }

 private:
  void Draw(int64_t n);

  const Context& ctx_;
  const std::vector<MemberTensors*>& members_;
  const bool fused_;
  const int64_t steps_;
  std::vector<size_t> mask_layers_;  // spec layers that draw a mask
  std::vector<double> mask_p_;       // [mask layer * K + k]
  int64_t step_bytes_ = 0;           // host bytes drawn per step
  int64_t begin_ = 0, end_ = 0;      // steps of the current chunk
  std::vector<std::vector<int32_t>> epoch_cache_;
  std::vector<int64_t> cached_epoch_;
  at::Tensor indices_, offsets_, adam_;  // [n, ...] on the device
  std::vector<at::Tensor> mask_chunks_;  // per mask layer: [n, K, B, ...] on the device
};

// One forward pass of a spec model: plain (`members` null: one member's
// tensors) or fused (`tensors` packed [K, ...] for the K `members`).
struct ForwardPass {
  const std::vector<at::Tensor>* tensors = nullptr;  // layout order
  const std::vector<MemberTensors*>* members = nullptr;
  bool train = false;
  // Training: the step's dropout masks per spec layer (StepDraws::masks);
  // null or an undefined mask: no dropout at that layer.
  const std::vector<at::Tensor>* masks = nullptr;
};

// Runs every layer of ctx.spec on `x`: plain [B, C, H, W] / [B, F] to
// [B, outputs]; fused [B, K*C, H, W] / [K, B, F] to [K, B, outputs].
at::Tensor ForwardLayers(const Context& ctx, const ForwardPass& pass, const at::Tensor& x);

// The normalized inputs and targets of the samples `idx` (on the device) of
// `split`; augmented (Augment) when `offsets` is defined.
void GatherBatch(const Context& ctx, const DeviceSplit& split, const at::Tensor& idx,
                 const at::Tensor& offsets, at::Tensor* x, at::Tensor* y);

// Applies ctx.options.augment to a training batch of raw images [M, C, H, W]
// (before Normalize) by StepDraws::offsets [3, M, 1]: row and column offsets
// into the zero-padded image and a flip per row.
at::Tensor Augment(const Context& ctx, const at::Tensor& raw, const at::Tensor& offsets);

// Float32 model input of raw rows of a split's x (never writes to `raw`).
at::Tensor Normalize(const Context& ctx, const at::Tensor& raw);

// Sum over the rows of the metric's per-sample score term, as a double
// tensor: correct predictions (accuracy) or squared errors summed over the
// outputs (neg_mse, r2). `out` is [M, outputs] (or [K, M, outputs], summed per
// member k into [K]); `y` the rows' targets.
at::Tensor ScoreSum(const Context& ctx, const at::Tensor& out, const at::Tensor& y);
// The metric of the first `count` rows of `split` from their ScoreSum (r2
// reads their targets).
double Score(const Context& ctx, const DeviceSplit& split, double sum, int64_t count);

// Plain training of one member for `steps` steps; `losses` receives one
// scalar tensor per step. Stops early (returning OK) after a non-finite loss,
// which the caller detects from `losses`.
Status TrainPlainSteps(const Context& ctx, MemberTensors* m, torch::jit::Module* script,
                       int64_t steps, std::vector<at::Tensor>* losses);

// ScoreSum of one member on the first `count` samples of `split`.
double EvaluatePlain(const Context& ctx, const MemberTensors& m, torch::jit::Module* script,
                     const DeviceSplit& split, int64_t count);

// A TorchScript clone whose parameters and buffers are the member's tensors.
StatusOr<torch::jit::Module> BindScript(const Context& ctx, const MemberTensors& m);

// Fused training of K members (same `steps`), then evaluation of the packed
// model (validation when eval_val, test when eval_test), then unpacking into
// each member's tensors. `losses` receives [K] tensors, one per step;
// `score_val` / `score_test` receive per-member ScoreSums. `compute_s`
// includes `eval_s`.
struct FusedResult {
  std::vector<at::Tensor> losses;
  std::vector<double> score_val;
  std::vector<double> score_test;
};
Status TrainFusedGroup(const Context& ctx, std::vector<MemberTensors*>& members, int64_t steps,
                       bool eval_val, bool eval_test, FusedResult* result, double* pack_s,
                       double* unpack_s, double* compute_s, double* eval_s);

// Sets the calling thread's OpenMP thread count once per value (see trainer.h).
void SetThreadIntraOpThreads(int n);

// Max pooling with a square window, no padding, dilation 1 and floor mode of a
// float [N, C, H, W] CPU tensor: the value and gradient of at::max_pool2d bit
// for bit (the same window scan, first maximum wins, a NaN wins over
// everything), and with relu_first those of at::max_pool2d(at::relu(x)) (up
// to the sign of a zero value). LibTorch 1.13's CPU kernel branches on every
// comparison and took ~2.4 ms for a LeNet-5 conv1 batch of 64 here (a
// quarter of a training step); pooling before the relu (exact: relu is
// monotonic and passes NaN) also runs the relu and its backward on a quarter
// of the values.
// REQUIRES: FastMaxPool2dApplies(x, kernel, stride, padding).
at::Tensor FastMaxPool2d(const at::Tensor& x, int64_t kernel, int64_t stride, bool relu_first);
bool FastMaxPool2dApplies(const at::Tensor& x, int64_t kernel, int64_t stride, int64_t padding);

// Which of ckpt's own convolution kernels run (one_channel_conv.cc): the
// CPU's best, or what CKPT_CONV_KERNELS asks for: "off" (LibTorch's
// convolutions, as before these kernels: to compare with PyTorch bit for
// bit), "avx2" (the AVX2 kernels on an AVX-512 CPU). Read on every call, so a
// test can change it between trainings.
enum class ConvIsa : int64_t { kNone = -1, kAvx512 = 0, kAvx2 = 1 };
ConvIsa ChosenConvIsa();

// A convolution whose groups each read one input channel: x [N, groups, H, W],
// weight [groups * out, 1, k, k] (k 3 or 5), stride 1, zero padding
// `padding`, bias [groups * out] or undefined; LibTorch's conv2d within float
// rounding, with the weight and bias gradients (not x's: x must not need one)
// (one_channel_conv.cc). Applies on CPUs with AVX-512 or AVX2 and FMA.
// REQUIRES: FastOneChannelConvApplies(x, weight, bias, groups, 1, padding).
at::Tensor FastOneChannelConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t groups, int64_t padding);
bool FastOneChannelConvApplies(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, int64_t groups, int64_t stride,
                               int64_t padding);

// A small convolution with 2 to 16 input and at most 32 output channels per
// group: x [N, groups * in, H, W], weight [groups * out, in, k, k] (k 3 or
// 5), stride 1, zero padding `padding`, bias [groups * out] or undefined,
// small enough that a kernel tile's planes stay in L2 (LeNet-5's conv2, plain
// and fused); LibTorch's conv2d within float rounding, with the gradients of
// x, weight and bias (batch_lane_conv.cc). Applies on CPUs with AVX-512 or
// AVX2 and FMA.
// REQUIRES: FastBatchLaneConvApplies(x, weight, bias, groups, 1, padding).
at::Tensor FastBatchLaneConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             int64_t groups, int64_t padding);
bool FastBatchLaneConvApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t groups, int64_t stride, int64_t padding);

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_MODEL_INTERNAL_H_
