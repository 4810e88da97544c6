// ckpt-bench population: the main job through the whole pipeline (scheduler,
// store, rings, worker processes), against the same training kernels called
// directly, in the same run.
//
//   ckpt-bench population [--config examples/fashion-mnist-pbt.toml]
//       [--members N] [--intervals I] [--steps S] [--eval-size E] [--slots K]
//       [--workers W] [--null-members N] [--null-intervals I] [--skip-train]
//       [--ring-mb M] [--null-sizes 30,10000] [--null-repeat R]
//       [--barriers ahead|wait|both] [--null-states changing|same]
//       [--transport ring|tcp [--repeat N] [--tcp-first]] [--blob-log on|off|both]
//
// --transport tcp: the same runs with the workers connected over TCP on
// loopback (ckpt-worker --connect processes this program starts; the
// scheduler spawns none and listens on 127.0.0.1:0), each next to the same run
// over the shared-memory ring: member_intervals_per_s_null and samples_per_s
// of both (prefixed tcp_ and ring_; the best of --repeat rounds that alternate
// which goes first) and their ratios tcp/ring. The bare loops are skipped then.
//
// The null run trains 0 steps and evaluates nothing, and (--null-states
// changing, the default) each interval still changes one weight, so every
// committed state is new bytes as in a real run (with `same` the worker
// returns the state unchanged and the store deduplicates it, which
// understates a real run's cost). Per size it reports the scheduler's CPU
// microseconds per member-interval (its rusage; it runs in this process),
// the bytes written per member-interval (/proc/self/io write_bytes) and
// their ratio to one state's tensors, and the store's bytes per member at
// rest. What is left is the
// pipeline's own cost per member-interval (store read, ring, worker decode and
// encode of a LeNet-5 state, commit, policy), measured in steady state (from
// the first committed result to the last; the start-up before the first
// result is reported as null_first_result_s_N). --null-sizes runs it at each
// population size and reports the cost ratio of the last size to the first,
// with the scheduler's peak RSS (this process; reset before each run, the
// first run's reported) and the
// store's size on disk at each. --null-repeat R runs each size R times from an
// empty store and reports the median (member_intervals_per_s_null), with each
// run's figure (..._runs_N) and the spread (..._min_N, ..._max_N): one run of
// 30 members lasts seconds, and on a shared host such runs spread by a third.
// --barriers both runs each size twice, first
// waiting at every synchronous barrier, then with members running ahead of
// barriers they cannot be exploited at (the default): the ratio is
// null_run_ahead_speedup_N.
// --blob-log: where the null runs' store keeps states: its blob log (on, the
// default), RocksDB's blob files (off), or both: each size runs with the blob
// log, then without it, one after the other in the same invocation; the
// second run's figures are under "rocksdb_blob_files", and
// blob_log_vs_rocksdb_written_N and blob_log_vs_rocksdb_per_s_N are the
// ratios of the two (bytes written per member-interval; member-intervals/s).
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/ipc/tcp_channel.h"
#include "ckpt/model/model_spec.h"
#include "ckpt/model/trainer.h"
#include "ckpt/records/config.h"
#include "ckpt/scheduler/scheduler.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

// Resets this process's peak RSS (VmHWM) to its current RSS (Linux >= 4.0).
void ResetPeakRss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// Bytes this process has caused to be written to storage (/proc/self/io
// write_bytes: the store's WAL, blob and table files; the scheduler runs in
// this process). 0 when the kernel does not account it.
uint64_t WrittenBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  uint64_t value = 0;
  while (io >> key >> value) {
    if (key == "write_bytes:") return value;
  }
  return 0;
}

