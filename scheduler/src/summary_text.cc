#include "ckpt/scheduler/summary_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "ckpt/records/status.h"

namespace ckpt::scheduler {

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = static_cast<long long>(s);
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, t % 3600 / 60);
}

std::string ProgressLine(const ExperimentSummary& s) {
  std::vector<double> scores;
  int done = 0, remaining = 0;
  for (const auto& m : s.members) {
    // A member scores once it has trained an interval.
    if (m.intervals_done > 0 && std::isfinite(m.val_score)) scores.push_back(m.val_score);
    if (m.intervals_done >= s.intervals) ++done;
    if (m.status != records::MemberStatus::kStopped && m.status != records::MemberStatus::kFailed) {
      remaining += std::max(0, s.intervals - m.intervals_done);
    }
  }
  std::sort(scores.begin(), scores.end());
  const double rate = s.wall_s > 0 ? static_cast<double>(s.train_samples) / s.wall_s : 0;
  const double per_interval =
      s.member_intervals > 0 ? s.wall_s / static_cast<double>(s.member_intervals) : NAN;
  return fmt::format(
      "{}: {} interval {}/{} | members done {}/{} | {:.0f} samples/s | best {} {:.4f} median "
      "{:.4f} | exploits {} | ETA {}",
      s.id, records::ExperimentPhaseName(s.phase),
      s.phase == records::ExperimentPhase::kTraining ? s.generation : s.intervals, s.intervals,
      done, s.members.size(), rate, format::SplitMetricName("val", s.metric),
      scores.empty() ? 0.0 : scores.back(), scores.empty() ? 0.0 : scores[scores.size() / 2],
      s.exploits,
      s.phase == records::ExperimentPhase::kDone ? "0s" : FormatDuration(per_interval * remaining));
}

std::string SummaryTable(const ExperimentSummary& s, size_t max_members) {
  std::string out =
      fmt::format("experiment {}: {}, {} members, {} intervals, {} exploits\n", s.id,
                  records::ExperimentStatusName(s.status), s.population, s.intervals, s.exploits);
  // The scores under the metric's name: "val_accuracy", "test_neg_mse".
  const std::string val_name = format::SplitMetricName("val", s.metric);
  const std::string test_name = format::SplitMetricName("test", s.metric);
  const size_t width = std::max<size_t>(9, test_name.size());
  auto score = [](double v) { return format::IsEvaluated(v) ? fmt::format("{:.4f}", v) : "-"; };
  out += fmt::format("{:<8} {:<8} {:>{}} {:>{}} {:>8}  {}\n", "member", "status", val_name, width,
                     test_name, width, "version", "hyperparameters");
  size_t shown = 0;
  for (const auto& m : s.members) {
    if (shown++ >= max_members) break;
    std::string hp;
    for (const auto& [k, v] : m.hparams) {
      hp += fmt::format("{}{}={:.4g}", hp.empty() ? "" : " ", k, v);
    }
    out += fmt::format("{:<8} {:<8} {:>{}} {:>{}} {:>8}  {}\n", m.member,
                       records::MemberStatusName(m.status), score(m.val_score), width,
                       score(m.test_score), width, m.version, hp);
  }
  return out;
}

const char* WorkerStateName(const WorkerStatus& w) {
  if (w.given_up) return "given up";
  if (w.pid == 0 && !w.ready) return "restarting";
  if (!w.ready) return "starting";
  return w.busy > 0 ? "training" : "idle";
}

}  // namespace ckpt::scheduler
