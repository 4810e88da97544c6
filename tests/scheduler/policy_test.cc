#include "ckpt/scheduler/policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

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

// Successive halving with rungs at 1, 3, 9, ... keeping a third.
records::ExperimentConfig HalvingConfig(int population) {
  auto c = PbtConfig(population);
  c.policy.kind = records::PolicyKind::kSuccessiveHalving;
  c.policy.eta = 3;
  c.policy.min_intervals = 1;
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
  auto d = (*policy)->Decide(3, pop, pop, {});
  ASSERT_EQ(d.size(), 2u);  // floor(0.2 * 10)
  for (const auto& [name, dec] : d) {
    EXPECT_TRUE(name == "m100" || name == "m101") << name;
    EXPECT_EQ(dec.kind, Decision::Kind::kExploit);
    EXPECT_TRUE(dec.donor == "m108" || dec.donor == "m109") << dec.donor;
    EXPECT_GE(dec.hparams.at("lr"), 1e-3);
    EXPECT_LE(dec.hparams.at("lr"), 1e-1);
  }
  // Same inputs, same decisions: a resumed run decides identically.
  auto again = (*policy)->Decide(3, pop, pop, {});
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
  EXPECT_TRUE((*policy)->Decide(3, pop, pop, {}).empty());
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
  auto c = HalvingConfig(9);
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  auto pop = Population(c, 3);  // rung 3 = 1 * 3
  auto d = (*policy)->Decide(3, pop, pop, {});
  EXPECT_EQ(d.size(), 6u);
  EXPECT_EQ(d.count("m108"), 0u);
  EXPECT_EQ(d.count("m100"), 1u);
  auto not_rung = Population(c, 2);
  EXPECT_TRUE((*policy)->Decide(2, not_rung, not_rung, {}).empty());
}

// The margins RunAhead asks for, checked against the decisions themselves:
// for random populations, a member whose margins hold among the finished ones
// is neither exploited nor a donor however the unfinished ones end (any
// scores, NaN included, or dropping out), for every quantile and readiness.
TEST(PolicyTest, PbtRunAheadMarginsHoldHoweverTheUnfinishedEnd) {
  std::mt19937_64 rng(4711);
  int checked = 0, eligible = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int n = 2 + static_cast<int>(rng() % 14);
    auto c = PbtConfig(n);
    c.policy.quantile = 0.05 + 0.05 * static_cast<double>(rng() % 10);
    c.policy.ready_intervals = 1 + static_cast<int>(rng() % 2);
    auto policy = Policy::Create(c);
    ASSERT_TRUE(policy.ok());
    const int gen = 3;
    std::vector<MemberProgress> pop = Population(c, gen);
    const int unfinished = static_cast<int>(rng() % static_cast<uint64_t>(n));
    for (auto& m : pop) {
      m.score = static_cast<double>(rng() % 8) / 8.0;  // ties on purpose
      m.last_exploit = static_cast<int>(rng() % 3) + 1;
    }
    // The first `unfinished` members are still running: their scores unknown.
    const std::vector<MemberProgress> finished(pop.begin() + unfinished, pop.end());
    for (const auto& m : finished) {
      auto margins = (*policy)->RunAhead(gen, m, n);
      ASSERT_TRUE(margins.has_value());
      int above = 0, below = 0;
      for (const auto& o : finished) {
        if (o.member == m.member) continue;
        (RanksBefore(o, m) ? above : below)++;
      }
      if (above < margins->above || below < margins->below) continue;
      ++eligible;
      for (int completion = 0; completion < 40; ++completion) {
        std::vector<MemberProgress> done = pop;
        for (int u = 0; u < unfinished; ++u) {
          const uint64_t r = rng() % 10;
          if (r == 0) {
            done[static_cast<size_t>(u)].active = false;
          } else if (r == 1) {
            done[static_cast<size_t>(u)].score = std::nan("");
          } else {
            done[static_cast<size_t>(u)].score = static_cast<double>(rng() % 10) / 8.0 - 0.1;
          }
        }
        std::vector<MemberProgress> at_gen;
        for (const auto& o : done) {
          if (o.active) at_gen.push_back(o);
        }
        const auto decisions = (*policy)->Decide(gen, at_gen, done, {});
        ++checked;
        ASSERT_EQ(decisions.count(m.member), 0u) << "trial " << trial << ": " << m.member;
        for (const auto& [name, d] : decisions) {
          ASSERT_NE(d.donor, m.member) << "trial " << trial << ": donor " << m.member;
        }
      }
    }
  }
  EXPECT_GT(eligible, 200);
  EXPECT_GT(checked, 8000);
}

