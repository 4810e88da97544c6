// The forward pass of a spec model, plain or fused: one switch over the
// layer kinds, each case saying how it runs on one member's tensors and on K
// members packed as one wide model (layouts: fused_train.cc's top comment).
#include "ckpt/base/cpu_features.h"
#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

at::Tensor OptionalTensor(const std::vector<at::Tensor>& t, int index) {
  return index >= 0 ? t[index] : at::Tensor();
}

// Where ckpt's own one-input-channel kernels do not run (a CPU without AVX2,
// or CKPT_CONV_KERNELS=off: one_channel_conv.cc) and the CPU has no
// AVX-512, a convolution of a one-channel input (LeNet-5's conv1) in training
// runs as LibTorch's own per-sample im2col and matrix product
// (thnn_conv2d, with its autograd) instead of oneDNN: oneDNN 2.6's AVX2
// kernels pad the one input channel to a block of eight, and ran that shape
// at 2-10 GFLOP/s (the weight gradient of a batch of 64: 7.4 ms of a ~16 ms
// LeNet-5 step on an AMD EPYC of the first Zen generation, ONEDNN_VERBOSE=1),
// plus reorders between the plain and blocked layouts every step. The same
// sums in another order: equal to oneDNN's within float rounding. AVX-512
// CPUs keep oneDNN (not measured against it), and so does evaluation (no
// gradient): oneDNN's forward of that shape reads the plain layout, and
// ckpt's chunks of 256 evaluated 1.4x slower through thnn_conv2d. A fixed
// property of the machine and the pass, so a resumed run computes as the
// uninterrupted one.
bool OneChannelCpuConvForTraining(const at::Tensor& x, const at::Tensor& weight) {
  return !base::CpuFeaturesOfThisHost().avx512f && at::GradMode::is_enabled() &&
         weight.requires_grad() && x.device().is_cpu() && x.dim() == 4 && x.size(1) == 1 &&
         x.scalar_type() == at::kFloat;
}

// How many members a pass runs: 1 plain, K fused.
int64_t PackedMembers(const ForwardPass& pass) {
  return pass.members != nullptr ? static_cast<int64_t>(pass.members->size()) : 1;
}

// Plain: one group; fused: K, member k's weights [out, in, k, k] at k.
at::Tensor Conv2dLayer(const ForwardPass& pass, const LayerSpec& l, const LayerTensors& lt,
                       const at::Tensor& x) {
  const std::vector<at::Tensor>& t = *pass.tensors;
  const bool fused = pass.members != nullptr;
  const int64_t K = PackedMembers(pass);
  const at::Tensor w = fused ? t[lt.weight].flatten(0, 1) : t[lt.weight];
  const at::Tensor b = lt.bias < 0 ? at::Tensor() : fused ? t[lt.bias].flatten() : t[lt.bias];
  if (FastOneChannelConvApplies(x, w, b, K, l.stride, l.padding)) {
    return FastOneChannelConv(x, w, b, K, l.padding);
  }
  if (FastBatchLaneConvApplies(x, w, b, K, l.stride, l.padding)) {
    return FastBatchLaneConv(x, w, b, K, l.padding);
  }
  if (!fused && OneChannelCpuConvForTraining(x, w)) {
    return at::thnn_conv2d(x, w, {w.size(2), w.size(3)}, b, {l.stride, l.stride},
                           {l.padding, l.padding});
  }
  return at::conv2d(x, w, b, {l.stride, l.stride}, {l.padding, l.padding}, {1, 1}, K);
}

// The training pass's dropout of layer `i`: `x` itself where no mask applies.
at::Tensor DropoutLayer(const ForwardPass& pass, size_t i, const at::Tensor& x) {
  if (pass.masks == nullptr || !(*pass.masks)[i].defined()) return x;
  return x * (*pass.masks)[i];
}

