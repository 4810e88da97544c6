// ckpt-tool's commands as a library: main.cc parses the command line into
// these option structs and calls one function; the tests call the binary.
//
// Every command returns OK or the reason it failed; ExitCodeFor maps that to
// the process exit code: 0 ok, 1 not found / verification failed / refused,
// 2 usage (InvalidArgument). Output goes to ToolOptions::out (text, or one
// JSON document with ToolOptions::json); a failure is one line on `err`,
// printed by the caller.
//
// Read commands open the store read-only (Store::OpenReadOnly): they work
// while a scheduler writes it and never block it. Restore, pin and unpin go
// through the control socket of a running `ckpt-scheduler serve` serving the
// store when one answers, and straight to the store otherwise. Import and gc
// need the store to themselves.
//
// Thread-safety: each command runs on the calling thread; not reentrant.
#ifndef CKPT_TOOLS_SRC_TOOL_H_
#define CKPT_TOOLS_SRC_TOOL_H_

#include <cstdint>
#include <cstdio>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::tool {

inline constexpr int kExitOk = 0;
inline constexpr int kExitFailed = 1;
inline constexpr int kExitUsage = 2;

// Where the store is when neither --store nor --socket says.
inline constexpr const char kDefaultStore[] = "var";
inline constexpr const char kServiceStore[] = "/var/lib/ckpt/store";
// The service's default socket (ckpt/scheduler/service.h).
inline constexpr const char kServiceSocket[] = "/run/ckpt/control.sock";

struct ToolOptions {
  // Store directory. Default: "" = ./var when it exists, else the service's
  // store (/var/lib/ckpt/store) when it exists, else the store of the
  // scheduler answering at the socket.
  std::string store_path;
  // Control socket of a running `ckpt-scheduler serve`. Default: "" =
  // $CKPT_SOCKET, else /run/ckpt/control.sock, used only when it answers and
  // serves the same store. An explicit socket that does not answer is an error.
  std::string socket_path;
  // One JSON document on `out` instead of text. Default: false.
  bool json = false;
  // Output and warnings. Default: stdout, stderr.
  FILE* out = stdout;
  FILE* err = stderr;
};

// 0 for OK, 2 for InvalidArgument, 1 otherwise.
int ExitCodeFor(const Status& status);

struct LsOptions {
  // "" lists experiments; an experiment id lists its members.
  std::string experiment;
  // Member order: "name", "score" (best first) or "step" (most first). Default: "name".
  std::string sort = "name";
};
Status Ls(const ToolOptions& tool, const LsOptions& options);

// `EXPERIMENT/MEMBER[@VERSION]`: manifest, metrics, hyperparameters, parent,
// reason, and the blob's tensors.
Status Show(const ToolOptions& tool, const std::string& ref);

struct LineageOptions {
  // `EXPERIMENT/MEMBER[@VERSION]`, or `EXPERIMENT` with dot/svg/png.
  std::string ref;
  // Graphviz DOT of the experiment's whole exploit graph on `out`. Default: false.
  bool dot = false;
  // Render that graph with Graphviz `dot` into this file. Default: "" (none).
  std::string svg;
  std::string png;
};
Status Lineage(const ToolOptions& tool, const LineageOptions& options);

struct PlotOptions {
  std::string experiment;
  // .svg or .png; gnuplot draws it. Required.
  std::string output;
  // Pixels. Default: 1000 wide, 260 per panel.
  int width = 1000;
  int panel_height = 260;
};
Status Plot(const ToolOptions& tool, const PlotOptions& options);

// Hyperparameters side by side; per tensor the L2 norm of B - A.
Status Diff(const ToolOptions& tool, const std::string& a, const std::string& b);

struct EventsOptions {
  std::string experiment;
  // First sequence number shown. Default: 1.
  uint64_t from_seq = 1;
  // Only events of this type ("exploit", "trained", ...). Default: "" (all).
  std::string type;
  // Keep reading new events until the experiment ends (done, stopped or
  // failed) or the process is interrupted. Default: false.
  bool follow = false;
  // --follow: milliseconds between looks at the store. Default: 500.
  int poll_ms = 500;
};
Status Events(const ToolOptions& tool, const EventsOptions& options);

struct ExportOptions {
  // `EXPERIMENT/MEMBER[@VERSION]`; with top > 0, `EXPERIMENT`.
  std::string ref;
  // File (.safetensors or .pt); with top > 0 a directory. Required.
  std::string output;
  // .pt: {"model", "optimizer", "ckpt"} instead of the bare state_dict. Default: false.
  bool optimizer = false;
  // Export the `top` best members (by head score) into `output`. Default: 0.
  int top = 0;
  // With top: "safetensors" or "pt". Default: "safetensors".
  std::string format = "safetensors";
};
Status Export(const ToolOptions& tool, const ExportOptions& options);

struct ImportOptions {
  // A .safetensors or .pt file.
  std::string file;
  // `EXPERIMENT/MEMBER`.
  std::string to;
};
Status Import(const ToolOptions& tool, const ImportOptions& options);

// `EXPERIMENT/MEMBER@VERSION`.
Status Restore(const ToolOptions& tool, const std::string& ref);
Status Pin(const ToolOptions& tool, const std::string& ref, bool pin);

// Every blob's checksums and every manifest's references, of the whole
// store or one experiment. FailedPrecondition ("verification failed: N
// problems") after printing the problems.
Status Verify(const ToolOptions& tool, const std::string& experiment);

struct GcOptions {
  // Report what would be released; change nothing. Default: false.
  bool dry_run = false;
  // Retention settings to apply (ckpt/store/store.h). Defaults: the store's.
  int keep_last_n = 3;
  int keep_best_k = 5;
};
Status Gc(const ToolOptions& tool, const GcOptions& options);

// Counts, bytes per column family, bytes saved by shared blobs.
Status Stats(const ToolOptions& tool);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_TOOL_H_
