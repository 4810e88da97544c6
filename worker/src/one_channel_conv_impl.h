// The kernels of one_channel_conv_kernels.h, written once over a vector type:
// included by one_channel_conv_avx512.cc and one_channel_conv_avx2.cc, each
// compiled with its own -m flags and instantiating these templates with its
// own traits type (so no instantiation is shared between the two files).
// Only templates here: an inline function compiled under -mavx512f in one file
// could be the copy the linker keeps for a CPU without it. The loops over
// accumulators are unrolled (GCC's -O2 kept them in memory otherwise, a load
// and a store around every FMA).
//
// Traits T: V (the vector type), kLanes, Zero(), Set1(f), Load(p) (kLanes
// floats), LoadN(p, n) (the first n, zeros after, reading nothing past p + n),
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

// Weight (and bias) gradients of output channels [begin, end): for kRows
// kernel rows at a time, kRows * K accumulators, each lane summing its
// column's products over the batch, rows and vectors in order, then the lanes
// summed. The lanes past the last column read a gradient of zero (LoadN).
template <typename T, int K, int kRows>
void OneChannelConvWeightGrad(const OneChannelConvShape& s, const float* padded,
                              const float* grad_out, float* grad_weight, float* grad_bias,
                              int64_t begin, int64_t end) {
  static_assert(K % kRows == 0, "kRows divides the kernel");
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  const int64_t plane_in = s.padded_h * s.padded_w;
  const int64_t plane_out = s.out_h * s.out_w;
  for (int64_t oc = begin; oc < end; ++oc) {
    const int64_t g = oc / s.out_per_group;
    V bias_acc = T::Zero();
    for (int ky0 = 0; ky0 < K; ky0 += kRows) {
      V acc[kRows][K];
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx) acc[r][kx] = T::Zero();
      }
      for (int64_t n = 0; n < s.batch; ++n) {
        const float* src = padded + (n * s.groups + g) * plane_in + ky0 * s.padded_w;
        const float* go = grad_out + (n * s.channels() + oc) * plane_out;
        for (int64_t y = 0; y < s.out_h; ++y) {
          for (int64_t x0 = 0; x0 < s.out_w; x0 += kLanes) {
            const int64_t left = s.out_w - x0;
            const V gv = T::LoadN(go + y * s.out_w + x0, left < kLanes ? left : kLanes);
            const float* row = src + y * s.padded_w + x0;
#pragma GCC unroll 8
            for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
              for (int kx = 0; kx < K; ++kx) {
                acc[r][kx] = T::Fma(gv, T::Load(row + r * s.padded_w + kx), acc[r][kx]);
              }
            }
            if (ky0 == 0) bias_acc = T::Add(bias_acc, gv);
          }
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx) {
          grad_weight[oc * K * K + static_cast<int64_t>(ky0 + r) * K + kx] = T::Sum(acc[r][kx]);
        }
      }
    }
    if (grad_bias != nullptr) grad_bias[oc] = T::Sum(bias_acc);
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
// the weight gradient takes kRowsOf5 kernel rows of a 5x5 kernel at a time
// (all 3 rows of a 3x3 one when that is 5, else one).
template <typename T>
void OneChannelConvForwardOf(const OneChannelConvShape& s, const float* padded, const float* weight,
                             const float* bias, float* out, int64_t begin, int64_t end) {
  if (s.kernel == 3)
    return OneChannelConvForwardAnyBlock<T, 3>(s, padded, weight, bias, out, begin, end);
  OneChannelConvForwardAnyBlock<T, 5>(s, padded, weight, bias, out, begin, end);
}

template <typename T, int kRowsOf5>
void OneChannelConvWeightGradOf(const OneChannelConvShape& s, const float* padded,
                                const float* grad_out, float* grad_weight, float* grad_bias,
                                int64_t begin, int64_t end) {
  if (s.kernel == 3) {
    return OneChannelConvWeightGrad<T, 3, (kRowsOf5 == 5 ? 3 : 1)>(s, padded, grad_out, grad_weight,
                                                                   grad_bias, begin, end);
  }
  OneChannelConvWeightGrad<T, 5, kRowsOf5>(s, padded, grad_out, grad_weight, grad_bias, begin, end);
}

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_ONE_CHANNEL_CONV_IMPL_H_
