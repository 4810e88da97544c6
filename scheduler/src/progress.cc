#include "progress.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "ckpt/scheduler/scheduler.h"

namespace ckpt::scheduler {

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const long long t = static_cast<long long>(s);
  if (s < 60) return fmt::format("{:.0f}s", s);
  if (s < 3600) return fmt::format("{}m{:02d}s", t / 60, t % 60);
  return fmt::format("{}h{:02d}m", t / 3600, t % 3600 / 60);
}

std::string ProgressLine(const Experiment& e, Clock::time_point now) {
  const auto& c = e.config();
  const ExperimentSummary s = e.Summary(now);
  std::vector<double> scores;
  int done = 0, remaining = 0;
  for (const auto& m : e.members()) {
    if (std::isfinite(m.state.score)) scores.push_back(m.state.score);
    if (m.state.status == records::MemberStatus::kDone) ++done;
    if (m.active()) remaining += std::max(0, c.intervals - m.state.interval);
  }
  std::sort(scores.begin(), scores.end());
  const double rate = s.wall_s > 0 ? static_cast<double>(s.train_samples) / s.wall_s : 0;
  const double per_interval =
      s.member_intervals > 0 ? s.wall_s / static_cast<double>(s.member_intervals) : NAN;
  const char* phase = e.phase() == Phase::kDone
                          ? "done"
                          : (e.phase() == Phase::kFinalEval ? "final eval" : "training");
  return fmt::format(
      "{}: {} interval {}/{} | members done {}/{} | {:.0f} samples/s | best {:.4f} median {:.4f} "
      "| exploits {} | ETA {}",
      e.id(), phase, e.phase() == Phase::kTraining ? e.generation() : c.intervals, c.intervals,
      done, e.members().size(), rate, scores.empty() ? 0.0 : scores.back(),
      scores.empty() ? 0.0 : scores[scores.size() / 2], e.exploits(),
      e.phase() == Phase::kDone ? "0s" : FormatDuration(per_interval * remaining));
}

Progress::Progress(FILE* out)
    : out_(out),
      tty_(out != nullptr && isatty(fileno(out)) == 1),
      last_line_(Clock::now() - std::chrono::hours(1)) {}

void Progress::Print(const std::vector<const Experiment*>& experiments, Clock::time_point now,
                     bool force_line) {
  if (out_ == nullptr) return;
  if (!tty_ && !force_line && now - last_line_ < std::chrono::seconds(10)) return;
  last_line_ = now;
  for (const Experiment* e : experiments) {
    const std::string line = ProgressLine(*e, now);
    if (tty_ && !force_line) {
      fmt::print(out_, "\r\033[K{}", line);
    } else {
      fmt::print(out_, "{}{}\n", tty_ ? "\r\033[K" : "", line);
    }
  }
  std::fflush(out_);
}

void Progress::Close() {
  if (out_ != nullptr && tty_) {
    std::fputs("\n", out_);
    std::fflush(out_);
  }
}

void PrintSummary(const ExperimentSummary& s, FILE* out) {
  fmt::print(out, "\nexperiment {}: {}, {} members, {} intervals, {} exploits\n", s.id, s.status,
             s.population, s.intervals, s.exploits);
  fmt::print(out, "{:<8} {:<8} {:>9} {:>9} {:>8}  {}\n", "member", "status", "val_acc", "test_acc",
             "version", "hyperparameters");
  int shown = 0;
  for (const auto& m : s.members) {
    if (shown++ >= 10) break;
    std::string hp;
    for (const auto& [k, v] : m.hparams)
      hp += fmt::format("{}{}={:.4g}", hp.empty() ? "" : " ", k, v);
    const std::string test = m.test_acc >= 0 ? fmt::format("{:.4f}", m.test_acc) : "-";
    fmt::print(out, "{:<8} {:<8} {:>9.4f} {:>9} {:>8}  {}\n", m.member, m.status, m.val_acc, test,
               m.version, hp);
  }
  fmt::print(out,
             "store: {} (run the same command again to see this table; "
             "ckpt-tool --store {} ls {} for every member)\n",
             s.store_path, s.store_path, s.id);
}

}  // namespace ckpt::scheduler
