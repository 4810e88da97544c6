// The batch-lane convolution's kernels (worker/src/batch_lane_conv_kernels.h),
// each ISA this CPU has, against the same convolution and gradients summed in
// double precision: every value within float32 rounding of a sum of its size
// (|error| <= 1e-5 * the sum of the absolute products), over shapes that
// exercise the channel and vector blocks, a batch that is not a whole number
// of vectors, groups, padding and the image's edges; and the same bits however
// the work items are split among threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "batch_lane_conv_kernels.h"

namespace ckpt::model::internal {
namespace {

struct Case {
  int64_t batch, groups, in_per_group, out_per_group, height, width, kernel, padding;
  bool bias;
};

std::string Name(const Case& c) {
  return "batch " + std::to_string(c.batch) + " groups " + std::to_string(c.groups) + " in " +
         std::to_string(c.in_per_group) + " out " + std::to_string(c.out_per_group) + " " +
         std::to_string(c.height) + "x" + std::to_string(c.width) + " kernel " +
         std::to_string(c.kernel) + " padding " + std::to_string(c.padding) +
         (c.bias ? " bias" : "");
}

struct Isa {
  const char* name;
  const BatchLaneConvKernels* kernels;
};

std::vector<Isa> Available() {
  std::vector<Isa> out;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) out.push_back({"avx512", &BatchLaneConvAvx512()});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out.push_back({"avx2", &BatchLaneConvAvx2()});
  }
#endif
  return out;
}

// A problem in plain NCHW (the reference's) and in the kernels' batch-lane
// layouts, as batch_lane_conv.cc makes them: zeros around the input and in
// the lanes past the batch.
class Problem {
 public:
  Problem(const Case& c, const BatchLaneConvKernels& k)
      : c_(c),
        s_(BatchLaneConvShapeOf(c.batch, c.groups, c.in_per_group, c.out_per_group, c.height,
                                c.width, c.kernel, c.padding, k.lanes, k.registers)) {
    std::mt19937 gen(static_cast<uint32_t>(c.batch * 131 + c.width * 7 + c.kernel));
    std::uniform_real_distribution<float> u(-1, 1);
    const int64_t K = c.kernel, lanes = s_.batch_lanes;
    x_.resize(c.batch * s_.in_channels() * c.height * c.width);
    for (float& v : x_) v = u(gen);
    w_.resize(s_.out_channels() * c.in_per_group * K * K);
    for (float& v : w_) v = u(gen);
    if (c.bias) {
      b_.resize(s_.out_channels());
      for (float& v : b_) v = u(gen);
    }
    g_.resize(c.batch * s_.out_channels() * s_.out_h * s_.out_w);
    for (float& v : g_) v = u(gen);
    in_.assign(s_.in_channels() * s_.padded_h * s_.padded_w * lanes, 0.0f);
    for (int64_t n = 0; n < c.batch; ++n) {
      for (int64_t ch = 0; ch < s_.in_channels(); ++ch) {
        for (int64_t y = 0; y < c.height; ++y) {
          for (int64_t x = 0; x < c.width; ++x) {
            in_[((ch * s_.padded_h + y + c.padding) * s_.padded_w + x + c.padding) * lanes + n] =
                X(n, ch, y, x);
          }
        }
      }
    }
    grad_out_.assign(s_.out_channels() * s_.out_h * s_.out_w * lanes, 0.0f);
    for (int64_t n = 0; n < c.batch; ++n) {
      for (int64_t oc = 0; oc < s_.out_channels(); ++oc) {
        for (int64_t p = 0; p < s_.out_h * s_.out_w; ++p) {
          grad_out_[(oc * s_.out_h * s_.out_w + p) * lanes + n] = G(n, oc, p);
        }
      }
    }
    // weight [groups * out, in, K, K] as [groups, in, K * K, out] and
    // [groups, out, K * K, in].
    const int64_t ipg = c.in_per_group, opg = c.out_per_group;
    by_in_.resize(w_.size());
    by_out_.resize(w_.size());
    for (int64_t oc = 0; oc < s_.out_channels(); ++oc) {
      const int64_t g = oc / opg, o = oc % opg;
      for (int64_t i = 0; i < ipg; ++i) {
        for (int64_t t = 0; t < K * K; ++t) {
          const float v = w_[(oc * ipg + i) * K * K + t];
          by_in_[((g * ipg + i) * K * K + t) * opg + o] = v;
          by_out_[((g * opg + o) * K * K + t) * ipg + i] = v;
        }
      }
    }
  }

