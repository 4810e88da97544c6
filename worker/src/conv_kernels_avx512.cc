// ckpt's convolution kernels for AVX-512F (compiled with -mavx512f -mfma,
// worker/CMakeLists.txt; called only where the CPU has AVX-512F), 16 floats
// per vector: the one-input-channel convolution's (16 columns; the weight
// gradient in blocks of up to 4 channels: 4 x 5 accumulators, 4 of the bias,
// 4 gradients and an input row in 32 vector registers) and the batch-lane
// convolution's (16 samples; tiles of up to 24 accumulators).
#include <immintrin.h>

#include <cstdint>

#include "batch_lane_conv_impl.h"
#include "one_channel_conv_impl.h"

namespace ckpt::model::internal {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int64_t kLanes = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Set1(float f) { return _mm512_set1_ps(f); }
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  // Load, into a register the compiler may not fold back into each use as a
  // memory operand (which would load the row once per channel again).
  static V LoadReg(const float* p) {
    V v = Load(p);
    asm("" : "+v"(v));
    return v;
  }
  static __mmask16 Mask(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }
  static V LoadN(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void StoreN(float* p, V v, int64_t n) { _mm512_mask_storeu_ps(p, Mask(n), v); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // rows[i] lane j <-> rows[j] lane i: pairs of floats, then of doubles, then
  // of 128-bit and 256-bit lanes interleaved. (The zero-masking forms with
  // every lane kept: GCC 12 warns of an uninitialised value in the plain
  // ones under -Werror.)
  __attribute__((always_inline)) static void Transpose(V* rows) {
    constexpr __mmask16 kAll = 0xffff;
    constexpr __mmask8 kAll8 = 0xff;
    V t[kLanes];
#pragma GCC unroll 16
    for (int64_t i = 0; i < 8; ++i) {
      t[2 * i] = _mm512_maskz_unpacklo_ps(kAll, rows[2 * i], rows[2 * i + 1]);
      t[2 * i + 1] = _mm512_maskz_unpackhi_ps(kAll, rows[2 * i], rows[2 * i + 1]);
    }
    auto pd = [](V v) { return _mm512_castps_pd(v); };
#pragma GCC unroll 16
    for (int64_t i = 0; i < 4; ++i) {
      rows[4 * i] =
          _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, pd(t[4 * i]), pd(t[4 * i + 2])));
      rows[4 * i + 1] =
          _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, pd(t[4 * i]), pd(t[4 * i + 2])));
      rows[4 * i + 2] =
          _mm512_castpd_ps(_mm512_maskz_unpacklo_pd(kAll8, pd(t[4 * i + 1]), pd(t[4 * i + 3])));
      rows[4 * i + 3] =
          _mm512_castpd_ps(_mm512_maskz_unpackhi_pd(kAll8, pd(t[4 * i + 1]), pd(t[4 * i + 3])));
    }
#pragma GCC unroll 16
    for (int64_t i = 0; i < 2; ++i) {
#pragma GCC unroll 16
      for (int64_t j = 0; j < 4; ++j) {
        t[8 * i + j] = _mm512_maskz_shuffle_f32x4(kAll, rows[8 * i + j], rows[8 * i + 4 + j], 0x88);
        t[8 * i + 4 + j] =
            _mm512_maskz_shuffle_f32x4(kAll, rows[8 * i + j], rows[8 * i + 4 + j], 0xdd);
      }
    }
#pragma GCC unroll 16
    for (int64_t j = 0; j < 8; ++j) {
      rows[j] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0x88);
      rows[8 + j] = _mm512_maskz_shuffle_f32x4(kAll, t[j], t[8 + j], 0xdd);
    }
  }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  // Halves added pairwise (GCC 12's _mm512_reduce_add_ps warns of an
  // uninitialised value under -Werror); called once per gradient value.
  static float Sum(V v) {
    alignas(64) float lane[kLanes];
    _mm512_store_ps(lane, v);
    for (int64_t width = kLanes / 2; width > 0; width /= 2) {
      for (int64_t i = 0; i < width; ++i) lane[i] += lane[i + width];
    }
    return lane[0];
  }
};

}  // namespace

const OneChannelConvKernels& OneChannelConvAvx512() {
  static const OneChannelConvKernels k{Avx512::kLanes, &OneChannelConvForwardOf<Avx512>,
                                       &OneChannelConvWeightGradOf<Avx512, 4>};
  return k;
}

const BatchLaneConvKernels& BatchLaneConvAvx512() {
  static const BatchLaneConvKernels k{Avx512::kLanes,
                                      32,
                                      &BatchLaneConvForwardOf<Avx512>,
                                      &BatchLaneConvDataGradOf<Avx512>,
                                      &BatchLaneConvWeightGradOf<Avx512>,
                                      &BatchLaneConvToLanes<Avx512>,
                                      &BatchLaneConvFromLanes<Avx512>};
  return k;
}

}  // namespace ckpt::model::internal
