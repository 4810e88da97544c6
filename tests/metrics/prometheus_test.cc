// The shipped Grafana dashboard against a real Prometheus server (Debian's
// /usr/bin/prometheus) scraping ckpt::metrics over real HTTP while a simulated
// 30-member run feeds it: every PromQL expression of every panel, with the
// template variables substituted, must return data through Prometheus' query
// API. GPU panels may be empty only where NVML is unavailable, and the test
// prints which were. Also: the dashboard's static shape (importable, datasource
// as a variable), and the shipped scrape configuration.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/metrics/metrics.h"
#include "dashboard_check.h"
#include "exposition.h"
#include "gpu_memory.h"
#include "prometheus_server.h"
#include "simulated_run.h"

namespace ckpt::metrics {
namespace {

using nlohmann::json;
using testing::ChildProcess;
using testing::PrometheusServer;
using testing::SimulatedRun;
using testing::SimulatedWorker;

constexpr char kExperiment[] = "exp-a";
// What Grafana would give $__rate_interval for a 1 s scrape interval (4x).
constexpr char kRateInterval[] = "5s";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json Dashboard() {
  auto d = testing::LoadDashboard(CKPT_DASHBOARD_JSON);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? *d : json::object();
}

TEST(DashboardTest, IsAnImportableDashboardWithDatasourceAndTemplateVariables) {
  const json d = Dashboard();
  ASSERT_FALSE(d.empty());
  EXPECT_GE(d.value("schemaVersion", 0), 36);
  EXPECT_FALSE(d.value("uid", "").empty());
  EXPECT_FALSE(d.value("title", "").empty());
  std::map<std::string, json> vars;
  for (const json& v : d["templating"]["list"]) vars[v.value("name", "")] = v;
  ASSERT_TRUE(vars.count("datasource"));
  EXPECT_EQ(vars["datasource"].value("type", ""), "datasource");
  EXPECT_EQ(vars["datasource"].value("query", ""), "prometheus");
  for (const char* name : {"experiment", "device"}) {
    ASSERT_TRUE(vars.count(name)) << name;
    EXPECT_EQ(vars[name].value("type", ""), "query") << name;
    EXPECT_EQ(vars[name]["datasource"].value("uid", ""), "${datasource}") << name;
  }

  const std::vector<json> panels = testing::DashboardPanels(d);
  std::set<int> ids;
  int with_queries = 0;
  for (const json& p : panels) {
    SCOPED_TRACE(p.value("title", "?"));
    EXPECT_TRUE(ids.insert(p.value("id", -1)).second) << "duplicate panel id";
    EXPECT_TRUE(p.contains("gridPos"));
    if (p.value("type", "") == "row") continue;
    ++with_queries;
    EXPECT_EQ(p["datasource"].value("uid", ""), "${datasource}");
    EXPECT_FALSE(p.value("description", "").empty());
    ASSERT_FALSE(p.value("targets", json::array()).empty());
    for (const json& t : p["targets"]) {
      EXPECT_EQ(t["datasource"].value("uid", ""), "${datasource}");
      const std::string expr = testing::SubstituteVariables(
          t.value("expr", ""), {{"experiment", kExperiment}, {"device", "cpu"}}, kRateInterval);
      EXPECT_EQ(expr.find('$'), std::string::npos) << "unknown variable in " << t.value("expr", "");
    }
  }
  EXPECT_GE(with_queries, 15);

  // Every ckpt_ name the dashboard uses is a family the library exposes (GPU
  // families as the header documents them, for hosts without NVML).
  MetricsOptions o;
  o.listen = "";
  auto m = Metrics::Open(o);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<SimulatedWorker> workers;
  for (int i = 0; i < 2; ++i) {
    auto c = ChildProcess::Start();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    workers.push_back(SimulatedWorker{"w" + std::to_string(i), "cpu", (*c)->pid()});
    children.push_back(std::move(*c));
  }
  SimulatedRun run(m->get(), kExperiment, 30, workers);
  run.Start();
  run.Step();
  auto exposed = testing::ParseExposition((*m)->RenderText());
  ASSERT_TRUE(exposed.ok()) << exposed.status().ToString();
  std::set<std::string> used;
  for (const testing::PanelQuery& q : testing::DashboardQueries(d)) {
    for (const std::string& name : testing::MetricNames(q.expr)) used.insert(name);
  }
  for (const std::string& name : used) {
    if (name.rfind("ckpt_gpu_", 0) == 0 && !(*m)->gpu_status().empty()) continue;
    EXPECT_TRUE(exposed->count(name)) << "the dashboard uses " << name << ", which is not exposed";
  }
  // And every family of the library has a panel.
  for (const auto& [name, family] : *exposed) {
    EXPECT_TRUE(used.count(name)) << name << " has no panel";
  }
}

TEST(DashboardTest, ShippedScrapeConfigIsValidAndTargetsTheDefaultListener) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  const std::string config = ReadFile(CKPT_PROMETHEUS_YML);
  EXPECT_NE(config.find("\"" + MetricsOptions().listen + "\""), std::string::npos)
      << "the scrape config does not target " << MetricsOptions().listen;
  EXPECT_NE(config.find("job_name: ckpt"), std::string::npos);
  if (::access(kPromtool, X_OK) != 0) GTEST_SKIP() << kPromtool << " is not installed";
  const std::string cmd = std::string(kPromtool) + " check config " + CKPT_PROMETHEUS_YML + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  EXPECT_EQ(::pclose(p), 0) << out;
}

// The devices of the simulated run, and so which GPU panels may have no
// data.
struct RunDevices {
  bool gpu = false;                    // NVML is available
  bool gpu_processes_visible = false;  // NVML can name the workers' processes
  std::string device;                  // the workers' device label
};

// Every panel query returns data through `server`, but GPU queries where the
// host cannot have any (listed on stdout, with why: `gpu_status`).
void ExpectPanelQueriesReturnData(const PrometheusServer& server, const json& dashboard,
                                  const RunDevices& devices, const std::string& gpu_status) {
  const bool gpu = devices.gpu;
  std::vector<std::string> empty_gpu;
  for (const testing::PanelQueryResult& r : testing::RunDashboardQueries(
           server, dashboard, {{"experiment", kExperiment}, {"device", devices.device}},
           kRateInterval)) {
    SCOPED_TRACE(r.query.panel + " / " + r.query.ref + ": " + r.sent);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    std::printf("%-50s %s  %zu series, %zu finite\n", r.query.panel.c_str(), r.query.ref.c_str(),
                r.series, r.finite);
    const bool per_process = r.query.expr.find("ckpt_gpu_process_") != std::string::npos;
    if (r.finite == 0 && testing::IsGpuQuery(r.query.expr) &&
        (!gpu || (per_process && !devices.gpu_processes_visible))) {
      empty_gpu.push_back(r.query.panel + " / " + r.query.ref);
      continue;
    }
    EXPECT_GT(r.finite, 0u) << "no data";
  }
  if (!empty_gpu.empty()) {
    std::printf("GPU queries without data (%s):\n",
                gpu ? "in a child PID namespace, NVML cannot name worker processes"
                    : ("no NVML here: " + gpu_status).c_str());
    for (const std::string& p : empty_gpu) std::printf("  %s\n", p.c_str());
  }
}

// The template variables' queries (label_values(METRIC, LABEL)) offer the
// run's experiment and `device`.
void ExpectTemplateVariablesOfferTheRun(const PrometheusServer& server, const json& dashboard,
                                        const std::string& device) {
  for (const json& v : dashboard["templating"]["list"]) {
    if (v.value("type", "") != "query") continue;
    const std::string def = v.value("definition", "");
    SCOPED_TRACE(def);
    const size_t open = def.find('(');
    const size_t comma = def.find(',');
    const size_t close = def.rfind(')');
    ASSERT_EQ(def.rfind("label_values(", 0), 0u);
    ASSERT_TRUE(comma != std::string::npos && close != std::string::npos);
    std::string metric = def.substr(open + 1, comma - open - 1);
    std::string label = def.substr(comma + 1, close - comma - 1);
    label.erase(0, label.find_first_not_of(' '));
    auto values = server.LabelValues(label, metric);
    ASSERT_TRUE(values.ok()) << values.status().ToString();
    const std::string want = label == "experiment" ? kExperiment : device;
    EXPECT_NE(std::find(values->begin(), values->end(), want), values->end())
        << label << " values lack " << want;
  }
}

TEST(DashboardTest, EveryPanelQueryReturnsDataFromARealPrometheus) {
  if (::access(testing::kPrometheusBinary, X_OK) != 0) {
    GTEST_SKIP() << testing::kPrometheusBinary << " is not installed";
  }
  const json dashboard = Dashboard();
  ASSERT_FALSE(testing::DashboardQueries(dashboard).empty());

  MetricsOptions o;
  o.listen = "127.0.0.1:0";
  auto opened = Metrics::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Metrics& metrics = **opened;
  const bool gpu = metrics.gpu_status().empty();
  // Workers on the GPU where there is one, so that the GPU panels' device
  // filter selects the devices NVML reports.
  const std::string device = gpu ? "cuda:0" : "cpu";

  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<SimulatedWorker> workers;
  for (int i = 0; i < 3; ++i) {
    auto c = ChildProcess::Start();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    if (i < 2) workers.push_back(SimulatedWorker{"w" + std::to_string(i), device, (*c)->pid()});
    children.push_back(std::move(*c));
  }
  // On a GPU host w0 is this process, holding device memory like a worker,
  // so that the per-process GPU memory panel has a process to show.
  std::unique_ptr<testing::DeviceMemory> gpu_memory;
  if (gpu) {
    gpu_memory = std::make_unique<testing::DeviceMemory>(size_t{256} << 20);
    ASSERT_TRUE(gpu_memory->ok()) << gpu_memory->why();
    workers[0].pid = ::getpid();
  }
  // NVML names processes by the host's pids: in a container's PID namespace
  // no worker can be matched to its GPU memory.
  const bool gpu_processes_visible = gpu && !testing::InChildPidNamespace();
  SimulatedRun run(&metrics, kExperiment, 30, workers);
  run.Start();
  run.Step();
  // w1 dies and comes back as the third process: a restart to show.
  children[1]->Kill();
  run.Restart(1, children[2]->pid());

  std::atomic<bool> stop{false};
  std::thread feeder([&] {
    while (!stop.load()) {
      run.Step();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  struct Joiner {
    std::atomic<bool>* stop;
    std::thread* t;
    ~Joiner() {
      stop->store(true);
      t->join();
    }
  } joiner{&stop, &feeder};

  testing::PrometheusServerOptions po;
  po.targets = {"127.0.0.1:" + std::to_string(metrics.port())};
  auto server = PrometheusServer::Start(po);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const Status scraped = (*server)->WaitForScrapes(8, std::chrono::seconds(120));
  ASSERT_TRUE(scraped.ok()) << scraped.ToString() << "\n" << (*server)->LogTail();

  const RunDevices devices{gpu, gpu_processes_visible, device};
  ExpectPanelQueriesReturnData(**server, dashboard, devices, metrics.gpu_status());
  if (HasFatalFailure()) return;
  ExpectTemplateVariablesOfferTheRun(**server, dashboard, device);
}

}  // namespace
}  // namespace ckpt::metrics
