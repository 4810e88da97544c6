// Model-based proposals of hyperparameters over an experiment's history
// (private to ckpt::scheduler; the policies in policy.cc use them):
//
// - TPE, the tree-structured Parzen estimator (Bergstra et al., NIPS 2011):
//   the trials are split into the best gamma and the rest, each side's
//   hyperparameters get a Parzen density per dimension, and of candidates
//   drawn from the good side's density the one with the largest ratio
//   good / rest is proposed.
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

// A search-space value on its normalised [0, 1] scale (log for log_uniform),
// and back (clamped to the bounds). REQUIRES: `dim` is not a choice.
double ToUnit(const records::SearchDim& dim, double value);
double FromUnit(const records::SearchDim& dim, double unit);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SRC_MODEL_BASED_H_
