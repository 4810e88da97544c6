// Small convolutions with several input channels per group (LeNet-5's conv2,
// plain and fused) through ckpt's batch-lane kernels
// (batch_lane_conv_kernels.h) on CPUs with AVX-512 or AVX2
// (FastBatchLaneConv, model_internal.h): the input and the output gradient
// are transposed once into the batch-lane layout, the kernels run the three
// products with every lane busy, and the output and the input gradient are
// transposed back. LibTorch's sums in another order: equal within float
// rounding, and the same bits from one run to the next, with any number of
// threads or members fused.

#include "batch_lane_conv_kernels.h"
#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

// Where a tile's input plane and output planes (bytes) fit no L2 cache, the
// weight gradient, which reads them once per kernel row and input channel,
// ran slower than oneDNN's (16 channels of 32 x 32 in batches of 128: 35
// against 51 GFLOP/s on one AVX-512 core); as did 64 channels per group.
constexpr int64_t kMaxTileBytes = int64_t{1} << 20;
constexpr int64_t kMaxInPerGroup = 16, kMaxOutPerGroup = 32;

// REQUIRES: isa is ConvIsa::kAvx512 or kAvx2.
const BatchLaneConvKernels& KernelsOf(ConvIsa isa) {
#if defined(__x86_64__)
  if (isa == ConvIsa::kAvx512) return BatchLaneConvAvx512();
  CKPT_CHECK(isa == ConvIsa::kAvx2);
  return BatchLaneConvAvx2();
#else
  (void)isa;
  std::abort();  // ChosenConvIsa() is kNone off x86-64
#endif
}

// x [batch, groups * in, H, W], weight [groups * out, in, k, k].
BatchLaneConvShape ShapeOf(at::IntArrayRef x, at::IntArrayRef weight, int64_t groups,
                           int64_t padding, const BatchLaneConvKernels& k) {
  return BatchLaneConvShapeOf(x[0], groups, weight[1], weight[0] / groups, x[2], x[3], weight[2],
                              padding, k.lanes, k.registers);
}

// x [N, C, H, W] into [C, H + 2 * pad, W + 2 * pad, lanes], zeros around
// and past the batch: a row of each channel at a time (the whole of a
// channel's plane without padding).
at::Tensor ToBatchLanes(const BatchLaneConvKernels& k, const at::Tensor& x_any, int64_t lanes,
                        int64_t pad) {
  const at::Tensor x = x_any.contiguous();
  const int64_t n_count = x.size(0), channels = x.size(1), h = x.size(2), w = x.size(3);
  const int64_t ph = h + 2 * pad, pw = w + 2 * pad;
  at::Tensor t = pad > 0 ? at::zeros({channels, ph, pw, lanes}, at::kFloat)
                         : at::empty({channels, ph, pw, lanes}, at::kFloat);
  const float* src = x.data_ptr<float>();
  float* dst = t.data_ptr<float>();
  const int64_t sample = channels * h * w;
  at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      if (pad == 0) {
        k.to_lanes(src + c * h * w, sample, n_count, h * w, dst + c * h * w * lanes, lanes);
        continue;
      }
      for (int64_t y = 0; y < h; ++y) {
        k.to_lanes(src + (c * h + y) * w, sample, n_count, w,
                   dst + ((c * ph + y + pad) * pw + pad) * lanes, lanes);
      }
    }
  });
  return t;
}

// [C, H, W, lanes] (the first n_count lanes) into a new [n_count, C, H, W].
at::Tensor FromBatchLanes(const BatchLaneConvKernels& k, const float* t, int64_t n_count,
                          int64_t channels, int64_t h, int64_t w, int64_t lanes) {
  at::Tensor x = at::empty({n_count, channels, h, w}, at::kFloat);
  float* dst = x.data_ptr<float>();
  const int64_t sample = channels * h * w;
  at::parallel_for(0, channels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      k.from_lanes(t + c * h * w * lanes, lanes, n_count, h * w, dst + c * h * w, sample);
    }
  });
  return x;
}

