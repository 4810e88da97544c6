// ckpt::metrics: the families a scrape shows (type, unit, labels), the text
// format over real HTTP (a strict parser and Debian's promtool), bounded label
// cardinality, counters fed from running totals, the listener's address
// checked on the socket, and the GPU families' absence without NVML.
#include "ckpt/metrics/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/logging/logging.h"
#include "exposition.h"
#include "http_get.h"
#include "simulated_run.h"

namespace ckpt::metrics {
namespace {

using testing::ChildProcess;
using testing::Exposition;
using testing::ExpositionFamily;
using testing::LabelSet;
using testing::SimulatedRun;
using testing::SimulatedWorker;

// What metrics.h and the design promise, written out independently of the
// library: name, type, unit (the name's suffix says it), label names.
struct ExpectedFamily {
  std::string name;
  std::string type;
  std::string unit;  // "seconds", "bytes", "ratio" or "" (a count or a score)
  std::set<std::string> labels;
};

const std::vector<ExpectedFamily>& ExpectedFamilies() {
  static const std::vector<ExpectedFamily> kFamilies{
      {"ckpt_interval_duration_seconds", "histogram", "seconds", {"experiment", "device"}},
      {"ckpt_trained_samples_total", "counter", "", {"experiment", "device"}},
      {"ckpt_exploits_total", "counter", "", {"experiment"}},
      {"ckpt_best_score", "gauge", "", {"experiment", "metric"}},
      {"ckpt_median_score", "gauge", "", {"experiment", "metric"}},
      {"ckpt_members", "gauge", "", {"experiment", "state"}},
      {"ckpt_member_failures_total", "counter", "", {"experiment", "reason"}},
      {"ckpt_store_operation_duration_seconds", "histogram", "seconds", {"op"}},
      {"ckpt_store_bytes_total", "counter", "bytes", {"op"}},
      {"ckpt_worker_samples_total", "counter", "", {"worker", "device"}},
      {"ckpt_worker_slots", "gauge", "", {"worker", "device"}},
      {"ckpt_worker_slots_busy", "gauge", "", {"worker", "device"}},
      {"ckpt_worker_fused", "gauge", "", {"worker", "device"}},
      {"ckpt_worker_allocator_allocated_bytes", "gauge", "bytes", {"worker", "device"}},
      {"ckpt_worker_allocator_reserved_bytes", "gauge", "bytes", {"worker", "device"}},
      {"ckpt_worker_restarts_total", "counter", "", {"worker", "device"}},
      {"ckpt_worker_cpu_seconds_total", "counter", "seconds", {"worker", "device"}},
      {"ckpt_worker_resident_memory_bytes", "gauge", "bytes", {"worker", "device"}},
      {"ckpt_ring_send_duration_seconds", "histogram", "seconds", {"worker", "device"}},
      {"ckpt_ring_used_bytes", "gauge", "bytes", {"worker", "device"}},
      {"ckpt_ring_capacity_bytes", "gauge", "bytes", {"worker", "device"}},
      {"ckpt_ring_bad_records_total", "counter", "", {"worker", "device"}},
      {"ckpt_ring_bytes_total", "counter", "bytes", {"worker", "device", "direction"}},
      {"ckpt_scheduler_cpu_seconds_total", "counter", "seconds", {}},
      {"ckpt_scheduler_resident_memory_bytes", "gauge", "bytes", {}},
      {"ckpt_host_cpus", "gauge", "", {}},
      {"ckpt_metrics_dropped_updates_total", "counter", "", {}},
      {"ckpt_remote_slots_capped_total", "counter", "", {}},
      {"ckpt_remote_task_timeouts_total", "counter", "", {}},
  };
  return kFamilies;
}

// Present exactly when NVML works.
const std::vector<ExpectedFamily>& ExpectedGpuFamilies() {
  static const std::vector<ExpectedFamily> kFamilies{
      {"ckpt_gpu_utilization_ratio", "gauge", "ratio", {"device"}},
      {"ckpt_gpu_memory_used_bytes", "gauge", "bytes", {"device"}},
      {"ckpt_gpu_memory_total_bytes", "gauge", "bytes", {"device"}},
      {"ckpt_gpu_process_memory_bytes", "gauge", "bytes", {"device", "worker"}},
  };
  return kFamilies;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

MetricsOptions LoopbackAnyPort() {
  MetricsOptions o;
  o.listen = "127.0.0.1:0";
  return o;
}

std::unique_ptr<Metrics> OpenOrDie(const MetricsOptions& options) {
  auto m = Metrics::Open(options);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  return m.ok() ? std::move(*m) : nullptr;
}

// GET /metrics over real HTTP, as Prometheus does.
StatusOr<std::string> ScrapeText(const Metrics& m) {
  CKPT_ASSIGN_OR_RETURN(testing::HttpResponse r,
                        testing::HttpGet("127.0.0.1", m.port(), "/metrics"));
  if (r.status != 200) return Status::Unavailable("HTTP " + std::to_string(r.status));
  // prometheus-cpp 1.0 says "text/plain; charset=utf-8", which Prometheus
  // reads as the text format 0.0.4.
  if (r.headers["content-type"].rfind("text/plain", 0) != 0) {
    return Status::Corruption("content-type " + r.headers["content-type"]);
  }
  return r.body;
}

Exposition ParseOrFail(const std::string& text) {
  auto parsed = testing::ParseExposition(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status().ToString() << "\n" << text.substr(0, 3000);
  return parsed.ok() ? *parsed : Exposition{};
}

// prometheus-cpp's listener adds its own exposer_* families (scrapes, bytes,
// request latency) to every endpoint; they are not ckpt's and are constant in
// number.
bool IsListenerOwn(const std::string& family) { return family.rfind("exposer_", 0) == 0; }

Exposition CkptFamilies(Exposition e) {
  for (auto it = e.begin(); it != e.end();) {
    it = IsListenerOwn(it->first) ? e.erase(it) : std::next(it);
  }
  return e;
}

size_t SeriesCount(const Exposition& e) {
  size_t n = 0;
  for (const auto& [name, f] : e) n += f.SeriesLabels().size();
  return n;
}

double ValueOf(const Exposition& e, const std::string& family, const LabelSet& labels,
               const std::string& sample_suffix = "") {
  auto it = e.find(family);
  if (it == e.end()) return std::nan("");
  const auto* s = it->second.Find(family + sample_suffix, labels);
  return s ? s->value : std::nan("");
}

// Worker stand-ins with real pids, and a run of `members` members over them.
struct Fixture {
  std::vector<std::unique_ptr<ChildProcess>> children;
  std::vector<SimulatedWorker> workers;

  explicit Fixture(int n_workers) {
    for (int i = 0; i < n_workers; ++i) {
      auto child = ChildProcess::Start();
      EXPECT_TRUE(child.ok()) << child.status().ToString();
      if (!child.ok()) return;
      workers.push_back(SimulatedWorker{"w" + std::to_string(i), "cpu", (*child)->pid()});
      children.push_back(std::move(*child));
    }
  }
};

TEST(MetricsTest, EveryFamilyIsExposedWithItsTypeUnitAndLabels) {
  auto m = OpenOrDie(LoopbackAnyPort());
  ASSERT_NE(m, nullptr);
  Fixture fx(2);
  ASSERT_EQ(fx.workers.size(), 2u);
  SimulatedRun run(m.get(), "exp-a", 30, fx.workers);
  run.Start();
  for (int i = 0; i < 30; ++i) run.Step();

  auto text = ScrapeText(*m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  const Exposition e = ParseOrFail(*text);

  std::vector<ExpectedFamily> expected = ExpectedFamilies();
  const bool gpu = m->gpu_status().empty();
  if (gpu) {
    for (const auto& f : ExpectedGpuFamilies()) expected.push_back(f);
  }
  std::set<std::string> expected_names;
  for (const ExpectedFamily& want : expected) {
    SCOPED_TRACE(want.name);
    expected_names.insert(want.name);
    auto it = e.find(want.name);
    ASSERT_NE(it, e.end()) << "family missing";
    const ExpositionFamily& f = it->second;
    EXPECT_EQ(f.type, want.type);
    EXPECT_FALSE(f.help.empty());
    // Prometheus naming: counters end in _total, a unit is the last word
    // before it, histograms of durations are _seconds.
    const std::string stem =
        want.type == "counter" ? want.name.substr(0, want.name.size() - 6) : want.name;
    if (want.type == "counter") {
      EXPECT_TRUE(EndsWith(want.name, "_total"));
    }
    if (!want.unit.empty()) {
      EXPECT_TRUE(EndsWith(stem, "_" + want.unit)) << "unit " << want.unit;
    }
    for (const std::string unit : {"_seconds", "_bytes", "_ratio"}) {
      if (EndsWith(stem, unit)) {
        EXPECT_EQ("_" + want.unit, unit);
      }
    }
    EXPECT_FALSE(f.samples.empty()) << "no series after a run";
    const std::vector<std::string> names = f.LabelNames();
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want.labels);
    for (const LabelSet& series : f.SeriesLabels()) {
      EXPECT_EQ(series.size(), want.labels.size()) << "a series lacks a label";
    }
  }
  for (const auto& [name, f] : e) {
    if (IsListenerOwn(name)) continue;
    EXPECT_TRUE(expected_names.count(name)) << "unexpected family " << name;
    EXPECT_EQ(name.rfind("ckpt_", 0), 0u) << name;
  }
  if (!gpu) {
    std::printf("GPU families absent: %s\n", m->gpu_status().c_str());
    for (const auto& f : ExpectedGpuFamilies()) EXPECT_EQ(e.count(f.name), 0u) << f.name;
  }
  // The HTTP body is what RenderText gives (same families and series).
  const Exposition rendered = ParseOrFail(m->RenderText());
  EXPECT_EQ(SeriesCount(rendered), SeriesCount(CkptFamilies(e)));
}

TEST(MetricsTest, ScrapePassesPromtoolCheckMetrics) {
  constexpr char kPromtool[] = "/usr/bin/promtool";
  if (::access(kPromtool, X_OK) != 0) GTEST_SKIP() << kPromtool << " is not installed";
  auto m = OpenOrDie(LoopbackAnyPort());
  ASSERT_NE(m, nullptr);
  Fixture fx(2);
  ASSERT_EQ(fx.workers.size(), 2u);
  SimulatedRun run(m.get(), "exp-a", 30, fx.workers);
  run.Start();
  for (int i = 0; i < 10; ++i) run.Step();
  auto text = ScrapeText(*m);
  ASSERT_TRUE(text.ok()) << text.status().ToString();

  char path[] = "/tmp/ckpt-metrics-scrape-XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << *text;
  // promtool exits 0 only for a parseable exposition without lint problems
  // (naming conventions, units, _total), 3 for lint problems, 1 for errors.
  const std::string cmd = std::string(kPromtool) + " check metrics < " + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[512];
  while (std::fgets(buf, sizeof(buf), p)) out += buf;
  const int rc = ::pclose(p);
  std::remove(path);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out, "");
}

TEST(MetricsTest, StrictParserRejectsWhatPrometheusRejects) {
  // The parser the other tests rely on must be able to fail.
  EXPECT_FALSE(testing::ParseExposition("x{a=\"b\" 1\n").ok());
  EXPECT_FALSE(testing::ParseExposition("# TYPE x counter\nx -1\n").ok());
  EXPECT_FALSE(testing::ParseExposition("x 1\nx 2\n").ok());
  EXPECT_FALSE(
      testing::ParseExposition("# TYPE x gauge\nx 1\n# TYPE y gauge\ny 1\nx{a=\"1\"} 2\n").ok());
  EXPECT_FALSE(testing::ParseExposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                        "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n")
                   .ok());
  EXPECT_FALSE(testing::ParseExposition("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\n"
                                        "h_count 1\n")
                   .ok());
  EXPECT_FALSE(testing::ParseExposition("x{a=\"\\t\"} 1\n").ok());
  EXPECT_FALSE(testing::ParseExposition("x 1").ok());
  EXPECT_TRUE(testing::ParseExposition("# HELP h d\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
                                       "h_bucket{le=\"+Inf\"} 1\nh_sum 0.5\nh_count 1\n"
                                       "x{a=\"q\\\"\\\\\\n\"} NaN\n")
                  .ok());
}

TEST(MetricsTest, LabelCardinalityStaysBoundedWith300Members) {
  auto m = OpenOrDie(LoopbackAnyPort());
  ASSERT_NE(m, nullptr);
  Fixture fx(4);
  ASSERT_EQ(fx.workers.size(), 4u);
  SimulatedRun run(m.get(), "exp-300", 300, fx.workers);
  run.Start();
  // After a few steps every per-experiment, per-worker and per-op series exists.
  for (int i = 0; i < 25; ++i) run.Step();
  auto first = ScrapeText(*m);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  const size_t series_after_first = SeriesCount(CkptFamilies(ParseOrFail(*first)));
  ASSERT_GT(series_after_first, 0u);
  // Every one of the 300 members trains several intervals.
  while (run.intervals() < int64_t{300} * 5) run.Step();
  auto last = ScrapeText(*m);
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  const Exposition e = CkptFamilies(ParseOrFail(*last));
  EXPECT_EQ(SeriesCount(e), series_after_first);
  // Experiment, device, worker and the enum labels only; their values come
  // from the run's configuration, never from a member.
  const std::set<std::string> allowed{
      "experiment", "device", "worker",    "state",
      "reason",     "op",     "direction", "metric"};  // the experiment's, one per experiment
  std::set<std::string> values;
  for (const auto& [name, f] : e) {
    for (const std::string& label : f.LabelNames()) EXPECT_TRUE(allowed.count(label)) << label;
    for (const LabelSet& s : f.SeriesLabels()) {
      for (const auto& [k, v] : s) values.insert(k + "=" + v);
    }
  }
  // reason: one value per member failure code (ipc::kMemberFailureCodeCount).
  EXPECT_LE(values.size(), 1u + 4u + 1u + 6u + 9u + 7u + 2u + 1u) << "distinct label values";
  EXPECT_EQ(
      ValueOf(e, "ckpt_trained_samples_total", {{"experiment", "exp-300"}, {"device", "cpu"}}),
      static_cast<double>(run.intervals()) * 6400);
}

TEST(MetricsTest, SeriesPerExperimentAndWorkerAreCapped) {
  // A caller that passed member names as experiments or workers would grow the
  // registry without bound; the caps stop it and count what they drop.
  MetricsOptions o = LoopbackAnyPort();
  o.max_experiments = 2;
  o.max_workers = 3;
  o.gpu = false;
  std::vector<std::pair<LogLevel, std::string>> lines;
  o.log = [&lines](LogLevel level, const std::string& line) { lines.emplace_back(level, line); };
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  for (int i = 0; i < 300; ++i) {
    const std::string member = "member-" + std::to_string(i);
    m->IntervalCommitted(member, "cpu", 0.5, 10);
    m->Exploited(member);
    WorkerStats stats;
    stats.samples_total = 10;
    m->SetWorkerStats(member, "cpu", stats);
  }
  const Exposition e = ParseOrFail(m->RenderText());
  EXPECT_EQ(e.at("ckpt_exploits_total").SeriesLabels().size(), 2u);
  EXPECT_EQ(e.at("ckpt_interval_duration_seconds").SeriesLabels().size(), 2u);
  EXPECT_EQ(e.at("ckpt_worker_samples_total").SeriesLabels().size(), 3u);
  EXPECT_EQ(ValueOf(e, "ckpt_metrics_dropped_updates_total", {}), 298.0 * 2 + 297.0);
  // One line says so, the first time.
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0].first, LogLevel::kWarning);
  EXPECT_NE(lines[0].second.find("\"member-2\""), std::string::npos) << lines[0].second;
  EXPECT_NE(lines[0].second.find("max_experiments 2"), std::string::npos) << lines[0].second;
  // Forgetting an experiment frees its place.
  m->ForgetExperiment("member-0");
  m->Exploited("member-300");
  const Exposition after = ParseOrFail(m->RenderText());
  EXPECT_TRUE(std::isnan(ValueOf(after, "ckpt_exploits_total", {{"experiment", "member-0"}})));
  EXPECT_EQ(ValueOf(after, "ckpt_exploits_total", {{"experiment", "member-300"}}), 1.0);
}

