// Max pooling of float CPU tensors in training and evaluation
// (FastMaxPool2d, model_internal.h): LibTorch's at::max_pool2d values and
// gradients bit for bit, without its per-comparison branches. 2x2 windows of
// stride 2 (LeNet-5's) have branch-free SSE2 paths, and AVX-512 ones picked at
// run time; other windows a scalar scan and a scatter of the gradient.
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <limits>

#include "ckpt/base/cpu_features.h"
#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

// One step of at::max_pool2d's window scan: `v` replaces the running maximum
// when larger or NaN.
inline void Take(float v, int32_t offset, float* maxval, int32_t* maxoffset) {
  if (v > *maxval || v != v) {
    *maxval = v;
    *maxoffset = offset;
  }
}

// With relu_first: a maximum that relu clamps (<= 0) gives 0 and offset -1
// (relu's gradient there is 0). The one difference from relu then pool is
// the sign of a zero (a window whose maximum is -0.0 gives +0.0).
inline void ClampWindow(float* maxval, int32_t* maxoffset) {
  if (!(*maxval > 0) && *maxval == *maxval) {
    *maxval = 0;
    *maxoffset = -1;
  }
}

// Pools one [H, W] plane into [oh, ow] (and, when `offsets` is not null, the
// plane offset each maximum came from) with at::max_pool2d's scan: row by row
// from the window's first value (which equals starting from -inf).
template <bool kReluFirst>
void PoolPlane(const float* plane, int64_t width, int64_t oh, int64_t ow, int64_t kernel,
               int64_t stride, float* out, int32_t* offsets) {
  for (int64_t i = 0; i < oh; ++i) {
    for (int64_t j = 0; j < ow; ++j) {
      const int32_t base = static_cast<int32_t>(i * stride * width + j * stride);
      float m = plane[base];
      int32_t at = base;
      for (int64_t h = 0; h < kernel; ++h) {
        for (int64_t w = h == 0 ? 1 : 0; w < kernel; ++w) {
          const int32_t offset = base + static_cast<int32_t>(h * width + w);
          Take(plane[offset], offset, &m, &at);
        }
      }
      if (kReluFirst) ClampWindow(&m, &at);
      out[i * ow + j] = m;
      if (offsets != nullptr) offsets[i * ow + j] = at;
    }
  }
}

// PoolPlane for 2x2 windows with stride 2 (LeNet-5's), four windows at a
// time with SSE2 (x86-64's baseline) and no branches: on activations each
// comparison is a coin toss, and a mispredicted branch per value made a
// branchy scan (like LibTorch's own) ~10x slower than this.
template <bool kReluFirst>
void PoolPlane2x2(const float* plane, int64_t width, int64_t oh, int64_t ow, float* out,
                  int32_t* offsets) {
  for (int64_t i = 0; i < oh; ++i) {
    const float* r0 = plane + 2 * i * width;
    const float* r1 = r0 + width;
    int64_t j = 0;
#if defined(__SSE2__)
    const __m128i lanes = _mm_setr_epi32(0, 2, 4, 6);
    // Loads stay in the row: j + 4 <= ow means 2j + 8 <= 2 * ow <= width. A
    // row whose width is not a multiple of 4 ends with the last four windows
    // again (recomputing a window writes the same values), not a scalar tail.
    for (; ow >= 4 && j < ow; j += 4) {
      if (j + 4 > ow) j = ow - 4;
      const __m128 x0 = _mm_loadu_ps(r0 + 2 * j), x1 = _mm_loadu_ps(r0 + 2 * j + 4);
      const __m128 y0 = _mm_loadu_ps(r1 + 2 * j), y1 = _mm_loadu_ps(r1 + 2 * j + 4);
      const __m128i base =
          _mm_add_epi32(_mm_set1_epi32(static_cast<int32_t>(2 * i * width + 2 * j)), lanes);
      __m128 m = _mm_shuffle_ps(x0, x1, _MM_SHUFFLE(2, 0, 2, 0));
      __m128i at = base;
      auto take = [&](__m128 v, int32_t delta) {
        const __m128 t = _mm_or_ps(_mm_cmpgt_ps(v, m), _mm_cmpunord_ps(v, v));
        m = _mm_or_ps(_mm_and_ps(t, v), _mm_andnot_ps(t, m));
        const __m128i ti = _mm_castps_si128(t);
        at = _mm_or_si128(_mm_and_si128(ti, _mm_add_epi32(base, _mm_set1_epi32(delta))),
                          _mm_andnot_si128(ti, at));
      };
      take(_mm_shuffle_ps(x0, x1, _MM_SHUFFLE(3, 1, 3, 1)), 1);
      take(_mm_shuffle_ps(y0, y1, _MM_SHUFFLE(2, 0, 2, 0)), static_cast<int32_t>(width));
      take(_mm_shuffle_ps(y0, y1, _MM_SHUFFLE(3, 1, 3, 1)), static_cast<int32_t>(width + 1));
      if (kReluFirst) {
        const __m128 keep = _mm_or_ps(_mm_cmpgt_ps(m, _mm_setzero_ps()), _mm_cmpunord_ps(m, m));
        m = _mm_and_ps(keep, m);
        at = _mm_or_si128(at, _mm_andnot_si128(_mm_castps_si128(keep), _mm_set1_epi32(-1)));
      }
      _mm_storeu_ps(out + i * ow + j, m);
      if (offsets != nullptr) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(offsets + i * ow + j), at);
      }
    }
