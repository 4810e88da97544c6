// ckpt-bench metrics: what ckpt::metrics costs the scheduler.
//
// hot_path_ns: one labelled counter update as the scheduler makes it
// (Metrics::Exploited: the experiment's series looked up, one atomic add),
// the median of 5 batches' mean over --updates calls; interval_committed_ns, store_operation_ns,
// worker_stats_ns and ring_stats_ns the same for the other per-event calls;
// hot_path_while_scraping_ns the first again with another thread scraping
// back to back.
// scrape_ms: the median (and p99) wall time of a full GET /metrics over HTTP
// on 127.0.0.1, with the families populated as in a 30-member run on two
// workers (real child processes, so the process sampler reads real /proc
// entries) and a thread reporting that run's updates all the while.
//
// pipeline_*: the same small PBT run through `ckpt-scheduler run` (real
// workers, store, rings) with metrics off and on, alternating, --rounds
// times each; the "on" runs are scraped once a second as Prometheus would.
// samples/s counts the run's known training samples over its wall time
// (start-up and final evaluation included, the same in both).
//
//   ckpt-bench metrics [--updates 2000000] [--scrapes 200] [--members 30]
//                      [--rounds 3] [--run-members 8] [--run-intervals 4]
//                      [--run-steps 40] [--skip-pipeline]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "ckpt/metrics/metrics.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;
using metrics::Metrics;

constexpr char kExperiment[] = "bench";

// A stand-in worker process: forked, it only waits to be killed.
pid_t StartIdleChild() {
  const pid_t pid = ::fork();
  if (pid == 0) {
    for (;;) ::pause();
  }
  return pid;
}

// One full scrape: GET /metrics over a fresh connection, read to the end.
// Returns the bytes received, or -1.
long Scrape(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  long total = -1;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0) {
    static const char kRequest[] =
        "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::send(fd, kRequest, sizeof(kRequest) - 1, MSG_NOSIGNAL) ==
        static_cast<ssize_t>(sizeof(kRequest) - 1)) {
      total = 0;
      char buf[65536];
      ssize_t n;
      while ((n = ::recv(fd, buf, sizeof(buf), 0)) > 0) total += n;
      if (n < 0) total = -1;
    }
  }
  ::close(fd);
  return total;
}

// Calls `fn` `n` times in 5 batches; the median over the batches of the mean
// time per call, in ns (the host is shared: one busy batch does not count).
template <typename Fn>
double NsPerCall(long long n, Fn fn) {
  constexpr int kBatches = 5;
  const long long per_batch = std::max(1LL, n / kBatches);
  std::vector<double> ns;
  for (int b = 0; b < kBatches; ++b) {
    const auto t0 = Clock::now();
    for (long long i = 0; i < per_batch; ++i) fn(b * per_batch + i);
    const auto t1 = Clock::now();
    ns.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() /
                 static_cast<double>(per_batch));
  }
  std::sort(ns.begin(), ns.end());
  return ns[kBatches / 2];
}

// The updates a run makes per committed interval on worker `w`.
struct RunFeeder {
  Metrics* m;
  int members;
  std::vector<std::string> workers{"w0", "w1"};
  std::vector<uint64_t> samples{0, 0};
  std::vector<uint64_t> ring{0, 0};
  long long intervals = 0;

