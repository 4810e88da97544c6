// The ckpt-worker process: one per device, serving one scheduler through the
// shared-memory segment the scheduler created (a spawned worker), or over TCP
// to a scheduler that listens for workers (--connect: a worker on another
// host, started by e.g. Slurm; ckpt/ipc/tcp_channel.h).
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

#include "ckpt/base/status.h"
#include "ckpt/ipc/fusion_mode.h"

namespace ckpt::worker {

struct WorkerOptions {
  // Segment created by the scheduler. Exactly one of segment and connect.
  std::string segment;
  // "HOST:PORT" of a scheduler listening for workers. Exactly one of segment
  // and connect.
  std::string connect;
  // With connect: the file holding the experiment's secret (mode 0600, owned
  // by this user; ckpt/ipc/tcp_channel.h LoadSecretFile). Required with connect.
  std::string secret_file;
  // With connect: how long to keep trying to reach the scheduler (one that is
  // not up yet, or restarting). Default: 60 s.
  std::chrono::milliseconds connect_timeout{60000};
  // "cpu", "cuda:N", or "auto" (cuda:0 when the NVIDIA driver shows a GPU this
  // process may use, else cpu). Default: "cpu".
  std::string device = "cpu";
  // Members (plain) or fused groups trained at once. Default: 2.
  int slots = 2;
  // Default: kAuto.
  ipc::FusionMode fusion = ipc::FusionMode::kAuto;
  // K of a fused group. Default: 8.
  int fusion_width = 8;
  // Intra-op threads of each slot. Default: 1.
  int intra_op_threads = 1;
  // On a GPU: TF32 convolutions and matrix products for every experiment
  // (model::TrainerOptions::allow_tf32). Default: false.
  bool allow_tf32 = false;
  // Seconds ChooseMode measures each mode for, with fusion "auto". Default: 1.
  double probe_seconds = 1.0;
  // A scheduler silent this long is treated as dead. Default: 10 s.
  std::chrono::milliseconds heartbeat_timeout{10000};
};

// Serves until SHUTDOWN (OK) or the scheduler is gone (Unavailable).
// NotFound / Corruption when the segment cannot be opened. With connect:
// Unavailable when no scheduler answered within connect_timeout;
// FailedPrecondition when the secret file is refused or the scheduler refused
// this worker's proof (or could not prove itself); InvalidArgument when both or
// neither of segment and connect are given.
Status RunWorker(const WorkerOptions& options);

}  // namespace ckpt::worker

#endif  // CKPT_WORKER_WORKER_LOOP_H_
