// The ckpt-worker process: one per device, serving one scheduler through the
// shared-memory segment the scheduler created.
//
// Protocol (ckpt/ipc/messages.h): the worker says HELLO (device, memory, slots,
// fusion support) as soon as it has opened the segment. CONFIGURE makes a
// Trainer for an experiment (the dataset is loaded once, onto the device) and,
// with fusion "auto", measures plain against fused training briefly and keeps
// the faster; a second HELLO says the mode and capacity. Each TRAIN (member
// "exp/member") is answered by exactly one RESULT or FAILED; a TRAIN that
// cannot be trained (unknown experiment, malformed or mismatched state,
// non-finite values) is answered FAILED with the reason and the worker goes on.
// STATS goes out about every second. SHUTDOWN, or the scheduler's death, ends
// the loop after the slot threads stop.
//
// Threads: the calling thread receives; `slots` threads train; one thread
// sends STATS. Sends are serialized (the result ring has one producer).
#ifndef CKPT_WORKER_WORKER_LOOP_H_
#define CKPT_WORKER_WORKER_LOOP_H_

#include <chrono>
#include <string>

#include "ckpt/format/status.h"

namespace ckpt::worker {

struct WorkerOptions {
  // Segment created by the scheduler. Required.
  std::string segment;
  // "cpu" or "cuda:N". Default: "cpu".
  std::string device = "cpu";
  // Members (plain) or fused groups trained at once. Default: 2.
  int slots = 2;
  // "auto" | "plain" | "fused". Default: "auto".
  std::string fusion = "auto";
  // K of a fused group. Default: 8.
  int fusion_width = 8;
  // Intra-op threads of each slot. Default: 1.
  int intra_op_threads = 1;
  // Seconds ChooseMode measures each mode for, with fusion "auto". Default: 1.
  double probe_seconds = 1.0;
  // A scheduler silent this long is treated as dead. Default: 10 s.
  std::chrono::milliseconds heartbeat_timeout{10000};
};

// Serves until SHUTDOWN (OK) or the scheduler is gone (Unavailable).
// NotFound / Corruption when the segment cannot be opened.
Status RunWorker(const WorkerOptions& options);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_WORKER_LOOP_H_