  float X(int64_t n, int64_t ch, int64_t y, int64_t x) const {
    return x_[((n * s_.in_channels() + ch) * c_.height + y) * c_.width + x];
  }
  float G(int64_t n, int64_t oc, int64_t p) const {
    return g_[(n * s_.out_channels() + oc) * s_.out_h * s_.out_w + p];
  }
  // The input at (sample, channel, row, column) of the zero-padded image.
  double In(int64_t n, int64_t ch, int64_t y, int64_t x) const {
    y -= c_.padding;
    x -= c_.padding;
    if (y < 0 || x < 0 || y >= c_.height || x >= c_.width) return 0;
    return X(n, ch, y, x);
  }
  double W(int64_t oc, int64_t i, int64_t ky, int64_t kx) const {
    return w_[((oc * c_.in_per_group + i) * c_.kernel + ky) * c_.kernel + kx];
  }

  std::vector<float> Forward(const BatchLaneConvKernels& k, int64_t chunk) const {
    std::vector<float> out(s_.out_channels() * s_.out_h * s_.out_w * s_.batch_lanes, NAN);
    for (int64_t i = 0; i < s_.forward_items(); i += chunk) {
      k.forward(s_, in_.data(), by_in_.data(), c_.bias ? b_.data() : nullptr, out.data(), i,
                std::min(i + chunk, s_.forward_items()));
    }
    return out;
  }
  std::vector<float> DataGrad(const BatchLaneConvKernels& k, int64_t chunk) const {
    std::vector<float> grad_in(s_.in_channels() * c_.height * c_.width * s_.batch_lanes, NAN);
    for (int64_t i = 0; i < s_.data_grad_items(); i += chunk) {
      k.data_grad(s_, grad_out_.data(), by_out_.data(), grad_in.data(), i,
                  std::min(i + chunk, s_.data_grad_items()));
    }
    return grad_in;
  }
  // The weight gradient, then the bias's.
  std::vector<float> WeightGrad(const BatchLaneConvKernels& k, int64_t chunk) const {
    std::vector<float> gw(w_.size() + s_.out_channels(), NAN);
    for (int64_t i = 0; i < s_.weight_grad_items(); i += chunk) {
      k.weight_grad(s_, in_.data(), grad_out_.data(), gw.data(),
                    c_.bias ? gw.data() + w_.size() : nullptr, i,
                    std::min(i + chunk, s_.weight_grad_items()));
    }
    return gw;
  }