// weight [groups * out, in, k, k] as [groups, in, k * k, out] (by_in) or
// [groups, out, k * k, in] (by_out).
at::Tensor WeightByIn(const at::Tensor& weight, int64_t groups) {
  const int64_t out = weight.size(0) / groups, in = weight.size(1);
  return weight.view({groups, out, in, -1}).permute({0, 2, 3, 1}).contiguous();
}
at::Tensor WeightByOut(const at::Tensor& weight, int64_t groups) {
  const int64_t out = weight.size(0) / groups, in = weight.size(1);
  return weight.view({groups, out, in, -1}).permute({0, 1, 3, 2}).contiguous();
}

// The output [N, groups * out, out_h, out_w] of the padded batch-lane input.
at::Tensor Forward(const BatchLaneConvKernels& k, const BatchLaneConvShape& s, const at::Tensor& in,
                   const at::Tensor& weight, const at::Tensor& bias) {
  const at::Tensor wt = WeightByIn(weight, s.groups);
  at::Tensor out = at::empty({s.out_channels() * s.out_h * s.out_w * s.batch_lanes}, at::kFloat);
  const float* pin = in.data_ptr<float>();
  const float* pw = wt.data_ptr<float>();
  const float* pb = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* po = out.data_ptr<float>();
  at::parallel_for(0, s.forward_items(), 1,
                   [&](int64_t begin, int64_t end) { k.forward(s, pin, pw, pb, po, begin, end); });
  return FromBatchLanes(k, po, s.batch, s.out_channels(), s.out_h, s.out_w, s.batch_lanes);
}