  void Interval() {
    const size_t w = static_cast<size_t>(intervals % 2);
    const long long member = intervals % members;
    ++intervals;
    m->StoreOperation(metrics::StoreOp::kReadHeadBlob, 60e-6, 250 << 10);
    m->RingSendObserved(workers[w], "cpu", 40e-6);
    m->IntervalCommitted(kExperiment, "cpu", 0.2 + 0.05 * static_cast<double>(member % 10), 6400);
    m->StoreOperation(metrics::StoreOp::kCommitResult, 300e-6, 250 << 10);
    m->StoreOperation(metrics::StoreOp::kSetMemberState, 25e-6, 300);
    m->StoreOperation(metrics::StoreOp::kAppendEvent, 20e-6, 200);
    if (intervals % 4 == 0) {
      m->Exploited(kExperiment);
      m->StoreOperation(metrics::StoreOp::kExploit, 150e-6, 600);
    }
    if (intervals % 25 == 0) m->MemberFailed(kExperiment, ipc::FailureCode::kNonFinite);
    samples[w] += 6400;
    metrics::WorkerStats stats;
    stats.samples_total = samples[w];
    stats.slots = 4;
    stats.slots_busy = 1 + intervals % 4;
    stats.allocator_allocated_bytes = int64_t{90} << 20;
    stats.allocator_reserved_bytes = int64_t{128} << 20;
    m->SetWorkerStats(workers[w], "cpu", stats);
    ring[w] += 256 << 10;
    metrics::RingStats rs;
    rs.bytes_to_worker_total = ring[w];
    rs.bytes_from_worker_total = ring[w];
    rs.used_bytes = 256 << 10;
    rs.capacity_bytes = uint64_t{64} << 20;
    m->SetRingStats(workers[w], "cpu", rs);
    metrics::MemberCounts counts;
    counts.running = 8;
    counts.queued = members - 8;
    m->SetMemberCounts(kExperiment, counts);
    m->SetScores(kExperiment, format::MetricKind::kAccuracy, 0.9, 0.8);
  }
};

// A loopback port nobody listens on now.
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// One `ckpt-scheduler run` of `toml` into a fresh store; its wall seconds,
// or -1. With `scrape_port` > 0 a thread scrapes it once a second.
double TimedRun(const std::string& scheduler, const std::string& toml, const std::string& store,
                int scrape_port, int* scrapes) {
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    const char* argv[] = {scheduler.c_str(), "run",     toml.c_str(), "--store",
                          store.c_str(),     "--quiet", nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    ::_exit(127);
  }
  std::atomic<bool> done{false};
  std::thread scraper([&] {
    while (scrape_port > 0 && !done.load()) {
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (!done.load() && Scrape(scrape_port) > 0) ++*scrapes;
    }
  });
  int status = 0;
  ::waitpid(pid, &status, 0);
  const double wall = std::chrono::duration<double>(Clock::now() - t0).count();
  done.store(true);
  scraper.join();
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? wall : -1;
}

std::string PipelineToml(const std::string& metrics, long long members, long long intervals,
                         long long steps) {
  std::ostringstream os;
  os << "name = \"metrics-bench\"\nseed = 1\nmetrics = \"" << metrics << "\"\n"
     << "[model]\nspec = \"lenet5\"\n[data]\nbatch_size = 64\neval_size = 500\n"
     << "[population]\nsize = " << members << "\nsteps_per_interval = " << steps
     << "\nintervals = " << intervals << "\n"
     << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.005\nmax = 0.1\n"
     << "[policy]\nkind = \"pbt\"\nquantile = 0.25\n"
     << "[[devices]]\ndevice = \"cpu\"\nslots = 2\nfusion = \"plain\"\n";
  return os.str();
}

struct MetricsBenchOptions {
  long long updates = 2000000;
  int scrapes = 200;
  int members = 30;
  bool skip_pipeline = false;
  long long rounds = 3;
  long long run_members = 8;
  long long run_intervals = 4;
  long long run_steps = 40;
};

// The mean cost of each per-event call, one thread, no scrape running (ns).
struct PerCallNs {
  double hot_path = 0;
  double interval = 0;
  double store = 0;
  double worker_stats = 0;
  double ring_stats = 0;
};

