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

}  // namespace
}  // namespace ckpt::scheduler
