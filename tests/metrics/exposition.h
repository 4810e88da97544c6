// A strict reader of the Prometheus text exposition format 0.0.4, for tests
// that check what the metrics listener serves.
//
// Strict means: every line is a # HELP, a # TYPE, another comment, a blank
// line or a sample; names and label names match Prometheus' grammar; label
// values use only the \\ \" \n escapes; values are what Go's ParseFloat
// takes (NaN and Inf in any case included); a family's HELP and TYPE come at most once and before
// its samples; its samples are contiguous; a series (name and label set) appears once; a counter is
// finite and not negative; a histogram has _bucket series with an `le` label, cumulative and ending
// at +Inf, equal to its _count, and a _sum, per label set. A violation is an InvalidArgument naming
// the line.
//
// Thread-safety: values and a pure function.
#ifndef CKPT_TESTS_METRICS_EXPOSITION_H_
#define CKPT_TESTS_METRICS_EXPOSITION_H_

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::testing {

using LabelSet = std::map<std::string, std::string>;

struct ExpositionSample {
  std::string name;  // as written: ckpt_x_bucket, ckpt_x_sum, ...
  LabelSet labels;
  double value = 0;
};

struct ExpositionFamily {
  std::string name;
  std::string type;  // counter | gauge | histogram | summary | untyped
  std::string help;
  std::vector<ExpositionSample> samples;

  // Label sets of the family's series, with a histogram's `le` left out and
  // its _bucket/_sum/_count merged: one entry per series a user would see.
  std::vector<LabelSet> SeriesLabels() const;
  // Label names used by any sample, `le` excluded.
  std::vector<std::string> LabelNames() const;
  // The value of the sample `name` (a family name plus suffix, or the family
  // name itself) with exactly `labels`; nullptr when absent.
  const ExpositionSample* Find(std::string_view name, const LabelSet& labels) const;
};

using Exposition = std::map<std::string, ExpositionFamily>;

StatusOr<Exposition> ParseExposition(std::string_view text);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_EXPOSITION_H_
