// The one-input-channel convolution's kernels (worker/src/
// one_channel_conv_kernels.h), each ISA this CPU has, against the same
// convolution and gradients summed in double precision: every value within
// float32 rounding of a sum of its size (|error| <= 1e-5 * the sum of the
// absolute products), over shapes that exercise the channel blocks, the
// last partial vector of a row, groups and padding.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "one_channel_conv_kernels.h"

namespace ckpt::model::internal {
namespace {

struct Case {
  int64_t batch, groups, out_per_group, height, width, kernel, padding;
  bool bias;
};

std::string Name(const Case& c) {
  return "batch " + std::to_string(c.batch) + " groups " + std::to_string(c.groups) + " out " +
         std::to_string(c.out_per_group) + " " + std::to_string(c.height) + "x" +
         std::to_string(c.width) + " kernel " + std::to_string(c.kernel) + " padding " +
         std::to_string(c.padding) + (c.bias ? " bias" : "");
}

struct Isa {
  const char* name;
  const OneChannelConvKernels* kernels;
};

std::vector<Isa> Available() {
  std::vector<Isa> out;
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512f")) out.push_back({"avx512", &OneChannelConvAvx512()});
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    out.push_back({"avx2", &OneChannelConvAvx2()});
  }
#endif
  return out;
}

class Problem {
 public:
  Problem(const Case& c, int64_t lanes)
      : c_(c),
        s_(OneChannelConvShapeOf(c.batch, c.groups, c.out_per_group, c.height, c.width, c.kernel,
                                 c.padding, lanes)) {
    std::mt19937 gen(static_cast<uint32_t>(c.batch * 131 + c.width * 7 + c.kernel));
    std::uniform_real_distribution<float> u(-1, 1);
    x_.resize(s_.planes() * c.height * c.width);
    for (float& v : x_) v = u(gen);
    w_.resize(s_.channels() * c.kernel * c.kernel);
    for (float& v : w_) v = u(gen);
    if (c.bias) {
      b_.resize(s_.channels());
      for (float& v : b_) v = u(gen);
    }
    g_.resize(c.batch * s_.channels() * s_.out_h * s_.out_w);
    for (float& v : g_) v = u(gen);
    // What one_channel_conv.cc's Pad makes: zeros around and to padded_w.
    padded_.assign(s_.planes() * s_.padded_h * s_.padded_w, 0.0f);
    for (int64_t p = 0; p < s_.planes(); ++p) {
      for (int64_t y = 0; y < c.height; ++y) {
        for (int64_t x = 0; x < c.width; ++x) {
          padded_[(p * s_.padded_h + y + c.padding) * s_.padded_w + x + c.padding] =
              x_[(p * c.height + y) * c.width + x];
        }
      }
    }
  }

  // The input at (plane, row, column) of the zero-padded image.
  double In(int64_t plane, int64_t y, int64_t x) const {
    y -= c_.padding;
    x -= c_.padding;
    if (y < 0 || x < 0 || y >= c_.height || x >= c_.width) return 0;
    return x_[(plane * c_.height + y) * c_.width + x];
  }

  void CheckForward(const OneChannelConvKernels& k) const {
    std::vector<float> out(g_.size(), NAN);
    k.forward(s_, padded_.data(), w_.data(), c_.bias ? b_.data() : nullptr, out.data(), 0,
              s_.planes());
    const int64_t K = c_.kernel;
    int bad = 0;
    for (int64_t n = 0; n < c_.batch; ++n) {
      for (int64_t oc = 0; oc < s_.channels(); ++oc) {
        const int64_t plane = n * c_.groups + oc / c_.out_per_group;
        for (int64_t y = 0; y < s_.out_h; ++y) {
          for (int64_t x = 0; x < s_.out_w; ++x) {
            double sum = c_.bias ? b_[oc] : 0.0;
            double mag = std::fabs(sum);
            for (int64_t ky = 0; ky < K; ++ky) {
              for (int64_t kx = 0; kx < K; ++kx) {
                const double t = w_[(oc * K + ky) * K + kx] * In(plane, y + ky, x + kx);
                sum += t;
                mag += std::fabs(t);
              }
            }
            const float got = out[((n * s_.channels() + oc) * s_.out_h + y) * s_.out_w + x];
            if (!(std::fabs(got - sum) <= 1e-5 * mag) && ++bad <= 5) {
              ADD_FAILURE() << Name(c_) << ": output n " << n << " channel " << oc << " (" << y
                            << ", " << x << ") " << got << ", expected " << sum;
            }
          }
        }
      }
    }
    EXPECT_EQ(bad, 0) << Name(c_);
  }