class BatchLaneConvFunction : public torch::autograd::Function<BatchLaneConvFunction> {
 public:
  // bias: defined (zeros for a layer without one). isa: ChosenConvIsa() for
  // this call (the backward uses the same, whatever the environment says by
  // then).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias, int64_t groups,
                            int64_t padding, int64_t isa) {
    const BatchLaneConvKernels& k = KernelsOf(static_cast<ConvIsa>(isa));
    const BatchLaneConvShape s = ShapeOf(x.sizes(), weight.sizes(), groups, padding, k);
    at::Tensor in = ToBatchLanes(k, x, s.batch_lanes, padding);
    at::Tensor out = Forward(k, s, in, weight, bias);
    ctx->save_for_backward({in, weight});
    ctx->saved_data["isa"] = isa;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["x_sizes"] = x.sizes();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const BatchLaneConvKernels& k = KernelsOf(static_cast<ConvIsa>(ctx->saved_data["isa"].toInt()));
    const auto saved = ctx->get_saved_variables();
    const at::Tensor& in = saved[0];
    const at::Tensor& weight = saved[1];
    const std::vector<int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const BatchLaneConvShape s = ShapeOf(x_sizes, weight.sizes(), ctx->saved_data["groups"].toInt(),
                                         ctx->saved_data["padding"].toInt(), k);
    const at::Tensor grad_out = ToBatchLanes(k, grads[0], s.batch_lanes, 0);
    const float* pg = grad_out.data_ptr<float>();
    at::Tensor grad_x, grad_w, grad_b;
    if (ctx->needs_input_grad(0)) {
      const at::Tensor w2 = WeightByOut(weight, s.groups);
      at::Tensor grad_in =
          at::empty({s.in_channels() * s.height * s.width * s.batch_lanes}, at::kFloat);
      const float* pw = w2.data_ptr<float>();
      float* pi = grad_in.data_ptr<float>();
      at::parallel_for(0, s.data_grad_items(), 1,
                       [&](int64_t begin, int64_t end) { k.data_grad(s, pg, pw, pi, begin, end); });
      grad_x = FromBatchLanes(k, pi, s.batch, s.in_channels(), s.height, s.width, s.batch_lanes);
    }
    if (ctx->needs_input_grad(1) || ctx->needs_input_grad(2)) {
      grad_w = at::empty(weight.sizes(), at::kFloat);
      if (ctx->needs_input_grad(2)) grad_b = at::empty({s.out_channels()}, at::kFloat);
      const float* pin = in.data_ptr<float>();
      float* gw = grad_w.data_ptr<float>();
      float* gb = grad_b.defined() ? grad_b.data_ptr<float>() : nullptr;
      at::parallel_for(0, s.weight_grad_items(), 1, [&](int64_t begin, int64_t end) {
        k.weight_grad(s, pin, pg, gw, gb, begin, end);
      });
      if (!ctx->needs_input_grad(1)) grad_w = at::Tensor();
    }
    return {grad_x, grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

BatchLaneConvShape BatchLaneConvShapeOf(int64_t batch, int64_t groups, int64_t in_per_group,
                                        int64_t out_per_group, int64_t height, int64_t width,
                                        int64_t kernel, int64_t padding, int64_t lanes,
                                        int64_t registers) {
  BatchLaneConvShape s;
  s.batch = batch;
  s.batch_lanes = RoundUp(batch, lanes);
  s.groups = groups;
  s.in_per_group = in_per_group;
  s.out_per_group = out_per_group;
  s.height = height;
  s.width = width;
  s.kernel = kernel;
  s.padding = padding;
  s.padded_h = height + 2 * padding;
  s.padded_w = width + 2 * padding;
  s.out_h = s.padded_h - kernel + 1;
  s.out_w = s.padded_w - kernel + 1;
  const int64_t vectors = s.batch_lanes / lanes;
  s.vectors_block = vectors % 4 == 0 ? 4 : vectors % 2 == 0 ? 2 : 1;
  // The largest block of 6, 4, 3, 2 or 1 channels that divides `channels`
  // and whose tile fits `fit` registers.
  auto block = [](int64_t channels, auto fits) {
    for (int64_t b : {6, 4, 3, 2}) {
      if (channels % b == 0 && fits(b)) return b;
    }
    return int64_t{1};
  };
  const int64_t nb = s.vectors_block;
  // kO * kN accumulators, kN input vectors and a broadcast weight.
  s.out_block = block(out_per_group, [&](int64_t b) { return b * nb + nb + 1 <= registers - 2; });
  s.in_block = block(in_per_group, [&](int64_t b) { return b * nb + nb + 1 <= registers - 2; });
  // kO * K accumulators, kO of the bias and kO gradients, an input vector.
  s.grad_out_block =
      block(out_per_group, [&](int64_t b) { return b * (kernel + 2) + 1 <= registers; });
  return s;
}

bool FastBatchLaneConvApplies(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t groups, int64_t stride, int64_t padding) {
  const ConvIsa isa = ChosenConvIsa();
  if (isa == ConvIsa::kNone || stride != 1 || padding < 0 || groups < 1) return false;
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || x.dim() != 4 || x.size(0) < 1) {
    return false;
  }
  if (!weight.device().is_cpu() || weight.scalar_type() != at::kFloat || weight.dim() != 4 ||
      !weight.is_contiguous() || weight.size(0) % groups != 0 || weight.size(2) != weight.size(3) ||
      (weight.size(2) != 3 && weight.size(2) != 5)) {
    return false;
  }
  const int64_t in = weight.size(1), out = weight.size(0) / groups;
  if (in < 2 || in > kMaxInPerGroup || out > kMaxOutPerGroup || x.size(1) != groups * in) {
    return false;
  }
  if (bias.defined() && (!bias.device().is_cpu() || bias.scalar_type() != at::kFloat ||
                         !bias.is_contiguous() || bias.numel() != weight.size(0))) {
    return false;
  }
  const int64_t ph = x.size(2) + 2 * padding, pw = x.size(3) + 2 * padding, k = weight.size(2);
  if (ph < k || pw < k) return false;
  const int64_t lanes = KernelsOf(isa).lanes;
  const int64_t tile_floats =
      (ph * pw + 4 * (ph - k + 1) * (pw - k + 1)) * RoundUp(x.size(0), lanes);
  return tile_floats * static_cast<int64_t>(sizeof(float)) <= kMaxTileBytes;
}

at::Tensor FastBatchLaneConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                             int64_t groups, int64_t padding) {
  const ConvIsa isa = ChosenConvIsa();
  const bool grad = at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() ||
                                                   (bias.defined() && bias.requires_grad()));
  if (grad) {
    return BatchLaneConvFunction::apply(
        x, weight, bias.defined() ? bias : at::zeros({weight.size(0)}, weight.options()), groups,
        padding, static_cast<int64_t>(isa));
  }
  const BatchLaneConvKernels& k = KernelsOf(isa);
  const BatchLaneConvShape s = ShapeOf(x.sizes(), weight.sizes(), groups, padding, k);
  return Forward(k, s, ToBatchLanes(k, x, s.batch_lanes, padding), weight, bias);
}

}  // namespace ckpt::model::internal
