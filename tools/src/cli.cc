// ckpt-tool's command line (cli.h): the CLI11 setup of main.cc, callable in
// process so that the fuzz target (tests/fuzz/tool_args_fuzz.cc) runs it.
#include "cli.h"

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ckpt::tool {

namespace {

using Command = CommandLine::Command;
// Each subcommand with the command it selects, in the order of --help.
using Subcommands = std::vector<std::pair<const CLI::App*, Command>>;

void AddGlobalOptions(CLI::App& app, ToolOptions& tool) {
  app.add_option("--store", tool.store_path,
                 "store directory (default: ./var, else /var/lib/ckpt/store, else the running "
                 "scheduler's)");
  app.add_option("--socket", tool.socket_path,
                 "control socket of a running `ckpt-scheduler serve` (default: $CKPT_SOCKET, "
                 "else /run/ckpt/control.sock when it answers)");
  app.add_flag("--json", tool.json, "one JSON document on stdout (read commands)");
}

// ls, show, lineage, plot, diff, events.
void AddReadCommands(CLI::App& app, CommandLine& cl, Subcommands& subs) {
  CLI::App* ls_cmd = app.add_subcommand(
      "ls", "experiments (status, members, intervals, best score), or one experiment's members");
  ls_cmd->add_option("experiment", cl.ls.experiment, "list this experiment's members");
  ls_cmd->add_option("--sort", cl.ls.sort, "member order: name, score or step")
      ->check(CLI::IsMember({"name", "score", "step"}));
  subs.emplace_back(ls_cmd, Command::kLs);

  CLI::App* show_cmd = app.add_subcommand(
      "show", "a version's manifest, metrics, hyperparameters, parent, reason and tensors");
  show_cmd->add_option("member", cl.show_ref, "EXPERIMENT/MEMBER[@VERSION]")->required();
  subs.emplace_back(show_cmd, Command::kShow);

  LineageOptions& lineage = cl.lineage;
  CLI::App* lineage_cmd = app.add_subcommand(
      "lineage", "the chain of versions and exploits back to a member's first version");
  lineage_cmd
      ->add_option("member", lineage.ref,
                   "EXPERIMENT/MEMBER[@VERSION] (or EXPERIMENT with --dot/--svg/--png)")
      ->required();
  lineage_cmd->add_flag("--dot", lineage.dot,
                        "Graphviz DOT of the experiment's whole exploit graph on stdout");
  lineage_cmd->add_option("--svg", lineage.svg, "render that graph to this SVG file (Graphviz)");
  lineage_cmd->add_option("--png", lineage.png, "render that graph to this PNG file (Graphviz)");
  subs.emplace_back(lineage_cmd, Command::kLineage);

  PlotOptions& plot = cl.plot;
  CLI::App* plot_cmd = app.add_subcommand(
      "plot",
      "each member's validation score and hyperparameters over steps, exploits marked "
      "(gnuplot)");
  plot_cmd->add_option("experiment", plot.experiment, "EXPERIMENT")->required();
  plot_cmd->add_option("-o,--output", plot.output, "FILE.svg or FILE.png")->required();
  plot_cmd->add_option("--width", plot.width, "pixels (default 1000)");
  plot_cmd->add_option("--panel-height", plot.panel_height, "pixels per panel (default 260)");
  subs.emplace_back(plot_cmd, Command::kPlot);

  CLI::App* diff_cmd = app.add_subcommand(
      "diff", "hyperparameters side by side and, per tensor, the L2 norm of the difference");
  diff_cmd->add_option("a", cl.diff_a, "EXPERIMENT/MEMBER[@VERSION]")->required();
  diff_cmd->add_option("b", cl.diff_b, "EXPERIMENT/MEMBER[@VERSION]")->required();
  subs.emplace_back(diff_cmd, Command::kDiff);

  EventsOptions& events = cl.events;
  CLI::App* events_cmd = app.add_subcommand(
      "events", "the decision log: intervals, exploits, failures, restores, worker losses");
  events_cmd->add_option("experiment", events.experiment, "EXPERIMENT")->required();
  events_cmd->add_flag("-f,--follow", events.follow,
                       "keep printing new events until the experiment ends (JSON lines with "
                       "--json)");
  events_cmd->add_option("--from", events.from_seq, "first sequence number (default 1)");
  events_cmd->add_option("--type", events.type, "only events of this type (exploit, trained, ...)");
  subs.emplace_back(events_cmd, Command::kEvents);
}

// export, import, restore, pin, unpin.
void AddTransferCommands(CLI::App& app, CommandLine& cl, Subcommands& subs) {
  ExportOptions& exp = cl.exp;
  CLI::App* export_cmd = app.add_subcommand(
      "export", "a version to .safetensors (as stored) or .pt (torch.load(weights_only=True))");
  export_cmd->add_option("member", exp.ref, "EXPERIMENT/MEMBER[@VERSION] (EXPERIMENT with --top)")
      ->required();
  export_cmd->add_option("-o,--output", exp.output, "FILE.safetensors, FILE.pt, or DIR with --top")
      ->required();
  export_cmd->add_flag("--optimizer", exp.optimizer,
                       ".pt: {\"model\", \"optimizer\" (torch.optim layout), \"ckpt\"}");
  export_cmd->add_option("--top", exp.top, "export the K best members into DIR");
  export_cmd->add_option("--format", exp.format, "with --top: safetensors or pt")
      ->check(CLI::IsMember({"safetensors", "pt"}));
  subs.emplace_back(export_cmd, Command::kExport);

  CLI::App* import_cmd = app.add_subcommand(
      "import",
      "a .safetensors or .pt state as a member's new version, checked against the "
      "experiment's model");
  import_cmd->add_option("file", cl.imp.file, "FILE.safetensors or FILE.pt")->required();
  import_cmd->add_option("--to", cl.imp.to, "EXPERIMENT/MEMBER")->required();
  subs.emplace_back(import_cmd, Command::kImport);

  CLI::App* restore_cmd = app.add_subcommand(
      "restore",
      "make a past version a member's head again (through the running scheduler when "
      "one serves the store)");
  restore_cmd->add_option("member", cl.restore_ref, "EXPERIMENT/MEMBER@VERSION")->required();
  subs.emplace_back(restore_cmd, Command::kRestore);
  CLI::App* pin_cmd = app.add_subcommand("pin", "keep a version's blob from retention");
  pin_cmd->add_option("member", cl.pin_ref, "EXPERIMENT/MEMBER@VERSION")->required();
  subs.emplace_back(pin_cmd, Command::kPin);
  CLI::App* unpin_cmd = app.add_subcommand("unpin", "let retention release a version again");
  unpin_cmd->add_option("member", cl.unpin_ref, "EXPERIMENT/MEMBER@VERSION")->required();
  subs.emplace_back(unpin_cmd, Command::kUnpin);
}

// verify, gc, stats.
void AddMaintenanceCommands(CLI::App& app, CommandLine& cl, Subcommands& subs) {
  CLI::App* verify_cmd = app.add_subcommand(
      "verify", "every blob's checksums and every manifest's references; exit 1 on a problem");
  verify_cmd->add_option("experiment", cl.verify_exp, "only this experiment");
  subs.emplace_back(verify_cmd, Command::kVerify);

  GcOptions& gc = cl.gc;
  CLI::App* gc_cmd = app.add_subcommand("gc", "apply retention now and return the space");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "report what would be released; change nothing");
  gc_cmd->add_option("--keep-last", gc.keep_last_n, "versions kept per member (default 3)");
  gc_cmd->add_option("--keep-best", gc.keep_best_k,
                     "best versions kept per experiment (default 5)");
  subs.emplace_back(gc_cmd, Command::kGc);

  subs.emplace_back(app.add_subcommand("stats", "counts, bytes, bytes saved by shared blobs"),
                    Command::kStats);
}

// The running service (`ckpt-scheduler serve`), through its control socket:
// submit, status, watch, pause, resume, stop, workers, top.
void AddServiceCommands(CLI::App& app, CommandLine& cl, Subcommands& subs) {
  CLI::App* submit_cmd = app.add_subcommand(
      "submit",
      "check an experiment file with the scheduler's parser, then hand it to the running "
      "service; --wait follows it to the end (exit 0 done, 1 stopped or failed)");
  submit_cmd->add_option("file", cl.submit.file, "EXPERIMENT.toml")->required();
  submit_cmd->add_flag("--wait", cl.submit.wait, "follow the experiment until it ends (as watch)");
  subs.emplace_back(submit_cmd, Command::kSubmit);
  CLI::App* status_cmd = app.add_subcommand(
      "status",
      "the service (version, uptime, store, workers, each experiment's progress), or one "
      "experiment's progress and members, live");
  status_cmd->add_option("experiment", cl.status_exp, "EXPERIMENT");
  subs.emplace_back(status_cmd, Command::kStatus);
  CLI::App* watch_cmd = app.add_subcommand(
      "watch",
      "an experiment's progress line (and table, on a terminal) until it ends (exit 0 done, "
      "1 stopped or failed)");
  watch_cmd->add_option("experiment", cl.watch.experiment, "EXPERIMENT")->required();
  subs.emplace_back(watch_cmd, Command::kWatch);

  // pause, resume and stop differ only in their verb.
  const struct {
    const char* name;
    const char* help;
    Command command;
  } kControls[] = {
      {"pause", "start no new intervals of an experiment (in-flight ones finish)", Command::kPause},
      {"resume", "let a paused experiment train again", Command::kResume},
      {"stop", "end an experiment now (in-flight intervals finish and are committed)",
       Command::kStop},
  };
  for (const auto& control : kControls) {
    CLI::App* control_cmd = app.add_subcommand(control.name, control.help);
    control_cmd->add_option("experiment", cl.control_exp, "EXPERIMENT")->required();
    subs.emplace_back(control_cmd, control.command);
  }

  subs.emplace_back(
      app.add_subcommand(
          "workers",
          "each worker of the service: host, device, slots, state, members in flight, samples/s, "
          "restarts"),
      Command::kWorkers);
  CLI::App* top_cmd = app.add_subcommand(
      "top",
      "a full-screen live view of the service, refreshed every second (q quits); plain text "
      "when stdout is not a terminal");
  top_cmd
      ->add_option("-n,--iterations", cl.top.iterations,
                   "refreshes before exiting (default: "
                   "until q, or forever without a "
                   "terminal)")
      ->check(CLI::NonNegativeNumber);
  subs.emplace_back(top_cmd, Command::kTop);
}

// The first word that is not an option, when it names no command: CLI11
// would call it "a subcommand is required"; this says what it is.
std::optional<std::string> UnknownCommand(const CLI::App& app, int argc, const char* const* argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--store" || a == "--socket") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(a);
    if (!known) return a;
    break;
  }
  return std::nullopt;
}

}  // namespace

