#include "ckpt/scheduler/policy.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <sstream>

#include "model_based.h"

namespace ckpt::scheduler {
namespace {

double Uniform01(std::mt19937_64& rng) {
  return std::uniform_real_distribution<double>(0.0, 1.0)(rng);
}

double Sample(const records::SearchDim& dim, std::mt19937_64& rng) {
  switch (dim.kind) {
    case records::SearchDim::Kind::kUniform:
      return dim.min + (dim.max - dim.min) * Uniform01(rng);
    case records::SearchDim::Kind::kLogUniform:
      return std::exp(std::log(dim.min) + (std::log(dim.max) - std::log(dim.min)) * Uniform01(rng));
    case records::SearchDim::Kind::kChoice:
      return dim.values[rng() % dim.values.size()];
  }
  return dim.min;
}

std::string Fmt(double v) {
  std::ostringstream os;
  os.precision(4);
  os << v;
  return os.str();
}

// Truncation selection's k: the members in the bottom (and in the top)
// quantile of `n` active ones. Never decreases as n grows.
size_t Truncation(double quantile, size_t n) {
  size_t k = static_cast<size_t>(std::floor(quantile * static_cast<double>(n)));
  if (k == 0) k = 1;
  if (2 * k > n) k = n / 2;
  return k;
}

// The median stopping rule (Golovin et al. 2017, "Google Vizier"): a member
// at interval t (past the grace intervals, before the last) whose best score
// up to t is below the median of the running averages, up to t, of the other
// members that reached t (at least kMedianMinOthers of them) is stopped.
// Scores are read from `history` at intervals <= t only, so a sync barrier
// decides the same whatever ran ahead of it. Members already in `out` are left.
constexpr size_t kMedianMinOthers = 2;

void MedianStops(const records::ExperimentConfig& config,
                 const std::vector<MemberProgress>& members, const History& history,
                 std::map<std::string, Decision>* out) {
  if (!config.policy.median_stopping) return;
  for (const auto& m : members) {
    const int t = m.intervals_done;
    if (!m.active || t < config.policy.median_grace_intervals || t >= config.intervals ||
        out->count(m.member)) {
      continue;
    }
    // Per member index: best score and (sum, count) of scores up to t.
    std::map<int, std::pair<double, std::pair<double, int>>> upto;
    std::set<int> reached;
    for (auto it = history.begin(); it != history.end() && it->first.first <= t; ++it) {
      const Observation& o = it->second;
      if (o.interval == t) reached.insert(o.index);
      if (std::isnan(o.score)) continue;
      auto& [best, mean] =
          upto.try_emplace(o.index, -HUGE_VAL, std::make_pair(0.0, 0)).first->second;
      best = std::max(best, o.score);
      mean.first += o.score;
      ++mean.second;
    }
    auto self = upto.find(m.index);
    if (self == upto.end() || !reached.count(m.index)) continue;
    std::vector<double> averages;
    for (int j : reached) {
      auto o = upto.find(j);
      if (j == m.index || o == upto.end()) continue;
      averages.push_back(o->second.second.first / o->second.second.second);
    }
    if (averages.size() < kMedianMinOthers) continue;
    std::sort(averages.begin(), averages.end());
    const size_t h = averages.size() / 2;
    const double median =
        averages.size() % 2 == 1 ? averages[h] : 0.5 * (averages[h - 1] + averages[h]);
    const double best = self->second.first;
    if (!(best < median)) continue;
    Decision d;
    d.kind = Decision::Kind::kStop;
    d.why = "median stopping at interval " + std::to_string(t) + ": best " + Fmt(best) +
            " < median " + Fmt(median) + " of " + std::to_string(averages.size()) +
            " others' running averages";
    (*out)[m.member] = std::move(d);
  }
}

// resample = "tpe" for the policies that keep a member's hyperparameters: its
// first ones, by TPE over the members that reached the interval most did.
std::optional<HParams> ProposeFirst(const records::ExperimentConfig& c,
                                    const MemberProgress& member, const History& history) {
  if (c.policy.resample != records::Resample::kTpe || member.intervals_done > 0) {
    return std::nullopt;
  }
  return ProposeTpe(c, TpeTrials(history, c.intervals),
                    MixSeed(c.seed, 0x79E, static_cast<uint64_t>(member.index)));
}

// PBT: truncation selection among members ready for exploit; PB2 explores by
// GP-UCB (model_based.h) instead of perturbing.
class PbtPolicy : public Policy {
 public:
  explicit PbtPolicy(const records::ExperimentConfig& config) : config_(config) {}
  bool synchronous() const override { return config_.policy.mode == records::PolicyMode::kSync; }