TEST(PolicyTest, RunAheadIsNeverAllowedAtARungOrInAsyncMode) {
  auto c = HalvingConfig(9);
  auto sh = Policy::Create(c);
  ASSERT_TRUE(sh.ok());
  const MemberProgress m = Population(c, 3)[0];
  EXPECT_FALSE((*sh)->RunAhead(3, m, 9).has_value());  // rung 3: stops are decided
  EXPECT_TRUE((*sh)->RunAhead(2, m, 9).has_value());   // between rungs: nothing is
  c.policy.mode = records::PolicyMode::kAsync;
  c.policy.kind = records::PolicyKind::kPbt;
  auto async = Policy::Create(c);
  ASSERT_TRUE(async.ok());
  EXPECT_FALSE((*async)->RunAhead(2, m, 9).has_value());
}

TEST(PolicyTest, RandomSearchNeverIntervenes) {
  auto c = PbtConfig(6);
  c.policy.kind = records::PolicyKind::kRandom;
  auto policy = Policy::Create(c);
  auto pop = Population(c, 5);
  EXPECT_TRUE((*policy)->Decide(5, pop, pop, {}).empty());
}

// --- HyperBand -----------------------------------------------------------------

records::ExperimentConfig HyperbandConfig(int population, int intervals) {
  auto c = PbtConfig(population);
  c.intervals = intervals;
  c.policy.kind = records::PolicyKind::kHyperband;
  c.policy.eta = 3;
  c.policy.min_intervals = 1;
  return c;
}

// Li et al. 2018, Table 1 (R = 81, eta = 3): n_i / r_i of each bracket.
TEST(HyperbandTest, BracketsAreThePapersTable) {
  const auto brackets = HyperbandBrackets(HyperbandConfig(143, 81));
  struct Row {
    int s, n;
    std::vector<int> counts, rungs;
  };
  const std::vector<Row> paper = {
      {4, 81, {81, 27, 9, 3, 1}, {1, 3, 9, 27, 81}},
      {3, 34, {34, 11, 3, 1}, {3, 9, 27, 81}},
      {2, 15, {15, 5, 1}, {9, 27, 81}},
      {1, 8, {8, 2}, {27, 81}},
      {0, 5, {5}, {81}},
  };
  ASSERT_EQ(brackets.size(), paper.size());
  for (size_t i = 0; i < paper.size(); ++i) {
    EXPECT_EQ(brackets[i].s, paper[i].s);
    EXPECT_EQ(brackets[i].n, paper[i].n) << "s=" << paper[i].s;
    EXPECT_EQ(brackets[i].counts, paper[i].counts) << "s=" << paper[i].s;
    EXPECT_EQ(brackets[i].rungs, paper[i].rungs) << "s=" << paper[i].s;
  }
  // A population of the paper's size runs each bracket with the paper's n.
  const auto assign = HyperbandAssignment(brackets, 143);
  std::map<int, int> per;
  for (int b : assign) ++per[b];
  EXPECT_EQ(per, (std::map<int, int>{{0, 81}, {1, 34}, {2, 15}, {3, 8}, {4, 5}}));
  // Fewer members: in proportion, every bracket keeps at least one.
  const auto small = HyperbandAssignment(brackets, 20);
  per.clear();
  for (int b : small) ++per[b];
  EXPECT_EQ(small.size(), 20u);
  EXPECT_EQ(per, (std::map<int, int>{{0, 11}, {1, 5}, {2, 2}, {3, 1}, {4, 1}}));
  EXPECT_TRUE(std::is_sorted(small.begin(), small.end()));
  per.clear();
  for (int b : HyperbandAssignment(brackets, 6)) ++per[b];  // 3.4, 1.4, 0.6, 0.3, 0.2
  EXPECT_EQ(per, (std::map<int, int>{{0, 2}, {1, 1}, {2, 1}, {3, 1}, {4, 1}}));
  // brackets = 2: the two most aggressive, rungs unchanged; R = 20 floors.
  auto two = HyperbandConfig(10, 81);
  two.policy.brackets = 2;
  ASSERT_EQ(HyperbandBrackets(two).size(), 2u);
  EXPECT_EQ(HyperbandBrackets(two)[1].rungs, (std::vector<int>{3, 9, 27, 81}));
  const auto r20 = HyperbandBrackets(HyperbandConfig(10, 20));
  ASSERT_EQ(r20.size(), 3u);
  EXPECT_EQ(r20[0].rungs, (std::vector<int>{2, 6, 20}));
  EXPECT_EQ(r20[2].rungs, (std::vector<int>{20}));
}

