#include "model_based.h"

#include <Eigen/Cholesky>
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
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

double GpCovariance(const GpKernel& kernel, const GpPoint& a, const GpPoint& b) {
  double d2 = 0;
  for (size_t i = 0; i < a.x.size() && i < b.x.size(); ++i)
    d2 += (a.x[i] - b.x[i]) * (a.x[i] - b.x[i]);
  return std::exp(-d2 / (2 * kernel.lengthscale * kernel.lengthscale)) *
         std::pow(1 - kernel.epsilon, std::fabs(a.t - b.t) / 2);
}

namespace {

// The Cholesky factor of K + noise I over `data`; nullopt when K is not
// positive definite.
std::optional<Eigen::LLT<Eigen::MatrixXd>> Factor(const GpKernel& kernel,
                                                  const std::vector<GpPoint>& data) {
  const Eigen::Index n = static_cast<Eigen::Index>(data.size());
  Eigen::MatrixXd k(n, n);
  for (Eigen::Index i = 0; i < n; ++i) {
    for (Eigen::Index j = 0; j <= i; ++j) {
      k(i, j) = k(j, i) =
          GpCovariance(kernel, data[static_cast<size_t>(i)], data[static_cast<size_t>(j)]);
    }
    k(i, i) += kernel.noise;
  }
  Eigen::LLT<Eigen::MatrixXd> llt(k);
  if (llt.info() != Eigen::Success) return std::nullopt;
  return llt;
}

Eigen::VectorXd ToVector(const std::vector<double>& v) {
  return Eigen::Map<const Eigen::VectorXd>(v.data(), static_cast<Eigen::Index>(v.size()));
}

}  // namespace

std::optional<std::vector<GpPrediction>> GpPosterior(const GpKernel& kernel,
                                                     const std::vector<GpPoint>& data,
                                                     const std::vector<double>& y,
                                                     const std::vector<GpPoint>& queries) {
  std::vector<GpPrediction> out(queries.size());
  if (data.empty()) {
    for (auto& p : out) p.variance = 1;
    return out;
  }
  auto llt = Factor(kernel, data);
  if (!llt) return std::nullopt;
  const Eigen::VectorXd alpha = llt->solve(ToVector(y));
  const Eigen::Index n = static_cast<Eigen::Index>(data.size());
  Eigen::VectorXd ks(n);
  for (size_t q = 0; q < queries.size(); ++q) {
    for (Eigen::Index i = 0; i < n; ++i) {
      ks(i) = GpCovariance(kernel, data[static_cast<size_t>(i)], queries[q]);
    }
    const Eigen::VectorXd v = llt->matrixL().solve(ks);
    out[q].mean = ks.dot(alpha);
    out[q].variance = std::max(0.0, 1.0 - v.squaredNorm());
  }
  return out;
}

double GpLogMarginalLikelihood(const GpKernel& kernel, const std::vector<GpPoint>& data,
                               const std::vector<double>& y) {
  auto llt = Factor(kernel, data);
  if (!llt) return -std::numeric_limits<double>::infinity();
  const Eigen::VectorXd yv = ToVector(y);
  const Eigen::VectorXd alpha = llt->solve(yv);
  const Eigen::MatrixXd l = llt->matrixL();
  return -0.5 * yv.dot(alpha) - l.diagonal().array().log().sum() -
         0.5 * static_cast<double>(y.size()) * std::log(2 * kPi);
}

Pb2Data Pb2Observations(const records::ExperimentConfig& config, const History& history,
                        int cutoff) {
  // Newest first, so that the cap keeps the most recent intervals.
  std::vector<std::pair<GpPoint, double>> found;
  for (auto it = history.rbegin(); it != history.rend(); ++it) {
    const auto& [key, o] = *it;
    if (key.first > cutoff || key.first < 2 || std::isnan(o.score)) continue;
    auto before = history.find({key.first - 1, key.second});
    if (before == history.end() || std::isnan(before->second.score)) continue;
    GpPoint p;
    p.t = key.first;
    for (const auto& [name, dim] : config.search_space) {
      auto v = o.hparams.find(name);
      p.x.push_back(v == o.hparams.end() ? 0.5 : ToUnit(dim, v->second));
    }
    found.emplace_back(std::move(p), o.score - before->second.score);
    if (found.size() == kPb2MaxPoints) break;
  }
  Pb2Data out;
  for (auto it = found.rbegin(); it != found.rend(); ++it) {
    out.points.push_back(it->first);
    out.improvement.push_back(it->second);
  }
  return out;
}

