// The worker's crash-test seam, as in the scheduler: CKPT_KILL_AT=POINT:N
// makes this process SIGKILL itself the N-th time it passes POINT (counted
// per process, so a restarted worker dies again at its own N-th pass;
// ckpt/base/kill_point.h parses it and names the points). The worker's points:
//   worker.decode       a TRAIN record decoded, still in the ring (not released)
//   worker.train        a slot starts a member-interval; the kill falls half
//                       the previous interval's compute time later, mid-training
//   worker.encode       a RESULT reserved in the ring, its state half written
//   worker.result_sent  a RESULT committed to the ring, before the scheduler
//                       has read it
// Any other point (the scheduler's) is ignored here; a malformed value is
// ignored too (the scheduler refuses it before a worker is started).
// CKPT_KILL_ONCE=FILE makes the kill happen only in the process that creates
// FILE (O_EXCL): one kill over all the worker's restarts, so that a point hit
// early in every incarnation cannot stop the run from progressing.
//
// Thread-safety: Hit, At and AtAfter may be called from any thread.
#ifndef CKPT_WORKER_SRC_KILL_POINTS_H_
#define CKPT_WORKER_SRC_KILL_POINTS_H_

#include <atomic>
#include <cstdint>
#include <string>

namespace ckpt::worker {

class KillPoints {
 public:
  // Reads CKPT_KILL_AT and CKPT_KILL_ONCE.
  KillPoints();
  // True the N-th time `point` is passed.
  bool Hit(const char* point);
  // Dies (SIGKILL) at the armed pass of `point`.
  void At(const char* point);
  // Mid-training: at the armed pass of `point`, SIGKILL `after_s` seconds
  // from now, from a thread of its own.
  void AtAfter(const char* point, double after_s);

 private:
  std::string point_;
  std::string once_file_;
  int64_t n_ = 0;
  std::atomic<int64_t> hits_{0};
};

// The process's kill points, read from the environment on first use.
KillPoints& WorkerKillPoints();

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_SRC_KILL_POINTS_H_