TEST(MetricsTest, CountersFromRunningTotalsSurviveAWorkerRestart) {
  MetricsOptions o;
  o.listen = "";
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  auto child = ChildProcess::Start();
  ASSERT_TRUE(child.ok());
  m->WorkerStarted("w0", "cpu", (*child)->pid());
  WorkerStats stats;
  stats.slots = 4;
  stats.slots_busy = 3;
  stats.samples_total = 100;
  m->SetWorkerStats("w0", "cpu", stats);
  stats.samples_total = 250;
  m->SetWorkerStats("w0", "cpu", stats);
  RingStats ring;
  ring.bytes_to_worker_total = 1000;
  ring.bytes_from_worker_total = 2000;
  ring.bad_records_total = 1;
  ring.used_bytes = 64;
  ring.capacity_bytes = 4096;
  m->SetRingStats("w0", "cpu", ring);

  const LabelSet w0{{"worker", "w0"}, {"device", "cpu"}};
  Exposition e = ParseOrFail(m->RenderText());
  EXPECT_EQ(ValueOf(e, "ckpt_worker_samples_total", w0), 250);
  EXPECT_EQ(ValueOf(e, "ckpt_worker_restarts_total", w0), 0);
  EXPECT_EQ(ValueOf(e, "ckpt_worker_slots_busy", w0), 3);
  EXPECT_GT(ValueOf(e, "ckpt_worker_resident_memory_bytes", w0), 0);
  EXPECT_GE(ValueOf(e, "ckpt_worker_cpu_seconds_total", w0), 0);

  // The process dies: its gauges and process figures go, its counters stay.
  (*child)->Kill();
  m->WorkerExited("w0", "cpu");
  e = ParseOrFail(m->RenderText());
  EXPECT_TRUE(std::isnan(ValueOf(e, "ckpt_worker_slots_busy", w0)));
  EXPECT_TRUE(std::isnan(ValueOf(e, "ckpt_ring_used_bytes", w0)));
  EXPECT_TRUE(std::isnan(ValueOf(e, "ckpt_worker_resident_memory_bytes", w0)));
  EXPECT_EQ(ValueOf(e, "ckpt_worker_samples_total", w0), 250);

  // A new process counts from zero again; the counter goes on from 250.
  auto second = ChildProcess::Start();
  ASSERT_TRUE(second.ok());
  m->WorkerStarted("w0", "cpu", (*second)->pid());
  stats.samples_total = 30;
  m->SetWorkerStats("w0", "cpu", stats);
  ring.bytes_to_worker_total = 10;
  ring.bytes_from_worker_total = 20;
  ring.bad_records_total = 0;
  m->SetRingStats("w0", "cpu", ring);
  e = ParseOrFail(m->RenderText());
  EXPECT_EQ(ValueOf(e, "ckpt_worker_samples_total", w0), 280);
  EXPECT_EQ(ValueOf(e, "ckpt_worker_restarts_total", w0), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_ring_bytes_total",
                    {{"worker", "w0"}, {"device", "cpu"}, {"direction", "to_worker"}}),
            1010);
  EXPECT_EQ(ValueOf(e, "ckpt_ring_bad_records_total", w0), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_worker_slots_busy", w0), 3);
  EXPECT_GT(ValueOf(e, "ckpt_worker_resident_memory_bytes", w0), 0);
}

