// ckpt-tool's command line: CLI11 parses it into the option structs of tool.h,
// then one command runs. main.cc is these two calls; the fuzz target runs
// ParseCommandLine alone.
//
//   ckpt-tool [--store DIR | --socket PATH] [--json] COMMAND ...
//
// Thread-safety: free functions; ParseCommandLine touches nothing but its
// streams.
#ifndef CKPT_TOOLS_SRC_CLI_H_
#define CKPT_TOOLS_SRC_CLI_H_

#include <cstdio>
#include <ostream>
#include <string>

#include "service_commands.h"
#include "tool.h"

namespace ckpt::tool {

// What the command line asks for.
struct CommandLine {
  enum class Command {
    kNone,  // nothing to run: exit with exit_code (help, or a usage error)
    kLs,
    kShow,
    kLineage,
    kPlot,
    kDiff,
    kEvents,
    kExport,
    kImport,
    kRestore,
    kPin,
    kUnpin,
    kVerify,
    kGc,
    kStats,
    // The running service's commands (service_commands.h).
    kSubmit,
    kStatus,
    kWatch,
    kPause,
    kResume,
    kStop,
    kWorkers,
    kTop
  };
  Command command = Command::kNone;
  // With kNone: 0 after --help, kExitUsage after a usage error.
  int exit_code = 0;
  ToolOptions tool;
  LsOptions ls;
  std::string show_ref;
  LineageOptions lineage;
  PlotOptions plot;
  std::string diff_a, diff_b;
  EventsOptions events;
  ExportOptions exp;
  ImportOptions imp;
  std::string restore_ref, pin_ref, unpin_ref;
  std::string verify_exp;
  GcOptions gc;
  SubmitOptions submit;
  std::string status_exp;   // "" = the whole service
  std::string control_exp;  // pause, resume, stop
  WatchOptions watch;
  TopOptions top;
};

// Parses argv (argv[0] the program). Help goes to `out`; a usage error is one
// line on `err` ("ckpt-tool: ... (see ckpt-tool --help)") and kNone with
// exit_code kExitUsage. Never throws for any argv.
CommandLine ParseCommandLine(int argc, const char* const* argv, std::ostream& out,
                             std::ostream& err);

// Runs the parsed command (or returns exit_code for kNone); a failure is one
// line on `err`. Returns the process exit code (ExitCodeFor).
int RunCommandLine(const CommandLine& command_line, FILE* err);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_CLI_H_