PerCallNs TimePerCall(Metrics& m, int64_t updates) {
  PerCallNs ns;
  ns.hot_path = NsPerCall(updates, [&](int64_t) { m.Exploited(kExperiment); });
  ns.interval =
      NsPerCall(updates, [&](int64_t i) { m.IntervalCommitted(kExperiment, "cpu", 0.25, 6400); });
  ns.store = NsPerCall(
      updates, [&](int64_t) { m.StoreOperation(metrics::StoreOp::kCommitResult, 3e-4, 4096); });
  metrics::WorkerStats stats;
  stats.slots = 4;
  stats.slots_busy = 3;
  stats.allocator_allocated_bytes = 1 << 20;
  stats.allocator_reserved_bytes = 2 << 20;
  ns.worker_stats = NsPerCall(updates / 4, [&](int64_t i) {
    stats.samples_total = static_cast<uint64_t>(i) * 64;
    m.SetWorkerStats("w0", "cpu", stats);
  });
  metrics::RingStats rs;
  rs.capacity_bytes = 64 << 20;
  ns.ring_stats = NsPerCall(updates / 4, [&](int64_t i) {
    rs.bytes_to_worker_total = static_cast<uint64_t>(i) * 4096;
    m.SetRingStats("w0", "cpu", rs);
  });
  std::printf(
      "per call: Exploited %.1f ns, IntervalCommitted %.1f ns, StoreOperation %.1f ns, "
      "SetWorkerStats %.1f ns, SetRingStats %.1f ns\n",
      ns.hot_path, ns.interval, ns.store, ns.worker_stats, ns.ring_stats);
  return ns;
}

// Full scrapes timed: the wall time of each (ms, sorted once summarized)
// and the size of the last.
struct ScrapeTimes {
  std::vector<double> ms;
  int64_t bytes = 0;
};

// Scrapes while a run keeps reporting (about 1,000 intervals a second); stops
// at the first scrape that fails.
ScrapeTimes TimeScrapesWhileReporting(Metrics& m, RunFeeder* feeder, int scrapes) {
  std::atomic<bool> stop{false};
  std::thread run([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      feeder->Interval();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  });
  ScrapeTimes t;
  for (int i = 0; i < scrapes; ++i) {
    const auto t0 = Clock::now();
    t.bytes = Scrape(m.port());
    const auto t1 = Clock::now();
    if (t.bytes <= 0) break;
    t.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  stop.store(true);
  run.join();
  return t;
}

// The hot path again while another thread scrapes back to back: an update
// waits at most for a scrape's copy of the one series it touches.
double TimeHotPathWhileScraping(Metrics& m, int64_t updates) {
  std::atomic<bool> stop_scraping{false};
  std::atomic<int64_t> during_scrapes{0};
  std::thread scraper([&] {
    while (!stop_scraping.load(std::memory_order_relaxed)) {
      if (Scrape(m.port()) > 0) during_scrapes.fetch_add(1, std::memory_order_relaxed);
    }
  });
  const double ns = NsPerCall(updates, [&](int64_t) { m.Exploited(kExperiment); });
  stop_scraping.store(true);
  scraper.join();
  std::printf("Exploited while scraping back to back (%ld scrapes): %.1f ns\n",
              during_scrapes.load(), ns);
  return ns;
}

// The whole pipeline with metrics off and on, alternating: the "pipeline"
// object of the report, or null when either side has no run that finished.
nlohmann::json TimePipeline(const MetricsBenchOptions& o) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string scheduler = (self.parent_path() / "../bin/ckpt-scheduler").string();
  const int64_t rounds = o.rounds;
  const int64_t rm = o.run_members, ri = o.run_intervals, rsteps = o.run_steps;
  const double samples = static_cast<double>(rm * ri * rsteps * 64);
  char tmpl[] = "/tmp/ckpt-metrics-bench-XXXXXX";
  const std::string dir = ::mkdtemp(tmpl) ? tmpl : "";
  std::vector<double> off, on;
  int scrapes_on = 0;
  for (int64_t r = 0; r < rounds && !dir.empty(); ++r) {
    for (int with : {0, 1}) {
      const int port = with ? FreePort() : 0;
      const std::string toml = dir + "/run.toml";
      std::ofstream(toml) << PipelineToml(with ? "127.0.0.1:" + std::to_string(port) : "", rm, ri,
                                          rsteps);
      const std::string store = dir + "/store-" + std::to_string(r) + "-" + std::to_string(with);
      const double wall = TimedRun(scheduler, toml, store, port, &scrapes_on);
      std::filesystem::remove_all(store, ec);
      if (wall <= 0) {
        std::fprintf(stderr, "ckpt-bench metrics: %s run failed\n", scheduler.c_str());
        continue;
      }
      (with ? on : off).push_back(samples / wall);
      std::printf("pipeline round %" PRId64 " metrics %s: %.0f samples/s\n", r + 1,
                  with ? "on" : "off", samples / wall);
    }
  }
  std::filesystem::remove_all(dir, ec);
  if (off.empty() || on.empty()) return nullptr;
  return {{"samples_per_s_off", Median(off)},        {"samples_per_s_on", Median(on)},
          {"on_over_off", Median(on) / Median(off)}, {"rounds", rounds},
          {"scrapes_during_on_runs", scrapes_on},    {"samples_per_run", samples}};
}