TEST(MetricsTest, RemoteWorkerBoundsAreCounted) {
  MetricsOptions o;
  o.listen = "";
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  Exposition e = ParseOrFail(m->RenderText());
  EXPECT_EQ(ValueOf(e, "ckpt_remote_slots_capped_total", {}), 0);
  EXPECT_EQ(ValueOf(e, "ckpt_remote_task_timeouts_total", {}), 0);
  m->RemoteSlotsCapped();
  m->RemoteTaskTimedOut();
  m->RemoteTaskTimedOut();
  e = ParseOrFail(m->RenderText());
  EXPECT_EQ(ValueOf(e, "ckpt_remote_slots_capped_total", {}), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_remote_task_timeouts_total", {}), 2);
}

TEST(MetricsTest, ExperimentFiguresAreWhatWasReported) {
  MetricsOptions o;
  o.listen = "";
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  m->IntervalCommitted("e", "cuda:1", 0.3, 640);
  m->IntervalCommitted("e", "cuda:1", 1.5, 640);
  m->MemberFailed("e", ipc::FailureCodeFromWorker("out-of-memory"));
  m->MemberFailed("e", ipc::FailureCodeFromWorker("something new"));
  m->Exploited("e");
  MemberCounts c;
  c.running = 3;
  c.queued = 5;
  c.failed = 1;
  m->SetMemberCounts("e", c);
  m->SetScores("e", format::MetricKind::kAccuracy, 0.91, 0.85);
  m->StoreOperation(StoreOp::kCommitResult, 0.002, 4096);
  const Exposition e = ParseOrFail(m->RenderText());
  const LabelSet ed{{"experiment", "e"}, {"device", "cuda:1"}};
  EXPECT_EQ(ValueOf(e, "ckpt_interval_duration_seconds", ed, "_count"), 2);
  EXPECT_DOUBLE_EQ(ValueOf(e, "ckpt_interval_duration_seconds", ed, "_sum"), 1.8);
  LabelSet le = ed;
  le["le"] = "0.32";
  EXPECT_EQ(ValueOf(e, "ckpt_interval_duration_seconds", le, "_bucket"), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_trained_samples_total", ed), 1280);
  EXPECT_EQ(
      ValueOf(e, "ckpt_member_failures_total", {{"experiment", "e"}, {"reason", "out_of_memory"}}),
      1);
  EXPECT_EQ(ValueOf(e, "ckpt_member_failures_total", {{"experiment", "e"}, {"reason", "internal"}}),
            1);
  EXPECT_EQ(
      ValueOf(e, "ckpt_member_failures_total", {{"experiment", "e"}, {"reason", "non_finite"}}), 0);
  EXPECT_EQ(ValueOf(e, "ckpt_exploits_total", {{"experiment", "e"}}), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_members", {{"experiment", "e"}, {"state", "queued"}}), 5);
  EXPECT_EQ(ValueOf(e, "ckpt_members", {{"experiment", "e"}, {"state", "done"}}), 0);
  EXPECT_EQ(ValueOf(e, "ckpt_best_score", {{"experiment", "e"}, {"metric", "accuracy"}}), 0.91);
  EXPECT_EQ(ValueOf(e, "ckpt_median_score", {{"experiment", "e"}, {"metric", "accuracy"}}), 0.85);
  EXPECT_EQ(ValueOf(e, "ckpt_store_bytes_total", {{"op", "commit_result"}}), 4096);
  EXPECT_EQ(
      ValueOf(e, "ckpt_store_operation_duration_seconds", {{"op", "commit_result"}}, "_count"), 1);
  EXPECT_EQ(ValueOf(e, "ckpt_store_operation_duration_seconds", {{"op", "flush"}}, "_count"), 0);
}

// --- the listener, checked on the socket -------------------------------------

struct ListeningSocket {
  std::string address;  // "127.0.0.1", "0.0.0.0", "::", ...
  int port = 0;
};

// TCP sockets in LISTEN state that this process holds (inodes of /proc/self/fd
// matched against /proc/net/tcp and tcp6).
std::vector<ListeningSocket> OwnListeningSockets() {
  std::set<std::string> inodes;
  if (DIR* d = ::opendir("/proc/self/fd")) {
    while (dirent* ent = ::readdir(d)) {
      char target[256];
      const std::string link = std::string("/proc/self/fd/") + ent->d_name;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) continue;
      target[n] = '\0';
      const std::string t(target);
      if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
    }
    ::closedir(d);
  }
  std::vector<ListeningSocket> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;
      const size_t colon = local.find(':');
      const std::string hex = local.substr(0, colon);
      ListeningSocket s;
      s.port = static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16));
      char text[INET6_ADDRSTRLEN] = {};
      if (hex.size() == 8) {
        in_addr a{};
        a.s_addr = static_cast<uint32_t>(std::stoul(hex, nullptr, 16));  // host order as stored
        ::inet_ntop(AF_INET, &a, text, sizeof(text));
      } else {
        in6_addr a{};
        for (int w = 0; w < 4; ++w) {
          const uint32_t word =
              static_cast<uint32_t>(std::stoul(hex.substr(size_t{8} * w, 8), nullptr, 16));
          std::memcpy(&a.s6_addr[size_t{4} * w], &word, 4);
        }
        ::inet_ntop(AF_INET6, &a, text, sizeof(text));
      }
      s.address = text;
      out.push_back(s);
    }
  }
  return out;
}

