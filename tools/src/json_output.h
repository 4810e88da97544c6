// JSON output shared by the read commands (ls, show, diff, events, verify,
// stats): numbers that may be NaN or infinite, and one document on `out`.
//
// Thread-safety: pure functions, and a write to `tool.out`.
#ifndef CKPT_TOOLS_SRC_JSON_OUTPUT_H_
#define CKPT_TOOLS_SRC_JSON_OUTPUT_H_

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "ckpt/base/status.h"
#include "tool.h"

namespace ckpt::tool {

// `v`, or null when it is not finite (JSON has no NaN).
nlohmann::json ScoreJson(double v);

// An object of `m`'s numbers, each as ScoreJson.
nlohmann::json NumberMapJson(const std::map<std::string, double>& m);

// `doc` indented by two, then a line break, on tool.out; IOError as Print.
Status PrintJson(const ToolOptions& tool, const nlohmann::json& doc);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_JSON_OUTPUT_H_