double CpuSeconds(int who) {
  rusage u{};
  getrusage(who, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// --null-states: the workers the scheduler spawns, and those this program
// connects, inherit this process's environment (ckpt-worker reads
// CKPT_TOUCH_NULL_INTERVALS at start).
void SetNullStates(const std::string& mode) {
  if (mode == "changing") {
    setenv("CKPT_TOUCH_NULL_INTERVALS", "1", 1);
  } else {
    unsetenv("CKPT_TOUCH_NULL_INTERVALS");
  }
}

struct RunResult {
  scheduler::ExperimentSummary summary;
  double wall_s = 0;
  // CPU time of the scheduler (this process) and of the workers (reaped
  // children) over the run.
  double scheduler_cpu_s = 0;
  double workers_cpu_s = 0;
  int64_t workers_peak_rss = 0;
};

// Starts `workers` ckpt-worker --connect processes once the scheduler of
// `store` writes its address; returns their pids (reaped by the caller).
std::vector<pid_t> ConnectWorkers(const std::string& store, const std::string& secret_file,
                                  int workers, int slots) {
  std::vector<pid_t> pids;
  std::string addr;
  const auto until = Clock::now() + std::chrono::seconds(60);
  while (addr.empty() && Clock::now() < until) {
    std::ifstream(store + "/workers.addr") >> addr;
    if (addr.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (addr.empty()) {
    std::fprintf(stderr, "population: the scheduler never listened\n");
    return pids;
  }
  auto found = scheduler::FindWorkerBinary("");
  if (!found.ok()) {
    std::fprintf(stderr, "population: %s\n", found.status().ToString().c_str());
    return pids;
  }
  const std::string& bin = *found;
  for (int w = 0; w < workers; ++w) {
    std::vector<std::string> args = {bin,
                                     "--connect",
                                     addr,
                                     "--secret-file",
                                     secret_file,
                                     "--device",
                                     "cpu",
                                     "--slots",
                                     std::to_string(slots),
                                     "--fusion",
                                     "plain",
                                     "--intra-op-threads",
                                     "1"};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = -1;
    if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) == 0) {
      pids.push_back(pid);
    }
  }
  return pids;
}

StatusOr<RunResult> RunPipeline(records::ExperimentConfig config, const std::string& store,
                                int workers, int slots, size_t ring_bytes, bool tcp = false,
                                bool run_ahead = true, bool blob_log = true) {
  scheduler::SchedulerOptions o;
  o.store_path = store;
  o.run_ahead = run_ahead;
  o.blob_log = blob_log;
  if (tcp) {
    std::filesystem::create_directories(store);
    o.remote.listen = "127.0.0.1:0";
    o.remote.secret_file = store + "-secret";
    o.remote.local = false;
  }
  if (ring_bytes > 0) o.ring_bytes = ring_bytes;
  records::DeviceConfig d;
  d.device = "cpu";
  d.count = workers;
  d.slots = slots;
  d.fusion = ipc::FusionMode::kPlain;
  d.intra_op_threads = 1;
  o.devices = {d};
  o.progress = stderr;
  o.final_eval_top = config.eval_size > 0 ? 3 : 0;
  config.devices = o.devices;
  const auto t0 = Clock::now();
  const double self0 = CpuSeconds(RUSAGE_SELF), children0 = CpuSeconds(RUSAGE_CHILDREN);
  CKPT_ASSIGN_OR_RETURN(auto s, scheduler::Scheduler::Create(o));
  CKPT_RETURN_IF_ERROR(s->Submit(config));
  std::vector<pid_t> remote;
  std::thread starter;
  if (tcp) {
    starter =
        std::thread([&] { remote = ConnectWorkers(store, o.remote.secret_file, workers, slots); });
  }
  Status ran = s->Run();
  if (starter.joinable()) starter.join();
  if (!ran.ok()) {
    for (pid_t p : remote) kill(p, SIGKILL);
  }
  for (pid_t p : remote) {
    int st = 0;
    waitpid(p, &st, 0);  // they exit after the scheduler's SHUTDOWN
  }
  CKPT_RETURN_IF_ERROR(ran);
  RunResult r;
  r.wall_s = std::chrono::duration<double>(Clock::now() - t0).count();
  CKPT_ASSIGN_OR_RETURN(r.summary, s->Summary(config.name));
  r.workers_peak_rss = s->WorkersPeakRssBytes();
  s.reset();  // stops and reaps the workers
  r.scheduler_cpu_s = CpuSeconds(RUSAGE_SELF) - self0;
  r.workers_cpu_s = CpuSeconds(RUSAGE_CHILDREN) - children0;
  return r;
}

// The same kernels, no scheduler, store or ring: `slots` threads each train
// members in turn, feeding each new state back in, for about `seconds`.
double BareLoopSamplesPerSecond(const records::ExperimentConfig& c, int slots, double seconds) {
  model::TrainerOptions t;
  t.model_spec = c.model_spec;
  t.optimizer = c.optimizer;
  t.batch_size = c.batch_size;
  t.eval_size = c.eval_size;
  t.dataset = c.dataset;
  t.dataset_path = c.dataset_path;
  t.intra_op_threads = 1;
  auto trainer = model::Trainer::Create(t);
  if (!trainer.ok()) {
    std::fprintf(stderr, "bare loop: %s\n", trainer.status().ToString().c_str());
    return 0;
  }
  std::atomic<int64_t> samples{0};
  std::atomic<bool> timing{false};
  const auto until = Clock::now() + std::chrono::duration<double>(seconds + 1.0);
  std::vector<std::thread> threads;
  Clock::time_point start;
  for (int s = 0; s < slots; ++s) {
    threads.emplace_back([&, s] {
      std::string state;
      int64_t round = 0;
      while (Clock::now() < until) {
        model::MemberTask task;
        task.member = "bare/" + std::to_string(s);
        task.init_seed = static_cast<uint64_t>(s + 1);
        task.state = reinterpret_cast<const uint8_t*>(state.data());
        task.state_size = state.size();
        task.hparams = {{"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 1e-4}};
        task.steps = c.steps_per_interval;
        auto o = (*trainer)->TrainPlain(task);
        if (!o.ok()) break;
        state = o.EncodeState();
        if (round++ > 0 && timing.load()) samples += o.samples;
      }
    });
  }
  // The first interval of each slot is warm-up; count from one second in.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  start = Clock::now();
  timing.store(true);
  for (auto& th : threads) th.join();
  const double dt = std::chrono::duration<double>(Clock::now() - start).count();
  return dt > 0 ? static_cast<double>(samples.load()) / dt : 0;
}

// The bare loop in a fresh process of this program (a worker is a separate
// process; this separates "another process" from "the pipeline"). 0 on error.
double BareLoopInChildProcess(const std::string& config, const records::ExperimentConfig& c,
                              int slots) {
  const std::string cmd = "/proc/" + std::to_string(getpid()) + "/exe";
  char exe[4096];
  const ssize_t n = readlink(cmd.c_str(), exe, sizeof exe - 1);
  if (n <= 0) return 0;
  exe[n] = '\0';
  const std::string line = std::string("'") + exe + "' population --bare-only --config '" + config +
                           "' --steps " + std::to_string(c.steps_per_interval) + " --eval-size " +
                           std::to_string(c.eval_size) + " --slots " + std::to_string(slots) +
                           " --workers 1";
  FILE* f = popen(line.c_str(), "r");
  if (f == nullptr) return 0;
  double v = 0;
  if (std::fscanf(f, "%lf", &v) != 1) v = 0;
  pclose(f);
  return v;
}

struct PopulationBenchOptions {
  std::string config = "examples/fashion-mnist-pbt.toml";
  int members = 8;
  int intervals = 3;
  int64_t steps = 100;
  int eval_size = 1000;
  int workers = 1;
  int slots = 2;
  size_t ring_mb = 0;  // 0: the scheduler's default
  std::string transport = "ring";
  int repeat = 1;
  bool tcp_first = false;
  bool skip_train = false;
  bool bare_only = false;
  int null_members = 30;
  int null_intervals = 10;
  int null_repeat = 1;
  bool scale = false;
  std::vector<long long> null_sizes;  // empty: --null-members only
  std::string barriers = "ahead";     // null runs: ahead, wait, or both (wait first)
  // Null runs: each interval changes one weight ("changing"), or not ("same").
  std::string null_states = "changing";
  // Null runs: the store's blob log ("on"), RocksDB's blob files ("off"), or
  // each size with both ("both").
  std::string blob_log = "on";
};

// What every pipeline run of the benchmark shares.
struct PopulationRun {
  std::string config_path;
  records::ExperimentConfig c;  // the real run's experiment
  int workers = 0;
  int slots = 0;
  size_t ring_bytes = 0;  // 0: the scheduler's default
  std::string root;       // the stores, removed at the end
};

// --transport tcp: each run over the ring, then over TCP.
int PopulationOverTcp(const PopulationBenchOptions& o, const PopulationRun& run) {
  const records::ExperimentConfig& c = run.c;
  const int workers = run.workers;
  const int slots = run.slots;
  const size_t ring_bytes = run.ring_bytes;
  const std::string& root = run.root;
  json out = {{"bench", "population"}, {"transport", "tcp"}, {"device", "cpu"},
              {"workers", workers},    {"slots", slots},     {"cpu", CpuDescription()}};
  SetNullStates(o.null_states);
  out["null_states"] = o.null_states;
  auto add = [&](const std::string& key, double v) {
    out[key] = std::isfinite(v) ? json(v) : json(nullptr);
  };
  // On a shared host the run that goes second is often slower (or faster):
  // --repeat N runs N rounds, alternating which transport goes first, and
  // keeps each figure's best round. --tcp-first starts with TCP.
  const int repeat = o.repeat;
  const bool tcp_first = o.tcp_first;
  add("repeat", repeat);
  auto keep_best = [&](const std::string& key, double v) {
    if (!out.contains(key) || out[key].is_null() || out[key].get<double>() < v) add(key, v);
  };
  for (int round = 0; round < repeat * 2; ++round) {
    const bool tcp = ((round % 2) == 1) != (tcp_first != ((round / 2) % 2 == 1));
    const std::string prefix = tcp ? "tcp_" : "ring_";
    if (!o.skip_train) {
      std::fprintf(stderr, "short real run over the %s...\n", tcp ? "TCP loopback" : "ring");
      auto r = RunPipeline(c, root + "/train-" + prefix + std::to_string(round), workers, slots,
                           ring_bytes, tcp);
      if (!r.ok()) {
        std::fprintf(stderr, "population: %s\n", r.status().ToString().c_str());
        return 1;
      }
      const auto& s = r->summary;
      keep_best(prefix + "samples_per_s",
                s.training_s > 0 ? static_cast<double>(s.train_samples) / s.training_s : 0);
      add(prefix + "training_s_last", s.training_s);
      add(prefix + "first_result_s_last", s.first_result_s);
    }
    records::ExperimentConfig z = c;
    z.name = "bench-null";
    z.population = o.null_members;
    z.intervals = o.null_intervals;
    z.steps_per_interval = 0;
    z.eval_size = 0;
    std::fprintf(stderr, "null run over the %s...\n", tcp ? "TCP loopback" : "ring");
    auto r = RunPipeline(z, root + "/null-" + prefix + std::to_string(round), workers, slots,
                         ring_bytes, tcp);
    if (!r.ok()) {
      std::fprintf(stderr, "population (null): %s\n", r.status().ToString().c_str());
      return 1;
    }
    const auto& ns = r->summary;
    const double steady_s = ns.training_s - ns.first_result_s;
    const double per_s = steady_s > 0 ? static_cast<double>(ns.member_intervals - 1) / steady_s : 0;
    std::fprintf(stderr, "  %s: %.0f member-intervals/s (null)\n", prefix.c_str(), per_s);
    keep_best(prefix + "member_intervals_per_s_null", per_s);
    add(prefix + "null_scheduler_cpu_s_last", r->scheduler_cpu_s);
    add(prefix + "null_workers_cpu_s_last", r->workers_cpu_s);
  }
  const auto ratio = [&](const std::string& key) {
    const double a = out.value("tcp_" + key, 0.0), b = out.value("ring_" + key, 0.0);
    add("tcp_vs_ring_" + key, b > 0 ? a / b : NAN);
  };
  ratio("member_intervals_per_s_null");
  if (!o.skip_train) ratio("samples_per_s");
  add("null_members", static_cast<double>(o.null_members));
  add("members", c.population);
  add("intervals", c.intervals);
  add("steps_per_interval", static_cast<double>(c.steps_per_interval));
  std::filesystem::remove_all(root);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// The JSON line of a run over the ring, built figure by figure.
struct Figures {
  json out = json::object();
  int64_t peak_workers = 0;  // the workers' peak RSS over every run

  // A figure that is not finite is written as null.
  void Add(const std::string& key, double v) {
    out[key] = std::isfinite(v) ? json(v) : json(nullptr);
  }
};

// The experiment of --config with the real run's shape; false (having said
// why) when it does not load.
bool LoadRun(const PopulationBenchOptions& o, PopulationRun* run) {
  run->config_path = o.config;
  auto loaded = records::LoadExperimentConfig(run->config_path);
  if (!loaded.ok()) {
    std::fprintf(stderr, "population: %s (run from the repository root or pass --config)\n",
                 loaded.status().ToString().c_str());
    return false;
  }
  records::ExperimentConfig& c = run->c;
  c = *loaded;
  c.population = o.members;
  c.intervals = o.intervals;
  c.steps_per_interval = o.steps;
  c.eval_size = o.eval_size;
  c.name = "bench-population";
  run->workers = o.workers;
  run->slots = o.slots;
  run->ring_bytes = o.ring_mb << 20;
  return true;
}

// The short real run against the bare loop, which runs before and after the
// pipeline (their mean is the reference, so a load change during the run
// shows in both) and in a separate process; 0, or the exit status that ends
// the benchmark.
int MeasureTraining(const PopulationRun& run, Figures* f) {
  const records::ExperimentConfig& c = run.c;
  const int bare_slots = run.slots * run.workers;
  std::fprintf(stderr, "measuring the bare loop (%d slots)...\n", bare_slots);
  const double bare_before = BareLoopSamplesPerSecond(c, bare_slots, 8.0);
  auto r = RunPipeline(c, run.root + "/train", run.workers, run.slots, run.ring_bytes);
  if (!r.ok()) {
    std::fprintf(stderr, "population: %s\n", r.status().ToString().c_str());
    return 1;
  }
  const auto& s = r->summary;
  const double samples_per_s =
      s.training_s > 0 ? static_cast<double>(s.train_samples) / s.training_s : 0;
  std::fprintf(stderr, "measuring the bare loop again...\n");
  const double bare_after = BareLoopSamplesPerSecond(c, bare_slots, 8.0);
  const double bare = 0.5 * (bare_before + bare_after);
  std::fprintf(stderr, "measuring the bare loop in a separate process...\n");
  const double bare_child = BareLoopInChildProcess(run.config_path, c, bare_slots);
  double best_val = 0, best_test = -1;
  for (const auto& m : s.members) {
    best_val = std::max(best_val, m.val_score);
    best_test = std::max(best_test, m.test_score);
  }
  f->Add("members", c.population);
  f->Add("intervals", c.intervals);
  f->Add("steps_per_interval", static_cast<double>(c.steps_per_interval));
  f->Add("wall_s", r->wall_s);
  f->Add("training_s", s.training_s);
  f->Add("first_result_s", s.first_result_s);
  f->Add("scheduler_cpu_s", r->scheduler_cpu_s);
  f->Add("workers_cpu_s", r->workers_cpu_s);
  f->Add("train_samples", static_cast<double>(s.train_samples));
  f->Add("samples_per_s", samples_per_s);
  f->Add("bare_loop_samples_per_s", bare);
  f->Add("bare_loop_before_samples_per_s", bare_before);
  f->Add("bare_loop_after_samples_per_s", bare_after);
  f->Add("overhead_share", bare > 0 ? 1.0 - samples_per_s / bare : NAN);
  f->Add("bare_loop_separate_process_samples_per_s", bare_child);
  f->Add("overhead_share_vs_separate_process",
         bare_child > 0 ? 1.0 - samples_per_s / bare_child : NAN);
  f->Add("best_val_acc", best_val);
  f->Add("best_test_acc", best_test);
  f->Add("exploits", static_cast<double>(s.exploits));
  f->peak_workers = std::max(f->peak_workers, r->workers_peak_rss);
  return 0;
}

// The null runs to make: the population sizes, the barrier modes (run ahead
// of sync barriers, or wait at each), and how often each runs.
struct NullPlan {
  std::vector<int64_t> sizes;
  std::vector<bool> modes;
  bool blob_log = true;  // the store of these runs keeps states in its blob log
  int intervals = 0;
  int repeat = 0;
  double per_s_first = 0;    // the first size's figure, running ahead
  uint64_t state_bytes = 0;  // one member's tensors (StateTensorBytes)
};

NullPlan MakeNullPlan(const PopulationBenchOptions& o) {
  NullPlan plan;
  plan.sizes = {o.null_members};
  if (o.scale) plan.sizes = {30, 300, 3000};
  if (!o.null_sizes.empty()) plan.sizes.assign(o.null_sizes.begin(), o.null_sizes.end());
  if (o.barriers != "ahead") plan.modes.push_back(false);
  if (o.barriers != "wait") plan.modes.push_back(true);
  plan.intervals = o.null_intervals;
  plan.repeat = o.null_repeat;
  return plan;
}

// The repeats of one null run, each from an empty store.
struct NullRepeats {
  std::vector<double> per_s;     // steady-state member-intervals/s of each run
  double first_result_s = 0;     // the last run's
  uint64_t scheduler_peak = 0;   // the first run's
  uint64_t store_bytes = 0;      // the last run's store on disk
  uint64_t written = 0;          // what the last run wrote to storage
  double scheduler_cpu_s = 0;    // the last run's scheduler (this process) CPU time
  int64_t member_intervals = 0;  // the last run's
};

// Bytes of one member's tensors (model, then optimizer slots) for `c`'s
// model on MNIST-shaped input: what a committed state carries besides its
// header. 0 when the spec does not parse on its own (TorchScript).
uint64_t StateTensorBytes(const records::ExperimentConfig& c) {
  auto spec = model::ModelSpec::Parse(c.model_spec);
  if (!spec.ok() || spec->is_torchscript()) return 0;
  uint64_t bytes = 0;
  for (const model::TensorSpec& t : model::StateLayout(spec->ModelTensors(), c.optimizer)) {
    bytes += static_cast<uint64_t>(t.numel()) * format::DTypeSize(t.dtype);
  }
  return bytes;
}

// The null trainer: 0 steps, no evaluation. The same number of intervals at
// every size: the first interval of a member initializes its weights in the
// worker and costs about twice a later one, so fewer intervals at one size
// would skew the comparison.
records::ExperimentConfig NullExperiment(const records::ExperimentConfig& c, int64_t n,
                                         int intervals) {
  records::ExperimentConfig z = c;
  z.name = "bench-null-" + std::to_string(n);
  z.population = static_cast<int>(n);
  z.intervals = intervals;
  z.steps_per_interval = 0;
  z.eval_size = 0;
  return z;
}

// --null-repeat runs: the same run again, each from an empty store. A run of
// 30 members lasts about two seconds, and on a shared 2-vCPU host one such
// run moved from 1,300 to 2,000 member-intervals/s between minutes: the
// figure is the median, with every run's and the spread. 0, or the exit
// status that ends the benchmark.
int RunNullRepeats(const PopulationRun& run, const NullPlan& plan, int64_t n, bool run_ahead,
                   NullRepeats* out, Figures* f) {
  const records::ExperimentConfig z = NullExperiment(run.c, n, plan.intervals);
  const std::string nn = std::to_string(n);
  for (int rep = 0; rep < plan.repeat; ++rep) {
    // This process is the scheduler: its peak RSS is reset before each
    // run, and the first run's is reported (later runs start with what
    // the allocator kept from the earlier ones).
    ResetPeakRss();
    std::string store = run.root;
    store.append("/null-").append(nn);
    const uint64_t written_before = WrittenBytes();
    auto r = RunPipeline(z, store, run.workers, run.slots, run.ring_bytes, /*tcp=*/false, run_ahead,
                         plan.blob_log);
    out->written = WrittenBytes() - written_before;
    if (!r.ok()) {
      std::fprintf(stderr, "population (null): %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (rep == 0) out->scheduler_peak = static_cast<uint64_t>(PeakRssBytes());
    std::error_code ec;
    out->store_bytes = 0;
    for (const auto& file : std::filesystem::recursive_directory_iterator(store, ec)) {
      if (file.is_regular_file(ec)) out->store_bytes += file.file_size(ec);
    }
    std::filesystem::remove_all(store, ec);
    // Steady state: from the first committed result to the last. The time
    // to the first result (worker start-up: CONFIGURE loads the dataset,
    // about 0.3 s here, paid once per worker and experiment) is reported
    // apart.
    const auto& ns = r->summary;
    const double steady_s = ns.training_s - ns.first_result_s;
    out->per_s.push_back(steady_s > 0 ? static_cast<double>(ns.member_intervals - 1) / steady_s
                                      : 0);
    out->first_result_s = ns.first_result_s;
    out->scheduler_cpu_s = r->scheduler_cpu_s;
    out->member_intervals = ns.member_intervals;
    std::fprintf(stderr,
                 "null run, %" PRId64
                 " members%s%s: %.0f member-intervals/s, scheduler peak RSS %.0f "
                 "MB, store %.0f MB, %.0f MB written\n",
                 n, run_ahead ? "" : " (waiting at every barrier)",
                 plan.blob_log ? "" : " (RocksDB's blob files)", out->per_s.back(),
                 PeakRssBytes() / 1e6, out->store_bytes / 1e6, out->written / 1e6);
    f->peak_workers = std::max(f->peak_workers, r->workers_peak_rss);
  }
  return 0;
}

// Adds the figures of the null runs of size `n` in one barrier mode; returns
// their median.
double AddNullFigures(const NullRepeats& nr, int64_t n, bool run_ahead, NullPlan* plan,
                      Figures* f) {
  const std::string nn = std::to_string(n);
  const std::vector<double>& runs = nr.per_s;
  const double per_s = Median(runs);
  const std::string mode_suffix = (run_ahead ? "_" : "_waiting_") + nn;
  if (plan->repeat > 1) {
    f->out["member_intervals_per_s_null_runs" + mode_suffix] = runs;
    f->Add("member_intervals_per_s_null_min" + mode_suffix,
           *std::min_element(runs.begin(), runs.end()));
    f->Add("member_intervals_per_s_null_max" + mode_suffix,
           *std::max_element(runs.begin(), runs.end()));
  }
  if (!run_ahead) {
    f->Add("member_intervals_per_s_null_waiting_" + nn, per_s);
    return per_s;
  }
  if (plan->per_s_first == 0) plan->per_s_first = per_s;
  f->Add("null_first_result_s_" + nn, nr.first_result_s);
  f->Add("null_scheduler_peak_rss_bytes_" + nn, static_cast<double>(nr.scheduler_peak));
  f->Add("null_store_bytes_" + nn, static_cast<double>(nr.store_bytes));
  // What the store wrote to reach that size (WAL, blob files, tables).
  f->Add("null_store_written_bytes_" + nn, static_cast<double>(nr.written));
  // Per member-interval, over the whole run (start-up included): the
  // scheduler's CPU time, the bytes written against the state's size, and
  // the store at rest per member.
  const double intervals = static_cast<double>(std::max<int64_t>(1, nr.member_intervals));
  f->Add("null_scheduler_cpu_us_per_member_interval_" + nn, 1e6 * nr.scheduler_cpu_s / intervals);
  f->Add("null_written_bytes_per_member_interval_" + nn,
         static_cast<double>(nr.written) / intervals);
  f->Add("null_written_vs_state_" + nn,
         plan->state_bytes > 0
             ? static_cast<double>(nr.written) / intervals / static_cast<double>(plan->state_bytes)
             : NAN);
  f->Add("null_store_bytes_per_member_" + nn,
         static_cast<double>(nr.store_bytes) / static_cast<double>(std::max<int64_t>(1, n)));
  const std::vector<int64_t>& sizes = plan->sizes;
  if (sizes.size() == 1) {
    f->Add("member_intervals_per_s_null", per_s);
    f->Add("null_members", static_cast<double>(n));
  } else {
    f->Add("member_intervals_per_s_null_" + nn, per_s);
    if (n == sizes.front()) f->Add("member_intervals_per_s_null", per_s);
    if (n == sizes.back()) {
      f->Add("null_cost_ratio_" + nn + "_vs_" + std::to_string(sizes.front()),
             per_s > 0 ? plan->per_s_first / per_s : NAN);
    }
  }
  return per_s;
}

// The null runs of every size, in every barrier mode, with each store of
// --blob-log (both: the blob log's figures in `f`, RocksDB's blob files' in
// f->out["rocksdb_blob_files"]); 0, or the exit status that ends the benchmark.
int MeasureNullRuns(const PopulationRun& run, const PopulationBenchOptions& o, Figures* f) {
  std::vector<NullPlan> plans;  // one per store kind
  Figures rocksdb;              // --blob-log both: the second kind's figures
  for (const bool blob_log : {true, false}) {
    if (o.blob_log != "both" && (o.blob_log == "on") != blob_log) continue;
    plans.push_back(MakeNullPlan(o));
    plans.back().blob_log = blob_log;
    plans.back().state_bytes = StateTensorBytes(run.c);
  }
  f->Add("state_tensor_bytes", static_cast<double>(plans.front().state_bytes));
  f->out["null_states"] = o.null_states;
  f->out["blob_log"] = o.blob_log;
  SetNullStates(o.null_states);
  for (int64_t n : plans.front().sizes) {
    const std::string nn = std::to_string(n);
    std::map<bool, NullRepeats> ahead_by_store;
    for (NullPlan& plan : plans) {
      Figures* out = plans.size() == 2 && !plan.blob_log ? &rocksdb : f;
      std::map<bool, double> per_s_by_mode;
      for (const bool run_ahead : plan.modes) {
        NullRepeats nr;
        if (int rc = RunNullRepeats(run, plan, n, run_ahead, &nr, out); rc != 0) return rc;
        per_s_by_mode[run_ahead] = AddNullFigures(nr, n, run_ahead, &plan, out);
        if (run_ahead) ahead_by_store[plan.blob_log] = nr;
      }
      if (per_s_by_mode.size() == 2 && per_s_by_mode[false] > 0) {
        out->Add("null_run_ahead_speedup_" + nn, per_s_by_mode[true] / per_s_by_mode[false]);
      }
      f->peak_workers = std::max(f->peak_workers, rocksdb.peak_workers);
    }
    if (ahead_by_store.size() == 2) {
      const NullRepeats& log = ahead_by_store[true];
      const NullRepeats& files = ahead_by_store[false];
      const auto per_interval = [](const NullRepeats& r) {
        return static_cast<double>(r.written) /
               static_cast<double>(std::max<int64_t>(1, r.member_intervals));
      };
      f->Add("blob_log_vs_rocksdb_written_" + nn,
             per_interval(files) > 0 ? per_interval(log) / per_interval(files) : NAN);
      const double files_per_s = Median(files.per_s);
      f->Add("blob_log_vs_rocksdb_per_s_" + nn,
             files_per_s > 0 ? Median(log.per_s) / files_per_s : NAN);
    }
  }
  if (plans.size() == 2) f->out["rocksdb_blob_files"] = rocksdb.out;
  return 0;
}

int Population(const PopulationBenchOptions& o) {
  PopulationRun run;
  if (!LoadRun(o, &run)) return 1;
  if (o.bare_only) {
    // The child of BareLoopInChildProcess: the bare loop alone in a fresh
    // process, as a worker is one.
    std::printf("%.6g\n", BareLoopSamplesPerSecond(run.c, run.slots * run.workers, 8.0));
    return 0;
  }
  run.root =
      (std::filesystem::temp_directory_path() / ("ckpt-bench-pop-" + std::to_string(getpid())))
          .string();
  std::filesystem::remove_all(run.root);
  if (o.transport == "tcp") return PopulationOverTcp(o, run);

  Figures f;
  f.out = {{"bench", "population"}, {"cpu", CpuDescription()}};
  if (!o.skip_train) {
    if (int rc = MeasureTraining(run, &f); rc != 0) return rc;
  }
  if (int rc = MeasureNullRuns(run, o, &f); rc != 0) return rc;
  f.Add("peak_rss_bytes_scheduler", static_cast<double>(PeakRssBytes()));
  f.Add("peak_rss_bytes_workers", static_cast<double>(f.peak_workers));
  f.Add("peak_rss_bytes_all_processes", static_cast<double>(PeakRssBytes() + f.peak_workers));
  f.out["device"] = "cpu";
  std::filesystem::remove_all(run.root);
  PrintJsonLine(f.out);
  return 0;
}

BenchRun PopulationFlags(CLI::App& cmd) {
  auto o = std::make_shared<PopulationBenchOptions>();
  cmd.add_option("--config", o->config, "experiment TOML whose model and data are run")
      ->capture_default_str();
  cmd.add_option("--members", o->members, "population of the real run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--intervals", o->intervals, "intervals of the real run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--steps", o->steps, "steps per interval of the real run")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--eval-size", o->eval_size, "validation samples per interval")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--workers", o->workers, "worker processes")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--slots", o->slots, "slots per worker")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--ring-mb", o->ring_mb, "MiB of each ring (0: the scheduler's default)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  cmd.add_option("--transport", o->transport, "ring, or tcp (each run over both)")
      ->check(CLI::IsMember({"ring", "tcp"}))
      ->capture_default_str();
  cmd.add_option("--repeat", o->repeat, "--transport tcp: rounds, the best kept")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--tcp-first", o->tcp_first, "--transport tcp: TCP goes first");
  cmd.add_flag("--skip-train", o->skip_train, "only the null runs");
  cmd.add_flag("--bare-only", o->bare_only, "print the bare loop's samples/s alone (internal)");
  cmd.add_option("--null-members", o->null_members, "population of the null run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--null-intervals", o->null_intervals, "intervals of each null run")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--null-repeat", o->null_repeat,
                 "runs of each null size; the median is the figure, with each run's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--scale", o->scale, "null runs of 30, 300 and 3000 members");
  cmd.add_option("--barriers", o->barriers,
                 "null runs: run ahead of sync barriers (ahead), wait at each (wait), or both, "
                 "waiting first, with null_run_ahead_speedup_N")
      ->check(CLI::IsMember({"ahead", "wait", "both"}))
      ->capture_default_str();
  cmd.add_option("--null-states", o->null_states,
                 "null runs: each 0-step interval changes one weight, so every state is new "
                 "bytes (changing), or returns the state unchanged, which the store deduplicates "
                 "(same)")
      ->check(CLI::IsMember({"changing", "same"}))
      ->capture_default_str();
  cmd.add_option("--blob-log", o->blob_log,
                 "null runs: the store keeps states in its blob log (on, the default), in "
                 "RocksDB's blob files (off), or each size runs with both, in this order (both)")
      ->check(CLI::IsMember({"on", "off", "both"}))
      ->capture_default_str();
  cmd.add_option("--null-sizes", o->null_sizes, "null runs of these populations, e.g. 30,10000")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  return [o] { return Population(*o); };
}

CKPT_BENCHMARK("population", "the PBT main job end to end vs the bare training loop",
               PopulationFlags);

}  // namespace
}  // namespace ckpt::bench