// Sync: at a bracket's rung the bracket keeps floor(n_i / eta) of its own
// members; members of other brackets and the last bracket are left alone.
TEST(HyperbandTest, EachBracketHalvesItsOwnMembersAtItsRungs) {
  auto c = HyperbandConfig(20, 9);  // brackets s=2 (1,3,9), s=1 (3,9), s=0 (9)
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  const auto assign = HyperbandAssignment(HyperbandBrackets(c), 20);
  int in0 = 0;
  for (int b : assign) in0 += b == 0;
  auto pop = Population(c, 1);
  auto d = (*policy)->Decide(1, pop, pop, {});
  EXPECT_EQ(static_cast<int>(d.size()), in0 - in0 / 3);
  for (const auto& [name, dec] : d) {
    const int index = std::stoi(name.substr(1)) - 100;
    EXPECT_EQ(assign[static_cast<size_t>(index)], 0) << name;
    EXPECT_EQ(dec.kind, Decision::Kind::kStop);
  }
  EXPECT_FALSE((*policy)->RunAhead(1, pop[0], 20).has_value());
  EXPECT_FALSE((*policy)->RunAhead(3, pop[0], 20).has_value());
  EXPECT_TRUE((*policy)->RunAhead(2, pop[0], 20).has_value());
  // At 3 both brackets s=2 and s=1 decide; nobody is stopped at the end.
  auto at3 = Population(c, 3);
  d = (*policy)->Decide(3, at3, at3, {});
  int stopped1 = 0;
  for (const auto& [name, dec] : d) stopped1 += assign[std::stoi(name.substr(1)) - 100] == 1;
  int in1 = 0;
  for (int b : assign) in1 += b == 1;
  EXPECT_EQ(stopped1, in1 - std::max(1, in1 / 3));
  auto at9 = Population(c, 9);
  EXPECT_TRUE((*policy)->Decide(9, at9, at9, {}).empty());
}

// --- Median stopping -----------------------------------------------------------

// `scores[i]` are member i's scores at intervals 1, 2, ...
History HistoryOf(const std::vector<std::vector<double>>& scores) {
  History h;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t t = 0; t < scores[i].size(); ++t) {
      const int index = static_cast<int>(i), interval = static_cast<int>(t) + 1;
      h[{interval, index}] = Observation{index, interval, {{"lr", 0.01}}, scores[i][t]};
    }
  }
  return h;
}

TEST(MedianStoppingTest, StopsAMemberWhoseBestIsBelowTheOthersMedianRunningAverage) {
  auto c = PbtConfig(5);
  c.policy.kind = records::PolicyKind::kRandom;
  c.policy.median_stopping = true;
  c.policy.median_grace_intervals = 2;
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  // Running averages at 2 of members 1..4: 0.5, 0.6, 0.7, 0.2 -> median 0.55.
  const History h = HistoryOf({{0.50, 0.54},
                               {0.40, 0.60},
                               {0.60, 0.60},
                               {0.60, 0.80},
                               {0.10, 0.30},
                               {0.90}});  // member 5 has not reached 2: not counted
  auto pop = Population(c, 2);
  auto d = (*policy)->Decide(2, pop, pop, h);
  // Member 0: best 0.54 < 0.55 stops; member 1: best 0.6 against the median
  // 0.56 of 0.52 (member 0's), 0.6, 0.7, 0.2 goes on; member 4: best 0.3 stops.
  ASSERT_EQ(d.count("m100"), 1u);
  EXPECT_EQ(d["m100"].kind, Decision::Kind::kStop);
  EXPECT_NE(d["m100"].why.find("median"), std::string::npos) << d["m100"].why;
  EXPECT_EQ(d.count("m101"), 0u);
  EXPECT_EQ(d.count("m103"), 0u);
  EXPECT_EQ(d.count("m104"), 1u);  // best 0.3
  // Later intervals in the history (a member ran ahead) change nothing at 2.
  History later = h;
  later[{3, 1}] = Observation{1, 3, {}, 0.0};
  later[{3, 2}] = Observation{2, 3, {}, 0.0};
  later[{3, 0}] = Observation{0, 3, {}, 0.99};
  EXPECT_EQ((*policy)->Decide(2, pop, pop, later).size(), d.size());
  // Before the grace intervals, at the last interval and with the rule off:
  // nobody.
  auto at1 = Population(c, 1);
  EXPECT_TRUE((*policy)->Decide(1, at1, at1, h).empty());
  c.intervals = 2;
  EXPECT_TRUE((*Policy::Create(c))->Decide(2, pop, pop, h).empty());
  c.intervals = 10;
  c.policy.median_stopping = false;
  EXPECT_TRUE((*Policy::Create(c))->Decide(2, pop, pop, h).empty());
  // With fewer than two others at the interval, nobody.
  c.policy.median_stopping = true;
  EXPECT_TRUE(
      (*Policy::Create(c))->Decide(2, pop, pop, HistoryOf({{0.1, 0.1}, {0.9, 0.9}})).empty());
  // Sync: members wait at every barrier the rule may decide.
  EXPECT_FALSE((*Policy::Create(c))->RunAhead(2, pop[0], 5).has_value());
}

