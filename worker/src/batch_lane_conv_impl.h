// The kernels of batch_lane_conv_kernels.h, written once over a vector type
// (the traits of one_channel_conv_impl.h, plus Store(p, v) and
// Transpose(rows), kLanes vectors transposed in place): included by
// conv_kernels_avx512.cc and conv_kernels_avx2.cc, each compiled with its own
// -m flags. Only templates here (see one_channel_conv_impl.h). A tile keeps
// its accumulators in registers: the loops over them are unrolled.
#ifndef CKPT_WORKER_SRC_BATCH_LANE_CONV_IMPL_H_
#define CKPT_WORKER_SRC_BATCH_LANE_CONV_IMPL_H_

#include <cstdint>
#include <type_traits>

#include "batch_lane_conv_kernels.h"

namespace ckpt::model::internal {

// Output channels [oc, oc + kO) of one group at output row y, for every
// column and kN batch vectors at a time: the bias, then per input channel
// the K * K taps, each tap's kN input vectors loaded once for the kO
// channels (whose weights of the tap are adjacent in weight_by_in).
template <typename T, int K, int kO, int kN>
void BatchLaneConvForwardTile(const BatchLaneConvShape& s, const float* in, const float* wt,
                              const float* bias, float* out, int64_t oc, int64_t y) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  const int64_t lanes = s.batch_lanes, pw = s.padded_w, ph = s.padded_h;
  const int64_t ipg = s.in_per_group, opg = s.out_per_group;
  const int64_t g = oc / opg;
  const int64_t ocl = oc % opg;
  for (int64_t x = 0; x < s.out_w; ++x) {
    for (int64_t n0 = 0; n0 < lanes; n0 += kN * kLanes) {
      V acc[kO][kN];
#pragma GCC unroll 8
      for (int j = 0; j < kO; ++j) {
        const V b = bias != nullptr ? T::Set1(bias[oc + j]) : T::Zero();
#pragma GCC unroll 4
        for (int v = 0; v < kN; ++v) acc[j][v] = b;
      }
      for (int64_t ic = 0; ic < ipg; ++ic) {
        const float* src = in + (((g * ipg + ic) * ph + y) * pw + x) * lanes + n0;
        const float* w = wt + (g * ipg + ic) * K * K * opg + ocl;
        for (int ky = 0; ky < K; ++ky) {
#pragma GCC unroll 8
          for (int kx = 0; kx < K; ++kx) {
            V v_in[kN];
#pragma GCC unroll 4
            for (int v = 0; v < kN; ++v)
              v_in[v] = T::Load(src + (ky * pw + kx) * lanes + v * kLanes);
#pragma GCC unroll 8
            for (int j = 0; j < kO; ++j) {
              const V wv = T::Set1(w[(ky * K + kx) * opg + j]);
#pragma GCC unroll 4
              for (int v = 0; v < kN; ++v) acc[j][v] = T::Fma(wv, v_in[v], acc[j][v]);
            }
          }
        }
      }
#pragma GCC unroll 8
      for (int j = 0; j < kO; ++j) {
        float* dst = out + (((oc + j) * s.out_h + y) * s.out_w + x) * lanes + n0;
#pragma GCC unroll 4
        for (int v = 0; v < kN; ++v) T::Store(dst + v * kLanes, acc[j][v]);
      }
    }
  }
}

// Gradient of input channels [ic, ic + kI) of one group at input row iy (of
// the unpadded input), every column: per output channel the taps that reach
// an output (none outside it is computed), each tap's kN gradient vectors
// loaded once for the kI channels (adjacent in weight_by_out).
template <typename T, int K, int kI, int kN>
void BatchLaneConvDataGradTile(const BatchLaneConvShape& s, const float* grad_out, const float* w2,
                               float* grad_in, int64_t ic, int64_t iy) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  const int64_t lanes = s.batch_lanes, oh = s.out_h, ow = s.out_w;
  const int64_t ipg = s.in_per_group, opg = s.out_per_group;
  const int64_t g = ic / ipg;
  const int64_t icl = ic % ipg;
  // Input (padded) row py meets output row py - ky for ky in [ky_lo, ky_hi].
  const int64_t py = iy + s.padding;
  const int64_t ky_lo = py - (oh - 1) > 0 ? py - (oh - 1) : 0;
  const int64_t ky_hi = py < K - 1 ? py : K - 1;
  for (int64_t ix = 0; ix < s.width; ++ix) {
    const int64_t px = ix + s.padding;
    const int64_t kx_lo = px - (ow - 1) > 0 ? px - (ow - 1) : 0;
    const int64_t kx_hi = px < K - 1 ? px : K - 1;
    for (int64_t n0 = 0; n0 < lanes; n0 += kN * kLanes) {
      V acc[kI][kN];
#pragma GCC unroll 8
      for (int i = 0; i < kI; ++i) {
#pragma GCC unroll 4
        for (int v = 0; v < kN; ++v) acc[i][v] = T::Zero();
      }
      for (int64_t oc = 0; oc < opg; ++oc) {
        const float* go = grad_out + (g * opg + oc) * oh * ow * lanes + n0;
        const float* w = w2 + (g * opg + oc) * K * K * ipg + icl;
        for (int64_t ky = ky_lo; ky <= ky_hi; ++ky) {
          const float* grow = go + ((py - ky) * ow + px) * lanes;
          for (int64_t kx = kx_lo; kx <= kx_hi; ++kx) {
            V gv[kN];
#pragma GCC unroll 4
            for (int v = 0; v < kN; ++v) gv[v] = T::Load(grow - kx * lanes + v * kLanes);
#pragma GCC unroll 8
            for (int i = 0; i < kI; ++i) {
              const V wv = T::Set1(w[(ky * K + kx) * ipg + i]);
#pragma GCC unroll 4
              for (int v = 0; v < kN; ++v) acc[i][v] = T::Fma(wv, gv[v], acc[i][v]);
            }
          }
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < kI; ++i) {
        float* dst = grad_in + (((ic + i) * s.height + iy) * s.width + ix) * lanes + n0;
#pragma GCC unroll 4
        for (int v = 0; v < kN; ++v) T::Store(dst + v * kLanes, acc[i][v]);
      }
    }
  }
}