  std::map<std::string, Decision> Decide(int generation, const std::vector<MemberProgress>& members,
                                         const std::vector<MemberProgress>& population,
                                         const History& history) const override {
    std::map<std::string, Decision> out;
    std::vector<MemberProgress> active;
    for (const auto& m : population) {
      if (m.active) active.push_back(m);
    }
    if (active.size() < 2) return out;
    const auto ranked = RankByScore(active);
    const size_t n = ranked.size();
    const size_t k = Truncation(config_.policy.quantile, n);
    if (k == 0) return out;  // n >= 2 makes k >= 1; the donor draw divides by it
    std::map<std::string, size_t> rank;
    for (size_t i = 0; i < n; ++i) rank[ranked[i]->member] = i;
    // PB2: the GP's data up to this generation, and the points chosen for
    // the members decided before (a batch).
    const bool pb2 = config_.policy.kind == records::PolicyKind::kPb2;
    const Pb2Data pb2_data = pb2 ? Pb2Observations(config_, history, generation) : Pb2Data{};
    std::vector<GpPoint> pending;
    for (const auto& m : members) {
      if (!m.active || m.intervals_done >= config_.intervals) continue;
      if (m.intervals_done - m.last_exploit < config_.policy.ready_intervals) continue;
      auto r = rank.find(m.member);
      if (r == rank.end() || r->second < n - k) continue;  // not in the bottom quantile
      std::mt19937_64 rng(MixSeed(config_.seed, static_cast<uint64_t>(generation),
                                  static_cast<uint64_t>(m.index) + 1));
      const MemberProgress* donor = ranked[rng() % k];
      Decision d;
      d.kind = Decision::Kind::kExploit;
      d.donor = donor->member;
      const uint64_t explore_seed = rng();
      std::optional<HParams> proposal;
      if (pb2) {
        proposal = Pb2Explore(config_, pb2_data, donor->hparams, generation + 1, rng(), &pending);
      } else if (config_.policy.resample == records::Resample::kTpe) {
        proposal = ProposeTpe(config_, TpeTrials(history, generation), rng());
      }
      d.hparams = pb2 && proposal ? *proposal
                                  : Explore(config_, donor->hparams, explore_seed,
                                            proposal ? &*proposal : nullptr);
      d.why = "rank " + std::to_string(r->second + 1) + "/" + std::to_string(n) + " score " +
              Fmt(m.score) + " < donor " + donor->member + " score " + Fmt(donor->score);
      if (pb2) d.why += proposal ? "; pb2: GP-UCB explore" : "; pb2: too little data, PBT explore";
      out[m.member] = std::move(d);
    }
    return out;
  }

  // Donors are the top k, the exploited come from the bottom k among those
  // ready; k is largest when no running member fails, so that case bounds all.
  std::optional<RunAheadMargins> RunAhead(int /*generation*/, const MemberProgress& member,
                                          int active) const override {
    if (!synchronous()) return std::nullopt;
    if (active < 2) return RunAheadMargins{};  // no decisions at all
    const int k =
        static_cast<int>(Truncation(config_.policy.quantile, static_cast<size_t>(active)));
    RunAheadMargins r;
    r.above = k;
    if (member.intervals_done < config_.intervals &&
        member.intervals_done - member.last_exploit >= config_.policy.ready_intervals) {
      r.below = k;
    }
    return r;
  }

