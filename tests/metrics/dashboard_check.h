// Runs the PromQL of a Grafana dashboard against a real Prometheus, for tests
// that check the shipped dashboard against what a ckpt process exports: the
// metrics tests against the library fed by a simulated run, a scheduler test
// against a real `ckpt-scheduler run`.
//
// Thread-safety: pure functions over their arguments.
#ifndef CKPT_TESTS_METRICS_DASHBOARD_CHECK_H_
#define CKPT_TESTS_METRICS_DASHBOARD_CHECK_H_

#include <cstddef>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "prometheus_server.h"

namespace ckpt::testing {

// One PromQL expression of one panel.
struct PanelQuery {
  std::string panel;  // the panel's title
  std::string ref;    // the target's refId
  std::string expr;   // as written in the dashboard, variables unsubstituted
};

// The dashboard at `path`. IOError when unreadable, Corruption when not JSON.
StatusOr<nlohmann::json> LoadDashboard(const std::string& path);

// Every panel of the dashboard, rows' nested panels included, in order.
std::vector<nlohmann::json> DashboardPanels(const nlohmann::json& dashboard);

// Every target expression of every panel, in order.
std::vector<PanelQuery> DashboardQueries(const nlohmann::json& dashboard);

// `expr` with $__rate_interval replaced by `rate_interval` and each $name or
// ${name} of `variables` by its value, as Grafana sends it with one value
// selected per variable.
std::string SubstituteVariables(std::string expr,
                                const std::map<std::string, std::string>& variables,
                                const std::string& rate_interval);

// ckpt_* metric names `expr` refers to, a histogram's _bucket/_sum/_count
// suffix removed.
std::set<std::string> MetricNames(const std::string& expr);

// True when `expr` reads a family of the GPU sampler (ckpt_gpu_*).
bool IsGpuQuery(const std::string& expr);

struct PanelQueryResult {
  PanelQuery query;
  std::string sent;  // the substituted expression
  Status status;     // of the query itself (a PromQL error, an unreachable server)
  size_t series = 0;
  size_t finite = 0;  // series whose value is a finite number
};

// Sends every query of `dashboard` to `server` with `variables` substituted.
std::vector<PanelQueryResult> RunDashboardQueries(
    const PrometheusServer& server, const nlohmann::json& dashboard,
    const std::map<std::string, std::string>& variables, const std::string& rate_interval);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_DASHBOARD_CHECK_H_