CommandLine ParseCommandLine(int argc, const char* const* argv, std::ostream& out,
                             std::ostream& err) {
  CommandLine cl;
  CLI::App app{
      "ckpt-tool: inspect, compare, picture, export, import, restore and verify checkpoints,\n"
      "and drive the running service (submit, status, watch, pause, resume, stop, workers, top).\n"
      "Members are named EXPERIMENT/MEMBER[@VERSION] (the head when no version).\n"
      "Exit codes: 0 ok, 1 not found or verification failed, 2 usage."};
  app.require_subcommand(1);
  app.fallthrough();
  AddGlobalOptions(app, cl.tool);
  Subcommands subs;
  AddReadCommands(app, cl, subs);
  AddTransferCommands(app, cl, subs);
  AddMaintenanceCommands(app, cl, subs);
  AddServiceCommands(app, cl, subs);

  if (const auto unknown = UnknownCommand(app, argc, argv)) {
    err << "ckpt-tool: unknown command \"" << *unknown << "\" (see ckpt-tool --help)\n";
    cl.exit_code = kExitUsage;
    return cl;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    cl.exit_code = app.exit(e, out, err);
    return cl;
  } catch (const CLI::CallForAllHelp& e) {
    cl.exit_code = app.exit(e, out, err);
    return cl;
  } catch (const CLI::ParseError& e) {
    err << "ckpt-tool: " << e.what() << " (see ckpt-tool --help)\n";
    cl.exit_code = kExitUsage;
    return cl;
  }
  for (const auto& [sub, command] : subs) {
    if (sub->parsed()) {
      cl.command = command;
      return cl;
    }
  }
  cl.exit_code = kExitUsage;
  return cl;
}

