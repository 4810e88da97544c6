// The kernels of one_channel_conv_kernels.h, written once over a vector type:
// included by conv_kernels_avx512.cc and conv_kernels_avx2.cc, each
// compiled with its own -m flags and instantiating these templates with its
// own traits type (so no instantiation is shared between the two files).
// Only templates here: an inline function compiled under -mavx512f in one file
// could be the copy the linker keeps for a CPU without it. The loops over
// accumulators are unrolled (GCC's -O2 kept them in memory otherwise, a load
// and a store around every FMA).
//
// Traits T: V (the vector type), kLanes, Zero(), Set1(f), Load(p) (kLanes
// floats), LoadReg(p) (Load, kept in a register for several uses),
// LoadN(p, n) (the first n, zeros after, reading nothing past p + n),
// StoreN(p, v, n) (the first n lanes), Fma(a, b, c) = a * b + c, Add, Sum
// (of the lanes).
#ifndef CKPT_WORKER_SRC_ONE_CHANNEL_CONV_IMPL_H_
#define CKPT_WORKER_SRC_ONE_CHANNEL_CONV_IMPL_H_

#include <cstdint>

#include "one_channel_conv_kernels.h"

namespace ckpt::model::internal {

// Output planes of input planes [begin, end): for each group of kBlock output
// channels, each row in vectors of kLanes columns, the bias then the K * K
// taps (row by row) accumulated in registers; one load of the input per tap
// serves kBlock channels, whose weights of that tap are adjacent (transposed
// into `taps` once per group, so the broadcasts share one pointer).
template <typename T, int K, int kBlock>
void OneChannelConvForward(const OneChannelConvShape& s, const float* padded, const float* weight,
                           const float* bias, float* out, int64_t begin, int64_t end) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  const int64_t plane_in = s.padded_h * s.padded_w;
  const int64_t plane_out = s.out_h * s.out_w;
  float taps[K * K * kBlock];
  for (int64_t p = begin; p < end; ++p) {
    const int64_t n = p / s.groups;
    const int64_t g = p % s.groups;
    const float* src = padded + p * plane_in;
    for (int64_t c0 = 0; c0 < s.out_per_group; c0 += kBlock) {
      const int64_t oc = g * s.out_per_group + c0;
      for (int t = 0; t < K * K; ++t) {
        for (int j = 0; j < kBlock; ++j) taps[t * kBlock + j] = weight[(oc + j) * K * K + t];
      }
      float* dst = out + (n * s.channels() + oc) * plane_out;
      V b[kBlock];
#pragma GCC unroll 8
      for (int j = 0; j < kBlock; ++j) b[j] = bias != nullptr ? T::Set1(bias[oc + j]) : T::Zero();
      for (int64_t y = 0; y < s.out_h; ++y) {
        for (int64_t x0 = 0; x0 < s.out_w; x0 += kLanes) {
          V acc[kBlock];
#pragma GCC unroll 8
          for (int j = 0; j < kBlock; ++j) acc[j] = b[j];
          const float* tap = taps;
          for (int ky = 0; ky < K; ++ky) {
            const float* row = src + (y + ky) * s.padded_w + x0;
#pragma GCC unroll 8
            for (int kx = 0; kx < K; ++kx) {
              const V in = T::Load(row + kx);
#pragma GCC unroll 8
              for (int j = 0; j < kBlock; ++j) acc[j] = T::Fma(T::Set1(tap[j]), in, acc[j]);
              tap += kBlock;
            }
          }
          const int64_t left = s.out_w - x0;
          const int64_t count = left < kLanes ? left : kLanes;
          float* at = dst + y * s.out_w + x0;
#pragma GCC unroll 8
          for (int j = 0; j < kBlock; ++j) T::StoreN(at + j * plane_out, acc[j], count);
        }
      }
    }
  }
}

// Weight and bias gradients of kC adjacent output channels [oc, oc + kC) of
// one group: for each sample and kernel row, kC * K accumulators (a
// channel's gradient vector loaded once serves the row's K taps, an input
// row segment loaded once serves the kC channels), and in the first row's
// pass kC more for the bias, each lane summing its column's products (or
// gradients) over the sample's rows and vectors in order; the sample's sums
// are then added to `sums` [kC][K][K] and `bias_sums` [kC] (vectors, which
// stay in L1 with the sample's planes). The lanes past the last column read
// a gradient of zero (LoadN). The caller sums the lanes.
template <typename T, int K, int kC>
void OneChannelConvGradBlock(const OneChannelConvShape& s, const float* padded,
                             const float* grad_out, int64_t oc, typename T::V* sums,
                             typename T::V* bias_sums) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  // Locals: a store through `sums` (a vector type, which may alias anything)
  // would otherwise make the compiler read the shape again.
  const int64_t padded_w = s.padded_w, out_h = s.out_h, out_w = s.out_w;
  const int64_t plane_in = s.padded_h * padded_w;
  const int64_t plane_out = out_h * out_w;
  const int64_t channels = s.channels(), groups = s.groups, batch = s.batch;
  const int64_t g = oc / s.out_per_group;
  for (int64_t n = 0; n < batch; ++n) {
    const float* src = padded + (n * groups + g) * plane_in;
    const float* go = grad_out + (n * channels + oc) * plane_out;
    for (int ky = 0; ky < K; ++ky) {
      V acc[kC][K];
      V bias[kC];
#pragma GCC unroll 8
      for (int c = 0; c < kC; ++c) {
        bias[c] = T::Zero();
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx) acc[c][kx] = T::Zero();
      }
      for (int64_t y = 0; y < out_h; ++y) {
        const float* row = src + (y + ky) * padded_w;
        const float* gy = go + y * out_w;
        for (int64_t x0 = 0; x0 < out_w; x0 += kLanes) {
          const int64_t left = out_w - x0;
          const int64_t count = left < kLanes ? left : kLanes;
          V gv[kC];
#pragma GCC unroll 8
          for (int c = 0; c < kC; ++c) gv[c] = T::LoadN(gy + c * plane_out + x0, count);
          if (ky == 0) {
#pragma GCC unroll 8
            for (int c = 0; c < kC; ++c) bias[c] = T::Add(bias[c], gv[c]);
          }
#pragma GCC unroll 8
          for (int kx = 0; kx < K; ++kx) {
            const V in = T::LoadReg(row + x0 + kx);
#pragma GCC unroll 8
            for (int c = 0; c < kC; ++c) acc[c][kx] = T::Fma(gv[c], in, acc[c][kx]);
          }
        }
      }
#pragma GCC unroll 8
      for (int c = 0; c < kC; ++c) {
        if (ky == 0) bias_sums[c] = T::Add(bias_sums[c], bias[c]);
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx) {
          V& sum = sums[(c * K + ky) * K + kx];
          sum = T::Add(sum, acc[c][kx]);
        }
      }
    }
  }
}

