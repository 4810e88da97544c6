// Kernels of a small convolution with several input channels per group
// (LeNet-5's conv2: 6 in, 16 out, 5x5 on 14x14; fused: K groups, one per
// member), stride 1, square kernels of 3 or 5, float32, on CPUs with AVX-512
// or AVX2, vectorised over the batch: each vector holds one value of 16 (8)
// samples, so every lane does useful work whatever the image's width (oneDNN
// ran LeNet-5's conv2 at 45-130 GFLOP/s forward and 47-52 backward on one
// AVX-512 core; a 10-wide output row fills 10 of 16 lanes), and no tap
// outside the image is computed. No LibTorch here: batch_lane_conv.cc checks
// shapes, transposes, threads and runs the autograd; each ISA's kernels are
// instantiated in conv_kernels_avx512.cc / conv_kernels_avx2.cc and called
// only where the CPU has the ISA.
//
// Layouts ("batch-lane": the sample index innermost; all contiguous float32;
// lanes = batch_lanes, the batch rounded up to whole vectors, the samples
// past the batch zero):
//   in      [in_channels, padded_h, padded_w, lanes], zero-padded by
//           `padding` on each side
//   out, grad_out [out_channels, out_h, out_w, lanes]
//   grad_in [in_channels, height, width, lanes] (no padding)
//   weight_by_in  [groups, in_per_group, kernel * kernel, out_per_group]
//   weight_by_out [groups, out_per_group, kernel * kernel, in_per_group]
//   (both the weight [out_channels, in_per_group, kernel, kernel] reordered)
// The sums run in a fixed order (forward: the bias, then input channel by
// channel the taps row by row; the data gradient: output channel by channel
// the taps; the weights' and bias's: pixel by pixel the batch's vectors, then
// the lanes), so a result does not depend on threads or on how many members
// are fused.
#ifndef CKPT_WORKER_SRC_BATCH_LANE_CONV_KERNELS_H_
#define CKPT_WORKER_SRC_BATCH_LANE_CONV_KERNELS_H_

#include <cstdint>

namespace ckpt::model::internal {

struct BatchLaneConvShape {
  int64_t batch = 0;
  int64_t batch_lanes = 0;  // batch rounded up to whole vectors
  int64_t groups = 0;
  int64_t in_per_group = 0;
  int64_t out_per_group = 0;
  int64_t height = 0;  // of the input
  int64_t width = 0;
  int64_t kernel = 0;  // 3 or 5
  int64_t padding = 0;
  int64_t padded_h = 0;  // height + 2 * padding
  int64_t padded_w = 0;
  int64_t out_h = 0;  // padded_h - kernel + 1
  int64_t out_w = 0;
  // Register tiles, as BatchLaneConvShapeOf picks them for the ISA:
  int64_t vectors_block = 0;   // batch vectors per tile: 4, 2 or 1
  int64_t out_block = 0;       // output channels per forward tile
  int64_t in_block = 0;        // input channels per data-gradient tile
  int64_t grad_out_block = 0;  // output channels per weight-gradient tile

  int64_t in_channels() const { return groups * in_per_group; }
  int64_t out_channels() const { return groups * out_per_group; }
  // The kernels' work items, [0, n): forward (an output channel block, an
  // output row); data gradient (an input channel block, an input row);
  // weight gradient (an output channel block, an input channel of the
  // group, a kernel row).
  int64_t forward_items() const { return out_channels() / out_block * out_h; }
  int64_t data_grad_items() const { return in_channels() / in_block * height; }
  int64_t weight_grad_items() const {
    return out_channels() / grad_out_block * in_per_group * kernel;
  }
};

// The shape of a convolution of x [batch, groups * in_per_group, height,
// width] by weight [groups * out_per_group, in_per_group, kernel, kernel]
// with `padding`, for an ISA of `lanes` floats per vector and `registers`
// vector registers. Defined in batch_lane_conv.cc, compiled without the ISA
// flags.
BatchLaneConvShape BatchLaneConvShapeOf(int64_t batch, int64_t groups, int64_t in_per_group,
                                        int64_t out_per_group, int64_t height, int64_t width,
                                        int64_t kernel, int64_t padding, int64_t lanes,
                                        int64_t registers);

// One ISA's kernels, each over work items [begin, end) (see the shape).
// weight_grad also writes the bias gradient of its items' output channels
// when grad_bias is not null (the items of input channel 0, kernel row 0).
struct BatchLaneConvKernels {
  int64_t lanes;
  int64_t registers;
  void (*forward)(const BatchLaneConvShape& s, const float* in, const float* weight_by_in,
                  const float* bias, float* out, int64_t begin, int64_t end);
  void (*data_grad)(const BatchLaneConvShape& s, const float* grad_out, const float* weight_by_out,
                    float* grad_in, int64_t begin, int64_t end);
  void (*weight_grad)(const BatchLaneConvShape& s, const float* in, const float* grad_out,
                      float* grad_weight, float* grad_bias, int64_t begin, int64_t end);
  // The transposes between a batch's plain rows and the batch-lane layout,
  // in blocks of lanes x lanes through registers. to_lanes:
  // dst[p * lanes + n] = src[n * sample_stride + p] for p < positions and
  // n < lanes, zero for n >= samples (lanes a multiple of the ISA's).
  // from_lanes: dst[n * sample_stride + p] = src[p * lanes + n] for
  // n < samples, p < positions.
  void (*to_lanes)(const float* src, int64_t sample_stride, int64_t samples, int64_t positions,
                   float* dst, int64_t lanes);
  void (*from_lanes)(const float* src, int64_t lanes, int64_t samples, int64_t positions,
                     float* dst, int64_t sample_stride);
};

// Defined only on x86-64 builds; call only where the CPU has the ISA
// (AVX-512F; AVX2 with FMA).
const BatchLaneConvKernels& BatchLaneConvAvx512();
const BatchLaneConvKernels& BatchLaneConvAvx2();

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_BATCH_LANE_CONV_KERNELS_H_
