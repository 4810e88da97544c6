// Runs the external programs ckpt-tool draws with (Graphviz `dot`, gnuplot).
//
// Thread-safety: a free function; it forks.
#ifndef CKPT_TOOLS_SRC_SUBPROCESS_H_
#define CKPT_TOOLS_SRC_SUBPROCESS_H_

#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::tool {

// Runs argv[0] (looked up in $PATH) with `input` on its standard input and its
// standard output discarded. OK when it exits 0. NotFound naming the program
// when it is not installed (with `install_hint`); Internal with the exit
// status and the last line of its standard error otherwise.
Status RunProgram(const std::vector<std::string>& argv, const std::string& input,
                  const std::string& install_hint);

// True when `program` is found in $PATH.
bool HaveProgram(const std::string& program);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_SUBPROCESS_H_