namespace {

// The kernel of the grid with the largest marginal likelihood of `y`.
GpKernel ChooseKernel(const std::vector<GpPoint>& data, const std::vector<double>& y) {
  GpKernel best;
  double best_ll = -std::numeric_limits<double>::infinity();
  for (double lengthscale : {0.1, 0.2, 0.4, 0.8}) {
    for (double epsilon : {0.05, 0.2}) {
      for (double noise : {0.01, 0.1}) {
        const GpKernel k{lengthscale, epsilon, noise};
        const double ll = GpLogMarginalLikelihood(k, data, y);
        if (ll > best_ll) best = k, best_ll = ll;
      }
    }
  }
  return best;
}

constexpr int kPb2UniformCandidates = 256;
constexpr int kPb2LocalCandidates = 64;

}  // namespace

std::optional<HParams> Pb2Explore(const records::ExperimentConfig& config, const Pb2Data& data,
                                  const HParams& from, int t, uint64_t seed,
                                  std::vector<GpPoint>* pending) {
  if (data.points.size() < 3) return std::nullopt;
  // Standardised improvements: the kernel grid and beta are on that scale.
  double mean = 0, var = 0;
  for (double v : data.improvement) mean += v;
  mean /= static_cast<double>(data.improvement.size());
  for (double v : data.improvement) var += (v - mean) * (v - mean);
  const double sd = std::sqrt(var / static_cast<double>(data.improvement.size()));
  std::vector<GpPoint> points = data.points;
  std::vector<double> y;
  for (double v : data.improvement) y.push_back(sd > 0 ? (v - mean) / sd : 0.0);
  const GpKernel kernel = ChooseKernel(points, y);
  if (pending != nullptr && !pending->empty()) {
    auto believed = GpPosterior(kernel, points, y, *pending);
    if (!believed) return std::nullopt;
    for (size_t i = 0; i < pending->size(); ++i) {
      points.push_back((*pending)[i]);
      y.push_back((*believed)[i].mean);
    }
  }
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::normal_distribution<double> near(0.0, 0.1);
  std::vector<double> start;
  for (const auto& [name, dim] : config.search_space) {
    auto v = from.find(name);
    start.push_back(v == from.end() ? 0.5 : ToUnit(dim, v->second));
  }
  std::vector<GpPoint> candidates;
  for (int c = 0; c < kPb2UniformCandidates + kPb2LocalCandidates; ++c) {
    GpPoint p;
    p.t = t;
    for (double s0 : start) {
      p.x.push_back(c < kPb2UniformCandidates ? unit(rng) : std::clamp(s0 + near(rng), 0.0, 1.0));
    }
    candidates.push_back(std::move(p));
  }
  auto predicted = GpPosterior(kernel, points, y, candidates);
  if (!predicted) return std::nullopt;
  const double beta = 0.2 + std::max(0.0, std::log(0.4 * static_cast<double>(points.size())));
  size_t best = 0;
  double best_ucb = -std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < candidates.size(); ++c) {
    const double ucb = (*predicted)[c].mean + std::sqrt(beta * (*predicted)[c].variance);
    if (ucb > best_ucb) best = c, best_ucb = ucb;
  }
  if (pending != nullptr) pending->push_back(candidates[best]);
  HParams out = from;
  size_t d = 0;
  for (const auto& [name, dim] : config.search_space)
    out[name] = FromUnit(dim, candidates[best].x[d++]);
  return out;
}

}  // namespace ckpt::scheduler