std::vector<ListeningSocket> OnPort(const std::vector<ListeningSocket>& all, int port) {
  std::vector<ListeningSocket> out;
  for (const auto& s : all) {
    if (s.port == port) out.push_back(s);
  }
  return out;
}

// An IPv4 address of this host that is not loopback; "" when there is none.
std::string NonLoopbackAddress() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* i = list; i != nullptr && found.empty(); i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* a = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    if ((ntohl(a->sin_addr.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
    found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(MetricsTest, ListensOnLoopbackOnlyByDefault) {
  const MetricsOptions defaults;
  EXPECT_EQ(defaults.listen, "127.0.0.1:9464");
  auto opened = Metrics::Open(defaults);
  MetricsOptions used = defaults;
  if (!opened.ok()) {
    // 9464 is held by another process on this host (a running scheduler):
    // the refusal must name the address, and the default host is checked on
    // a free port instead.
    EXPECT_TRUE(opened.status().IsUnavailable()) << opened.status().ToString();
    EXPECT_NE(opened.status().message().find("127.0.0.1:9464"), std::string::npos);
    std::printf("port 9464 is busy here (%s); checking 127.0.0.1 on a free port\n",
                opened.status().ToString().c_str());
    used.listen = "127.0.0.1:0";
    opened = Metrics::Open(used);
  }
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  std::unique_ptr<Metrics> m = std::move(*opened);
  ASSERT_GT(m->port(), 0);
  const auto sockets = OnPort(OwnListeningSockets(), m->port());
  ASSERT_FALSE(sockets.empty()) << "no listening socket of this process on port " << m->port();
  for (const ListeningSocket& s : sockets) EXPECT_EQ(s.address, "127.0.0.1");

  auto local = testing::HttpGet("127.0.0.1", m->port(), "/metrics");
  ASSERT_TRUE(local.ok()) << local.status().ToString();
  EXPECT_EQ(local->status, 200);
  const std::string outside = NonLoopbackAddress();
  if (outside.empty()) {
    std::printf("no non-loopback IPv4 address: refusal from outside not checked\n");
  } else {
    auto remote = testing::HttpGet(outside, m->port(), "/metrics", std::chrono::seconds(5));
    ASSERT_FALSE(remote.ok()) << "served on " << outside;
    EXPECT_NE(remote.status().message().find("Connection refused"), std::string::npos)
        << remote.status().ToString();
  }
}

TEST(MetricsTest, AllInterfacesOnlyWhenTheAddressSaysSo) {
  // The same socket check sees the difference, so the loopback test can fail.
  MetricsOptions o;
  o.listen = "0.0.0.0:0";
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  const auto sockets = OnPort(OwnListeningSockets(), m->port());
  ASSERT_EQ(sockets.size(), 1u);
  EXPECT_EQ(sockets[0].address, "0.0.0.0");
  const std::string outside = NonLoopbackAddress();
  if (!outside.empty()) {
    auto remote = testing::HttpGet(outside, m->port(), "/metrics");
    ASSERT_TRUE(remote.ok()) << remote.status().ToString();
    EXPECT_EQ(remote->status, 200);
  }
}

TEST(MetricsTest, EmptyListenRunsNoListener) {
  const size_t before = OwnListeningSockets().size();
  MetricsOptions o;
  o.listen = "";
  auto m = OpenOrDie(o);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->port(), 0);
  EXPECT_EQ(OwnListeningSockets().size(), before);
  m->Exploited("e");
  const Exposition e = ParseOrFail(m->RenderText());
  EXPECT_EQ(ValueOf(e, "ckpt_exploits_total", {{"experiment", "e"}}), 1);
}

TEST(MetricsTest, BusyPortIsAnUnavailableStatusNamingTheAddress) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 4), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  MetricsOptions o;
  o.listen = address;
  auto m = Metrics::Open(o);
  ::close(fd);
  ASSERT_FALSE(m.ok());
  EXPECT_TRUE(m.status().IsUnavailable()) << m.status().ToString();
  EXPECT_NE(m.status().message().find(address), std::string::npos) << m.status().ToString();
  EXPECT_NE(m.status().message().find("Address already in use"), std::string::npos)
      << m.status().ToString();
}

