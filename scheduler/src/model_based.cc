#include "model_based.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

namespace ckpt::scheduler {
namespace {

constexpr double kPi = 3.14159265358979323846;

double NormalCdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }

// A Parzen density on [0, 1]: one Gaussian per point (width: the larger gap
// to its neighbours, the bounds counting as neighbours) plus a wide prior at
// the centre, each truncated to [0, 1], equally weighted (Bergstra et al.).
class Parzen {
 public:
  explicit Parzen(std::vector<double> points) {
    std::sort(points.begin(), points.end());
    const size_t n = points.size();
    const double min_sigma = 1.0 / std::min(100.0, static_cast<double>(n) + 1.0);
    for (size_t i = 0; i < n; ++i) {
      const double left = i == 0 ? 0.0 : points[i - 1];
      const double right = i + 1 == n ? 1.0 : points[i + 1];
      const double sigma = std::max(points[i] - left, right - points[i]);
      Add(points[i], std::clamp(sigma, min_sigma, 1.0));
    }
    Add(0.5, 1.0);  // the prior
  }

  double Density(double x) const {
    double p = 0;
    for (const auto& c : components_) {
      const double z = (x - c.mu) / c.sigma;
      p += std::exp(-0.5 * z * z) / (c.sigma * std::sqrt(2 * kPi) * c.mass);
    }
    return p / static_cast<double>(components_.size());
  }

  double Sample(std::mt19937_64& rng) const {
    const auto& c = components_[rng() % components_.size()];
    std::normal_distribution<double> normal(c.mu, c.sigma);
    for (int tries = 0; tries < 64; ++tries) {
      const double x = normal(rng);
      if (x >= 0 && x <= 1) return x;
    }
    return std::clamp(c.mu, 0.0, 1.0);
  }

 private:
  struct Component {
    double mu, sigma, mass;  // mass: of the Gaussian within [0, 1]
  };
  void Add(double mu, double sigma) {
    components_.push_back(
        {mu, sigma, std::max(1e-12, NormalCdf((1 - mu) / sigma) - NormalCdf(-mu / sigma))});
  }
  std::vector<Component> components_;
};

// A choice dimension's smoothed value frequencies (one pseudo-count each).
std::vector<double> ChoiceWeights(const records::SearchDim& dim, const std::vector<double>& seen) {
  std::vector<double> w(dim.values.size(), 1.0);
  for (double v : seen) {
    auto it = std::find(dim.values.begin(), dim.values.end(), v);
    if (it != dim.values.end()) w[static_cast<size_t>(it - dim.values.begin())] += 1.0;
  }
  double total = 0;
  for (double x : w) total += x;
  for (double& x : w) x /= total;
  return w;
}

}  // namespace

double ToUnit(const records::SearchDim& dim, double value) {
  if (dim.max <= dim.min) return 0.5;
  if (dim.kind == records::SearchDim::Kind::kLogUniform) {
    return std::clamp(
        (std::log(value) - std::log(dim.min)) / (std::log(dim.max) - std::log(dim.min)), 0.0, 1.0);
  }
  return std::clamp((value - dim.min) / (dim.max - dim.min), 0.0, 1.0);
}

double FromUnit(const records::SearchDim& dim, double unit) {
  const double u = std::clamp(unit, 0.0, 1.0);
  if (dim.kind == records::SearchDim::Kind::kLogUniform) {
    return std::clamp(std::exp(std::log(dim.min) + u * (std::log(dim.max) - std::log(dim.min))),
                      dim.min, dim.max);
  }
  return std::clamp(dim.min + u * (dim.max - dim.min), dim.min, dim.max);
}

std::vector<std::pair<HParams, double>> TpeTrials(const History& history, int cutoff) {
  std::map<int, int> per_interval;
  for (const auto& [key, o] : history) {
    if (key.first <= cutoff && !std::isnan(o.score)) ++per_interval[key.first];
  }
  int best = 0, most = 0;
  for (const auto& [interval, n] : per_interval) {
    if (n >= most) best = interval, most = n;
  }
  std::vector<std::pair<HParams, double>> out;
  for (auto it = history.lower_bound({best, 0}); it != history.end() && it->first.first == best;
       ++it) {
    if (!std::isnan(it->second.score)) out.emplace_back(it->second.hparams, it->second.score);
  }
  return out;
}

std::optional<HParams> ProposeTpe(const records::ExperimentConfig& config,
                                  const std::vector<std::pair<HParams, double>>& trials,
                                  uint64_t seed, const TpeOptions& options) {
  if (static_cast<int>(trials.size()) < std::max(1, options.startup)) return std::nullopt;
  // Best first; ties by position, so the split is a function of the inputs.
  std::vector<size_t> order(trials.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return trials[a].second > trials[b].second; });
  const size_t n_good = std::max<size_t>(
      1, static_cast<size_t>(std::ceil(options.gamma * static_cast<double>(trials.size()))));
  std::mt19937_64 rng(seed);
  HParams out = config.fixed_hparams;
  for (const auto& [name, dim] : config.search_space) {
    std::vector<double> good, bad;
    for (size_t r = 0; r < order.size(); ++r) {
      const HParams& h = trials[order[r]].first;
      auto it = h.find(name);
      if (it == h.end()) continue;
      const double v =
          dim.kind == records::SearchDim::Kind::kChoice ? it->second : ToUnit(dim, it->second);
      (r < n_good ? good : bad).push_back(v);
    }
    if (dim.kind == records::SearchDim::Kind::kChoice) {
      const auto l = ChoiceWeights(dim, good), g = ChoiceWeights(dim, bad);
      // Candidates from l, the best l/g wins: over a few values, the best
      // ratio among those drawn.
      std::discrete_distribution<size_t> pick(l.begin(), l.end());
      size_t chosen = pick(rng);
      for (int c = 1; c < options.candidates; ++c) {
        const size_t k = pick(rng);
        if (l[k] / g[k] > l[chosen] / g[chosen]) chosen = k;
      }
      out[name] = dim.values[chosen];
      continue;
    }
    const Parzen l(good), g(bad);
    double best_x = l.Sample(rng);
    double best_ratio = std::log(l.Density(best_x)) - std::log(g.Density(best_x));
    for (int c = 1; c < options.candidates; ++c) {
      const double x = l.Sample(rng);
      const double ratio = std::log(l.Density(x)) - std::log(g.Density(x));
      if (ratio > best_ratio) best_x = x, best_ratio = ratio;
    }
    out[name] = FromUnit(dim, best_x);
  }
  return out;
}

}  // namespace ckpt::scheduler
