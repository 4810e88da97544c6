#include "progress.h"

#include <spdlog/fmt/fmt.h>
#include <unistd.h>

#include "ckpt/scheduler/scheduler.h"
#include "ckpt/scheduler/summary_text.h"

namespace ckpt::scheduler {

std::string ProgressLine(const Experiment& e, Clock::time_point now) {
  return ProgressLine(e.Summary(now));
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
  fmt::print(out, "\n{}", SummaryTable(s, 10));
  fmt::print(out,
             "store: {} (run the same command again to see this table; "
             "ckpt-tool --store {} ls {} for every member)\n",
             s.store_path, s.store_path, s.id);
}

}  // namespace ckpt::scheduler