// Weight (and bias) gradients of output channels [begin, end), in blocks of
// at most kMaxC channels of one group (kMaxC * (K + 2) + 1 vector registers:
// the ISA's file picks it).
template <typename T, int K, int kMaxC>
void OneChannelConvWeightGrad(const OneChannelConvShape& s, const float* padded,
                              const float* grad_out, float* grad_weight, float* grad_bias,
                              int64_t begin, int64_t end) {
  static_assert(kMaxC >= 1 && kMaxC <= 4, "blocks of 1 to 4 channels");
  using V = typename T::V;
  V sums[kMaxC * K * K];
  V bias_sums[kMaxC];
  for (int64_t oc = begin; oc < end;) {
    const int64_t group_end = (oc / s.out_per_group + 1) * s.out_per_group;
    const int64_t to = end < group_end ? end : group_end;
    // The group's rest in blocks of at most kMaxC, as even as they go (6
    // channels in 3 + 3 rather than 4 + 2).
    const int64_t rest = to - oc;
    const int64_t blocks = (rest + kMaxC - 1) / kMaxC;
    const int c = static_cast<int>((rest + blocks - 1) / blocks);
    for (int i = 0; i < c * K * K; ++i) sums[i] = T::Zero();
    for (int i = 0; i < c; ++i) bias_sums[i] = T::Zero();
    switch (c) {
      case 4:
        if constexpr (kMaxC >= 4) {
          OneChannelConvGradBlock<T, K, 4>(s, padded, grad_out, oc, sums, bias_sums);
        }
        break;
      case 3:
        if constexpr (kMaxC >= 3) {
          OneChannelConvGradBlock<T, K, 3>(s, padded, grad_out, oc, sums, bias_sums);
        }
        break;
      case 2:
        if constexpr (kMaxC >= 2) {
          OneChannelConvGradBlock<T, K, 2>(s, padded, grad_out, oc, sums, bias_sums);
        }
        break;
      default:
        OneChannelConvGradBlock<T, K, 1>(s, padded, grad_out, oc, sums, bias_sums);
    }
    for (int i = 0; i < c * K * K; ++i) grad_weight[oc * K * K + i] = T::Sum(sums[i]);
    if (grad_bias != nullptr) {
      for (int i = 0; i < c; ++i) grad_bias[oc + i] = T::Sum(bias_sums[i]);
    }
    oc += c;
  }
}

// Forward with the largest block of at most 8 channels that divides
// out_per_group.
template <typename T, int K>
void OneChannelConvForwardAnyBlock(const OneChannelConvShape& s, const float* padded,
                                   const float* weight, const float* bias, float* out,
                                   int64_t begin, int64_t end) {
  const int64_t co = s.out_per_group;
  if (co % 8 == 0) return OneChannelConvForward<T, K, 8>(s, padded, weight, bias, out, begin, end);
  if (co % 6 == 0) return OneChannelConvForward<T, K, 6>(s, padded, weight, bias, out, begin, end);
  if (co % 4 == 0) return OneChannelConvForward<T, K, 4>(s, padded, weight, bias, out, begin, end);
  if (co % 3 == 0) return OneChannelConvForward<T, K, 3>(s, padded, weight, bias, out, begin, end);
  if (co % 2 == 0) return OneChannelConvForward<T, K, 2>(s, padded, weight, bias, out, begin, end);
  OneChannelConvForward<T, K, 1>(s, padded, weight, bias, out, begin, end);
}

// The entry points of one ISA: kernel 3 or 5 (one_channel_conv.cc checks);
// the weight gradient takes blocks of at most kMaxC channels.
template <typename T>
void OneChannelConvForwardOf(const OneChannelConvShape& s, const float* padded, const float* weight,
                             const float* bias, float* out, int64_t begin, int64_t end) {
  if (s.kernel == 3)
    return OneChannelConvForwardAnyBlock<T, 3>(s, padded, weight, bias, out, begin, end);
  OneChannelConvForwardAnyBlock<T, 5>(s, padded, weight, bias, out, begin, end);
}

template <typename T, int kMaxC>
void OneChannelConvWeightGradOf(const OneChannelConvShape& s, const float* padded,
                                const float* grad_out, float* grad_weight, float* grad_bias,
                                int64_t begin, int64_t end) {
  if (s.kernel == 3) {
    return OneChannelConvWeightGrad<T, 3, kMaxC>(s, padded, grad_out, grad_weight, grad_bias, begin,
                                                 end);
  }
  OneChannelConvWeightGrad<T, 5, kMaxC>(s, padded, grad_out, grad_weight, grad_bias, begin, end);
}

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_ONE_CHANNEL_CONV_IMPL_H_
