// Kernels of a convolution whose groups each read one input channel
// (LeNet-5's conv1 plain: one group; fused: K groups, one per member), stride
// 1, square kernels of 3 or 5, float32, on CPUs with AVX-512 or AVX2. No
// LibTorch here: one_channel_conv.cc checks shapes, allocates, threads and
// runs the autograd; each ISA's kernels are compiled in a file of their own
// with its -m flags (conv_kernels_avx512.cc, conv_kernels_avx2.cc)
// and called only where the CPU has the ISA.
//
// Layouts (all contiguous float32):
//   padded   [planes, padded_h, padded_w]: input plane p = n * groups + g,
//            zero-padded by `padding` on each side, then zeros to padded_w
//            (the kernels read whole vectors past the last output column).
//   weight   [groups * out_per_group, kernel, kernel]
//   bias     [groups * out_per_group] or null
//   out      [batch, groups * out_per_group, out_h, out_w]
// The sums run in a fixed order (the bias, then the taps row by row), so a
// result does not depend on threads or on how many members are fused.
#ifndef CKPT_WORKER_SRC_ONE_CHANNEL_CONV_KERNELS_H_
#define CKPT_WORKER_SRC_ONE_CHANNEL_CONV_KERNELS_H_

#include <cstdint>

namespace ckpt::model::internal {

struct OneChannelConvShape {
  int64_t batch = 0;
  int64_t groups = 0;
  int64_t out_per_group = 0;
  int64_t height = 0;  // of the input
  int64_t width = 0;
  int64_t kernel = 0;  // 3 or 5
  int64_t padding = 0;
  int64_t out_h = 0;  // height + 2 * padding - kernel + 1
  int64_t out_w = 0;
  int64_t padded_h = 0;  // height + 2 * padding
  int64_t padded_w = 0;  // see OneChannelConvShapeOf

  int64_t planes() const { return batch * groups; }
  int64_t channels() const { return groups * out_per_group; }
};

// The shape of a convolution of x [batch, groups, height, width] by weight
// [groups * out_per_group, 1, kernel, kernel] with `padding`, its padded
// rows long enough for vectors of `lanes` floats (whole vectors cover every
// output column, plus the kernel's reach past the last). Defined in
// one_channel_conv.cc, compiled without the ISA flags (no inline function
// here: see one_channel_conv_impl.h).
OneChannelConvShape OneChannelConvShapeOf(int64_t batch, int64_t groups, int64_t out_per_group,
                                          int64_t height, int64_t width, int64_t kernel,
                                          int64_t padding, int64_t lanes);

// One ISA's kernels. Forward writes out planes [begin, end) (input planes, each
// all its group's output channels); WeightGrad writes the weight (and, when
// grad_bias is not null, bias) gradients of output channels [begin, end),
// summed over the batch. grad_out has out's layout.
struct OneChannelConvKernels {
  int64_t lanes;
  void (*forward)(const OneChannelConvShape& s, const float* padded, const float* weight,
                  const float* bias, float* out, int64_t begin, int64_t end);
  void (*weight_grad)(const OneChannelConvShape& s, const float* padded, const float* grad_out,
                      float* grad_weight, float* grad_bias, int64_t begin, int64_t end);
};

// Defined only on x86-64 builds; call only where the CPU has the ISA
// (AVX-512F; AVX2 with FMA).
const OneChannelConvKernels& OneChannelConvAvx512();
const OneChannelConvKernels& OneChannelConvAvx2();

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_ONE_CHANNEL_CONV_KERNELS_H_
