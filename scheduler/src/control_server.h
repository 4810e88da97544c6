// ControlServer: the scheduler's control API on a Unix socket, JSON lines
// (private to ckpt::scheduler; serve mode only).
//
// Requests are one JSON object per line ({"verb": "...", ...}), answered with
// one JSON object per line ({"ok": true, ...} or {"ok": false, "error": "..."}).
// The verbs and their fields are documented in ckpt/scheduler/control_client.h.
// The socket lives in a 0750 runtime directory; each peer's uid/gid (SO_PEERCRED)
// is checked against the allowed users and groups before any request is read.
// Requests are validated and bounded in size; a malformed, oversized or unknown
// request gets an error reply naming the problem; a slow or idle client never
// blocks others (every socket is asynchronous on the event loop, with an idle
// timeout).
//
// Thread-safety: lives on the event loop of its ControlTarget.
#ifndef CKPT_SCHEDULER_CONTROL_SERVER_H_
#define CKPT_SCHEDULER_CONTROL_SERVER_H_

#include <memory>

#include "ckpt/base/status.h"
#include "ckpt/scheduler/scheduler.h"
#include "control_target.h"

namespace ckpt::scheduler {

class ControlServer {
 public:
  virtual ~ControlServer() = default;

  // Creates the runtime directory (0750) when missing, refuses to replace the
  // socket of a live server (AlreadyExists naming the path), removes a stale
  // one, binds and listens. REQUIRES: called on target->io()'s thread.
  static StatusOr<std::unique_ptr<ControlServer>> Start(ControlTarget* target,
                                                        const ControlOptions& options);

  // Applies what can change at run time (allowed users and groups, limits).
  // Returns a line saying what could not be applied, or "" when all was.
  virtual std::string Reconfigure(const ControlOptions& options) = 0;

  // Stops accepting, closes every connection and removes the socket file.
  virtual void Close() = 0;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_CONTROL_SERVER_H_