#endif
    for (; j < ow; ++j) {
      const int32_t base = static_cast<int32_t>(2 * i * width + 2 * j);
      float m = r0[2 * j];
      int32_t at = base;
      Take(r0[2 * j + 1], base + 1, &m, &at);
      Take(r1[2 * j], base + static_cast<int32_t>(width), &m, &at);
      Take(r1[2 * j + 1], base + static_cast<int32_t>(width) + 1, &m, &at);
      if (kReluFirst) ClampWindow(&m, &at);
      out[i * ow + j] = m;
      if (offsets != nullptr) offsets[i * ow + j] = at;
    }
  }
}

// The gradient of a plane that 2x2 windows of stride 2 tile exactly (height
// 2 * oh, width 2 * ow): each input value gets its window's gradient where the
// window's maximum came from it (`offsets`, as PoolPlane2x2 wrote them; -1
// where relu clamped the window) and 0 elsewhere, every value written once.
// `g + 0` is the scatter's `0 + g` to the bit (a -0.0 gradient lands as +0.0).
void UnpoolPlane2x2(const float* g, const int32_t* offsets, int64_t width, int64_t oh, int64_t ow,
                    float* grad_in) {
  for (int64_t i = 0; i < oh; ++i) {
    float* r0 = grad_in + 2 * i * width;
    float* r1 = r0 + width;
    int64_t j = 0;
#if defined(__SSE2__)
    const __m128i lanes = _mm_setr_epi32(0, 2, 4, 6);
    // As in PoolPlane2x2: a row whose width is not a multiple of 4 ends with
    // its last four windows again (the same values written twice).
    for (; ow >= 4 && j < ow; j += 4) {
      if (j + 4 > ow) j = ow - 4;
      const __m128 v = _mm_add_ps(_mm_loadu_ps(g + i * ow + j), _mm_setzero_ps());
      const __m128i at = _mm_loadu_si128(reinterpret_cast<const __m128i*>(offsets + i * ow + j));
      const __m128i base =
          _mm_add_epi32(_mm_set1_epi32(static_cast<int32_t>(2 * i * width + 2 * j)), lanes);
      auto from = [&](int32_t delta) {
        const __m128i hit = _mm_cmpeq_epi32(at, _mm_add_epi32(base, _mm_set1_epi32(delta)));
        return _mm_and_ps(_mm_castsi128_ps(hit), v);
      };
      const __m128 top_left = from(0), top_right = from(1);
      const __m128 bottom_left = from(static_cast<int32_t>(width));
      const __m128 bottom_right = from(static_cast<int32_t>(width) + 1);
      _mm_storeu_ps(r0 + 2 * j, _mm_unpacklo_ps(top_left, top_right));
      _mm_storeu_ps(r0 + 2 * j + 4, _mm_unpackhi_ps(top_left, top_right));
      _mm_storeu_ps(r1 + 2 * j, _mm_unpacklo_ps(bottom_left, bottom_right));
      _mm_storeu_ps(r1 + 2 * j + 4, _mm_unpackhi_ps(bottom_left, bottom_right));
    }
#endif
    for (; j < ow; ++j) {
      const int32_t base = static_cast<int32_t>(2 * i * width + 2 * j);
      const int32_t at = offsets[i * ow + j];
      const float v = g[i * ow + j] + 0.0f;
      r0[2 * j] = at == base ? v : 0.0f;
      r0[2 * j + 1] = at == base + 1 ? v : 0.0f;
      r1[2 * j] = at == base + static_cast<int32_t>(width) ? v : 0.0f;
      r1[2 * j + 1] = at == base + static_cast<int32_t>(width) + 1 ? v : 0.0f;
    }
  }
}

