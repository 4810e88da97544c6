// ckpt-tool: inspect, compare, picture, export, import, restore and verify the
// checkpoints of a ckpt store.
//
//   ckpt-tool [--store DIR | --socket PATH] [--json] COMMAND ...
//
// Thin: parses the command line into the option structs of tool.h (cli.h)
// and calls one command. Exit codes: 0 ok, 1 not found / verification failed,
// 2 usage.
#include <cstdio>
#include <iostream>

#include "cli.h"

int main(int argc, char** argv) {
  const ckpt::tool::CommandLine cl = ckpt::tool::ParseCommandLine(argc, argv, std::cout, std::cerr);
  return ckpt::tool::RunCommandLine(cl, stderr);
}