 private:
  const records::ExperimentConfig config_;
};

class RandomSearchPolicy : public Policy {
 public:
  explicit RandomSearchPolicy(const records::ExperimentConfig& config) : config_(config) {}
  bool synchronous() const override { return config_.policy.mode == records::PolicyMode::kSync; }
  std::optional<HParams> Propose(const MemberProgress& member,
                                 const History& history) const override {
    return ProposeFirst(config_, member, history);
  }
  std::map<std::string, Decision> Decide(int /*generation*/,
                                         const std::vector<MemberProgress>& members,
                                         const std::vector<MemberProgress>& /*population*/,
                                         const History& history) const override {
    std::map<std::string, Decision> out;
    MedianStops(config_, members, history, &out);
    return out;
  }
  std::optional<RunAheadMargins> RunAhead(int, const MemberProgress&, int) const override {
    if (!synchronous() || config_.policy.median_stopping) return std::nullopt;
    return RunAheadMargins{};  // never decides anything
  }

 private:
  const records::ExperimentConfig config_;
};

// Successive halving: at rungs min_intervals * eta^i keep the top 1/eta of the
// members that reached the rung (async: of those that reached it so far, ASHA).
class SuccessiveHalvingPolicy : public Policy {
 public:
  explicit SuccessiveHalvingPolicy(const records::ExperimentConfig& config) : config_(config) {}
  bool synchronous() const override { return config_.policy.mode == records::PolicyMode::kSync; }
  std::optional<HParams> Propose(const MemberProgress& member,
                                 const History& history) const override {
    return ProposeFirst(config_, member, history);
  }

  bool IsRung(int intervals) const {
    for (long long r = config_.policy.min_intervals; r <= intervals; r *= config_.policy.eta) {
      if (r == intervals) return true;
    }
    return false;
  }

  std::map<std::string, Decision> Decide(int /*generation*/,
                                         const std::vector<MemberProgress>& members,
                                         const std::vector<MemberProgress>& population,
                                         const History& history) const override {
    std::map<std::string, Decision> out;
    for (const auto& m : members) {
      if (!m.active || m.intervals_done >= config_.intervals || !IsRung(m.intervals_done)) continue;
      std::vector<MemberProgress> peers;
      for (const auto& p : population) {
        if (p.intervals_done >= m.intervals_done) peers.push_back(p);
      }
      const auto ranked = RankByScore(peers);
      size_t keep = (ranked.size() + config_.policy.eta - 1) / config_.policy.eta;
      size_t pos = 0;
      while (pos < ranked.size() && ranked[pos]->member != m.member) ++pos;
      if (pos >= keep) {
        Decision d;
        d.kind = Decision::Kind::kStop;
        d.why = "rung " + std::to_string(m.intervals_done) + ": rank " + std::to_string(pos + 1) +
                "/" + std::to_string(ranked.size()) + ", keeping " + std::to_string(keep);
        out[m.member] = std::move(d);
      }
    }
    MedianStops(config_, members, history, &out);
    return out;
  }

  // Between rungs nothing is decided (unless the median rule runs); at a rung
  // the member waits.
  std::optional<RunAheadMargins> RunAhead(int generation, const MemberProgress& /*member*/,
                                          int /*active*/) const override {
    if (!synchronous() || (IsRung(generation) && generation < config_.intervals) ||
        config_.policy.median_stopping) {
      return std::nullopt;
    }
    return RunAheadMargins{};
  }

 private:
  const records::ExperimentConfig config_;
};

// HyperBand: successive halving in each bracket, among the bracket's members
// (sync: the paper's floor(n_i / eta) kept, at least one; async: ASHA's top
// 1/eta of those that reached the rung so far, as SuccessiveHalvingPolicy).
class HyperbandPolicy : public Policy {
 public:
  explicit HyperbandPolicy(const records::ExperimentConfig& config)
      : config_(config),
        brackets_(HyperbandBrackets(config)),
        bracket_of_(HyperbandAssignment(brackets_, config.population)) {}
  bool synchronous() const override { return config_.policy.mode == records::PolicyMode::kSync; }
  std::optional<HParams> Propose(const MemberProgress& member,
                                 const History& history) const override {
    return ProposeFirst(config_, member, history);
  }

