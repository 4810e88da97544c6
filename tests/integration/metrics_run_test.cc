// The shipped Grafana dashboard against a real run: a real `ckpt-scheduler
// run` (real workers, store and Fashion-MNIST) exports its metrics, a real
// Prometheus (Debian's) scrapes it, and every PromQL expression of every panel
// must return data through Prometheus' HTTP API. GPU panels may be empty only
// where there is no GPU, and the test prints which were.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dashboard_check.h"
#include "process_util.h"
#include "prometheus_server.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;

TEST(MetricsRunTest, EveryDashboardPanelHasDataFromARealRun) {
  if (access(testing::kPrometheusBinary, X_OK) != 0) {
    GTEST_SKIP() << testing::kPrometheusBinary << " is not installed";
  }
  auto dashboard = testing::LoadDashboard(CKPT_DASHBOARD_JSON);
  ASSERT_TRUE(dashboard.ok()) << dashboard.status().ToString();
  const std::string dir = testing::TempDir("metrics-run");
  ASSERT_FALSE(dir.empty());
  const int port = testing::FreeLoopbackPort();
  ASSERT_GT(port, 0);
  std::ostringstream toml;
  // Long enough to be scraped many times; max_wall_s ends it if the test
  // does not stop it first.
  toml << "name = \"dash\"\nseed = 3\nmetrics = \"127.0.0.1:" << port << "\"\n"
       << "[model]\nspec = \"lenet5\"\n[data]\nbatch_size = 16\neval_size = 200\n"
       << "[population]\nsize = 6\nsteps_per_interval = 20\nintervals = 10000\nmax_wall_s = 240\n"
       << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n"
       << "[policy]\nkind = \"pbt\"\nquantile = 0.34\n"
       << "[[devices]]\ndevice = \"cpu\"\nslots = 2\nfusion = \"plain\"\n";
  std::ofstream(dir + "/dash.toml") << toml.str();
  testing::Child run({testing::Env("CKPT_SCHEDULER_BIN", CKPT_SCHEDULER_BIN), "run",
                      dir + "/dash.toml", "--store", dir + "/store", "--grace-ms", "3000"},
                     dir + "/run.log");

  testing::PrometheusServerOptions po;
  po.targets = {"127.0.0.1:" + std::to_string(port)};
  auto server = testing::PrometheusServer::Start(po);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const Status scraped = (*server)->WaitForScrapes(10, std::chrono::seconds(180));
  ASSERT_TRUE(scraped.ok()) << scraped.ToString() << "\n" << run.Log();
  ASSERT_TRUE(run.Running()) << run.Log();
  // A run's first exploit comes after the first generation (6 intervals on
  // two slots): wait for it so the exploit panel has a rate to show.
  for (int i = 0; i < 120; ++i) {
    auto q = (*server)->Query("ckpt_exploits_total{experiment=\"dash\"} > 0");
    if (q.ok() && !q->empty()) break;
    std::this_thread::sleep_for(milliseconds(1000));
  }
  ASSERT_TRUE((*server)->WaitForScrapes(3, std::chrono::seconds(60)).ok());

  std::vector<std::string> empty_gpu;
  int checked = 0;
  for (const testing::PanelQueryResult& r : testing::RunDashboardQueries(
           **server, *dashboard, {{"experiment", "dash"}, {"device", "cpu"}}, "5s")) {
    SCOPED_TRACE(r.query.panel + " / " + r.query.ref + ": " + r.sent);
    ASSERT_TRUE(r.status.ok()) << r.status.ToString();
    std::printf("%-50s %s  %zu series, %zu finite\n", r.query.panel.c_str(), r.query.ref.c_str(),
                r.series, r.finite);
    ++checked;
    if (r.finite == 0 && testing::IsGpuQuery(r.query.expr) &&
        !std::filesystem::exists("/proc/driver/nvidia/gpus")) {
      empty_gpu.push_back(r.query.panel + " / " + r.query.ref);
      continue;
    }
    EXPECT_GT(r.finite, 0u) << "no data from the run";
  }
  EXPECT_GT(checked, 10);
  if (!empty_gpu.empty()) {
    std::printf("GPU queries without data (this host has no GPU):\n");
    for (const std::string& p : empty_gpu) std::printf("  %s\n", p.c_str());
  }
  kill(run.pid(), SIGTERM);
  EXPECT_TRUE(run.WaitFor(milliseconds(60000))) << run.Log();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace ckpt
