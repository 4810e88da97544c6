// Dispatcher: hands queued member-intervals to workers with room (private to
// ckpt::scheduler). The worker with the most free capacity goes first;
// experiments with work share workers round-robin, one task at a time, so a
// large experiment cannot starve a small one.
//
// Thread-safety: one thread (the event loop).
#ifndef CKPT_SCHEDULER_DISPATCHER_H_
#define CKPT_SCHEDULER_DISPATCHER_H_

#include <cstdint>
#include <vector>

#include "experiment.h"
#include "worker_handle.h"

namespace ckpt::scheduler {

// Where tasks go: WorkerPool, or a test's recorder.
class TaskSink {
 public:
  virtual ~TaskSink() = default;
  // The worker with the most free capacity, counting `per_slot` in-flight
  // tasks per slot; -1 when none has room.
  virtual int PickFree(int per_slot) const = 0;
  // REQUIRES: PickFree returned `worker`.
  virtual void Send(size_t worker, Task task) = 0;
};

class Dispatcher {
 public:
  // Members in flight per worker slot: one training, one whose state is
  // already in the worker and waits for the slot, so that the transfer and
  // the commit of one member overlap another's training (null intervals: +20%
  // at 300 members).
  static constexpr int kInFlightPerSlot = 2;

  // Sends work until no worker has room or no experiment has work.
  // `experiments` in submission order.
  void Dispatch(TaskSink* sink, const std::vector<Experiment*>& experiments, Clock::time_point now);

 private:
  size_t rr_ = 0;
  uint64_t next_task_ = 1;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_DISPATCHER_H_