#if defined(__x86_64__)
// The 2x2 / stride 2 paths again, sixteen windows at a time, on CPUs with
// AVX-512 (chosen at run time: the build targets x86-64's baseline). Same
// scan, same results to the bit; a row's last windows are masked lanes.
#define CKPT_AVX512 __attribute__((target("avx512f")))

// Take over sixteen windows.
CKPT_AVX512 inline void Take16(__m512 v, __m512i offset, __m512* maxval, __m512i* maxoffset) {
  const __mmask16 t =
      _mm512_cmp_ps_mask(v, *maxval, _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  *maxval = _mm512_mask_mov_ps(*maxval, t, v);
  *maxoffset = _mm512_mask_mov_epi32(*maxoffset, t, offset);
}

// Lanes [0, n) set (none when n <= 0).
inline __mmask16 FirstLanes(int64_t n) {
  if (n <= 0) return 0;
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1);
}

template <bool kReluFirst>
CKPT_AVX512 void PoolPlane2x2Avx512(const float* plane, int64_t width, int64_t oh, int64_t ow,
                                    float* out, int32_t* offsets) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  const __m512i right = _mm512_set1_epi32(1);
  const __m512i below = _mm512_set1_epi32(static_cast<int32_t>(width));
  for (int64_t i = 0; i < oh; ++i) {
    const float* r0 = plane + 2 * i * width;
    const float* r1 = r0 + width;
    for (int64_t j = 0; j < ow; j += 16) {
      const int64_t n = std::min<int64_t>(16, ow - j);
      // A window's two values of a row; the loads stay in the row (2n values).
      const __mmask16 first = FirstLanes(2 * n), second = FirstLanes(2 * n - 16);
      const __m512 a0 = _mm512_maskz_loadu_ps(first, r0 + 2 * j);
      const __m512 a1 = _mm512_maskz_loadu_ps(second, r0 + 2 * j + 16);
      const __m512 b0 = _mm512_maskz_loadu_ps(first, r1 + 2 * j);
      const __m512 b1 = _mm512_maskz_loadu_ps(second, r1 + 2 * j + 16);
      const __m512i base =
          _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(2 * i * width + 2 * j)), even);
      __m512 m = _mm512_permutex2var_ps(a0, even, a1);
      __m512i at = base;
      Take16(_mm512_permutex2var_ps(a0, odd, a1), _mm512_add_epi32(base, right), &m, &at);
      const __m512i bottom = _mm512_add_epi32(base, below);
      Take16(_mm512_permutex2var_ps(b0, even, b1), bottom, &m, &at);
      Take16(_mm512_permutex2var_ps(b0, odd, b1), _mm512_add_epi32(bottom, right), &m, &at);
      if (kReluFirst) {
        const __mmask16 keep = _mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ) |
                               _mm512_cmp_ps_mask(m, m, _CMP_UNORD_Q);
        m = _mm512_maskz_mov_ps(keep, m);
        at = _mm512_mask_mov_epi32(_mm512_set1_epi32(-1), keep, at);
      }
      const __mmask16 lanes = FirstLanes(n);
      _mm512_mask_storeu_ps(out + i * ow + j, lanes, m);
      if (offsets != nullptr) _mm512_mask_storeu_epi32(offsets + i * ow + j, lanes, at);
    }
  }
}

