// How an experiment's progress and results read as text: the progress line
// and the summary table of `ckpt-scheduler run`, which `ckpt-tool status`,
// `watch` and `top` show live from the control socket. One rendering for both,
// from the plain values of summary.h (part of ckpt::control_client, so the
// tool needs nothing of the scheduler's engine).
//
// Thread-safety: pure functions.
#ifndef CKPT_SCHEDULER_SUMMARY_TEXT_H_
#define CKPT_SCHEDULER_SUMMARY_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::scheduler {

// "42s", "3m07s", "2h05m"; "?" for a negative or non-finite time.
std::string FormatDuration(double seconds);

// One experiment's progress line (no newline): phase, interval, members done,
// samples/s, best and median validation score of the members that have one,
// exploits, ETA.
//   "demo: training interval 3/6 | members done 0/8 | 812 samples/s | best 0.7712
//    median 0.7020 | exploits 4 | ETA 1m10s"
std::string ProgressLine(const ExperimentSummary& summary);

// The summary table: a heading line ("experiment demo: done, 8 members, 6
// intervals, 9 exploits"), a column header and the best `max_members` members
// (summary.members is best first), each line "\n"-terminated.
std::string SummaryTable(const ExperimentSummary& summary, size_t max_members);

// A worker as a person reads it: "starting" (no HELLO yet), "idle", "training"
// (members in flight), "restarting" (waiting out its backoff), "given up".
const char* WorkerStateName(const WorkerStatus& worker);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_SUMMARY_TEXT_H_
