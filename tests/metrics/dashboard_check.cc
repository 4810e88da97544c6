#include "dashboard_check.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <sstream>

namespace ckpt::testing {
namespace {

void CollectPanels(const nlohmann::json& panels, std::vector<nlohmann::json>* out) {
  for (const nlohmann::json& p : panels) {
    out->push_back(p);
    if (p.contains("panels")) CollectPanels(p["panels"], out);
  }
}

std::string ReplaceAll(std::string s, const std::string& from, const std::string& to) {
  for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size())) {
    s.replace(pos, from.size(), to);
  }
  return s;
}

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

}  // namespace

StatusOr<nlohmann::json> LoadDashboard(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IOError(path + ": cannot read");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json d = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (d.is_discarded() || !d.is_object()) return Status::Corruption(path + ": not a JSON object");
  return d;
}

std::vector<nlohmann::json> DashboardPanels(const nlohmann::json& dashboard) {
  std::vector<nlohmann::json> out;
  CollectPanels(dashboard.value("panels", nlohmann::json::array()), &out);
  return out;
}

std::vector<PanelQuery> DashboardQueries(const nlohmann::json& dashboard) {
  std::vector<PanelQuery> out;
  for (const nlohmann::json& p : DashboardPanels(dashboard)) {
    for (const nlohmann::json& t : p.value("targets", nlohmann::json::array())) {
      out.push_back(PanelQuery{p.value("title", "?"), t.value("refId", "?"), t.value("expr", "")});
    }
  }
  return out;
}

std::string SubstituteVariables(std::string expr,
                                const std::map<std::string, std::string>& variables,
                                const std::string& rate_interval) {
  expr = ReplaceAll(expr, "$__rate_interval", rate_interval);
  for (const auto& [name, value] : variables) {
    expr = ReplaceAll(expr, "${" + name + "}", value);
    // "$name" only where the name ends ($device must not eat $devices).
    const std::string token = "$" + name;
    for (size_t pos = expr.find(token); pos != std::string::npos;
         pos = expr.find(token, pos + value.size())) {
      const size_t end = pos + token.size();
      if (end < expr.size() && IsNameChar(expr[end])) {
        pos += 1;
        continue;
      }
      expr.replace(pos, token.size(), value);
    }
  }
  return expr;
}

std::set<std::string> MetricNames(const std::string& expr) {
  std::set<std::string> out;
  for (size_t pos = expr.find("ckpt_"); pos != std::string::npos;
       pos = expr.find("ckpt_", pos + 1)) {
    if (pos > 0 && IsNameChar(expr[pos - 1])) continue;
    size_t end = pos;
    while (end < expr.size() && IsNameChar(expr[end])) ++end;
    std::string name = expr.substr(pos, end - pos);
    for (const std::string suffix : {"_bucket", "_sum", "_count"}) {
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          name.find("_seconds") != std::string::npos) {
        name.resize(name.size() - suffix.size());
      }
    }
    out.insert(name);
  }
  return out;
}

bool IsGpuQuery(const std::string& expr) { return expr.find("ckpt_gpu_") != std::string::npos; }

std::vector<PanelQueryResult> RunDashboardQueries(
    const PrometheusServer& server, const nlohmann::json& dashboard,
    const std::map<std::string, std::string>& variables, const std::string& rate_interval) {
  std::vector<PanelQueryResult> out;
  for (const PanelQuery& q : DashboardQueries(dashboard)) {
    PanelQueryResult r;
    r.query = q;
    r.sent = SubstituteVariables(q.expr, variables, rate_interval);
    auto result = server.Query(r.sent);
    if (!result.ok()) {
      r.status = result.status();
    } else {
      r.series = result->size();
      for (const PromSample& s : *result) r.finite += std::isfinite(s.value) ? 1 : 0;
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ckpt::testing