  void CheckWeightGrad(const OneChannelConvKernels& k) const {
    const int64_t K = c_.kernel;
    std::vector<float> gw(w_.size(), NAN), gb(s_.channels(), NAN);
    k.weight_grad(s_, padded_.data(), g_.data(), gw.data(), c_.bias ? gb.data() : nullptr, 0,
                  s_.channels());
    int bad = 0;
    for (int64_t oc = 0; oc < s_.channels(); ++oc) {
      const int64_t g = oc / c_.out_per_group;
      double bias_sum = 0, bias_mag = 0;
      for (int64_t ky = 0; ky < K; ++ky) {
        for (int64_t kx = 0; kx < K; ++kx) {
          double sum = 0, mag = 0;
          for (int64_t n = 0; n < c_.batch; ++n) {
            for (int64_t y = 0; y < s_.out_h; ++y) {
              for (int64_t x = 0; x < s_.out_w; ++x) {
                const double go = g_[((n * s_.channels() + oc) * s_.out_h + y) * s_.out_w + x];
                const double t = go * In(n * c_.groups + g, y + ky, x + kx);
                sum += t;
                mag += std::fabs(t);
                if (ky == 0 && kx == 0) {
                  bias_sum += go;
                  bias_mag += std::fabs(go);
                }
              }
            }
          }
          const float got = gw[(oc * K + ky) * K + kx];
          if (!(std::fabs(got - sum) <= 1e-5 * mag) && ++bad <= 5) {
            ADD_FAILURE() << Name(c_) << ": weight gradient channel " << oc << " (" << ky << ", "
                          << kx << ") " << got << ", expected " << sum;
          }
        }
      }
      if (c_.bias && !(std::fabs(gb[oc] - bias_sum) <= 1e-5 * bias_mag) && ++bad <= 5) {
        ADD_FAILURE() << Name(c_) << ": bias gradient channel " << oc << " " << gb[oc]
                      << ", expected " << bias_sum;
      }
    }
    EXPECT_EQ(bad, 0) << Name(c_);
  }

  const OneChannelConvShape& shape() const { return s_; }

 private:
  Case c_;
  OneChannelConvShape s_;
  std::vector<float> x_, w_, b_, g_, padded_;
};

const Case kCases[] = {
    {8, 1, 6, 28, 28, 5, 2, true},   // LeNet-5's conv1, plain
    {4, 8, 6, 28, 28, 5, 2, true},   // fused, K = 8
    {3, 3, 8, 13, 17, 3, 1, false},  // blocks of 8, no bias, widths not a multiple of a vector
    {2, 2, 5, 9, 40, 5, 0, true},    // blocks of 1, no padding
    {2, 1, 4, 7, 7, 3, 0, true},     // a row shorter than a vector
    {1, 5, 3, 20, 33, 5, 2, true},   // blocks of 3
};

TEST(OneChannelConvTest, ForwardAndGradientsMatchDoublePrecisionOnEveryIsaOfThisCpu) {
  const auto isas = Available();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 with FMA";
  for (const Isa& isa : isas) {
    SCOPED_TRACE(isa.name);
    for (const Case& c : kCases) {
      Problem p(c, isa.kernels->lanes);
      p.CheckForward(*isa.kernels);
      p.CheckWeightGrad(*isa.kernels);
    }
  }
}

// Planes and channels split among threads as one_channel_conv.cc's
// parallel_for may: the same bits as one call over all of them.
TEST(OneChannelConvTest, SplittingTheWorkGivesTheSameBits) {
  const auto isas = Available();
  if (isas.empty()) GTEST_SKIP() << "this CPU has neither AVX-512F nor AVX2 with FMA";
  const Case c{5, 3, 6, 28, 28, 5, 2, true};
  for (const Isa& isa : isas) {
    SCOPED_TRACE(isa.name);
    Problem p(c, isa.kernels->lanes);
    const OneChannelConvShape& s = p.shape();
    std::vector<float> x(s.planes() * s.padded_h * s.padded_w);
    std::mt19937 gen(7);
    std::uniform_real_distribution<float> u(-1, 1);
    for (int64_t i = 0; i < s.planes(); ++i) {
      for (int64_t y = 0; y < s.height; ++y) {
        for (int64_t z = 0; z < s.width; ++z) {
          x[(i * s.padded_h + y + s.padding) * s.padded_w + z + s.padding] = u(gen);
        }
      }
    }
    std::vector<float> w(s.channels() * 25), b(s.channels()), g(s.batch * s.channels() * 28 * 28);
    for (float& v : w) v = u(gen);
    for (float& v : b) v = u(gen);
    for (float& v : g) v = u(gen);
    std::vector<float> whole(g.size()), parts(g.size());
    isa.kernels->forward(s, x.data(), w.data(), b.data(), whole.data(), 0, s.planes());
    for (int64_t i = 0; i < s.planes(); i += 4) {
      isa.kernels->forward(s, x.data(), w.data(), b.data(), parts.data(), i,
                           std::min(i + 4, s.planes()));
    }
    EXPECT_EQ(whole, parts);
    std::vector<float> gw_whole(w.size()), gb_whole(b.size()), gw_parts(w.size()),
        gb_parts(b.size());
    isa.kernels->weight_grad(s, x.data(), g.data(), gw_whole.data(), gb_whole.data(), 0,
                             s.channels());
    for (int64_t oc = 0; oc < s.channels(); ++oc) {
      isa.kernels->weight_grad(s, x.data(), g.data(), gw_parts.data(), gb_parts.data(), oc, oc + 1);
    }
    EXPECT_EQ(gw_whole, gw_parts);
    EXPECT_EQ(gb_whole, gb_parts);
  }
}

}  // namespace
}  // namespace ckpt::model::internal