TEST(MetricsTest, MalformedListenAddressIsInvalidArgument) {
  for (const char* bad : {"9464", ":9464", "localhost:9464", "127.0.0.1:", "127.0.0.1:65536",
                          "127.0.0.1:94x4", "[::1]:9464", "::1:9464"}) {
    MetricsOptions o;
    o.listen = bad;
    auto m = Metrics::Open(o);
    ASSERT_FALSE(m.ok()) << bad;
    EXPECT_TRUE(m.status().IsInvalidArgument()) << bad << ": " << m.status().ToString();
    EXPECT_NE(m.status().message().find(bad), std::string::npos) << m.status().ToString();
  }
}

// --- GPU families without NVML -----------------------------------------------

TEST(MetricsTest, WithoutNvmlGpuFamiliesAreAbsentAndOneLineSaysWhy) {
  // Without MetricsOptions::log the line goes to the process's logger
  // (ckpt/logging/logging.h): captured here by a second sink.
  std::ostringstream log;
  auto& sinks = logging::Logger().sinks();
  sinks.push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(log));
  MetricsOptions o;
  o.listen = "";
  o.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  auto m = Metrics::Open(o);
  sinks.pop_back();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_NE((*m)->gpu_status().find("dlopen /nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << (*m)->gpu_status();
  const std::string text = log.str();
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 1u) << text;
  EXPECT_NE(text.find((*m)->gpu_status()), std::string::npos) << text;
  const Exposition e = ParseOrFail((*m)->RenderText());
  for (const auto& f : ExpectedGpuFamilies()) EXPECT_EQ(e.count(f.name), 0u) << f.name;

  // The same line through MetricsOptions::log, where the scheduler sends it.
  std::vector<std::pair<LogLevel, std::string>> routed_lines;
  o.log = [&routed_lines](LogLevel level, const std::string& line) {
    routed_lines.emplace_back(level, line);
  };
  auto routed = Metrics::Open(o);
  ASSERT_TRUE(routed.ok()) << routed.status().ToString();
  ASSERT_EQ(routed_lines.size(), 1u);
  EXPECT_EQ(routed_lines[0].first, LogLevel::kInfo);
  EXPECT_NE(routed_lines[0].second.find((*routed)->gpu_status()), std::string::npos)
      << routed_lines[0].second;

  // Turned off by options: no NVML, no log line.
  std::ostringstream quiet;
  sinks.push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(quiet));
  o.gpu = false;
  o.log = nullptr;
  auto off = Metrics::Open(o);
  sinks.pop_back();
  ASSERT_TRUE(off.ok());
  EXPECT_EQ((*off)->gpu_status(), "NVML disabled by options");
  EXPECT_EQ(quiet.str(), "");
}

}  // namespace
}  // namespace ckpt::metrics
