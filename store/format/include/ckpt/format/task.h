// What an experiment's members learn: the training loss and the validation
// metric every score of the system is (MemberOutcome::val_score, records,
// PBT ranking). A metric is always "higher is better": PBT ranks by it as is.
// Wherever a score is shown to a person (the run's table, ckpt-tool, the
// Python client, checkpoint metrics) it carries the metric's own name:
// "val_accuracy", "test_r2" (SplitMetricName).
//
// A split that was not evaluated has the score kNotEvaluated (NaN): no metric
// takes that value (-1 was the old marker, a valid neg_mse or r2), it ranks
// last, and it is null in JSON.
//
// Defaults follow the dataset's targets (ckpt/format/tensor_dataset.h):
// class labels train with cross-entropy and score accuracy; float targets
// train with mean squared error and score its negative (neg_mse); r2 (the
// coefficient of determination) is the other metric for float targets.
//
// Thread-safety: values and pure functions.
#ifndef CKPT_FORMAT_TASK_H_
#define CKPT_FORMAT_TASK_H_

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/tensor_dataset.h"

namespace ckpt::format {

enum class LossKind { kCrossEntropy, kMse };
enum class MetricKind {
  kAccuracy,  // fraction of argmax predictions equal to the label
  kNegMse,    // -(mean over samples and outputs of (prediction - target)^2)
  // 1 - SSE / SST over the evaluated rows, both summed over the outputs, SST
  // about each output's mean of those rows: scikit-learn's r2_score (with
  // multioutput="variance_weighted" for several outputs). Constant targets
  // (SST = 0): 1 when predicted exactly, else 0 (r2_score's force_finite).
  // At most 1; below 0 when worse than predicting the mean.
  kR2,
};
inline constexpr std::array<MetricKind, 3> kMetricKinds = {MetricKind::kAccuracy,
                                                           MetricKind::kNegMse, MetricKind::kR2};

inline std::string_view LossKindName(LossKind k) {
  return k == LossKind::kCrossEntropy ? "cross_entropy" : "mse";
}
inline std::string_view MetricKindName(MetricKind k) {
  switch (k) {
    case MetricKind::kAccuracy:
      return "accuracy";
    case MetricKind::kNegMse:
      return "neg_mse";
    case MetricKind::kR2:
      return "r2";
  }
  return "accuracy";
}
// "val_accuracy", "test_neg_mse": a score of `split` under the metric's name.
inline std::string SplitMetricName(std::string_view split, MetricKind k) {
  std::string out(split);
  out += '_';
  out += MetricKindName(k);
  return out;
}

inline constexpr double kNotEvaluated = std::numeric_limits<double>::quiet_NaN();
inline bool IsEvaluated(double score) { return !std::isnan(score); }

// The values `k` can take: accuracy [0, 1], neg_mse (-inf, 0], r2 (-inf, 1],
// finite. `range` (when given) receives that interval as text.
inline bool InMetricRange(MetricKind k, double v, std::string* range = nullptr) {
  const bool finite = std::isfinite(v);
  switch (k) {
    case MetricKind::kAccuracy:
      if (range != nullptr) *range = "[0, 1]";
      return finite && v >= 0 && v <= 1;
    case MetricKind::kNegMse:
      if (range != nullptr) *range = "(-inf, 0] and finite";
      return finite && v <= 0;
    case MetricKind::kR2:
      if (range != nullptr) *range = "(-inf, 1] and finite";
      return finite && v <= 1;
  }
  return false;
}

// InvalidArgument for another name.
inline StatusOr<LossKind> ParseLossKind(std::string_view name) {
  if (name == "cross_entropy") return LossKind::kCrossEntropy;
  if (name == "mse") return LossKind::kMse;
  return Status::InvalidArgument("unknown loss \"" + std::string(name) +
                                 "\" (expected cross_entropy or mse)");
}
inline StatusOr<MetricKind> ParseMetricKind(std::string_view name) {
  if (name == "accuracy") return MetricKind::kAccuracy;
  if (name == "neg_mse") return MetricKind::kNegMse;
  if (name == "r2") return MetricKind::kR2;
  return Status::InvalidArgument("unknown metric \"" + std::string(name) +
                                 "\" (expected accuracy, neg_mse or r2)");
}

// The target kind a loss or metric needs.
inline TargetKind TargetOf(LossKind k) {
  return k == LossKind::kCrossEntropy ? TargetKind::kClasses : TargetKind::kValues;
}
inline TargetKind TargetOf(MetricKind k) {
  return k == MetricKind::kAccuracy ? TargetKind::kClasses : TargetKind::kValues;
}
inline LossKind DefaultLoss(TargetKind t) {
  return t == TargetKind::kClasses ? LossKind::kCrossEntropy : LossKind::kMse;
}
inline MetricKind DefaultMetric(TargetKind t) {
  return t == TargetKind::kClasses ? MetricKind::kAccuracy : MetricKind::kNegMse;
}

// The one hyperparameter of a member that is not its optimizer's: the
// probability of every dropout layer of a layer-list model (each layer's own
// p when unset), searched and perturbed like lr ([search_space.dropout]). The
// scheduler checks its range, the worker that the model has a dropout layer.
// Other numeric layer settings (widths, kernels) change the tensor layout,
// which every member of a population shares, so they cannot be searched.
inline constexpr char kDropoutHparam[] = "dropout";
inline bool IsDropoutProbability(double p) { return p >= 0 && p < 1; }

// Augmentation of training images ([N, C, H, W] data only), the standard
// CIFAR recipe: pad by `crop_padding` zero pixels on each side and crop back
// at a random offset ("random_crop:P"), then mirror left-right with
// probability 1/2 ("hflip"). Written in TOML as a list of those names.
struct Augmentation {
  int64_t crop_padding = 0;  // 0 = no crop
  bool hflip = false;
  bool any() const { return crop_padding > 0 || hflip; }
};

// InvalidArgument naming the entry for an unknown or repeated name, or a
// padding outside 1..64.
inline StatusOr<Augmentation> ParseAugmentation(const std::vector<std::string>& names) {
  Augmentation a;
  bool crop = false;
  for (const std::string& n : names) {
    if (n == "hflip" && !a.hflip) {
      a.hflip = true;
    } else if (n.rfind("random_crop:", 0) == 0 && !crop) {
      const std::string v = n.substr(12);
      int64_t p = 0;
      bool ok = !v.empty() && v.size() <= 2;
      for (char c : v) {
        ok = ok && c >= '0' && c <= '9';
        if (ok) p = p * 10 + (c - '0');
      }
      if (!ok || p < 1 || p > 64) {
        return Status::InvalidArgument("augment \"" + n + "\": the padding must be 1..64");
      }
      a.crop_padding = p;
      crop = true;
    } else {
      return Status::InvalidArgument("augment \"" + n +
                                     "\" is unknown or repeated (expected random_crop:P, hflip)");
    }
  }
  return a;
}

inline std::vector<std::string> AugmentationNames(const Augmentation& a) {
  std::vector<std::string> out;
  if (a.crop_padding > 0) out.push_back("random_crop:" + std::to_string(a.crop_padding));
  if (a.hflip) out.push_back("hflip");
  return out;
}

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_TASK_H_
