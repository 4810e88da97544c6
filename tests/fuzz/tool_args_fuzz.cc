// Fuzz target for ckpt-tool's argument handling: the input, split at NUL
// bytes, is argv[1..]; ParseCommandLine (the CLI11 setup main.cc runs) must
// give a command or a usage error, never a crash or an exception. The member
// references of a parsed command then go through their parsers, as the
// commands do first. Nothing is run.
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "member_ref.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> args = {"ckpt-tool"};
  std::string current;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(current);
      current.clear();
    } else {
      current.push_back(static_cast<char>(data[i]));
    }
  }
  if (!current.empty()) args.push_back(current);
  if (args.size() > 64) return 0;
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  std::ostringstream out, err;
  using ckpt::tool::CommandLine;
  const CommandLine cl =
      ckpt::tool::ParseCommandLine(static_cast<int>(args.size()), argv.data(), out, err);
  if (cl.command == CommandLine::Command::kNone) {
    if (cl.exit_code != 0 && cl.exit_code != ckpt::tool::kExitUsage) std::abort();
    return 0;
  }
  for (const std::string* ref : {&cl.show_ref, &cl.lineage.ref, &cl.diff_a, &cl.diff_b, &cl.exp.ref,
                                 &cl.imp.to, &cl.restore_ref, &cl.pin_ref, &cl.unpin_ref}) {
    auto m = ckpt::tool::ParseMemberRef(*ref);
    if (m.ok() && (!ckpt::tool::IsValidId(m->exp) || !ckpt::tool::IsValidId(m->member))) {
      std::abort();
    }
    auto e = ckpt::tool::ParseExperimentOrMemberRef(*ref);
    if (e.ok() && !ckpt::tool::IsValidId(e->exp)) std::abort();
  }
  for (const std::string* id :
       {&cl.ls.experiment, &cl.plot.experiment, &cl.events.experiment, &cl.verify_exp}) {
    (void)ckpt::tool::ParseExperimentId(*id);
  }
  return 0;
}
