#include "ckpt/scheduler/policy.h"

#include <gtest/gtest.h>

#include <cmath>

namespace ckpt::scheduler {
namespace {

records::ExperimentConfig PbtConfig(int population) {
  records::ExperimentConfig c;
  c.name = "p";
  c.seed = 11;
  c.population = population;
  c.intervals = 10;
  c.search_space["lr"] = records::SearchDim{records::SearchDim::Kind::kLogUniform, 1e-3, 1e-1, {}};
  c.search_space["momentum"] =
      records::SearchDim{records::SearchDim::Kind::kUniform, 0.5, 0.99, {}};
  c.policy.kind = records::PolicyKind::kPbt;
  c.policy.quantile = 0.2;
  return c;
}

std::vector<MemberProgress> Population(const records::ExperimentConfig& c, int interval) {
  std::vector<MemberProgress> v;
  for (int i = 0; i < c.population; ++i) {
    MemberProgress m;
    m.member = "m" + std::to_string(100 + i);
    m.index = i;
    m.intervals_done = interval;
    m.score = 0.5 + 0.01 * i;  // m100 worst ... best last
    m.hparams = SampleInitial(c, i);
    v.push_back(m);
  }
  return v;
}

TEST(PolicyTest, SampleInitialStaysInTheSpaceAndIsDeterministic) {
  auto c = PbtConfig(10);
  for (int i = 0; i < 50; ++i) {
    auto h = SampleInitial(c, i);
    EXPECT_GE(h["lr"], 1e-3);
    EXPECT_LE(h["lr"], 1e-1);
    EXPECT_GE(h["momentum"], 0.5);
    EXPECT_LE(h["momentum"], 0.99);
    EXPECT_EQ(h, SampleInitial(c, i));
  }
  EXPECT_NE(SampleInitial(c, 0), SampleInitial(c, 1));
}

TEST(PolicyTest, PbtBottomQuantileExploitsTopQuantile) {
  auto c = PbtConfig(10);
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  auto pop = Population(c, 3);
  auto d = (*policy)->Decide(3, pop, pop);
  ASSERT_EQ(d.size(), 2u);  // floor(0.2 * 10)
  for (const auto& [name, dec] : d) {
    EXPECT_TRUE(name == "m100" || name == "m101") << name;
    EXPECT_EQ(dec.kind, Decision::Kind::kExploit);
    EXPECT_TRUE(dec.donor == "m108" || dec.donor == "m109") << dec.donor;
    EXPECT_GE(dec.hparams.at("lr"), 1e-3);
    EXPECT_LE(dec.hparams.at("lr"), 1e-1);
  }
  // Same inputs, same decisions: a resumed run decides identically.
  auto again = (*policy)->Decide(3, pop, pop);
  ASSERT_EQ(again.size(), d.size());
  for (const auto& [name, dec] : d) {
    EXPECT_EQ(again[name].donor, dec.donor);
    EXPECT_EQ(again[name].hparams, dec.hparams);
  }
}

TEST(PolicyTest, PbtSkipsMembersNotReadyOrAlreadyExploited) {
  auto c = PbtConfig(10);
  c.policy.ready_intervals = 2;
  auto policy = Policy::Create(c);
  auto pop = Population(c, 3);
  pop[0].last_exploit = 2;  // exploited one interval ago: not ready
  pop[1].last_exploit = 3;  // exploited at this generation already
  EXPECT_TRUE((*policy)->Decide(3, pop, pop).empty());
}

TEST(PolicyTest, NanScoresRankLast) {
  auto c = PbtConfig(5);
  auto pop = Population(c, 1);
  pop[4].score = std::nan("");
  auto ranked = RankByScore(pop);
  EXPECT_EQ(ranked.front()->member, "m103");
  EXPECT_EQ(ranked.back()->member, "m104");
}

TEST(PolicyTest, ExplorePerturbsWithinBounds) {
  auto c = PbtConfig(4);
  c.policy.resample_probability = 0;
  HParams from = {{"lr", 0.01}, {"momentum", 0.9}};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    auto h = Explore(c, from, seed);
    EXPECT_TRUE(std::abs(h["lr"] - 0.008) < 1e-12 || std::abs(h["lr"] - 0.012) < 1e-12) << h["lr"];
    EXPECT_LE(h["momentum"], 0.99);
  }
}

TEST(PolicyTest, SuccessiveHalvingStopsAllButTheTopThirdAtARung) {
  auto c = PbtConfig(9);
  c.policy.kind = records::PolicyKind::kSuccessiveHalving;
  c.policy.eta = 3;
  c.policy.min_intervals = 1;
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  auto pop = Population(c, 3);  // rung 3 = 1 * 3
  auto d = (*policy)->Decide(3, pop, pop);
  EXPECT_EQ(d.size(), 6u);
  EXPECT_EQ(d.count("m108"), 0u);
  EXPECT_EQ(d.count("m100"), 1u);
  auto not_rung = Population(c, 2);
  EXPECT_TRUE((*policy)->Decide(2, not_rung, not_rung).empty());
}

TEST(PolicyTest, RandomSearchNeverIntervenes) {
  auto c = PbtConfig(6);
  c.policy.kind = records::PolicyKind::kRandom;
  auto policy = Policy::Create(c);
  auto pop = Population(c, 5);
  EXPECT_TRUE((*policy)->Decide(5, pop, pop).empty());
}

}  // namespace
}  // namespace ckpt::scheduler
