// Model-based proposals of hyperparameters over an experiment's history
// (private to ckpt::scheduler; the policies in policy.cc use them):
//
// - TPE, the tree-structured Parzen estimator (Bergstra et al., NIPS 2011):
//   the trials are split into the best gamma and the rest, each side's
//   hyperparameters get a Parzen density per dimension, and of candidates
//   drawn from the good side's density the one with the largest ratio
//   good / rest is proposed.
//
// - PB2's explore step (Parker-Holder et al., NeurIPS 2020): a time-varying
//   Gaussian process (Bogunovic et al. 2016) models the improvement of a
//   member's score over an interval as a function of the hyperparameters it
//   trained with and the interval, and the explored member gets the
//   hyperparameters maximising the upper confidence bound at the next
//   interval, within the search space's bounds. The GP is Eigen's (a Cholesky
//   factorisation), behind this header.
//
// Dimensions are modelled on the scale the search space gives them (a
// log_uniform one in log space), normalised to [0, 1]; a choice dimension by
// smoothed counts of its values. Every function is deterministic given its
// seed and inputs: a resumed run that sees the same history proposes the same.
//
// Thread-safety: pure functions.
#ifndef CKPT_SCHEDULER_SRC_MODEL_BASED_H_
#define CKPT_SCHEDULER_SRC_MODEL_BASED_H_

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "ckpt/records/config.h"
#include "ckpt/scheduler/policy.h"

namespace ckpt::scheduler {

// What TPE models: one trial per member that reached `interval`, its
// hyperparameters there and its score (the interval most members reached up
// to `cutoff`, the latest of equals, so the scores compared had the same
// training). Trials without a score are left out. Ordered by member index.
std::vector<std::pair<HParams, double>> TpeTrials(const History& history, int cutoff);

struct TpeOptions {
  // Fraction of the trials taken as the good ones (at least one). Default: 0.25.
  double gamma = 0.25;
  // Candidates drawn from the good density. Default: 24.
  int candidates = 24;
  // Fewer trials than this: no proposal (the caller draws uniformly). Default: 5.
  int startup = 5;
};

// A TPE proposal for every dimension of `config.search_space` (plus the fixed
// hyperparameters) from `trials`; nullopt with fewer than options.startup.
// Values lie within the space's bounds (a choice: one of its values).
std::optional<HParams> ProposeTpe(const records::ExperimentConfig& config,
                                  const std::vector<std::pair<HParams, double>>& trials,
                                  uint64_t seed, const TpeOptions& options = {});

// One input of the time-varying GP: a point of the unit box (the searched
// hyperparameters in search-space order, ToUnit) at a time (an interval).
struct GpPoint {
  std::vector<double> x;
  double t = 0;
};

// The GP's covariance: k(a, b) = exp(-|a.x - b.x|^2 / (2 lengthscale^2)) *
// (1 - epsilon)^(|a.t - b.t| / 2), unit signal variance, and observation
// noise of variance `noise`.
struct GpKernel {
  double lengthscale = 0.2;
  double epsilon = 0.1;
  double noise = 0.01;
};
double GpCovariance(const GpKernel& kernel, const GpPoint& a, const GpPoint& b);

struct GpPrediction {
  double mean = 0;
  double variance = 0;  // of the latent function (no observation noise)
};

// The posterior of a zero-mean GP with `kernel` conditioned on y[i] observed
// at data[i], at each query (the prior when `data` is empty). Returns
// nullopt when the covariance matrix is not positive definite.
// REQUIRES: data.size() == y.size(); every x of one dimension.
std::optional<std::vector<GpPrediction>> GpPosterior(const GpKernel& kernel,
                                                     const std::vector<GpPoint>& data,
                                                     const std::vector<double>& y,
                                                     const std::vector<GpPoint>& queries);

// log p(y | data, kernel); -inf when the matrix is not positive definite.
double GpLogMarginalLikelihood(const GpKernel& kernel, const std::vector<GpPoint>& data,
                               const std::vector<double>& y);

// PB2's data up to `cutoff`: for each member and interval t whose score and
// the score at t - 1 are known, the point (its hyperparameters at t, t) and
// the improvement score(t) - score(t - 1); the most recent kPb2MaxPoints.
inline constexpr size_t kPb2MaxPoints = 256;
struct Pb2Data {
  std::vector<GpPoint> points;
  std::vector<double> improvement;
};
Pb2Data Pb2Observations(const records::ExperimentConfig& config, const History& history,
                        int cutoff);

// PB2's explore of a member that copied `from`, for interval `t` (the next
// one): the improvements standardised, the kernel chosen by marginal
// likelihood on a fixed grid, and of candidates (uniform in the unit box and
// around `from`) the one with the largest UCB, mean + sqrt(beta) * sd with
// beta = 0.2 + max(0, log(0.4 n)) as in the PB2 authors' code. `pending`:
// points chosen for other members of the same decision, counted as observed
// at their predicted mean (so a batch spreads out); the choice is added to
// it. With fewer than 3 data points, nullopt (the caller explores as PBT).
// REQUIRES: every searched dimension is continuous (the config refuses
// "pb2" over a choice).
std::optional<HParams> Pb2Explore(const records::ExperimentConfig& config, const Pb2Data& data,
                                  const HParams& from, int t, uint64_t seed,
                                  std::vector<GpPoint>* pending);

// A search-space value on its normalised [0, 1] scale (log for log_uniform),
// and back (clamped to the bounds). REQUIRES: `dim` is not a choice.
double ToUnit(const records::SearchDim& dim, double value);
double FromUnit(const records::SearchDim& dim, double unit);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SRC_MODEL_BASED_H_
