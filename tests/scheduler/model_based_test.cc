// The model-based proposals (scheduler/src/model_based.h) on synthetic
// objectives whose optimum is known.
#include "model_based.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <utility>
#include <vector>

namespace ckpt::scheduler {
namespace {

records::ExperimentConfig SpaceConfig() {
  records::ExperimentConfig c;
  c.seed = 11;
  c.search_space["lr"] = records::SearchDim{records::SearchDim::Kind::kLogUniform, 1e-3, 1e-1, {}};
  c.search_space["momentum"] =
      records::SearchDim{records::SearchDim::Kind::kUniform, 0.5, 0.99, {}};
  return c;
}

// Distance to the optimum (lr 0.02, momentum 0.9) on the space's unit scale.
double Distance(const HParams& h) {
  const double a = (std::log10(h.at("lr")) - std::log10(0.02)) / 2.0;
  const double b = (h.at("momentum") - 0.9) / 0.49;
  return std::sqrt(a * a + b * b);
}

HParams Uniform(const records::ExperimentConfig& c, std::mt19937_64& rng) {
  HParams h;
  for (const auto& [name, dim] : c.search_space) {
    h[name] = FromUnit(dim, std::uniform_real_distribution<double>(0, 1)(rng));
  }
  return h;
}

// 40 trials, one at a time, each proposed from those before it (uniform
// until TPE has its startup trials): the last 16 lie far closer to the
// optimum than uniform draws do, every proposal within the bounds.
TEST(TpeTest, ProposalsConcentrateOnTheOptimumOfASyntheticObjective) {
  const auto c = SpaceConfig();
  double tpe = 0, uniform = 0;
  int n = 0;
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    std::mt19937_64 rng(seed);
    std::vector<std::pair<HParams, double>> trials;
    for (int k = 0; k < 40; ++k) {
      auto proposed = ProposeTpe(c, trials, MixSeed(seed, static_cast<uint64_t>(k)));
      EXPECT_EQ(proposed.has_value(), k >= TpeOptions{}.startup);
      const HParams h = proposed ? *proposed : Uniform(c, rng);
      EXPECT_GE(h.at("lr"), 1e-3);
      EXPECT_LE(h.at("lr"), 1e-1);
      EXPECT_GE(h.at("momentum"), 0.5);
      EXPECT_LE(h.at("momentum"), 0.99);
      const double d = Distance(h);
      trials.emplace_back(h, -d * d);
      if (k >= 24) {
        tpe += d;
        uniform += Distance(Uniform(c, rng));
        ++n;
      }
    }
  }
  tpe /= n;
  uniform /= n;
  std::printf("mean distance to the optimum, last 16 of 40 trials: TPE %.3f, uniform %.3f\n", tpe,
              uniform);
  EXPECT_LT(tpe, 0.5 * uniform);
}

TEST(TpeTest, DeterministicGivenTheSeedAndTheTrials) {
  auto c = SpaceConfig();
  c.search_space["nesterov"] = records::SearchDim{records::SearchDim::Kind::kChoice, 0, 0, {0, 1}};
  std::mt19937_64 rng(3);
  std::vector<std::pair<HParams, double>> trials;
  for (int k = 0; k < 12; ++k) {
    HParams h = Uniform(c, rng);
    h["nesterov"] = static_cast<double>(k % 2);
    trials.emplace_back(h, k % 2 == 1 ? 1.0 - Distance(h) : -Distance(h));  // nesterov 1 is better
  }
  const auto a = ProposeTpe(c, trials, 77);
  ASSERT_TRUE(a.has_value());
  EXPECT_EQ(a, ProposeTpe(c, trials, 77));
  EXPECT_NE(a, ProposeTpe(c, trials, 78));
  int ones = 0;
  for (uint64_t s = 0; s < 50; ++s) ones += ProposeTpe(c, trials, s)->at("nesterov") == 1.0;
  EXPECT_GT(ones, 40);  // the good trials all had it
}

// Trials are the members at the interval most of them reached, up to the
// cutoff, without those that have no score.
TEST(TpeTest, TrialsAreTheMembersAtTheIntervalMostReached) {
  History h;
  for (int i = 0; i < 4; ++i) h[{1, i}] = Observation{i, 1, {{"lr", 0.01 * (i + 1)}}, 0.1 * i};
  for (int i = 0; i < 3; ++i) h[{2, i}] = Observation{i, 2, {{"lr", 0.01 * (i + 1)}}, 0.5 * i};
  h[{1, 4}] = Observation{4, 1, {}, std::nan("")};
  auto t = TpeTrials(h, 5);
  ASSERT_EQ(t.size(), 4u);  // interval 1: 4 scored, interval 2: 3
  EXPECT_EQ(t[3].second, 0.1 * 3);
  for (int i = 3; i < 5; ++i) h[{2, i}] = Observation{i, 2, {{"lr", 0.05}}, 1.0};
  t = TpeTrials(h, 5);
  ASSERT_EQ(t.size(), 5u);  // interval 2 has 5 now: the latest of the most
  EXPECT_EQ(t[1].second, 0.5);
  EXPECT_EQ(TpeTrials(h, 1).size(), 4u);  // the cutoff
  EXPECT_TRUE(TpeTrials({}, 3).empty());
}

// --- PB2's Gaussian process ---------------------------------------------------

GpPoint At(std::vector<double> x, double t) { return GpPoint{std::move(x), t}; }

// One and two observations: the posterior's closed form, by hand.
TEST(GpTest, PosteriorMatchesTheClosedFormOnTinyInputs) {
  const GpKernel k{0.3, 0.1, 0.01};
  const double s = k.noise;
  // k((0.2, 1), (0.5, 2)) = exp(-0.3^2 / (2 * 0.3^2)) * 0.9^(1/2).
  const double c = std::exp(-0.5) * std::sqrt(0.9);
  EXPECT_NEAR(GpCovariance(k, At({0.2}, 1), At({0.5}, 2)), c, 1e-15);
  auto one = GpPosterior(k, {At({0.2}, 1)}, {1.5}, {At({0.5}, 2), At({0.2}, 1)});
  ASSERT_TRUE(one.has_value());
  EXPECT_NEAR((*one)[0].mean, c * 1.5 / (1 + s), 1e-12);
  EXPECT_NEAR((*one)[0].variance, 1 - c * c / (1 + s), 1e-12);
  EXPECT_NEAR((*one)[1].mean, 1.5 / (1 + s), 1e-12);
  EXPECT_NEAR((*one)[1].variance, 1 - 1 / (1 + s), 1e-12);
  // Two points: K = [[1+s, b], [b, 1+s]], K^-1 = [[1+s, -b], [-b, 1+s]] / det.
  const GpPoint p1 = At({0.2, 0.4}, 1), p2 = At({0.6, 0.1}, 3), q = At({0.3, 0.3}, 2);
  const double b = GpCovariance(k, p1, p2), k1 = GpCovariance(k, p1, q),
               k2 = GpCovariance(k, p2, q);
  EXPECT_NEAR(b, std::exp(-(0.16 + 0.09) / 0.18) * 0.9, 1e-15);
  const double det = (1 + s) * (1 + s) - b * b;
  const double y1 = 0.7, y2 = -1.1;
  const double a1 = ((1 + s) * y1 - b * y2) / det, a2 = (-b * y1 + (1 + s) * y2) / det;
  const double quad = (k1 * k1 * (1 + s) - 2 * k1 * k2 * b + k2 * k2 * (1 + s)) / det;
  auto two = GpPosterior(k, {p1, p2}, {y1, y2}, {q});
  ASSERT_TRUE(two.has_value());
  EXPECT_NEAR((*two)[0].mean, k1 * a1 + k2 * a2, 1e-12);
  EXPECT_NEAR((*two)[0].variance, 1 - quad, 1e-12);
  // The marginal likelihood of one point: N(y; 0, 1 + s).
  EXPECT_NEAR(GpLogMarginalLikelihood(k, {p1}, {y1}),
              -0.5 * y1 * y1 / (1 + s) - 0.5 * std::log(1 + s) - 0.5 * std::log(2 * M_PI), 1e-12);
  // No data: the prior.
  auto prior = GpPosterior(k, {}, {}, {q});
  EXPECT_EQ((*prior)[0].mean, 0);
  EXPECT_EQ((*prior)[0].variance, 1);
}

// A history where the improvement over an interval peaks at lr = 0.01
// (log scale) whatever the momentum: 8 members over 6 intervals.
History Pb2History(const records::ExperimentConfig& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  History h;
  std::vector<double> score(8, 0.0);
  for (int t = 1; t <= 6; ++t) {
    for (int i = 0; i < 8; ++i) {
      const HParams hp = Uniform(c, rng);
      const double u = ToUnit(c.search_space.at("lr"), hp.at("lr"));
      score[static_cast<size_t>(i)] += 0.1 - (u - 0.5) * (u - 0.5);
      h[{t, i}] = Observation{i, t, hp, score[static_cast<size_t>(i)]};
    }
  }
  return h;
}

// UCB's choices lie within the space's bounds (log scale for lr), each a
// function of its inputs, and with this much data near the peak.
TEST(Pb2Test, UcbChoicesLieWithinTheBoundsNearTheBestImprovement) {
  auto c = SpaceConfig();
  c.search_space["lr"] = records::SearchDim{records::SearchDim::Kind::kLogUniform, 1e-4, 1.0, {}};
  double off = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const History h = Pb2History(c, seed);
    const Pb2Data data = Pb2Observations(c, h, 6);
    ASSERT_EQ(data.points.size(), 40u);  // intervals 2..6 of 8 members
    const HParams from = {{"lr", 0.5}, {"momentum", 0.6}, {"fixed", 3}};
    std::vector<GpPoint> pending;
    for (int member = 0; member < 3; ++member) {
      auto chosen =
          Pb2Explore(c, data, from, 7, MixSeed(seed, static_cast<uint64_t>(member)), &pending);
      ASSERT_TRUE(chosen.has_value());
      EXPECT_GE(chosen->at("lr"), 1e-4);
      EXPECT_LE(chosen->at("lr"), 1.0);
      EXPECT_GE(chosen->at("momentum"), 0.5);
      EXPECT_LE(chosen->at("momentum"), 0.99);
      EXPECT_EQ(chosen->at("fixed"), 3);  // what is not searched is kept
      if (member == 0) {
        off += std::fabs(ToUnit(c.search_space.at("lr"), chosen->at("lr")) - 0.5);
        std::vector<GpPoint> again;
        EXPECT_EQ(chosen, Pb2Explore(c, data, from, 7, MixSeed(seed, 0), &again));
      }
    }
    EXPECT_EQ(pending.size(), 3u);
  }
  std::printf("mean distance of PB2's choice to the peak (unit scale): %.3f\n", off / 10);
  EXPECT_LT(off / 10, 0.15);  // uniform choices would average 0.25
  // Too little data: no choice (PBT's explore is used).
  EXPECT_FALSE(Pb2Explore(c, Pb2Data{}, {}, 2, 1, nullptr).has_value());
}

}  // namespace
}  // namespace ckpt::scheduler