TEST(MedianStoppingTest, HalvingStopsByRungAndByMedian) {
  auto c = HalvingConfig(6);
  c.policy.median_stopping = true;
  auto policy = Policy::Create(c);
  ASSERT_TRUE(policy.ok());
  // Interval 2 is no rung: only the median rule stops (members 0 and 4).
  const History h = HistoryOf({{0.5, 0.5}, {0.6, 0.6}, {0.6, 0.7}, {0.7, 0.7}, {0.1, 0.1}, {}});
  auto pop = Population(c, 2);
  pop.pop_back();
  auto d = (*policy)->Decide(2, pop, pop, h);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(d.count("m100"), 1u);
  EXPECT_EQ(d.count("m104"), 1u);
}

// --- PB2 -----------------------------------------------------------------------

// PB2 exploits as PBT does (the same members, the same donors) and explores
// by GP-UCB once it has data: values within the bounds, not PBT's
// perturbations of the donor's, the same for the same inputs.
TEST(Pb2PolicyTest, ExploitsAsPbtAndExploresByTheGpWithinTheBounds) {
  auto c = PbtConfig(10);
  c.policy.resample_probability = 0;
  auto pbt = Policy::Create(c);
  c.policy.kind = records::PolicyKind::kPb2;
  auto pb2 = Policy::Create(c);
  ASSERT_TRUE(pb2.ok());
  auto pop = Population(c, 3);
  History h;
  for (int t = 1; t <= 3; ++t) {
    for (const auto& m : pop) {
      h[{t, m.index}] = Observation{m.index, t, m.hparams, m.score * t / 3};
    }
  }
  const auto by_pbt = (*pbt)->Decide(3, pop, pop, h);
  const auto by_pb2 = (*pb2)->Decide(3, pop, pop, h);
  ASSERT_EQ(by_pb2.size(), by_pbt.size());
  for (const auto& [name, d] : by_pb2) {
    ASSERT_EQ(by_pbt.count(name), 1u) << name;
    EXPECT_EQ(d.donor, by_pbt.at(name).donor);
    EXPECT_NE(d.why.find("GP-UCB"), std::string::npos) << d.why;
    const HParams& donor = pop[static_cast<size_t>(std::stoi(d.donor.substr(1)) - 100)].hparams;
    const double ratio = d.hparams.at("lr") / donor.at("lr");
    EXPECT_FALSE(std::fabs(ratio - 0.8) < 1e-9 || std::fabs(ratio - 1.2) < 1e-9) << ratio;
    EXPECT_GE(d.hparams.at("lr"), 1e-3);
    EXPECT_LE(d.hparams.at("lr"), 1e-1);
    EXPECT_GE(d.hparams.at("momentum"), 0.5);
    EXPECT_LE(d.hparams.at("momentum"), 0.99);
  }
  const auto again = (*pb2)->Decide(3, pop, pop, h);
  for (const auto& [name, d] : by_pb2) EXPECT_EQ(again.at(name).hparams, d.hparams);
  // Before it has data (interval 1), it explores as PBT.
  auto at1 = Population(c, 1);
  History first;
  for (const auto& m : at1) first[{1, m.index}] = Observation{m.index, 1, m.hparams, m.score};
  for (const auto& [name, d] : (*pb2)->Decide(1, at1, at1, first)) {
    EXPECT_NE(d.why.find("PBT explore"), std::string::npos) << d.why;
  }
}

}  // namespace
}  // namespace ckpt::scheduler
