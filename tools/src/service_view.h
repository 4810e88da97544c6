// Text views of a running service (one `status` reply): what `ckpt-tool
// status`, `workers` and `top` print or draw, line by line, so that the
// terminal UI (top.cc) and the plain output show the same thing.
//
// Thread-safety: pure functions.
#ifndef CKPT_TOOLS_SRC_SERVICE_VIEW_H_
#define CKPT_TOOLS_SRC_SERVICE_VIEW_H_

#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/scheduler/control_client.h"
#include "tool.h"

namespace ckpt::tool {

// The service's control client (service_commands.h says which socket).
// Errors: ControlClient::Connect's.
StatusOr<std::unique_ptr<scheduler::ControlClient>> ConnectService(const ToolOptions& tool);

// "ckpt-scheduler 0.1.0 on HOST, pid N, up 3m07s", store and socket, the
// workers in one line, then each experiment: status, members by state, and
// its progress line (ckpt/scheduler/summary_text.h).
std::vector<std::string> ServiceView(const scheduler::ServiceStatus& status);

// One row per worker: index, host, device, slots, state, members in flight,
// samples/s, restarts, pid, resident memory and device allocator memory (its
// last STATS), and its GPU's utilization and memory (NVML, local workers on a
// GPU); with a header row.
std::vector<std::string> WorkersView(const scheduler::ServiceStatus& status);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_SERVICE_VIEW_H_