CKPT_AVX512 void UnpoolPlane2x2Avx512(const float* g, const int32_t* offsets, int64_t width,
                                      int64_t oh, int64_t ow, float* grad_in) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  // Interleaving a window's left and right values into a row.
  const __m512i low = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i high = _mm512_add_epi32(low, _mm512_set1_epi32(8));
  const __m512i right = _mm512_set1_epi32(1);
  const __m512i below = _mm512_set1_epi32(static_cast<int32_t>(width));
  for (int64_t i = 0; i < oh; ++i) {
    float* r0 = grad_in + 2 * i * width;
    float* r1 = r0 + width;
    for (int64_t j = 0; j < ow; j += 16) {
      const int64_t n = std::min<int64_t>(16, ow - j);
      const __mmask16 lanes = FirstLanes(n);
      const __m512 v =
          _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, g + i * ow + j), _mm512_setzero_ps());
      const __m512i at = _mm512_maskz_loadu_epi32(lanes, offsets + i * ow + j);
      const __m512i base =
          _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(2 * i * width + 2 * j)), even);
      const __m512i bottom = _mm512_add_epi32(base, below);
      const __m512 top_left = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, base), v);
      const __m512 top_right =
          _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(base, right)), v);
      const __m512 bottom_left = _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, bottom), v);
      const __m512 bottom_right =
          _mm512_maskz_mov_ps(_mm512_cmpeq_epi32_mask(at, _mm512_add_epi32(bottom, right)), v);
      const __mmask16 first = FirstLanes(2 * n), second = FirstLanes(2 * n - 16);
      _mm512_mask_storeu_ps(r0 + 2 * j, first, _mm512_permutex2var_ps(top_left, low, top_right));
      _mm512_mask_storeu_ps(r0 + 2 * j + 16, second,
                            _mm512_permutex2var_ps(top_left, high, top_right));
      _mm512_mask_storeu_ps(r1 + 2 * j, first,
                            _mm512_permutex2var_ps(bottom_left, low, bottom_right));
      _mm512_mask_storeu_ps(r1 + 2 * j + 16, second,
                            _mm512_permutex2var_ps(bottom_left, high, bottom_right));
    }
  }
}
#undef CKPT_AVX512

// Read once, on the first pool (not in a static initializer, which could run
// before libgcc has read the CPU's features).
bool UseAvx512() { return base::CpuFeaturesOfThisHost().avx512f; }
#else
constexpr bool UseAvx512() { return false; }
#endif

// Fills `out` [N, C, OH, OW] and, when `offsets` is defined, the window's
// plane offset per output value.
template <bool kReluFirst>
void PoolForward(const at::Tensor& x, int64_t kernel, int64_t stride, at::Tensor& out,
                 at::Tensor& offsets) {
  const int64_t planes = x.size(0) * x.size(1), height = x.size(2), width = x.size(3);
  const int64_t oh = out.size(2), ow = out.size(3);
  const float* in = x.data_ptr<float>();
  float* o = out.data_ptr<float>();
  int32_t* off = offsets.defined() ? offsets.data_ptr<int32_t>() : nullptr;
  const bool two = kernel == 2 && stride == 2;
  const bool avx512 = two && UseAvx512();
  at::parallel_for(0, planes, 16, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* plane = in + p * height * width;
      float* plane_out = o + p * oh * ow;
      int32_t* plane_off = off != nullptr ? off + p * oh * ow : nullptr;
      if (avx512) {
#if defined(__x86_64__)
        PoolPlane2x2Avx512<kReluFirst>(plane, width, oh, ow, plane_out, plane_off);
#endif
      } else if (two) {
        PoolPlane2x2<kReluFirst>(plane, width, oh, ow, plane_out, plane_off);
      } else {
        PoolPlane<kReluFirst>(plane, width, oh, ow, kernel, stride, plane_out, plane_off);
      }
    }
  });
}