int MetricsBench(const MetricsBenchOptions& o) {
  metrics::MetricsOptions options;
  options.listen = "127.0.0.1:0";
  auto opened = Metrics::Open(options);
  if (!opened.ok()) {
    std::fprintf(stderr, "ckpt-bench metrics: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  Metrics& m = **opened;
  std::vector<pid_t> children{StartIdleChild(), StartIdleChild()};
  m.WorkerStarted("w0", "cpu", children[0]);
  m.WorkerStarted("w1", "cpu", children[1]);
  RunFeeder feeder{&m, o.members};
  for (int i = 0; i < o.members * 4; ++i) feeder.Interval();

  const PerCallNs ns = TimePerCall(m, o.updates);
  ScrapeTimes scrape = TimeScrapesWhileReporting(m, &feeder, o.scrapes);
  const double hot_path_scraping_ns = TimeHotPathWhileScraping(m, o.updates);
  for (pid_t pid : children) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  std::vector<double>& ms = scrape.ms;
  if (ms.empty()) {
    std::fprintf(stderr, "ckpt-bench metrics: scrape of 127.0.0.1:%d failed\n", m.port());
    return 1;
  }
  std::sort(ms.begin(), ms.end());
  const double median = ms[ms.size() / 2];
  const double p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  std::printf("scrape (%zu, %ld bytes, %s): median %.3f ms, p99 %.3f ms\n", ms.size(), scrape.bytes,
              m.gpu_status().empty() ? "with NVML" : "without NVML", median, p99);

  const nlohmann::json pipeline = o.skip_pipeline ? nlohmann::json(nullptr) : TimePipeline(o);
  nlohmann::json out{{"bench", "metrics"},
                     {"pipeline", pipeline},
                     {"hot_path_ns", ns.hot_path},
                     {"hot_path_while_scraping_ns", hot_path_scraping_ns},
                     {"interval_committed_ns", ns.interval},
                     {"store_operation_ns", ns.store},
                     {"worker_stats_ns", ns.worker_stats},
                     {"ring_stats_ns", ns.ring_stats},
                     {"scrape_ms", median},
                     {"scrape_p99_ms", p99},
                     {"scrape_bytes", scrape.bytes},
                     {"scrapes", ms.size()},
                     {"members", o.members},
                     {"gpu_sampler", m.gpu_status().empty()}};
  PrintJsonLine(out);
  return 0;
}

BenchRun MetricsFlags(CLI::App& cmd) {
  auto o = std::make_shared<MetricsBenchOptions>();
  cmd.add_option("--updates", o->updates, "calls timed per hot-path measurement")
      ->check(CLI::Range(4LL, 1LL << 40))
      ->capture_default_str();
  cmd.add_option("--scrapes", o->scrapes, "GET /metrics timed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--members", o->members, "members of the simulated run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--skip-pipeline", o->skip_pipeline, "skip the ckpt-scheduler runs");
  cmd.add_option("--rounds", o->rounds, "pipeline runs with metrics off, and on")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--run-members", o->run_members, "population of each pipeline run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--run-intervals", o->run_intervals, "intervals of each pipeline run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--run-steps", o->run_steps, "steps per interval of each pipeline run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return [o] { return MetricsBench(*o); };
}

}  // namespace

CKPT_BENCHMARK("metrics", "ckpt::metrics: hot-path update cost and full scrape time", MetricsFlags);

}  // namespace ckpt::bench
