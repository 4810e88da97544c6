// The one-input-channel convolution's kernels for AVX-512F (compiled with
// -mavx512f -mfma, worker/CMakeLists.txt; called only where the CPU has
// AVX-512F): 16 columns per vector, the weight gradient in blocks of up to
// 4 channels (4 x 5 accumulators, 4 of the bias, 4 gradients and an input
// row in 32 vector registers).
#include <immintrin.h>

#include <cstdint>

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
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
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

}  // namespace ckpt::model::internal
