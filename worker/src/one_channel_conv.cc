// Convolutions whose groups each read one input channel (LeNet-5's conv1:
// one group plain, K fused), on CPUs with AVX-512 or AVX2 (FastOneChannelConv,
// model_internal.h). oneDNN pads the one channel to a block of 8 or 16 and
// reorders the output between its blocked layout and the plain one both ways
// every step (0.49 ms of a 4.85 ms LeNet-5 step on an AVX-512 Xeon, and its
// AVX2 kernels ran this shape at 2-10 GFLOP/s on a first-generation Zen);
// here the input is zero-padded once into rows of whole vectors and every
// output is a register accumulation (one_channel_conv_impl.h). The same sums
// as LibTorch's in another order: equal within float rounding, and the same
// bits from one run to the next, with any number of threads or members fused.
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "ckpt/base/cpu_features.h"
#include "model_internal.h"
#include "one_channel_conv_kernels.h"

namespace ckpt::model::internal {
namespace {

// REQUIRES: isa is ConvIsa::kAvx512 or kAvx2, as ChosenConvIsa gave it.
const OneChannelConvKernels& KernelsOf(ConvIsa isa) {
#if defined(__x86_64__)
  if (isa == ConvIsa::kAvx512) return OneChannelConvAvx512();
  CKPT_CHECK(isa == ConvIsa::kAvx2);
  return OneChannelConvAvx2();
#else
  (void)isa;
  std::abort();  // ChosenConvIsa() is kNone off x86-64
#endif
}

// x [batch, groups, H, W], weight [groups * out, 1, k, k].
OneChannelConvShape ShapeOf(at::IntArrayRef x, at::IntArrayRef weight, int64_t groups,
                            int64_t padding, int64_t lanes) {
  return OneChannelConvShapeOf(x[0], groups, weight[0] / groups, x[2], x[3], weight[2], padding,
                               lanes);
}

// x [batch, groups, H, W] (each plane's rows contiguous, the planes anywhere:
// the fused pass's input is a transposed view) into [planes, padded_h,
// padded_w], zeros around.
at::Tensor Pad(const at::Tensor& x, const OneChannelConvShape& s) {
  at::Tensor padded = at::zeros({s.planes(), s.padded_h, s.padded_w}, at::kFloat);
  const float* src = x.data_ptr<float>();
  float* dst = padded.data_ptr<float>();
  const int64_t plane_in = s.padded_h * s.padded_w;
  for (int64_t n = 0; n < s.batch; ++n) {
    for (int64_t g = 0; g < s.groups; ++g) {
      const float* plane = src + n * x.stride(0) + g * x.stride(1);
      float* to = dst + (n * s.groups + g) * plane_in + s.padding * s.padded_w + s.padding;
      for (int64_t y = 0; y < s.height; ++y) {
        std::memcpy(to + y * s.padded_w, plane + y * x.stride(2), sizeof(float) * s.width);
      }
    }
  }
  return padded;
}

at::Tensor Forward(const OneChannelConvKernels& k, const OneChannelConvShape& s,
                   const at::Tensor& padded, const at::Tensor& weight, const at::Tensor& bias) {
  at::Tensor out = at::empty({s.batch, s.channels(), s.out_h, s.out_w}, weight.options());
  const float* pp = padded.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  const float* b = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* o = out.data_ptr<float>();
  at::parallel_for(0, s.planes(), 8,
                   [&](int64_t begin, int64_t end) { k.forward(s, pp, w, b, o, begin, end); });
  return out;
}

class OneChannelConvFunction : public torch::autograd::Function<OneChannelConvFunction> {
 public:
  // bias: defined (zeros for a layer without one: autograd takes no
  // undefined input, and 0 + the first product is that product).
  // kernels: ChosenConvIsa() for this call (the backward uses the same,
  // whatever the environment says by then).
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, const at::Tensor& bias, int64_t groups,
                            int64_t padding, int64_t kernels) {
    const OneChannelConvKernels& k = KernelsOf(static_cast<ConvIsa>(kernels));
    const OneChannelConvShape s = ShapeOf(x.sizes(), weight.sizes(), groups, padding, k.lanes);
    at::Tensor padded = Pad(x, s);
    at::Tensor out = Forward(k, s, padded, weight, bias);
    ctx->save_for_backward({padded});
    ctx->saved_data["kernels"] = kernels;
    ctx->saved_data["groups"] = groups;
    ctx->saved_data["padding"] = padding;
    ctx->saved_data["x_sizes"] = x.sizes();
    ctx->saved_data["w_sizes"] = weight.sizes();
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const OneChannelConvKernels& k =
        KernelsOf(static_cast<ConvIsa>(ctx->saved_data["kernels"].toInt()));
    const at::Tensor padded = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].contiguous();
    const std::vector<int64_t> x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    const std::vector<int64_t> w_sizes = ctx->saved_data["w_sizes"].toIntVector();
    const OneChannelConvShape s = ShapeOf(x_sizes, w_sizes, ctx->saved_data["groups"].toInt(),
                                          ctx->saved_data["padding"].toInt(), k.lanes);
    at::Tensor grad_w = at::empty(w_sizes, grad.options());
    at::Tensor grad_b;
    if (ctx->needs_input_grad(2)) grad_b = at::empty({s.channels()}, grad.options());
    const float* pp = padded.data_ptr<float>();
    const float* g = grad.data_ptr<float>();
    float* gw = grad_w.data_ptr<float>();
    float* gb = grad_b.defined() ? grad_b.data_ptr<float>() : nullptr;
    at::parallel_for(0, s.channels(), 1, [&](int64_t begin, int64_t end) {
      k.weight_grad(s, pp, g, gw, gb, begin, end);
    });
    return {at::Tensor(), grad_w, grad_b, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

ConvIsa ChosenConvIsa() {
#if defined(__x86_64__)
  const base::CpuFeatures& cpu = base::CpuFeaturesOfThisHost();
  const bool avx512 = cpu.avx512f;
  const bool avx2 = cpu.Avx2Fma();
  const char* choice = std::getenv("CKPT_CONV_KERNELS");
  const std::string_view c = choice != nullptr ? choice : "";
  if (c == "off") return ConvIsa::kNone;
  if (avx512 && c != "avx2") return ConvIsa::kAvx512;
  if (avx2) return ConvIsa::kAvx2;
#endif
  return ConvIsa::kNone;
}

OneChannelConvShape OneChannelConvShapeOf(int64_t batch, int64_t groups, int64_t out_per_group,
                                          int64_t height, int64_t width, int64_t kernel,
                                          int64_t padding, int64_t lanes) {
  OneChannelConvShape s;
  s.batch = batch;
  s.groups = groups;
  s.out_per_group = out_per_group;
  s.height = height;
  s.width = width;
  s.kernel = kernel;
  s.padding = padding;
  s.out_h = height + 2 * padding - kernel + 1;
  s.out_w = width + 2 * padding - kernel + 1;
  s.padded_h = height + 2 * padding;
  s.padded_w = (s.out_w + lanes - 1) / lanes * lanes + kernel - 1;
  return s;
}

bool FastOneChannelConvApplies(const at::Tensor& x, const at::Tensor& weight,
                               const at::Tensor& bias, int64_t groups, int64_t stride,
                               int64_t padding) {
  if (ChosenConvIsa() == ConvIsa::kNone || stride != 1 || padding < 0 || groups < 1) return false;
  if (!x.device().is_cpu() || x.scalar_type() != at::kFloat || x.dim() != 4 ||
      x.size(1) != groups || x.stride(3) != 1 || x.stride(2) < x.size(3) ||
      (at::GradMode::is_enabled() && x.requires_grad())) {
    return false;
  }
  if (!weight.device().is_cpu() || weight.scalar_type() != at::kFloat || weight.dim() != 4 ||
      !weight.is_contiguous() || weight.size(1) != 1 || weight.size(0) % groups != 0 ||
      weight.size(2) != weight.size(3) || (weight.size(2) != 3 && weight.size(2) != 5)) {
    return false;
  }
  if (bias.defined() && (!bias.device().is_cpu() || bias.scalar_type() != at::kFloat ||
                         !bias.is_contiguous() || bias.numel() != weight.size(0))) {
    return false;
  }
  return x.size(0) > 0 && x.size(2) + 2 * padding >= weight.size(2) &&
         x.size(3) + 2 * padding >= weight.size(3);
}

at::Tensor FastOneChannelConv(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                              int64_t groups, int64_t padding) {
  const auto kernels = static_cast<int64_t>(ChosenConvIsa());
  const bool grad = at::GradMode::is_enabled() &&
                    (weight.requires_grad() || (bias.defined() && bias.requires_grad()));
  if (grad) {
    return OneChannelConvFunction::apply(
        x, weight, bias.defined() ? bias : at::zeros({weight.size(0)}, weight.options()), groups,
        padding, kernels);
  }
  const OneChannelConvKernels& k = KernelsOf(static_cast<ConvIsa>(kernels));
  const OneChannelConvShape s = ShapeOf(x.sizes(), weight.sizes(), groups, padding, k.lanes);
  return Forward(k, s, Pad(x, s), weight, bias);
}

}  // namespace ckpt::model::internal