  std::map<std::string, Decision> Decide(int /*generation*/,
                                         const std::vector<MemberProgress>& members,
                                         const std::vector<MemberProgress>& population,
                                         const History& /*history*/) const override {
    std::map<std::string, Decision> out;
    const size_t eta = static_cast<size_t>(config_.policy.eta);
    for (const auto& m : members) {
      const int b = BracketOf(m.index);
      if (!m.active || b < 0 || !IsStoppingRung(brackets_[b], m.intervals_done)) continue;
      std::vector<MemberProgress> peers;
      for (const auto& p : population) {
        if (BracketOf(p.index) == b && p.intervals_done >= m.intervals_done) peers.push_back(p);
      }
      const auto ranked = RankByScore(peers);
      const size_t keep = synchronous() ? std::max<size_t>(1, ranked.size() / eta)
                                        : (ranked.size() + eta - 1) / eta;
      size_t pos = 0;
      while (pos < ranked.size() && ranked[pos]->member != m.member) ++pos;
      if (pos < keep) continue;
      Decision d;
      d.kind = Decision::Kind::kStop;
      d.why = "bracket s=" + std::to_string(brackets_[b].s) + " rung " +
              std::to_string(m.intervals_done) + ": rank " + std::to_string(pos + 1) + "/" +
              std::to_string(ranked.size()) + ", keeping " + std::to_string(keep);
      out[m.member] = std::move(d);
    }
    return out;
  }

  // Nothing is decided between rungs; at any bracket's rung members wait
  // (margins are asked per interval, not per bracket).
  std::optional<RunAheadMargins> RunAhead(int generation, const MemberProgress& /*member*/,
                                          int /*active*/) const override {
    if (!synchronous()) return std::nullopt;
    for (const auto& b : brackets_) {
      if (IsStoppingRung(b, generation)) return std::nullopt;
    }
    return RunAheadMargins{};
  }

 private:
  static bool IsStoppingRung(const HyperbandBracket& b, int intervals) {
    for (size_t i = 0; i + 1 < b.rungs.size(); ++i) {
      if (b.rungs[i] == intervals) return true;
    }
    return false;
  }
  int BracketOf(int index) const {
    return index >= 0 && index < static_cast<int>(bracket_of_.size()) ? bracket_of_[index] : -1;
  }

  const records::ExperimentConfig config_;
  const std::vector<HyperbandBracket> brackets_;
  const std::vector<int> bracket_of_;
};

}  // namespace

std::vector<HyperbandBracket> HyperbandBrackets(const records::ExperimentConfig& config) {
  const auto& p = config.policy;
  const int fit = records::MaxHyperbandBrackets(config.intervals, p.min_intervals, p.eta);
  const int used = p.brackets == 0 ? fit : std::min(p.brackets, fit);
  const int s_max = fit - 1;
  std::vector<HyperbandBracket> out;
  for (int s = s_max; s > s_max - used; --s) {
    HyperbandBracket b;
    b.s = s;
    int64_t eta_s = 1;
    for (int i = 0; i < s; ++i) eta_s *= p.eta;
    // n = ceil((s_max + 1) / (s + 1) * eta^s), in integers.
    b.n = static_cast<int>((static_cast<int64_t>(s_max + 1) * eta_s + s) / (s + 1));
    int64_t div = eta_s;
    for (int i = 0; i <= s; ++i) {
      b.rungs.push_back(static_cast<int>(config.intervals / div));
      b.counts.push_back(static_cast<int>(b.n / (eta_s / div)));
      div /= p.eta;
    }
    out.push_back(std::move(b));
  }
  return out;
}

std::vector<int> HyperbandAssignment(const std::vector<HyperbandBracket>& brackets,
                                     int population) {
  const int k = static_cast<int>(brackets.size());
  std::vector<int> count(static_cast<size_t>(k), 0);
  int64_t total = 0;
  for (const auto& b : brackets) total += b.n;
  std::vector<std::pair<int64_t, int>> remainder;  // (-remainder, bracket): largest first
  int given = 0;
  for (int i = 0; i < k && total > 0; ++i) {
    const int64_t share = static_cast<int64_t>(population) * brackets[static_cast<size_t>(i)].n;
    count[static_cast<size_t>(i)] = static_cast<int>(share / total);
    given += static_cast<int>(share / total);
    remainder.push_back({-(share % total), i});
  }
  std::sort(remainder.begin(), remainder.end());
  for (size_t i = 0; given < population && i < remainder.size(); ++i, ++given) {
    ++count[static_cast<size_t>(remainder[i].second)];
  }
  // Every bracket runs: an empty one takes a member from the largest (of
  // equals, the least aggressive, so that the first keeps the most).
  for (int& c : count) {
    size_t largest = 0;
    for (size_t i = 0; i < count.size(); ++i) {
      if (count[i] >= count[largest]) largest = i;
    }
    if (c == 0 && count[largest] > 1) --count[largest], c = 1;
  }
  std::vector<int> out;
  for (int i = 0; i < k; ++i)
    out.insert(out.end(), static_cast<size_t>(count[static_cast<size_t>(i)]), i);
  out.resize(static_cast<size_t>(std::max(0, population)), k - 1);
  return out;
}

std::optional<HParams> Policy::Propose(const MemberProgress& /*member*/,
                                       const History& /*history*/) const {
  return std::nullopt;
}

std::optional<RunAheadMargins> Policy::RunAhead(int /*generation*/,
                                                const MemberProgress& /*member*/,
                                                int /*active*/) const {
  return std::nullopt;
}

uint64_t MixSeed(uint64_t a, uint64_t b, uint64_t c) {
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(a) ^ b) ^ c);
}

