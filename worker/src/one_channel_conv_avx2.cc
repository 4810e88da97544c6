// The one-input-channel convolution's kernels for AVX2 with FMA (compiled
// with -mavx2 -mfma, worker/CMakeLists.txt; called only where the CPU has
// both): 8 columns per vector, the weight gradient in blocks of 2 channels
// (2 x 5 accumulators, 2 of the bias, 2 gradients and an input row in 16
// vector registers).
#include <immintrin.h>

#include <cstdint>

#include "one_channel_conv_impl.h"

namespace ckpt::model::internal {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int64_t kLanes = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Set1(float f) { return _mm256_set1_ps(f); }
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  // Load, into a register the compiler may not fold back into each use as a
  // memory operand (which would load the row once per channel again).
  static V LoadReg(const float* p) {
    V v = Load(p);
    asm("" : "+v"(v));
    return v;
  }
  static __m256i Mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static V LoadN(const float* p, int64_t n) { return _mm256_maskload_ps(p, Mask(n)); }
  static void StoreN(float* p, V v, int64_t n) { _mm256_maskstore_ps(p, Mask(n), v); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static float Sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

}  // namespace

const OneChannelConvKernels& OneChannelConvAvx2() {
  static const OneChannelConvKernels k{Avx2::kLanes, &OneChannelConvForwardOf<Avx2>,
                                       &OneChannelConvWeightGradOf<Avx2, 2>};
  return k;
}

}  // namespace ckpt::model::internal
