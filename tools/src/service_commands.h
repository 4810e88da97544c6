// The commands that drive a running `ckpt-scheduler serve` through its
// control socket (ckpt/scheduler/control_client.h): submit, status, watch,
// pause, resume, stop, workers, and top (top.cc). The socket is
// ToolOptions::socket_path, else $CKPT_SOCKET, else /run/ckpt/control.sock.
//
// Errors a person can act on: no service at the socket ("no ckpt-scheduler
// answers at PATH: is the service running? ..."), a socket they may not use
// ("permission denied ...: add yourself to group G"), an experiment that does
// not exist (the reply names the ones that do). Exit codes as every command
// (tool.h): 0 ok, 1 refused / not found / ended badly, 2 usage or a bad file.
//
// Thread-safety: each command runs on the calling thread.
#ifndef CKPT_TOOLS_SRC_SERVICE_COMMANDS_H_
#define CKPT_TOOLS_SRC_SERVICE_COMMANDS_H_

#include <string>

#include "ckpt/base/status.h"
#include "tool.h"

namespace ckpt::tool {

struct SubmitOptions {
  // The experiment's TOML file. Parsed here first with the scheduler's own
  // parser: a bad file is an InvalidArgument naming the key and its line, and
  // nothing is sent. Required.
  std::string file;
  // Follow the experiment to its end (as watch): OK when it is done,
  // Aborted when it was stopped or failed. Default: false.
  bool wait = false;
  // Milliseconds between looks while waiting. Default: 1000.
  int poll_ms = 1000;
};
Status Submit(const ToolOptions& tool, const SubmitOptions& options);

// The service (version, host, uptime, store, workers, each experiment's
// progress line) when `experiment` is "", else that experiment's progress
// line and summary table (every member).
Status ServiceStatus(const ToolOptions& tool, const std::string& experiment);

enum class ControlVerb { kPause, kResume, kStop };
// Pauses (no new intervals; in-flight ones finish), resumes or stops an
// experiment. FailedPrecondition when it has ended.
Status Control(const ToolOptions& tool, ControlVerb verb, const std::string& experiment);

// Each worker: index, host, device, slots, state, members in flight,
// samples/s, restarts, pid.
Status Workers(const ToolOptions& tool);

struct WatchOptions {
  std::string experiment;
  // Milliseconds between looks. Default: 1000.
  int poll_ms = 1000;
};
// The experiment's progress line (on a terminal, with its table redrawn in
// place; elsewhere a line per committed interval; with --json one summary per
// line) until it ends. OK when it ended done; Aborted when stopped or failed.
Status Watch(const ToolOptions& tool, const WatchOptions& options);

struct TopOptions {
  // Milliseconds between refreshes. Default: 1000.
  int refresh_ms = 1000;
  // Refreshes before exiting; 0 = until `q` (terminal) or forever (plain
  // text). Default: 0.
  int iterations = 0;
};
// A full-screen live view of the whole service (ncurses) when stdout is a
// terminal, `q` quits; plain text (a frame per refresh) otherwise.
Status Top(const ToolOptions& tool, const TopOptions& options);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_SERVICE_COMMANDS_H_