class MaxPool2dFunction : public torch::autograd::Function<MaxPool2dFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            int64_t kernel, int64_t stride, bool relu_first) {
    at::Tensor out = at::empty({x.size(0), x.size(1), (x.size(2) - kernel) / stride + 1,
                                (x.size(3) - kernel) / stride + 1},
                               x.options());
    at::Tensor offsets = at::empty(out.sizes(), x.options().dtype(at::kInt));
    if (relu_first) {
      PoolForward<true>(x, kernel, stride, out, offsets);
    } else {
      PoolForward<false>(x, kernel, stride, out, offsets);
    }
    ctx->save_for_backward({offsets});
    ctx->saved_data["height"] = x.size(2);
    ctx->saved_data["width"] = x.size(3);
    ctx->saved_data["tiles_2x2"] =
        kernel == 2 && stride == 2 && x.size(2) == 2 * out.size(2) && x.size(3) == 2 * out.size(3);
    return out;
  }

  // at::max_pool2d_with_indices_backward's rule: each output's gradient is
  // added at the offset its maximum came from (windows may overlap) to a
  // zeroed plane. Where 2x2 windows of stride 2 tile the plane (LeNet-5's),
  // each value is in exactly one window and the plane is written once instead.
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor offsets = ctx->get_saved_variables()[0];
    const at::Tensor grad = grads[0].contiguous();
    const int64_t height = ctx->saved_data["height"].toInt();
    const int64_t width = ctx->saved_data["width"].toInt();
    const int64_t planes = offsets.size(0) * offsets.size(1);
    const int64_t per_out = offsets.size(2) * offsets.size(3);
    const int32_t* off = offsets.data_ptr<int32_t>();
    const float* g = grad.data_ptr<float>();
    if (ctx->saved_data["tiles_2x2"].toBool()) {
      at::Tensor gin = at::empty({offsets.size(0), offsets.size(1), height, width}, grad.options());
      float* gi = gin.data_ptr<float>();
      const int64_t oh = offsets.size(2), ow = offsets.size(3);
      const bool avx512 = UseAvx512();
      at::parallel_for(0, planes, 16, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p) {
          if (avx512) {
#if defined(__x86_64__)
            UnpoolPlane2x2Avx512(g + p * per_out, off + p * per_out, width, oh, ow,
                                 gi + p * height * width);
#endif
          } else {
            UnpoolPlane2x2(g + p * per_out, off + p * per_out, width, oh, ow,
                           gi + p * height * width);
          }
        }
      });
      return {gin, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    at::Tensor gin = at::zeros({offsets.size(0), offsets.size(1), height, width}, grad.options());
    float* gi = gin.data_ptr<float>();
    at::parallel_for(0, planes, 16, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        float* plane = gi + p * height * width;
        for (int64_t k = p * per_out; k < (p + 1) * per_out; ++k) {
          if (off[k] >= 0) plane[off[k]] += g[k];
        }
      }
    });
    return {gin, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool FastMaxPool2dApplies(const at::Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return padding == 0 && kernel >= 1 && stride >= 1 && x.device().is_cpu() && x.dim() == 4 &&
         x.scalar_type() == at::kFloat && x.is_contiguous() && x.size(2) >= kernel &&
         x.size(3) >= kernel && x.size(2) * x.size(3) <= std::numeric_limits<int32_t>::max();
}

at::Tensor FastMaxPool2d(const at::Tensor& x, int64_t kernel, int64_t stride, bool relu_first) {
  if (at::GradMode::is_enabled() && x.requires_grad()) {
    return MaxPool2dFunction::apply(x, kernel, stride, relu_first);
  }
  at::Tensor out = at::empty(
      {x.size(0), x.size(1), (x.size(2) - kernel) / stride + 1, (x.size(3) - kernel) / stride + 1},
      x.options());
  at::Tensor no_offsets;
  if (relu_first) {
    PoolForward<true>(x, kernel, stride, out, no_offsets);
  } else {
    PoolForward<false>(x, kernel, stride, out, no_offsets);
  }
  return out;
}

}  // namespace ckpt::model::internal
