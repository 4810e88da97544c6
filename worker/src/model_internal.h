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
};

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

// Builds `state` from `task`: parses and validates the blob or initialises a
// fresh member; tensors end on ctx.device. Returns a failure (bad-request,
// bad-state, non-finite) or std::nullopt on success.
std::optional<Failure> LoadMember(const Context& ctx, const MemberTask& task, MemberTensors* state);

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

// Dropout masks: a CPU generator seeded from (data seed, step, layer), so a
// member's masks are the same plain or fused, and after a restore.
at::Tensor DropoutMask(uint64_t data_seed, int64_t step, size_t layer, double p,
                       at::IntArrayRef shape, const at::Device& device);

// One forward pass of a spec model: plain (`members` null: one member's
// tensors, dropout drawn from data_seed and step) or fused (`tensors` packed
// [K, ...] for the K `members`, each drawing its own dropout).
struct ForwardPass {
  const std::vector<at::Tensor>* tensors = nullptr;  // layout order
  const std::vector<MemberTensors*>* members = nullptr;
  bool train = false;
  uint64_t data_seed = 0;
  int64_t step = 0;
  // Plain: the member's dropout hyperparameter (each layer's p when unset);
  // fused passes read each member's own (MemberTensors::hp).
  std::optional<double> dropout;
};

// Runs every layer of ctx.spec on `x`: plain [B, C, H, W] / [B, F] to
// [B, outputs]; fused [B, K*C, H, W] / [K, B, F] to [K, B, outputs].
at::Tensor ForwardLayers(const Context& ctx, const ForwardPass& pass, const at::Tensor& x);

// The normalized inputs and targets of the samples `idx` of `split`;
// augmented (Augment) when `members` is given.
void GatherBatch(const Context& ctx, const DeviceSplit& split, const std::vector<int64_t>& idx,
                 at::Tensor* x, at::Tensor* y,
                 const std::vector<const MemberTensors*>* members = nullptr);

// Applies ctx.options.augment to a training batch of raw images [M, C, H, W]
// (before Normalize): rows [k * B, (k + 1) * B) belong to `members[k]`, whose
// crop offsets and flips are drawn from its data seed and step alone, so a
// member's batch is augmented the same plain or fused.
at::Tensor Augment(const Context& ctx, const at::Tensor& raw,
                   const std::vector<const MemberTensors*>& members);

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
