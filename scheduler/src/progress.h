// Progress: how a run looks on a terminal and in a log (private to
// ckpt::scheduler): one line per experiment (interval, members done,
// samples/s, best and median score, exploits, ETA), rewritten in place on a
// TTY, at most every 10 s otherwise (journald, a file), so a long run's log
// stays readable.
//
// Thread-safety: one thread (the event loop).
#ifndef CKPT_SCHEDULER_PROGRESS_H_
#define CKPT_SCHEDULER_PROGRESS_H_

#include <cstdio>
#include <string>
#include <vector>

#include "experiment.h"

namespace ckpt::scheduler {

// One experiment's progress line (ckpt/scheduler/summary_text.h).
std::string ProgressLine(const Experiment& e, Clock::time_point now);

class Progress {
 public:
  // `out` nullptr: no output.
  explicit Progress(FILE* out);

  // Writes each experiment's line: in place on a TTY unless `force_line`;
  // elsewhere only when `force_line` or 10 s have passed since the last.
  void Print(const std::vector<const Experiment*>& experiments, Clock::time_point now,
             bool force_line);
  // Ends an in-place line (before the summary table).
  void Close();

 private:
  FILE* const out_;
  const bool tty_;
  Clock::time_point last_line_;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_PROGRESS_H_