// Runs layers [begin, end) of the spec (a residual's body or shortcut is a
// sub-range).
at::Tensor RunLayers(const Context& ctx, const ForwardPass& pass, at::Tensor x, size_t begin,
                     size_t end) {
  const auto& layers = ctx.spec.layers();
  const std::vector<at::Tensor>& t = *pass.tensors;
  const bool fused = pass.members != nullptr;
  const int64_t K = PackedMembers(pass);
  // A packed [K, ...] tensor as the one-dimensional [K * ...] BatchNorm takes.
  auto flat = [&](int index) { return fused ? t[index].view({-1}) : t[index]; };
  for (size_t i = begin; i < end; ++i) {
    const LayerSpec& l = layers[i];
    const LayerTensors& lt = ctx.layer_tensors[i];
    switch (l.kind) {
      case LayerKind::kConv2d:
        x = Conv2dLayer(pass, l, lt, x);
        break;
      case LayerKind::kLinear:
        if (fused) {
          at::Tensor wt = t[lt.weight].transpose(1, 2);
          x = lt.bias >= 0 ? at::baddbmm(t[lt.bias].unsqueeze(1), x, wt) : at::bmm(x, wt);
        } else {
          x = at::linear(x, t[lt.weight], OptionalTensor(t, lt.bias));
        }
        break;
      case LayerKind::kRelu:
        if (i + 1 < end && layers[i + 1].kind == LayerKind::kMaxPool2d &&
            FastMaxPool2dApplies(x, layers[i + 1].kernel, layers[i + 1].stride,
                                 layers[i + 1].padding)) {
          // relu then max pool as one pass: the pool of the relu is the relu of the pool.
          x = FastMaxPool2d(x, layers[i + 1].kernel, layers[i + 1].stride, /*relu_first=*/true);
          ++i;
          break;
        }
        x = at::relu(x);
        break;
      case LayerKind::kTanh:
        x = at::tanh(x);
        break;
      case LayerKind::kMaxPool2d:
        if (FastMaxPool2dApplies(x, l.kernel, l.stride, l.padding)) {
          x = FastMaxPool2d(x, l.kernel, l.stride, /*relu_first=*/false);
          break;
        }
        x = at::max_pool2d(x, {l.kernel, l.kernel}, {l.stride, l.stride}, {l.padding, l.padding});
        break;
      case LayerKind::kAvgPool2d:
        x = at::avg_pool2d(x, {l.kernel, l.kernel}, {l.stride, l.stride}, {l.padding, l.padding});
        break;
      case LayerKind::kBatchNorm2d:
        if (pass.train) t[lt.num_batches_tracked].add_(1);
        x = at::batch_norm(x, flat(lt.weight), flat(lt.bias), flat(lt.running_mean),
                           flat(lt.running_var), pass.train, l.momentum, l.eps,
                           /*cudnn_enabled=*/true);
        break;
      case LayerKind::kDropout:
        if (pass.train) x = DropoutLayer(pass, i, x);
        break;
      case LayerKind::kFlatten:
        x = fused ? x.reshape({x.size(0), K, -1}).transpose(0, 1) : x.flatten(1);
        break;
      case LayerKind::kGlobalAvgPool:
        x = x.mean({2, 3});
        if (fused) x = x.view({x.size(0), K, -1}).transpose(0, 1);
        break;
      case LayerKind::kResidual: {
        const size_t body_end = i + 1 + static_cast<size_t>(l.body);
        const size_t shortcut_end = body_end + static_cast<size_t>(l.shortcut);
        at::Tensor body = RunLayers(ctx, pass, x, i + 1, body_end);
        at::Tensor shortcut = l.shortcut > 0 ? RunLayers(ctx, pass, x, body_end, shortcut_end) : x;
        x = body + shortcut;
        i = shortcut_end - 1;
        break;
      }
    }
  }
  return x;
}

}  // namespace

at::Tensor ForwardLayers(const Context& ctx, const ForwardPass& pass, const at::Tensor& x) {
  return RunLayers(ctx, pass, x, 0, ctx.spec.layers().size());
}

}  // namespace ckpt::model::internal
