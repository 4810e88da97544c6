// A real Prometheus server for tests: Debian's /usr/bin/prometheus, started on
// a free loopback port with a temporary configuration and data directory that
// scrape the given targets, and queried through its HTTP API.
//
// PrometheusServer owns the child process and the temporary directory: the
// destructor stops the process (SIGTERM, then SIGKILL after 10 s) and removes
// the directory. Queries may be made from any thread; Start and the
// destructor from one.
//
// Reusable by any test that wants to check what Prometheus sees of a ckpt
// process: the metrics tests scrape a ckpt::metrics::Metrics in the test
// process; a scheduler test can scrape a `ckpt-scheduler run` the same way.
#ifndef CKPT_TESTS_METRICS_PROMETHEUS_SERVER_H_
#define CKPT_TESTS_METRICS_PROMETHEUS_SERVER_H_

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::testing {

inline constexpr char kPrometheusBinary[] = "/usr/bin/prometheus";

struct PrometheusServerOptions {
  // The server binary. Default: /usr/bin/prometheus.
  std::string binary = kPrometheusBinary;
  // "HOST:PORT" of each /metrics endpoint to scrape, all in one job. Required.
  std::vector<std::string> targets;
  // The job label of the targets. Default: "ckpt".
  std::string job = "ckpt";
  // Scrape interval (and timeout), whole seconds. Default: 1.
  int scrape_interval_s = 1;
  // How long Start waits for the server to be ready. Default: 60 s.
  std::chrono::seconds start_timeout{60};
};

// One element of an instant query's result.
struct PromSample {
  std::map<std::string, std::string> labels;
  double value = 0;
};

class PrometheusServer {
 public:
  // Writes the configuration, starts the server on a free 127.0.0.1 port and
  // waits until /-/ready answers 200. NotFound when the binary is missing;
  // Unavailable (with the end of the server's log) when it exits or is not
  // ready in time; IOError for a temporary file that cannot be written.
  static StatusOr<std::unique_ptr<PrometheusServer>> Start(const PrometheusServerOptions& options);
  ~PrometheusServer();
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  int port() const { return port_; }
  const std::string& job() const { return options_.job; }

  // GET /api/v1/<path_and_query>; the "data" member of a "success" answer.
  // Unavailable when the server cannot be reached; InvalidArgument with
  // Prometheus' error (e.g. a PromQL parse error) otherwise.
  StatusOr<nlohmann::json> Api(const std::string& path_and_query) const;

  // An instant query at the server's now. A vector result gives one element
  // per series; a scalar one element without labels; a matrix (a range
  // selector) one element per series with its last value.
  StatusOr<std::vector<PromSample>> Query(const std::string& promql) const;

  // Values of label `label` over the series matching `selector`
  // (/api/v1/label/<label>/values?match[]=<selector>).
  StatusOr<std::vector<std::string>> LabelValues(const std::string& label,
                                                 const std::string& selector) const;

  // Waits until every target of the job is up and Prometheus holds at least
  // `scrapes` scrapes of each. Aborted with the targets' state at the
  // deadline.
  Status WaitForScrapes(int scrapes, std::chrono::seconds deadline) const;

  // The last `bytes` of the server's log, for failure messages.
  std::string LogTail(size_t bytes = 4000) const;

 private:
  PrometheusServer(PrometheusServerOptions options, std::string dir, pid_t pid, int port);
  const PrometheusServerOptions options_;
  const std::string dir_;
  pid_t pid_;
  int port_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_PROMETHEUS_SERVER_H_
