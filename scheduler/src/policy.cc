#include "ckpt/scheduler/policy.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

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

// PBT: truncation selection among members ready for exploit.
class PbtPolicy : public Policy {
 public:
  explicit PbtPolicy(const records::ExperimentConfig& config) : config_(config) {}
  bool synchronous() const override { return config_.policy.mode == records::PolicyMode::kSync; }

  std::map<std::string, Decision> Decide(
      int generation, const std::vector<MemberProgress>& members,
      const std::vector<MemberProgress>& population) const override {
    std::map<std::string, Decision> out;
    std::vector<MemberProgress> active;
    for (const auto& m : population) {
      if (m.active) active.push_back(m);
    }
    if (active.size() < 2) return out;
    const auto ranked = RankByScore(active);
    const size_t n = ranked.size();
    const size_t k = Truncation(config_.policy.quantile, n);
    std::map<std::string, size_t> rank;
    for (size_t i = 0; i < n; ++i) rank[ranked[i]->member] = i;
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
      d.hparams = Explore(config_, donor->hparams, rng());
      d.why = "rank " + std::to_string(r->second + 1) + "/" + std::to_string(n) + " score " +
              Fmt(m.score) + " < donor " + donor->member + " score " + Fmt(donor->score);
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
  std::map<std::string, Decision> Decide(int, const std::vector<MemberProgress>&,
                                         const std::vector<MemberProgress>&) const override {
    return {};
  }
  std::optional<RunAheadMargins> RunAhead(int, const MemberProgress&, int) const override {
    if (!synchronous()) return std::nullopt;
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

  bool IsRung(int intervals) const {
    for (long long r = config_.policy.min_intervals; r <= intervals; r *= config_.policy.eta) {
      if (r == intervals) return true;
    }
    return false;
  }

  std::map<std::string, Decision> Decide(
      int generation, const std::vector<MemberProgress>& members,
      const std::vector<MemberProgress>& population) const override {
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
    return out;
  }

  // Between rungs nothing is decided; at a rung the member waits.
  std::optional<RunAheadMargins> RunAhead(int generation, const MemberProgress& /*member*/,
                                          int /*active*/) const override {
    if (!synchronous() || (IsRung(generation) && generation < config_.intervals)) {
      return std::nullopt;
    }
    return RunAheadMargins{};
  }

 private:
  const records::ExperimentConfig config_;
};

}  // namespace

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

HParams Explore(const records::ExperimentConfig& config, const HParams& from, uint64_t rng_seed) {
  std::mt19937_64 rng(rng_seed);
  HParams h = from;
  for (const auto& [name, dim] : config.search_space) {
    auto it = h.find(name);
    if (it == h.end() || Uniform01(rng) < config.policy.resample_probability) {
      h[name] = Sample(dim, rng);
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
      return std::unique_ptr<Policy>(new PbtPolicy(config));
    case records::PolicyKind::kRandom:
      return std::unique_ptr<Policy>(new RandomSearchPolicy(config));
    case records::PolicyKind::kSuccessiveHalving:
      return std::unique_ptr<Policy>(new SuccessiveHalvingPolicy(config));
  }
  return Status::InvalidArgument("policy.kind: unknown policy");
}

}  // namespace ckpt::scheduler