int RunCommandLine(const CommandLine& cl, FILE* err) {
  using C = CommandLine::Command;
  Status status;
  switch (cl.command) {
    case C::kNone:
      return cl.exit_code;
    case C::kLs:
      status = Ls(cl.tool, cl.ls);
      break;
    case C::kShow:
      status = Show(cl.tool, cl.show_ref);
      break;
    case C::kLineage:
      status = Lineage(cl.tool, cl.lineage);
      break;
    case C::kPlot:
      status = Plot(cl.tool, cl.plot);
      break;
    case C::kDiff:
      status = Diff(cl.tool, cl.diff_a, cl.diff_b);
      break;
    case C::kEvents:
      status = Events(cl.tool, cl.events);
      break;
    case C::kExport:
      status = Export(cl.tool, cl.exp);
      break;
    case C::kImport:
      status = Import(cl.tool, cl.imp);
      break;
    case C::kRestore:
      status = Restore(cl.tool, cl.restore_ref);
      break;
    case C::kPin:
      status = Pin(cl.tool, cl.pin_ref, true);
      break;
    case C::kUnpin:
      status = Pin(cl.tool, cl.unpin_ref, false);
      break;
    case C::kVerify:
      status = Verify(cl.tool, cl.verify_exp);
      break;
    case C::kGc:
      status = Gc(cl.tool, cl.gc);
      break;
    case C::kStats:
      status = Stats(cl.tool);
      break;
    case C::kSubmit:
      status = Submit(cl.tool, cl.submit);
      break;
    case C::kStatus:
      status = ServiceStatus(cl.tool, cl.status_exp);
      break;
    case C::kWatch:
      status = Watch(cl.tool, cl.watch);
      break;
    case C::kPause:
      status = Control(cl.tool, ControlVerb::kPause, cl.control_exp);
      break;
    case C::kResume:
      status = Control(cl.tool, ControlVerb::kResume, cl.control_exp);
      break;
    case C::kStop:
      status = Control(cl.tool, ControlVerb::kStop, cl.control_exp);
      break;
    case C::kWorkers:
      status = Workers(cl.tool);
      break;
    case C::kTop:
      status = Top(cl.tool, cl.top);
      break;
  }
  if (!status.ok()) {
    std::string msg = status.message();
    for (char& c : msg) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(err, "ckpt-tool: %s\n", msg.c_str());
  }
  return ExitCodeFor(status);
}

}  // namespace ckpt::tool