// Weight gradients of output channels [oc, oc + kO) of one group, input
// channel icl of the group, kernel row ky: kO * K accumulators summed over
// every output pixel and batch vector (each gradient vector loaded once
// serves the row's K taps, each input vector the kO channels), then their
// lanes. With grad_bias (for icl 0 and ky 0), the channels' bias gradients
// in the same pass.
template <typename T, int K, int kO>
void BatchLaneConvWeightGradTile(const BatchLaneConvShape& s, const float* in,
                                 const float* grad_out, float* grad_weight, float* grad_bias,
                                 int64_t oc, int64_t icl, int64_t ky) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  // Locals: a vector store may alias anything, the shape included.
  const int64_t lanes = s.batch_lanes, pw = s.padded_w, ph = s.padded_h;
  const int64_t oh = s.out_h, ow = s.out_w, ipg = s.in_per_group;
  const int64_t g = oc / s.out_per_group;
  V acc[kO][K];
  V bias[kO];
#pragma GCC unroll 8
  for (int j = 0; j < kO; ++j) {
    bias[j] = T::Zero();
#pragma GCC unroll 8
    for (int kx = 0; kx < K; ++kx) acc[j][kx] = T::Zero();
  }
  const float* plane = in + (g * ipg + icl) * ph * pw * lanes;
  const int64_t plane_out = oh * ow * lanes;
  for (int64_t y = 0; y < oh; ++y) {
    const float* row = plane + (y + ky) * pw * lanes;
    const float* go = grad_out + (oc * oh + y) * ow * lanes;
    for (int64_t x = 0; x < ow; ++x) {
      for (int64_t n0 = 0; n0 < lanes; n0 += kLanes) {
        V gv[kO];
#pragma GCC unroll 8
        for (int j = 0; j < kO; ++j) gv[j] = T::Load(go + j * plane_out + x * lanes + n0);
        if (grad_bias != nullptr) {
#pragma GCC unroll 8
          for (int j = 0; j < kO; ++j) bias[j] = T::Add(bias[j], gv[j]);
        }
#pragma GCC unroll 8
        for (int kx = 0; kx < K; ++kx) {
          const V v_in = T::LoadReg(row + (x + kx) * lanes + n0);
#pragma GCC unroll 8
          for (int j = 0; j < kO; ++j) acc[j][kx] = T::Fma(gv[j], v_in, acc[j][kx]);
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < kO; ++j) {
#pragma GCC unroll 8
    for (int kx = 0; kx < K; ++kx) {
      grad_weight[(((oc + j) * ipg + icl) * K + ky) * K + kx] = T::Sum(acc[j][kx]);
    }
    if (grad_bias != nullptr) grad_bias[oc + j] = T::Sum(bias[j]);
  }
}

// BatchLaneConvKernels::to_lanes: a block of kLanes samples' rows of kLanes
// positions loaded (LoadN: none past the row), transposed, stored as the
// positions' vectors.
template <typename T>
void BatchLaneConvToLanes(const float* src, int64_t sample_stride, int64_t samples,
                          int64_t positions, float* dst, int64_t lanes) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  V rows[kLanes];
  for (int64_t n0 = 0; n0 < lanes; n0 += kLanes) {
    for (int64_t p0 = 0; p0 < positions; p0 += kLanes) {
      const int64_t count = positions - p0 < kLanes ? positions - p0 : kLanes;
#pragma GCC unroll 16
      for (int64_t r = 0; r < kLanes; ++r) {
        rows[r] =
            n0 + r < samples ? T::LoadN(src + (n0 + r) * sample_stride + p0, count) : T::Zero();
      }
      T::Transpose(rows);
      for (int64_t j = 0; j < count; ++j) T::Store(dst + (p0 + j) * lanes + n0, rows[j]);
    }
  }
}

// BatchLaneConvKernels::from_lanes: the inverse, for the first `samples`.
template <typename T>
void BatchLaneConvFromLanes(const float* src, int64_t lanes, int64_t samples, int64_t positions,
                            float* dst, int64_t sample_stride) {
  using V = typename T::V;
  constexpr int64_t kLanes = T::kLanes;
  V rows[kLanes];
  for (int64_t p0 = 0; p0 < positions; p0 += kLanes) {
    const int64_t count = positions - p0 < kLanes ? positions - p0 : kLanes;
    for (int64_t n0 = 0; n0 < samples; n0 += kLanes) {
#pragma GCC unroll 16
      for (int64_t j = 0; j < kLanes; ++j) {
        rows[j] = j < count ? T::Load(src + (p0 + j) * lanes + n0) : T::Zero();
      }
      T::Transpose(rows);
      const int64_t rows_left = samples - n0 < kLanes ? samples - n0 : kLanes;
      for (int64_t r = 0; r < rows_left; ++r) {
        T::StoreN(dst + (n0 + r) * sample_stride + p0, rows[r], count);
      }
    }
  }
}

// Calls f(kernel, block) with each as a std::integral_constant: kernel 3 or
// 5, a block of 6, 4, 3, 2 or 1 (channels or vectors).
template <typename F>
void WithTile(int64_t kernel, int64_t block, F&& f) {
  auto with_kernel = [&](auto k) {
    switch (block) {
      case 6:
        return f(k, std::integral_constant<int, 6>{});
      case 4:
        return f(k, std::integral_constant<int, 4>{});
      case 3:
        return f(k, std::integral_constant<int, 3>{});
      case 2:
        return f(k, std::integral_constant<int, 2>{});
      default:
        return f(k, std::integral_constant<int, 1>{});
    }
  };
  if (kernel == 3) return with_kernel(std::integral_constant<int, 3>{});
  with_kernel(std::integral_constant<int, 5>{});
}

// The entry points of one ISA: the tiles the shape names.
template <typename T>
void BatchLaneConvForwardOf(const BatchLaneConvShape& s, const float* in, const float* wt,
                            const float* bias, float* out, int64_t begin, int64_t end) {
  WithTile(s.kernel, s.out_block, [&](auto k, auto o) {
    constexpr int K = decltype(k)::value, kO = decltype(o)::value;
    WithTile(K, s.vectors_block, [&](auto, auto v) {
      constexpr int kN = decltype(v)::value;
      if constexpr (kN == 4 || kN == 2 || kN == 1) {
        for (int64_t item = begin; item < end; ++item) {
          BatchLaneConvForwardTile<T, K, kO, kN>(s, in, wt, bias, out, item / s.out_h * kO,
                                                 item % s.out_h);
        }
      }
    });
  });
}

template <typename T>
void BatchLaneConvDataGradOf(const BatchLaneConvShape& s, const float* grad_out, const float* w2,
                             float* grad_in, int64_t begin, int64_t end) {
  WithTile(s.kernel, s.in_block, [&](auto k, auto i) {
    constexpr int K = decltype(k)::value, kI = decltype(i)::value;
    WithTile(K, s.vectors_block, [&](auto, auto v) {
      constexpr int kN = decltype(v)::value;
      if constexpr (kN == 4 || kN == 2 || kN == 1) {
        for (int64_t item = begin; item < end; ++item) {
          BatchLaneConvDataGradTile<T, K, kI, kN>(s, grad_out, w2, grad_in, item / s.height * kI,
                                                  item % s.height);
        }
      }
    });
  });
}

template <typename T>
void BatchLaneConvWeightGradOf(const BatchLaneConvShape& s, const float* in, const float* grad_out,
                               float* grad_weight, float* grad_bias, int64_t begin, int64_t end) {
  WithTile(s.kernel, s.grad_out_block, [&](auto k, auto o) {
    constexpr int K = decltype(k)::value, kO = decltype(o)::value;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t ky = item % K;
      const int64_t icl = item / K % s.in_per_group;
      const int64_t oc = item / K / s.in_per_group * kO;
      BatchLaneConvWeightGradTile<T, K, kO>(s, in, grad_out, grad_weight,
                                            icl == 0 && ky == 0 ? grad_bias : nullptr, oc, icl, ky);
    }
  });
}

}  // namespace ckpt::model::internal

#endif  // CKPT_WORKER_SRC_BATCH_LANE_CONV_IMPL_H_
