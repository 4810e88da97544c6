#include "json_output.h"

#include <cmath>

#include "session.h"

namespace ckpt::tool {

using json = nlohmann::json;

json ScoreJson(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json NumberMapJson(const std::map<std::string, double>& m) {
  json j = json::object();
  for (const auto& [k, v] : m) j[k] = ScoreJson(v);
  return j;
}

Status PrintJson(const ToolOptions& tool, const json& doc) {
  return Print(tool.out, doc.dump(2) + "\n");
}

}  // namespace ckpt::tool
