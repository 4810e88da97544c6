// Who a process is, and whether it still runs: pid + process start time
// (/proc/PID/stat field 22) + boot id (/proc/sys/kernel/random/boot_id). A
// recycled pid has another start time; a segment left over from another boot
// has another boot id.
//
// Thread-safety: pure functions over /proc.
#ifndef CKPT_IPC_SRC_LIVENESS_H_
#define CKPT_IPC_SRC_LIVENESS_H_

#include <cstdint>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::ipc::internal {

struct ProcessIdentity {
  uint64_t pid = 0;
  uint64_t start_time = 0;
  uint8_t boot_id[16] = {};
};

// This process. IOError when /proc cannot be read.
StatusOr<ProcessIdentity> SelfIdentity();

// This host's boot id, read once. IOError when /proc cannot be read.
StatusOr<const uint8_t*> BootId();

// True when the process `id` names still runs on this boot and is not a zombie.
// Otherwise false, with the reason in *why ("exited", "pid 12 was reused", ...).
bool ProcessAlive(const ProcessIdentity& id, std::string* why);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_LIVENESS_H_
