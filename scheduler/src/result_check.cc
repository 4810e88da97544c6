#include "result_check.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <system_error>

namespace ckpt::scheduler {
namespace {

// Shortest text that reads back as `v` ("1e+308", "0.5", "nan", "-inf").
std::string Num(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "?";
  return std::string(buf, end);
}

std::string Num(int64_t v) { return std::to_string(v); }

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string TensorText(const StateLayout::Tensor& t) {
  return std::string(format::DTypeName(t.dtype)) + " " + ShapeText(t.shape);
}

std::string Who(const SentTask& sent) {
  return "member " + sent.experiment + "/" + sent.member + ", " + sent.worker;
}

// A score of the experiment's metric on `split` ("val", "test"): in its range,
// or "not evaluated" (format::kNotEvaluated, null on the wire) where
// `allow_unevaluated`; exactly that when `must_be_unevaluated`.
Status CheckScore(const SentTask& sent, std::string_view split, double v, bool allow_unevaluated,
                  bool must_be_unevaluated) {
  const std::string name = format::SplitMetricName(split, sent.rules.metric);
  if (must_be_unevaluated) {
    if (!format::IsEvaluated(v)) return Status::OK();
    return Status::InvalidArgument(
        fmt::format("{}: {} {}, expected none (the experiment does not validate: eval_size = 0)",
                    Who(sent), name, Num(v)));
  }
  if (allow_unevaluated && !format::IsEvaluated(v)) return Status::OK();
  std::string range;
  if (format::InMetricRange(sent.rules.metric, v, &range)) return Status::OK();
  return Status::InvalidArgument(
      fmt::format("{}: {} {} outside {}", Who(sent), name, Num(v), range));
}

Status CheckNonNegative(const SentTask& sent, const char* field, double v) {
  if (std::isfinite(v) && v >= 0) return Status::OK();
  return Status::InvalidArgument(Who(sent) + ": " + field + " " + Num(v) +
                                 ", expected a finite value >= 0");
}

Status CheckEqual(const SentTask& sent, const char* field, int64_t got, int64_t want,
                  const std::string& why) {
  if (got == want) return Status::OK();
  return Status::InvalidArgument(Who(sent) + ": " + field + " " + Num(got) + ", expected " +
                                 Num(want) + " (" + why + ")");
}

// The state's metadata against the task (the file comment's "metadata").
Status CheckStateMetadata(const SentTask& sent, const format::CheckpointMeta& meta,
                          int64_t samples) {
  const std::string want_optimizer = format::OptimizerKindName(sent.rules.optimizer);
  if (meta.optimizer != want_optimizer) {
    return Status::InvalidArgument(Who(sent) + ": state ckpt.optimizer \"" +
                                   meta.optimizer.substr(0, 32) + "\", expected \"" +
                                   want_optimizer + "\" (the experiment's)");
  }
  for (const auto& [name, value] : sent.hparams) {
    auto it = meta.hparams.find(name);
    if (it == meta.hparams.end()) {
      return Status::InvalidArgument(Who(sent) + ": state ckpt.hparams has no " + name +
                                     ", expected " + Num(value) + " (the TRAIN's)");
    }
    // Exact: the worker stores the value it was sent, and JSON carries
    // doubles exactly.
    if (!(it->second == value)) {
      return Status::InvalidArgument(Who(sent) + ": state ckpt.hparams " + name + " " +
                                     Num(it->second) + ", expected " + Num(value) +
                                     " (the TRAIN's)");
    }
  }
  const uint64_t want_cursor = sent.start_cursor + static_cast<uint64_t>(samples);
  if (meta.data_cursor != want_cursor) {
    return Status::InvalidArgument(
        Who(sent) + ": state ckpt.data_cursor " + std::to_string(meta.data_cursor) + ", expected " +
        std::to_string(want_cursor) + " (the sent state's " + std::to_string(sent.start_cursor) +
        " + " + Num(samples) + " samples)");
  }
  if (sent.data_seed && meta.data_seed != *sent.data_seed) {
    return Status::InvalidArgument(Who(sent) + ": state ckpt.data_seed " +
                                   std::to_string(meta.data_seed) + ", expected " +
                                   std::to_string(*sent.data_seed) + " (the sent state's)");
  }
  return Status::OK();
}

}  // namespace

ResultRules ResultRulesFor(const records::ExperimentConfig& config) {
  ResultRules rules;
  rules.metric = config.Metric();
  rules.validates = config.eval_size > 0;
  rules.batch_size = config.batch_size;
  rules.optimizer = config.optimizer;
  return rules;
}

StateLayout LayoutOf(const format::CheckpointView& view) {
  StateLayout layout;
  for (const auto& t : view.tensors()) layout.tensors[t.name] = {t.dtype, t.shape};
  return layout;
}

Status CompareLayouts(std::string_view who, const StateLayout& want, const StateLayout& got) {
  const std::string w(who);
  for (const auto& [name, t] : want.tensors) {
    auto it = got.tensors.find(name);
    if (it == got.tensors.end()) {
      return Status::InvalidArgument(
          fmt::format("{}: state tensor {} missing, expected {}", w, name, TensorText(t)));
    }
    if (it->second.dtype != t.dtype) {
      return Status::InvalidArgument(fmt::format("{}: state tensor {} dtype {}, expected {}", w,
                                                 name, format::DTypeName(it->second.dtype),
                                                 format::DTypeName(t.dtype)));
    }
    if (it->second.shape != t.shape) {
      return Status::InvalidArgument(fmt::format("{}: state tensor {} shape {}, expected {}", w,
                                                 name, ShapeText(it->second.shape),
                                                 ShapeText(t.shape)));
    }
  }
  for (const auto& [name, t] : got.tensors) {
    if (want.tensors.count(name) == 0) {
      return Status::InvalidArgument(fmt::format(
          "{}: state tensor {} ({}) unexpected: not in the member's layout of {} tensors", w, name,
          TensorText(t), want.tensors.size()));
    }
  }
  return Status::OK();
}

Status CheckResult(const SentTask& sent, const ipc::Result& r, StateLayout* result_layout,
                   std::optional<format::CheckpointView>* state_view) {
  if (r.experiment != sent.experiment || r.member != sent.member) {
    return Status::InvalidArgument(Who(sent) + ": member \"" + r.experiment + "/" + r.member +
                                   "\", expected \"" + sent.experiment + "/" + sent.member + "\"");
  }
  const bool validates = sent.rules.validates;
  CKPT_RETURN_IF_ERROR(CheckScore(sent, "val", r.val_score, /*allow_unevaluated=*/true,
                                  /*must_be_unevaluated=*/!validates));
  if (sent.eval_only) {
    CKPT_RETURN_IF_ERROR(CheckScore(sent, "test", r.test_score, /*allow_unevaluated=*/true,
                                    /*must_be_unevaluated=*/false));
  }
  const int64_t steps = sent.eval_only ? 0 : sent.steps;
  // Both products are bounded by the configuration (steps_per_interval and
  // batch_size), and start_step by a stored state; a sum that would overflow
  // cannot be the step asked for, so it is refused rather than computed.
  if (sent.start_step < 0 || steps < 0 ||
      sent.start_step > std::numeric_limits<int64_t>::max() - steps) {
    return Status::InvalidArgument(Who(sent) + ": step " + Num(r.step) + " cannot answer " +
                                   Num(steps) + " steps from step " + Num(sent.start_step));
  }
  CKPT_RETURN_IF_ERROR(CheckEqual(sent, "step", r.step, sent.start_step + steps,
                                  "step " + Num(sent.start_step) + " + " + Num(steps) + " steps"));
  int64_t want_samples = 0;
  if (__builtin_mul_overflow(steps, sent.rules.batch_size, &want_samples)) {
    return Status::InvalidArgument(Who(sent) + ": samples " + Num(r.samples) + " cannot answer " +
                                   Num(steps) + " steps of " + Num(sent.rules.batch_size));
  }
  CKPT_RETURN_IF_ERROR(
      CheckEqual(sent, "samples", r.samples, want_samples,
                 Num(steps) + " steps x batch size " + Num(sent.rules.batch_size)));
  CKPT_RETURN_IF_ERROR(CheckNonNegative(sent, "train_loss", r.train_loss));
  CKPT_RETURN_IF_ERROR(CheckNonNegative(sent, "compute_s", r.compute_s));
  if (sent.eval_only) return Status::OK();

  if (r.state.size == 0 || r.state.data == nullptr) {
    return Status::InvalidArgument(Who(sent) + ": state of " +
                                   Num(static_cast<int64_t>(r.state.size)) +
                                   " bytes, expected a checkpoint");
  }
  auto view = format::ParseCheckpoint(r.state.data, r.state.size);
  if (!view.ok()) {
    return Status::Corruption(Who(sent) + ": state: " + view.status().message());
  }
  CKPT_RETURN_IF_ERROR(
      CheckEqual(sent, "state ckpt.step", view->meta().step, r.step, "the result's step"));
  StateLayout got = LayoutOf(*view);
  if (sent.layout) CKPT_RETURN_IF_ERROR(CompareLayouts(Who(sent), *sent.layout, got));
  CKPT_RETURN_IF_ERROR(CheckStateMetadata(sent, view->meta(), want_samples));
  if (result_layout != nullptr) *result_layout = std::move(got);
  if (state_view != nullptr) *state_view = std::move(*view);
  return Status::OK();
}

}  // namespace ckpt::scheduler
