// ckpt-tool: inspect, compare, picture, export, import, restore and verify the
// checkpoints of a ckpt store.
//
//   ckpt-tool [--store DIR | --socket PATH] [--json] COMMAND ...
//
// Thin: parses the command line into the option structs of tool.h and calls
// one command. Exit codes: 0 ok, 1 not found / verification failed, 2 usage.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tool.h"

namespace {

int Finish(const ckpt::Status& status) {
  if (!status.ok()) {
    std::string msg = status.message();
    for (char& c : msg) {
      if (c == '\n') c = ' ';
    }
    std::fprintf(stderr, "ckpt-tool: %s\n", msg.c_str());
  }
  return ckpt::tool::ExitCodeFor(status);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::tool;
  CLI::App app{
      "ckpt-tool: inspect, compare, picture, export, import, restore and verify checkpoints.\n"
      "Members are named EXPERIMENT/MEMBER[@VERSION] (the head when no version).\n"
      "Exit codes: 0 ok, 1 not found or verification failed, 2 usage."};
  app.require_subcommand(1);
  app.fallthrough();
  ToolOptions tool;
  app.add_option("--store", tool.store_path,
                 "store directory (default: ./var, else /var/lib/ckpt/store, else the running "
                 "scheduler's)");
  app.add_option("--socket", tool.socket_path,
                 "control socket of a running `ckpt-scheduler serve` (default: $CKPT_SOCKET, "
                 "else /run/ckpt/control.sock when it answers)");
  app.add_flag("--json", tool.json, "one JSON document on stdout (read commands)");

  LsOptions ls;
  CLI::App* ls_cmd = app.add_subcommand(
      "ls", "experiments (status, members, intervals, best score), or one experiment's members");
  ls_cmd->add_option("experiment", ls.experiment, "list this experiment's members");
  ls_cmd->add_option("--sort", ls.sort, "member order: name, score or step")
      ->check(CLI::IsMember({"name", "score", "step"}));

  std::string show_ref;
  CLI::App* show_cmd = app.add_subcommand(
      "show", "a version's manifest, metrics, hyperparameters, parent, reason and tensors");
  show_cmd->add_option("member", show_ref, "EXPERIMENT/MEMBER[@VERSION]")->required();

  LineageOptions lineage;
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

  PlotOptions plot;
  CLI::App* plot_cmd = app.add_subcommand(
      "plot",
      "each member's validation score and hyperparameters over steps, exploits marked "
      "(gnuplot)");
  plot_cmd->add_option("experiment", plot.experiment, "EXPERIMENT")->required();
  plot_cmd->add_option("-o,--output", plot.output, "FILE.svg or FILE.png")->required();
  plot_cmd->add_option("--width", plot.width, "pixels (default 1000)");
  plot_cmd->add_option("--panel-height", plot.panel_height, "pixels per panel (default 260)");

  std::string diff_a, diff_b;
  CLI::App* diff_cmd = app.add_subcommand(
      "diff", "hyperparameters side by side and, per tensor, the L2 norm of the difference");
  diff_cmd->add_option("a", diff_a, "EXPERIMENT/MEMBER[@VERSION]")->required();
  diff_cmd->add_option("b", diff_b, "EXPERIMENT/MEMBER[@VERSION]")->required();

  EventsOptions events;
  CLI::App* events_cmd = app.add_subcommand(
      "events", "the decision log: intervals, exploits, failures, restores, worker losses");
  events_cmd->add_option("experiment", events.experiment, "EXPERIMENT")->required();
  events_cmd->add_flag("-f,--follow", events.follow,
                       "keep printing new events until the experiment ends (JSON lines with "
                       "--json)");
  events_cmd->add_option("--from", events.from_seq, "first sequence number (default 1)");
  events_cmd->add_option("--type", events.type, "only events of this type (exploit, trained, ...)");

  ExportOptions exp;
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

  ImportOptions imp;
  CLI::App* import_cmd = app.add_subcommand(
      "import",
      "a .safetensors or .pt state as a member's new version, checked against the "
      "experiment's model");
  import_cmd->add_option("file", imp.file, "FILE.safetensors or FILE.pt")->required();
  import_cmd->add_option("--to", imp.to, "EXPERIMENT/MEMBER")->required();

  std::string restore_ref, pin_ref, unpin_ref;
  CLI::App* restore_cmd = app.add_subcommand(
      "restore",
      "make a past version a member's head again (through the running scheduler when "
      "one serves the store)");
  restore_cmd->add_option("member", restore_ref, "EXPERIMENT/MEMBER@VERSION")->required();
  CLI::App* pin_cmd = app.add_subcommand("pin", "keep a version's blob from retention");
  pin_cmd->add_option("member", pin_ref, "EXPERIMENT/MEMBER@VERSION")->required();
  CLI::App* unpin_cmd = app.add_subcommand("unpin", "let retention release a version again");
  unpin_cmd->add_option("member", unpin_ref, "EXPERIMENT/MEMBER@VERSION")->required();

  std::string verify_exp;
  CLI::App* verify_cmd = app.add_subcommand(
      "verify", "every blob's checksums and every manifest's references; exit 1 on a problem");
  verify_cmd->add_option("experiment", verify_exp, "only this experiment");

  GcOptions gc;
  CLI::App* gc_cmd = app.add_subcommand("gc", "apply retention now and return the space");
  gc_cmd->add_flag("--dry-run", gc.dry_run, "report what would be released; change nothing");
  gc_cmd->add_option("--keep-last", gc.keep_last_n, "versions kept per member (default 3)");
  gc_cmd->add_option("--keep-best", gc.keep_best_k,
                     "best versions kept per experiment (default 5)");

  CLI::App* stats_cmd = app.add_subcommand("stats", "counts, bytes, bytes saved by shared blobs");

  // CLI11 calls a word that names no command "a subcommand is required";
  // say what it is.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--store" || a == "--socket") {
      ++i;
      continue;
    }
    if (a.empty() || a[0] == '-') continue;
    bool known = false;
    for (const CLI::App* sub : app.get_subcommands({})) known = known || sub->check_name(a);
    if (!known) {
      std::fprintf(stderr, "ckpt-tool: unknown command \"%s\" (see ckpt-tool --help)\n", a.c_str());
      return kExitUsage;
    }
    break;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string what = e.what();
    std::fprintf(stderr, "ckpt-tool: %s (see ckpt-tool --help)\n", what.c_str());
    return kExitUsage;
  }

  if (ls_cmd->parsed()) return Finish(Ls(tool, ls));
  if (show_cmd->parsed()) return Finish(Show(tool, show_ref));
  if (lineage_cmd->parsed()) return Finish(Lineage(tool, lineage));
  if (plot_cmd->parsed()) return Finish(Plot(tool, plot));
  if (diff_cmd->parsed()) return Finish(Diff(tool, diff_a, diff_b));
  if (events_cmd->parsed()) return Finish(Events(tool, events));
  if (export_cmd->parsed()) return Finish(Export(tool, exp));
  if (import_cmd->parsed()) return Finish(Import(tool, imp));
  if (restore_cmd->parsed()) return Finish(Restore(tool, restore_ref));
  if (pin_cmd->parsed()) return Finish(Pin(tool, pin_ref, true));
  if (unpin_cmd->parsed()) return Finish(Pin(tool, unpin_ref, false));
  if (verify_cmd->parsed()) return Finish(Verify(tool, verify_exp));
  if (gc_cmd->parsed()) return Finish(Gc(tool, gc));
  if (stats_cmd->parsed()) return Finish(Stats(tool));
  return kExitUsage;
}