bool RanksBefore(double score_a, const std::string& a, double score_b, const std::string& b) {
  const bool an = std::isnan(score_a), bn = std::isnan(score_b);
  if (an != bn) return bn;
  if (!an && score_a != score_b) return score_a > score_b;
  return a < b;
}

std::vector<const MemberProgress*> RankByScore(const std::vector<MemberProgress>& members) {
  std::vector<const MemberProgress*> out;
  for (const auto& m : members) out.push_back(&m);
  std::sort(out.begin(), out.end(),
            [](const MemberProgress* a, const MemberProgress* b) { return RanksBefore(*a, *b); });
  return out;
}

HParams SampleInitial(const records::ExperimentConfig& config, int index) {
  std::mt19937_64 rng(MixSeed(config.seed, 0xC0FFEE, static_cast<uint64_t>(index)));
  HParams h = config.fixed_hparams;
  for (const auto& [name, dim] : config.search_space) h[name] = Sample(dim, rng);
  return h;
}

HParams Explore(const records::ExperimentConfig& config, const HParams& from, uint64_t rng_seed,
                const HParams* proposal) {
  std::mt19937_64 rng(rng_seed);
  HParams h = from;
  for (const auto& [name, dim] : config.search_space) {
    auto it = h.find(name);
    if (it == h.end() || Uniform01(rng) < config.policy.resample_probability) {
      auto p = proposal != nullptr ? proposal->find(name) : h.end();
      h[name] = proposal != nullptr && p != proposal->end() ? p->second : Sample(dim, rng);
      continue;
    }
    const auto& factors = config.policy.perturb;
    const double f = factors[rng() % factors.size()];
    if (dim.kind == records::SearchDim::Kind::kChoice) {
      // Move to the neighbouring choice in the factor's direction.
      auto pos = std::find(dim.values.begin(), dim.values.end(), it->second);
      size_t i = pos == dim.values.end() ? 0 : static_cast<size_t>(pos - dim.values.begin());
      if (f > 1 && i + 1 < dim.values.size()) ++i;
      if (f < 1 && i > 0) --i;
      it->second = dim.values[i];
    } else {
      it->second = std::clamp(it->second * f, dim.min, dim.max);
    }
  }
  return h;
}

StatusOr<std::unique_ptr<Policy>> Policy::Create(const records::ExperimentConfig& config) {
  switch (config.policy.kind) {
    case records::PolicyKind::kPbt:
    case records::PolicyKind::kPb2:
      return std::unique_ptr<Policy>(new PbtPolicy(config));
    case records::PolicyKind::kRandom:
      return std::unique_ptr<Policy>(new RandomSearchPolicy(config));
    case records::PolicyKind::kSuccessiveHalving:
      return std::unique_ptr<Policy>(new SuccessiveHalvingPolicy(config));
    case records::PolicyKind::kHyperband:
      if (records::MaxHyperbandBrackets(config.intervals, config.policy.min_intervals,
                                        config.policy.eta) == 0) {
        return Status::InvalidArgument("policy.min_intervals: above the intervals");
      }
      return std::unique_ptr<Policy>(new HyperbandPolicy(config));
  }
  return Status::InvalidArgument("policy.kind: unknown policy");
}

}  // namespace ckpt::scheduler