  void Check(const BatchLaneConvKernels& k) const {
    const int64_t K = c_.kernel, ipg = c_.in_per_group, opg = c_.out_per_group;
    const int64_t lanes = s_.batch_lanes, oh = s_.out_h, ow = s_.out_w;
    int bad = 0;
    auto expect_near = [&](float got, double sum, double mag, const std::string& what) {
      if (!(std::fabs(got - sum) <= 1e-5 * mag) && ++bad <= 5) {
        ADD_FAILURE() << Name(c_) << ": " << what << " " << got << ", expected " << sum;
      }
    };
    const std::vector<float> out = Forward(k, s_.forward_items());
    for (int64_t n = 0; n < c_.batch; ++n) {
      for (int64_t oc = 0; oc < s_.out_channels(); ++oc) {
        const int64_t g = oc / opg;
        for (int64_t y = 0; y < oh; ++y) {
          for (int64_t x = 0; x < ow; ++x) {
            double sum = c_.bias ? b_[oc] : 0.0;
            double mag = std::fabs(sum);
            for (int64_t i = 0; i < ipg; ++i) {
              for (int64_t ky = 0; ky < K; ++ky) {
                for (int64_t kx = 0; kx < K; ++kx) {
                  const double t = W(oc, i, ky, kx) * In(n, g * ipg + i, y + ky, x + kx);
                  sum += t;
                  mag += std::fabs(t);
                }
              }
            }
            expect_near(out[((oc * oh + y) * ow + x) * lanes + n], sum, mag,
                        "output n " + std::to_string(n) + " channel " + std::to_string(oc) + " (" +
                            std::to_string(y) + ", " + std::to_string(x) + ")");
          }
        }
      }
    }
    const std::vector<float> grad_in = DataGrad(k, s_.data_grad_items());
    for (int64_t n = 0; n < c_.batch; ++n) {
      for (int64_t ch = 0; ch < s_.in_channels(); ++ch) {
        const int64_t g = ch / ipg, i = ch % ipg;
        for (int64_t iy = 0; iy < c_.height; ++iy) {
          for (int64_t ix = 0; ix < c_.width; ++ix) {
            double sum = 0, mag = 0;
            for (int64_t o = 0; o < opg; ++o) {
              for (int64_t ky = 0; ky < K; ++ky) {
                for (int64_t kx = 0; kx < K; ++kx) {
                  const int64_t y = iy + c_.padding - ky, x = ix + c_.padding - kx;
                  if (y < 0 || x < 0 || y >= oh || x >= ow) continue;
                  const double t = W(g * opg + o, i, ky, kx) * G(n, g * opg + o, y * ow + x);
                  sum += t;
                  mag += std::fabs(t);
                }
              }
            }
            expect_near(grad_in[((ch * c_.height + iy) * c_.width + ix) * lanes + n], sum, mag,
                        "input gradient n " + std::to_string(n) + " channel " + std::to_string(ch) +
                            " (" + std::to_string(iy) + ", " + std::to_string(ix) + ")");
          }
        }
      }
    }
    const std::vector<float> gw = WeightGrad(k, s_.weight_grad_items());
    for (int64_t oc = 0; oc < s_.out_channels(); ++oc) {
      const int64_t g = oc / opg;
      double bias_sum = 0, bias_mag = 0;
      for (int64_t n = 0; n < c_.batch; ++n) {
        for (int64_t p = 0; p < oh * ow; ++p) {
          bias_sum += G(n, oc, p);
          bias_mag += std::fabs(G(n, oc, p));
        }
      }
      if (c_.bias)
        expect_near(gw[w_.size() + oc], bias_sum, bias_mag, "bias gradient " + std::to_string(oc));
      for (int64_t i = 0; i < ipg; ++i) {
        for (int64_t ky = 0; ky < K; ++ky) {
          for (int64_t kx = 0; kx < K; ++kx) {
            double sum = 0, mag = 0;
            for (int64_t n = 0; n < c_.batch; ++n) {
              for (int64_t y = 0; y < oh; ++y) {
                for (int64_t x = 0; x < ow; ++x) {
                  const double t = G(n, oc, y * ow + x) * In(n, g * ipg + i, y + ky, x + kx);
                  sum += t;
                  mag += std::fabs(t);
                }
              }
            }
            expect_near(gw[((oc * ipg + i) * K + ky) * K + kx], sum, mag,
                        "weight gradient channel " + std::to_string(oc) + " input " +
                            std::to_string(i) + " (" + std::to_string(ky) + ", " +
                            std::to_string(kx) + ")");
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << Name(c_);
  }

  const BatchLaneConvShape& shape() const { return s_; }

 private:
  Case c_;
  BatchLaneConvShape s_;
  std::vector<float> x_, w_, b_, g_, in_, grad_out_, by_in_, by_out_;
};

const Case kCases[] = {
    {20, 1, 6, 16, 14, 14, 5, 0, true},  // LeNet-5's conv2, a batch past whole vectors
    {8, 3, 6, 16, 14, 14, 5, 0, true},   // fused, K = 3
    {40, 2, 3, 6, 9, 11, 3, 1, false},   // blocks of 6 and 3, kernel 3, padding, no bias
    {33, 1, 4, 5, 7, 6, 5, 2, true},     // blocks of 1 (5 outputs), padding past the kernel's half
    {32, 1, 2, 8, 6, 6, 3, 0, true},     // two vectors of 16
    {64, 1, 6, 16, 10, 10, 5, 0, true},  // four vectors of 16
    {1, 2, 2, 4, 5, 5, 5, 0, false},     // one sample, one output pixel
};

TEST(BatchLaneConvTest, ForwardAndGradientsMatchDoublePrecisionOnEveryIsaOfThisCpu) {
  const auto isas = Available();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 with FMA";
  for (const Isa& isa : isas) {
    SCOPED_TRACE(isa.name);
    for (const Case& c : kCases) Problem(c, *isa.kernels).Check(*isa.kernels);
  }
}

// Work items split among threads as batch_lane_conv.cc's parallel_for may:
// the same bits as one call over all of them.
TEST(BatchLaneConvTest, SplittingTheWorkGivesTheSameBits) {
  const auto isas = Available();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 with FMA";
  for (const Isa& isa : isas) {
    SCOPED_TRACE(isa.name);
    const Problem p({24, 2, 6, 16, 14, 14, 5, 0, true}, *isa.kernels);
    const BatchLaneConvShape& s = p.shape();
    EXPECT_EQ(p.Forward(*isa.kernels, s.forward_items()), p.Forward(*isa.kernels, 3));
    EXPECT_EQ(p.DataGrad(*isa.kernels, s.data_grad_items()), p.DataGrad(*isa.kernels, 5));
    EXPECT_EQ(p.WeightGrad(*isa.kernels, s.weight_grad_items()), p.WeightGrad(*isa.kernels, 1));
  }
}

// The transposes into and out of the batch-lane layout against their
// definitions: rows shorter and longer than a vector, a batch past whole
// vectors and past a whole number of blocks, zeros in the lanes past it,
// nothing written past a row or the batch.
TEST(BatchLaneConvTest, TransposesIntoAndOutOfTheBatchLanesAreExact) {
  const auto isas = Available();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 with FMA";
  for (const Isa& isa : isas) {
    SCOPED_TRACE(isa.name);
    const int64_t L = isa.kernels->lanes;
    for (const int64_t samples : {int64_t{1}, L, 2 * L + 3}) {
      for (const int64_t positions : {int64_t{5}, L, 3 * L + 7}) {
        SCOPED_TRACE(std::to_string(samples) + " samples, " + std::to_string(positions) +
                     " positions");
        const int64_t lanes = (samples + L - 1) / L * L, stride = positions + 3;
        std::vector<float> src(samples * stride);
        std::mt19937 gen(static_cast<uint32_t>(samples * 31 + positions));
        std::uniform_real_distribution<float> u(-1, 1);
        for (float& v : src) v = u(gen);
        std::vector<float> t(positions * lanes, NAN);
        isa.kernels->to_lanes(src.data(), stride, samples, positions, t.data(), lanes);
        int bad = 0;
        for (int64_t p = 0; p < positions; ++p) {
          for (int64_t n = 0; n < lanes; ++n) {
            const float want = n < samples ? src[n * stride + p] : 0.0f;
            if (!(t[p * lanes + n] == want) && ++bad <= 3) {
              ADD_FAILURE() << "to_lanes position " << p << " sample " << n << ": "
                            << t[p * lanes + n] << ", expected " << want;
            }
          }
        }
        std::vector<float> back(samples * stride, -7.0f);
        isa.kernels->from_lanes(t.data(), lanes, samples, positions, back.data(), stride);
        for (int64_t n = 0; n < samples; ++n) {
          for (int64_t p = 0; p < stride; ++p) {
            const float want = p < positions ? src[n * stride + p] : -7.0f;
            if (!(back[n * stride + p] == want) && ++bad <= 6) {
              ADD_FAILURE() << "from_lanes sample " << n << " position " << p << ": "
                            << back[n * stride + p] << ", expected " << want;
            }
          }
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

}  // namespace
}  // namespace ckpt::model::internal
