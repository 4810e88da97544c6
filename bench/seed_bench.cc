// ckpt-bench seed: the seed user's workload (issue 11) through ckpt against
// the user's own Python setup (bench/seed_approach.py), side by side.
//
// Workload: --population LeNet-5 members on Fashion-MNIST, SGD with momentum
// and weight decay, batch 64, --intervals x --steps, validation on --eval-size
// images after each interval, synchronous PBT (bottom 20% copy a top-20%
// member and multiply each hyperparameter by 0.8 or 1.2), test accuracy at the
// end. The contenders run one after the other, each round in a rotated order
// so that a load change on the machine spreads over all of them:
//   ckpt    `ckpt-scheduler run` on an experiment file written to a temp dir
//           (its own store, one cpu worker with --slots slots);
//   python  /usr/bin/python3 bench/seed_approach.py (Pool(7), torch.save /
//           torch.load per member and interval), the same LibTorch 1.13;
//   bare    ckpt's own training loop on the same work, no scheduler, store or
//           ring: this program in a child process (`--bare-only`), --slots
//           threads calling Trainer::TrainPlain member after member, each new
//           state fed back as a blob, a barrier per interval, the test split
//           scored for the same number of best members as the scheduler's
//           final evaluation. Its ratio to ckpt is the pipeline's overhead.
//   python_api, python_api_torchscript (Fashion-MNIST only; --skip-api
//           leaves them out): the user's own LeNet5 nn.Module and the data
//           as NumPy arrays through ckpt's Python API
//           (bench/seed_python_api.py, the project venv's Python,
//           Experiment(...).run()), the module converted by torch.fx to the
//           layer list "lenet5" is, or given as a TorchScript file (what the
//           API falls back to for a module it cannot convert). Their ratios
//           to ckpt are api_vs_ckpt and api_torchscript_vs_ckpt; their time
//           includes Python's start, importing torch, the conversion and
//           writing the arrays to the store's data folder once per run.
//   python_api_builtin (with the API contenders): the same script with the
//           built-in name "lenet5" in place of the module: everything but the
//           model as python_api's, so api_vs_api_builtin is the conversion's
//           cost alone (api_vs_ckpt also differs in the data's format, the
//           metrics endpoint and the worker's phase log).
// --only NAME,... runs those contenders alone (a ratio is reported when both
// of its contenders ran), e.g. --only python_api,python_api_builtin.
// Each contender is timed from spawn to exit (samples/s = training samples /
// that wall time) while a sampler thread sums the PSS of its process tree
// from /proc/PID/smaps_rollup every --sample-ms; the peak of the sum counts.
// Reading smaps_rollup walks the process's page tables under its mmap lock
// (tens of ms for a worker, more on a loaded machine), so it is sampled once
// a second by default: more often perturbs what it measures.
// Ratios are per round (the contenders of one round ran minutes apart at
// most) and the JSON reports their median; figures are noisy on a shared
// machine, so compare ratios, not absolute rates across runs.
//
//   ckpt-bench seed [--workload fashion-lenet5] [--rounds 2] [--population 30]
//       [--intervals 4] [--steps 100] [--batch-size 64] [--eval-size 2000] [--slots 2]
//       [--fusion plain] [--seed 2026]
//       [--final-eval-top 5] [--scheduler PATH] [--python /usr/bin/python3]
//       [--script bench/seed_approach.py] [--dataset-path DIR] [--sample-ms 1000]
//       [--skip-bare] [--skip-api] [--api-python PATH] [--only NAME,...]
//       [--ckpt-args="--flag value ..."] [--rows 6000]
//
// --ckpt-args: extra arguments of `ckpt-scheduler run`, split at spaces (give
// it with "=": a value that starts with "--" would read as the next flag).
//
// --workload cifar-resnet20: the same race on a model with ~100x LeNet-5's
// arithmetic per sample: ResNet-20 (ckpt's built-in "resnet20"; the Python
// side builds the same 272,474-parameter network) on a CIFAR-shaped set
// (examples/make_dataset.py cifar-synthetic, --rows rows written into the
// temp dir with --python unless --dataset-path names a safetensors file),
// random crop (4-pixel padding) and horizontal flip, per-channel normalization
// from the training split, the search space of examples/cifar10-resnet20-pbt.toml
// and the user's PBT step as above. Its defaults are smaller: 8 members x 3
// intervals x 20 steps of batch 64, 500 validation images. No bare-loop
// contender (the bare loop trains LeNet-5 on IDX files only).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "ckpt/model/trainer.h"

extern char** environ;

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// The members the scheduler scores on the test split when an experiment
// ends (SchedulerOptions::final_eval_top, which `run` leaves at its default).
constexpr int kFinalEvalTop = 5;

enum class WorkloadKind { kFashionLenet5, kCifarResnet20 };
const std::map<std::string, WorkloadKind> kWorkloads = {
    {"fashion-lenet5", WorkloadKind::kFashionLenet5},
    {"cifar-resnet20", WorkloadKind::kCifarResnet20}};

struct Workload {
  WorkloadKind kind = WorkloadKind::kFashionLenet5;
  // 0 (eval_size: -1, as 0 skips validation): the workload's default
  // (fashion-lenet5 / cifar-resnet20).
  int population = 0;  // 30 / 8
  int intervals = 0;   // 4 / 3
  int64_t steps = 0;   // 100 / 20
  int batch_size = 64;
  int eval_size = -1;  // 2000 / 500
  int rows = 6000;     // cifar-synthetic rows when no --dataset-path
  int slots = 2;
  std::string fusion = "plain";
  uint64_t seed = 2026;
  std::string dataset_path;  // "": Fashion-MNIST's IDX directory / a generated set
  int final_eval_top = kFinalEvalTop;

  std::string Name() const {
    for (const auto& [name, k] : kWorkloads) {
      if (k == kind) return name;
    }
    return "?";
  }
  bool cifar() const { return kind == WorkloadKind::kCifarResnet20; }
  // Fills the workload's defaults in for what was not given.
  void Resolve() {
    if (population == 0) population = cifar() ? 8 : 30;
    if (intervals == 0) intervals = cifar() ? 3 : 4;
    if (steps == 0) steps = cifar() ? 20 : 100;
    if (eval_size < 0) eval_size = cifar() ? 500 : 2000;
    if (!cifar() && dataset_path.empty()) dataset_path = "/usr/share/datasets/fashion-mnist";
  }

  int64_t TrainSamples() const {
    return static_cast<int64_t>(population) * intervals * steps * batch_size;
  }
};

// The children of `pid`, from /proc/PID/task/*/children (each thread lists
// the processes it forked): far cheaper than reading every /proc/*/stat.
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  // A process may end while it is listed: errors end the listing, never throw.
  std::error_code ec;
  for (fs::directory_iterator it("/proc/" + std::to_string(pid) + "/task", ec), end;
       !ec && it != end; it.increment(ec)) {
    std::ifstream in(it->path() / "children");
    for (long c; in >> c;) out.push_back(static_cast<pid_t>(c));
  }
  return out;
}

// Summed PSS of `root` and its descendants, read from /proc; `by_name`
// receives the PSS per process name (comm).
int64_t TreePssBytes(pid_t root, std::map<std::string, int64_t>* by_name) {
  int64_t total = 0;
  std::vector<pid_t> stack = {root};
  while (!stack.empty()) {
    const pid_t pid = stack.back();
    stack.pop_back();
    for (pid_t c : Children(pid)) stack.push_back(c);
    std::ifstream rollup("/proc/" + std::to_string(pid) + "/smaps_rollup");
    std::string line;
    while (std::getline(rollup, line)) {
      if (line.rfind("Pss:", 0) == 0) {
        const int64_t pss = std::atoll(line.c_str() + 4) * 1024;
        total += pss;
        std::ifstream comm_file("/proc/" + std::to_string(pid) + "/comm");
        std::string comm;
        std::getline(comm_file, comm);
        (*by_name)[comm] += pss;
        break;
      }
    }
  }
  return total;
}

struct ProcessRun {
  int exit_code = -1;
  double wall_s = 0;
  int64_t peak_pss = 0;
  std::map<std::string, int64_t> peak_pss_by_name;  // at the peak of the sum
  std::string out;                                  // its stdout
  std::string err;                                  // its stderr
};

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Runs argv[0] with stdout and stderr into files under `dir` and `extra_env`
// added to this environment, sampling the summed PSS of its process tree
// until it exits.
ProcessRun RunMeasured(const std::vector<std::string>& args,
                       const std::vector<std::string>& extra_env, const std::string& dir,
                       int sample_ms) {
  ProcessRun r;
  const std::string out_path = dir + "/stdout", err_path = dir + "/stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  posix_spawn_file_actions_addopen(&actions, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                   0644);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = extra_env;
  for (char** e = environ; *e != nullptr; ++e) env_strings.emplace_back(*e);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const auto start = Clock::now();
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    r.err = "cannot start " + args[0] + ": " + std::strerror(rc);
    return r;
  }
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      std::map<std::string, int64_t> by_name;
      const int64_t pss = TreePssBytes(pid, &by_name);
      if (pss > r.peak_pss) {
        r.peak_pss = pss;
        r.peak_pss_by_name = std::move(by_name);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(sample_ms));
    }
  });
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  done.store(true);
  sampler.join();
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out_path);
  r.err = ReadFile(err_path);
  return r;
}

std::string LastLine(const std::string& text) {
  std::string s = text;
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  const size_t nl = s.rfind('\n');
  return nl == std::string::npos ? s : s.substr(nl + 1);
}

std::string Tail(const std::string& text, size_t n) {
  return text.size() <= n ? text : text.substr(text.size() - n);
}

// The experiment file of the workload (keys: scheduler/include/ckpt/scheduler/config.h).
std::string ExperimentToml(const Workload& w, const std::string& store) {
  json path = w.dataset_path, store_path = store;
  std::ostringstream t;
  t << "name = \"seed\"\nseed = " << w.seed << "\nstore = " << store_path.dump() << "\n";
  if (w.cifar()) {
    t << "[model]\nspec = \"resnet20\"\noptimizer = \"sgd\"\n"
      << "[data]\nformat = \"safetensors\"\npath = " << path.dump()
      << "\naugment = [\"random_crop:4\", \"hflip\"]\n";
  } else {
    t << "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n"
      << "[data]\ndataset = \"fashion-mnist\"\npath = " << path.dump() << "\n";
  }
  t << "batch_size = " << w.batch_size << "\neval_size = " << w.eval_size << "\n"
    << "[population]\nsize = " << w.population << "\nsteps_per_interval = " << w.steps
    << "\nintervals = " << w.intervals << "\n";
  // The search spaces of examples/fashion-mnist-pbt.toml and
  // examples/cifar10-resnet20-pbt.toml, as seed_approach.py draws them.
  if (w.cifar()) {
    t << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.01\nmax = 0.4\n"
      << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.8\nmax = 0.95\n"
      << "[search_space.weight_decay]\ntype = \"log_uniform\"\nmin = 0.00005\nmax = 0.001\n";
  } else {
    t << "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.2\n"
      << "[search_space.momentum]\ntype = \"uniform\"\nmin = 0.5\nmax = 0.99\n"
      << "[search_space.weight_decay]\ntype = \"log_uniform\"\nmin = 0.000001\nmax = 0.01\n";
  }
  t
      // The user's PBT: every interval, bottom 20% copy a top-20% member, then
      // each hyperparameter times 0.8 or 1.2 (never resampled).
      << "[policy]\nkind = \"pbt\"\nmode = \"sync\"\nquantile = 0.2\nperturb = [0.8, 1.2]\n"
      << "resample_probability = 0.0\nready_intervals = 1\n"
      << "[[devices]]\ndevice = \"cpu\"\nslots = " << w.slots << "\nfusion = \"" << w.fusion
      << "\"\nfusion_width = 8\nintra_op_threads = 1\n";
  return t.str();
}

// val_acc and test_acc of the best member in the summary `ckpt-scheduler run
// --summary-json` wrote (the control protocol's JSON: members best first; a
// score never measured is -1). False, with the reason in *why, when the file
// is not that.
bool ReadSummary(const std::string& path, double* val_acc, double* test_acc, std::string* why) {
  std::ifstream in(path);
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("members") || !j["members"].is_array() ||
      j["members"].empty()) {
    *why = path + ": no summary with members";
    return false;
  }
  const json& best = j["members"].front();
  if (!best.contains("val_score") || !best["val_score"].is_number() ||
      !best.contains("test_score") || !best["test_score"].is_number()) {
    *why = path + ": the best member has no numeric val_score/test_score";
    return false;
  }
  *val_acc = best["val_score"].get<double>();
  *test_acc = best["test_score"].get<double>();
  return true;
}

std::string SelfExe() {
  std::error_code ec;
  return fs::read_symlink("/proc/self/exe", ec).string();
}

// ckpt's own loop on the workload, in this process (the `--bare-only` child).
int BareLoop(const Workload& w) {
  const auto start = Clock::now();
  model::TrainerOptions t;
  t.model_spec = "lenet5";
  t.optimizer = format::OptimizerKind::kSgd;
  t.batch_size = w.batch_size;
  t.eval_size = w.eval_size;
  t.dataset = "fashion-mnist";
  t.dataset_path = w.dataset_path;
  t.intra_op_threads = 1;
  t.seed = w.seed;
  auto trainer = model::Trainer::Create(t);
  if (!trainer.ok()) {
    std::fprintf(stderr, "bare loop: %s\n", trainer.status().ToString().c_str());
    return 1;
  }
  std::mt19937_64 rng(w.seed);
  std::uniform_real_distribution<double> u(0, 1);
  auto log_uniform = [&](double lo, double hi) {
    return std::exp(std::log(lo) + u(rng) * (std::log(hi) - std::log(lo)));
  };
  const size_t n = static_cast<size_t>(w.population);
  std::vector<std::map<std::string, double>> hparams(n);
  for (auto& h : hparams) {
    h["lr"] = log_uniform(1e-3, 0.2);
    h["momentum"] = 0.5 + 0.49 * u(rng);
    h["weight_decay"] = log_uniform(1e-6, 1e-2);
  }
  std::vector<std::string> states(n);
  std::vector<double> val(n, 0), test(n, -1);
  std::atomic<bool> failed{false};
  std::mutex phases_mu;
  double decode_s = 0, train_s = 0, evaluate_s = 0, encode_s = 0, blob_s = 0;
  // One interval (or the final evaluation) of `members` over the slot threads.
  auto run = [&](const std::vector<size_t>& members, int64_t steps, bool eval_test) {
    std::atomic<size_t> next{0};
    std::vector<std::thread> threads;
    for (int s = 0; s < w.slots; ++s) {
      threads.emplace_back([&] {
        for (size_t j; (j = next.fetch_add(1)) < members.size();) {
          const size_t i = members[j];
          model::MemberTask task;
          task.member = "bare/" + std::to_string(i);
          task.init_seed = i + 1;
          task.state = reinterpret_cast<const uint8_t*>(states[i].data());
          task.state_size = states[i].size();
          task.hparams = hparams[i];
          task.steps = steps;
          task.eval_test = eval_test;
          auto o = (*trainer)->TrainPlain(task);
          if (!o.ok()) {
            std::fprintf(stderr, "bare loop: %s\n", o.status.ToString().c_str());
            failed.store(true);
            return;
          }
          const auto blob_start = Clock::now();
          states[i] = o.EncodeState();
          const double blob = std::chrono::duration<double>(Clock::now() - blob_start).count();
          val[i] = o.val_score;
          test[i] = o.test_score;
          std::lock_guard<std::mutex> lock(phases_mu);
          decode_s += o.pack_s;
          train_s += o.compute_s - o.eval_s;
          evaluate_s += o.eval_s;
          encode_s += o.unpack_s;
          blob_s += blob;
        }
      });
    }
    for (auto& th : threads) th.join();
  };
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  for (int i = 0; i < w.intervals && !failed.load(); ++i) run(all, w.steps, false);
  std::vector<size_t> best = all;
  std::sort(best.begin(), best.end(), [&](size_t a, size_t b) { return val[a] > val[b]; });
  best.resize(std::min(best.size(), static_cast<size_t>(std::max(1, w.final_eval_top))));
  if (!failed.load()) run(best, 0, true);
  if (failed.load()) return 1;
  const double wall_s = std::chrono::duration<double>(Clock::now() - start).count();
  json out{{"bench", "seed_bare_loop"},
           {"wall_s", wall_s},
           {"train_samples", w.TrainSamples()},
           {"samples_per_s", static_cast<double>(w.TrainSamples()) / wall_s},
           {"best_val_acc", val[best[0]]},
           {"test_acc", test[best[0]]},
           // Summed over the slot threads; blob_s writes each new state out.
           {"phases",
            {{"decode_s", decode_s},
             {"train_s", train_s},
             {"evaluate_s", evaluate_s},
             {"encode_s", encode_s},
             {"blob_s", blob_s}}}};
  PrintJsonLine(out);
  return 0;
}

double Mean(const std::vector<double>& v) {
  if (v.empty()) return NAN;
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

enum class ContenderKind { kCkpt, kPython, kBare, kApi, kApiTorchScript, kApiBuiltin };

struct Contender {
  Contender(ContenderKind k, std::string n) : kind(k), name(std::move(n)) {}
  ContenderKind kind;
  std::string name;
  std::vector<double> wall_s, samples_per_s, pss_bytes, best_val_acc, test_acc;
  json pss_by_process = json::array();  // per round, at the peak
  json phases = json::array();          // per round: ckpt's worker, or the bare loop
};

struct Contenders {
  Contender ckpt{ContenderKind::kCkpt, "ckpt"};
  Contender python{ContenderKind::kPython, "python"};
  Contender bare{ContenderKind::kBare, "bare"};
  Contender api{ContenderKind::kApi, "python_api"};
  Contender api_script{ContenderKind::kApiTorchScript, "python_api_torchscript"};
  Contender api_builtin{ContenderKind::kApiBuiltin, "python_api_builtin"};

  std::vector<Contender*> All() { return {&ckpt, &python, &bare, &api, &api_script, &api_builtin}; }
  std::vector<const Contender*> All() const {
    return {&ckpt, &python, &bare, &api, &api_script, &api_builtin};
  }
};

// The ratios of each round: ckpt's rate over Python's, ckpt's peak PSS over
// Python's, and the share of the bare loop's rate ckpt loses (with the bare
// loop only).
struct RoundRatios {
  std::vector<double> speedup, pss_ratio, overhead;
  // The Python API's rate over ckpt's (--skip-api: empty), and the converted
  // module's over the built-in's, both through the API.
  std::vector<double> api_vs_ckpt, api_torchscript_vs_ckpt, api_vs_api_builtin;
};

// The JSON of the worker's "ckpt-worker phases: {...}" stderr line (CKPT_WORKER_PHASES=1).
json WorkerPhases(const std::string& err) {
  static constexpr char kPrefix[] = "ckpt-worker phases: ";
  const size_t at = err.rfind(kPrefix);
  if (at == std::string::npos) return nullptr;
  const size_t begin = at + sizeof kPrefix - 1;
  const size_t end = err.find('\n', begin);
  return json::parse(err.substr(begin, end == std::string::npos ? end : end - begin), nullptr,
                     /*allow_exceptions=*/false);
}

struct SeedBenchOptions {
  Workload workload;
  bool bare_only = false;
  int rounds = 2;
  int sample_ms = 1000;
  std::string scheduler;  // empty: ckpt-scheduler of this build
  std::string python = "/usr/bin/python3";
  std::string script = "bench/seed_approach.py";
  bool skip_bare = false;
  bool skip_api = false;
  std::string api_python;  // empty: the project venv's, else /usr/bin/python3
  std::string ckpt_args;
  std::vector<std::string> only;  // empty: every contender the options allow
};

// What the contenders run, resolved from the options once.
struct SeedRun {
  Workload w;
  std::string exe;  // this program, for the bare loop
  std::string scheduler_bin;
  std::string python;
  std::string script;
  std::string ckpt_args;
  fs::path root;  // the temp dir of every run
  int sample_ms = 0;
  bool with_bare = false;
  bool with_api = false;
  std::string api_python;
  std::string bin_dir;  // this build's bin/, the API's CKPT_BIN
  std::vector<std::string> only;
};

SeedRun ResolveRun(const SeedBenchOptions& o) {
  SeedRun s;
  s.w = o.workload;
  s.exe = SelfExe();
  const fs::path build_dir = fs::path(s.exe).parent_path().parent_path();
  s.scheduler_bin =
      o.scheduler.empty() ? (build_dir / "bin" / "ckpt-scheduler").string() : o.scheduler;
  s.python = o.python;
  s.script = o.script;
  if (!fs::exists(s.script)) s.script = std::string(CKPT_SOURCE_DIR) + "/bench/seed_approach.py";
  s.with_bare = !o.skip_bare && !s.w.cifar();
  s.with_api = !o.skip_api && !s.w.cifar();
  s.bin_dir = (build_dir / "bin").string();
  s.api_python = o.api_python;
  if (s.api_python.empty()) {
    const std::string venv = std::string(CKPT_SOURCE_DIR) + "/.venv/bin/python";
    s.api_python = fs::exists(venv) ? venv : "/usr/bin/python3";
  }
  s.ckpt_args = o.ckpt_args;
  s.only = o.only;
  s.sample_ms = o.sample_ms;
  s.root = fs::temp_directory_path() / ("ckpt-bench-seed-" + std::to_string(getpid()));
  return s;
}

// The CIFAR-shaped set, written by the script the README gives users; 0, or
// the exit status that ends the benchmark.
int MakeCifarDataset(SeedRun* s) {
  Workload& w = s->w;
  w.dataset_path = (s->root / "cifar-synthetic.safetensors").string();
  const ProcessRun made = RunMeasured(
      {s->python, std::string(CKPT_SOURCE_DIR) + "/examples/make_dataset.py", "cifar-synthetic",
       w.dataset_path, "--n", std::to_string(w.rows), "--seed", std::to_string(w.seed)},
      {}, s->root.string(), s->sample_ms);
  if (made.exit_code != 0) {
    std::fprintf(stderr, "seed: examples/make_dataset.py exited with %d\n%s\n", made.exit_code,
                 Tail(made.err, 2000).c_str());
    return 1;
  }
  std::fprintf(stderr, "%s", made.out.c_str());
  return 0;
}

std::vector<std::string> CkptCommand(const SeedRun& s, const std::string& dir) {
  const std::string toml = dir + "/seed.toml";
  std::ofstream(toml) << ExperimentToml(s.w, dir + "/store");
  std::vector<std::string> cmd = {s.scheduler_bin,      "run", toml, "--quiet", "--summary-json",
                                  dir + "/summary.json"};
  std::istringstream extra(s.ckpt_args);
  for (std::string a; extra >> a;) cmd.push_back(a);
  return cmd;
}

std::vector<std::string> PythonCommand(const SeedRun& s, const std::string& dir) {
  const Workload& w = s.w;
  return {s.python,       s.script,
          "--population", std::to_string(w.population),
          "--intervals",  std::to_string(w.intervals),
          "--steps",      std::to_string(w.steps),
          "--eval-size",  std::to_string(w.eval_size),
          "--seed",       std::to_string(w.seed),
          "--dataset",    w.dataset_path,
          "--workload",   w.Name(),
          "--batch",      std::to_string(w.batch_size),
          "--workdir",    dir + "/members",
          "--no-pss"};
}

std::vector<std::string> BareCommand(const SeedRun& s) {
  const Workload& w = s.w;
  return {s.exe,
          "seed",
          "--bare-only",
          "--population",
          std::to_string(w.population),
          "--intervals",
          std::to_string(w.intervals),
          "--steps",
          std::to_string(w.steps),
          "--eval-size",
          std::to_string(w.eval_size),
          "--slots",
          std::to_string(w.slots),
          "--seed",
          std::to_string(w.seed),
          "--final-eval-top",
          std::to_string(w.final_eval_top),
          "--dataset-path",
          w.dataset_path};
}

// The seed workload through the Python API, in `dir`.
std::vector<std::string> ApiCommand(const SeedRun& s, const std::string& dir, ContenderKind kind) {
  const Workload& w = s.w;
  std::vector<std::string> cmd = {
      s.api_python,   std::string(CKPT_SOURCE_DIR) + "/bench/seed_python_api.py",
      "--population", std::to_string(w.population),
      "--intervals",  std::to_string(w.intervals),
      "--steps",      std::to_string(w.steps),
      "--batch",      std::to_string(w.batch_size),
      "--eval-size",  std::to_string(w.eval_size),
      "--slots",      std::to_string(w.slots),
      "--fusion",     w.fusion,
      "--seed",       std::to_string(w.seed),
      "--dataset",    w.dataset_path,
      "--store",      dir + "/store"};
  if (kind == ContenderKind::kApiTorchScript) cmd.emplace_back("--torchscript");
  if (kind == ContenderKind::kApiBuiltin) cmd.emplace_back("--builtin");
  return cmd;
}

// The command line of contender `c`, run in `dir`.
std::vector<std::string> ContenderCommand(const Contender& c, const SeedRun& s,
                                          const std::string& dir) {
  switch (c.kind) {
    case ContenderKind::kCkpt:
      return CkptCommand(s, dir);
    case ContenderKind::kPython:
      return PythonCommand(s, dir);
    case ContenderKind::kBare:
      return BareCommand(s);
    case ContenderKind::kApi:
    case ContenderKind::kApiTorchScript:
    case ContenderKind::kApiBuiltin:
      return ApiCommand(s, dir, c.kind);
  }
  return {};
}

// The result of one run: the best member's accuracies, and its phases where
// it reports them.
struct RunResult {
  double val_acc = NAN;
  double test_acc = NAN;
  std::optional<json> phases;
};

// From ckpt's summary file, or the others' last stdout line; false (having
// said why on stderr) when there is none.
bool ReadResult(const Contender& c, const ProcessRun& r, const std::string& dir, RunResult* out) {
  if (c.kind == ContenderKind::kCkpt) {
    std::string why;
    if (!ReadSummary(dir + "/summary.json", &out->val_acc, &out->test_acc, &why)) {
      std::fprintf(stderr, "seed: %s; ckpt-scheduler printed:\n%s\n", why.c_str(),
                   Tail(r.out, 2000).c_str());
      return false;
    }
    out->phases = WorkerPhases(r.err);
    return true;
  }
  json j = json::parse(LastLine(r.out), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("best_val_acc") || !j.contains("test_acc")) {
    std::fprintf(stderr, "seed: %s printed no result line:\n%s\n%s\n", c.name.c_str(),
                 Tail(r.out, 2000).c_str(), Tail(r.err, 2000).c_str());
    return false;
  }
  out->val_acc = j["best_val_acc"].get<double>();
  out->test_acc = j["test_acc"].get<double>();
  if (j.contains("phases")) out->phases = j["phases"];
  return true;
}

// One round's rate (samples/s) and peak PSS per contender name.
struct RoundFigures {
  std::map<std::string, double> rate;
  std::map<std::string, int64_t> pss;
};

// Runs contender `c` once in `round` and adds what it measured to `c` and
// `round_figures`; 0, or the exit status that ends the benchmark.
int RunContender(const SeedRun& s, int round, Contender* c, RoundFigures* round_figures) {
  const std::string& who = c->name;
  const std::string dir = (s.root / (who + std::to_string(round))).string();
  fs::create_directories(dir);
  const std::vector<std::string> cmd = ContenderCommand(*c, s, dir);
  std::fprintf(stderr, "round %d: %s...\n", round + 1, who.c_str());
  std::vector<std::string> env;
  if (c->kind == ContenderKind::kCkpt) env.push_back("CKPT_WORKER_PHASES=1");
  if (c->kind == ContenderKind::kApi || c->kind == ContenderKind::kApiTorchScript ||
      c->kind == ContenderKind::kApiBuiltin) {
    // The package from this checkout, driving this build's binaries.
    env.push_back("CKPT_BIN=" + s.bin_dir);
    env.push_back("PYTHONPATH=" + std::string(CKPT_SOURCE_DIR) + "/python");
  }
  ProcessRun r = RunMeasured(cmd, env, dir, s.sample_ms);
  if (r.exit_code != 0) {
    std::fprintf(stderr, "seed: %s exited with %d\n%s\n%s\n", who.c_str(), r.exit_code,
                 Tail(r.out, 2000).c_str(), Tail(r.err, 4000).c_str());
    return 1;
  }
  RunResult result;
  if (!ReadResult(*c, r, dir, &result)) return 1;
  if (result.phases.has_value()) c->phases.push_back(*result.phases);
  c->pss_by_process.push_back(r.peak_pss_by_name);
  const double per_s = static_cast<double>(s.w.TrainSamples()) / r.wall_s;
  c->wall_s.push_back(r.wall_s);
  c->samples_per_s.push_back(per_s);
  c->pss_bytes.push_back(static_cast<double>(r.peak_pss));
  c->best_val_acc.push_back(result.val_acc);
  c->test_acc.push_back(result.test_acc);
  round_figures->rate[who] = per_s;
  round_figures->pss[who] = r.peak_pss;
  std::fprintf(stderr,
               "round %d: %s %.2f s, %.0f samples/s, peak PSS %.0f MB, val %.4f test %.4f\n",
               round + 1, who.c_str(), r.wall_s, per_s, static_cast<double>(r.peak_pss) / 1e6,
               result.val_acc, result.test_acc);
  return 0;
}

// The rounds, each running the contenders in an order rotated by one; 0, or
// the exit status that ends the benchmark.
// The contenders that run: those the options allow, cut to --only.
std::vector<Contender*> RunOrder(const SeedRun& s, Contenders* all) {
  std::vector<Contender*> order = {&all->ckpt, &all->python};
  if (s.with_bare) order.push_back(&all->bare);
  if (s.with_api) {
    order.push_back(&all->api);
    order.push_back(&all->api_script);
    order.push_back(&all->api_builtin);
  }
  if (s.only.empty()) return order;
  std::vector<Contender*> kept;
  for (Contender* c : order) {
    if (std::find(s.only.begin(), s.only.end(), c->name) != s.only.end()) kept.push_back(c);
  }
  return kept;
}

// Appends a / b of this round's rates to `out` when both contenders ran.
void AddRatio(const std::map<std::string, double>& rate, const std::string& a, const std::string& b,
              std::vector<double>* out) {
  const auto x = rate.find(a);
  const auto y = rate.find(b);
  if (x != rate.end() && y != rate.end()) out->push_back(x->second / y->second);
}

void AddRoundRatios(const RoundFigures& f, RoundRatios* ratios) {
  AddRatio(f.rate, "ckpt", "python", &ratios->speedup);
  const auto ckpt_pss = f.pss.find("ckpt");
  const auto python_pss = f.pss.find("python");
  if (ckpt_pss != f.pss.end() && python_pss != f.pss.end()) {
    ratios->pss_ratio.push_back(python_pss->second > 0 ? static_cast<double>(ckpt_pss->second) /
                                                             static_cast<double>(python_pss->second)
                                                       : NAN);
  }
  std::vector<double> bare_share;
  AddRatio(f.rate, "ckpt", "bare", &bare_share);
  for (double r : bare_share) ratios->overhead.push_back(1.0 - r);
  AddRatio(f.rate, "python_api", "ckpt", &ratios->api_vs_ckpt);
  AddRatio(f.rate, "python_api_torchscript", "ckpt", &ratios->api_torchscript_vs_ckpt);
  AddRatio(f.rate, "python_api", "python_api_builtin", &ratios->api_vs_api_builtin);
}

int RunRounds(const SeedRun& s, int rounds, Contenders* all, RoundRatios* ratios) {
  const std::vector<Contender*> order = RunOrder(s, all);
  if (order.empty()) {
    std::fprintf(stderr, "seed: --only names no contender that runs here\n");
    return 2;
  }
  for (int round = 0; round < rounds; ++round) {
    RoundFigures f;
    for (size_t k = 0; k < order.size(); ++k) {
      Contender* c = order[(k + static_cast<size_t>(round)) % order.size()];
      if (int rc = RunContender(s, round, c, &f); rc != 0) return rc;
    }
    AddRoundRatios(f, ratios);
  }
  return 0;
}

void Report(const SeedRun& s, int rounds, const Contenders& all, const RoundRatios& ratios) {
  const Workload& w = s.w;
  json out{{"bench", "seed"},
           {"workload", w.Name()},
           {"rounds", rounds},
           {"population", w.population},
           {"intervals", w.intervals},
           {"steps_per_interval", w.steps},
           {"batch_size", w.batch_size},
           {"eval_size", w.eval_size},
           {"slots", w.slots},
           {"fusion", w.fusion},
           {"train_samples", w.TrainSamples()},
           {"cpu", CpuDescription()}};
  for (const Contender* c : all.All()) {
    if (c->wall_s.empty()) continue;
    out[c->name + "_samples_per_s"] = Median(c->samples_per_s);
    out[c->name + "_wall_s"] = c->wall_s;
    out[c->name + "_pss_bytes"] = Median(c->pss_bytes);
    out[c->name + "_best_val_acc"] = Mean(c->best_val_acc);
    out[c->name + "_test_acc"] = Mean(c->test_acc);
    out[c->name + "_pss_bytes_by_process"] = c->pss_by_process;
    if (!c->phases.empty()) out[c->name + "_phases_s"] = c->phases;
  }
  const std::pair<const char*, const std::vector<double>*> reported[] = {
      {"speedup", &ratios.speedup},
      {"pss_ratio", &ratios.pss_ratio},
      {"overhead_share", &ratios.overhead},
      {"api_vs_ckpt", &ratios.api_vs_ckpt},
      {"api_torchscript_vs_ckpt", &ratios.api_torchscript_vs_ckpt},
      {"api_vs_api_builtin", &ratios.api_vs_api_builtin}};
  for (const auto& [name, per_round] : reported) {
    if (per_round->empty()) continue;
    out[name] = Median(*per_round);
    out[std::string(name) + "_per_round"] = *per_round;
  }
  out["device"] = "cpu";
  PrintJsonLine(out);
}

int Seed(const SeedBenchOptions& options) {
  SeedBenchOptions o = options;
  o.workload.Resolve();
  if (o.bare_only) return BareLoop(o.workload);

  SeedRun s = ResolveRun(o);
  fs::remove_all(s.root);
  fs::create_directories(s.root);
  if (s.w.cifar() && s.w.dataset_path.empty()) {
    if (int rc = MakeCifarDataset(&s); rc != 0) return rc;
  }
  Contenders all;
  RoundRatios ratios;
  if (int rc = RunRounds(s, o.rounds, &all, &ratios); rc != 0) return rc;
  fs::remove_all(s.root);
  Report(s, o.rounds, all, ratios);
  return 0;
}

BenchRun SeedFlags(CLI::App& cmd) {
  auto o = std::make_shared<SeedBenchOptions>();
  Workload& w = o->workload;
  cmd.add_option("--rounds", o->rounds, "rounds of the contenders")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--workload", w.kind, "fashion-lenet5 or cifar-resnet20")
      ->transform(CLI::CheckedTransformer(kWorkloads, CLI::ignore_case))
      ->capture_default_str();
  cmd.add_option("--population", w.population, "members (default: 30 / cifar 8)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--intervals", w.intervals, "intervals (default: 4 / cifar 3)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--steps", w.steps, "steps per interval (default: 100 / cifar 20)")
      ->check(CLI::PositiveNumber);
  cmd.add_option("--batch-size", w.batch_size, "training batch")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--eval-size", w.eval_size,
                 "validation samples per interval (default: 2000 / cifar 500)")
      ->check(CLI::NonNegativeNumber);
  cmd.add_option("--rows", w.rows, "cifar-synthetic rows generated (train 80%, val, test 10%)")
      ->check(CLI::Range(100, 1000000))
      ->capture_default_str();
  cmd.add_option("--slots", w.slots, "ckpt's training slots")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--fusion", w.fusion, "ckpt's fusion mode")->capture_default_str();
  cmd.add_option("--seed", w.seed, "the experiment's seed")->capture_default_str();
  cmd.add_option("--final-eval-top", w.final_eval_top, "members scored on the test split")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--dataset-path", w.dataset_path,
                 "Fashion-MNIST directory / cifar safetensors file (default: generated)");
  cmd.add_option("--scheduler", o->scheduler, "ckpt-scheduler (default: this build's)");
  cmd.add_option("--python", o->python, "Python of the seed approach")->capture_default_str();
  cmd.add_option("--script", o->script, "the seed approach")->capture_default_str();
  cmd.add_option("--sample-ms", o->sample_ms, "PSS sampling period")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--skip-bare", o->skip_bare, "no bare-loop contender");
  cmd.add_flag("--skip-api", o->skip_api, "no Python API contenders");
  cmd.add_option("--only", o->only,
                 "run only these contenders: ckpt, python, bare, python_api, "
                 "python_api_torchscript, python_api_builtin")
      ->delimiter(',')
      ->check(CLI::IsMember({"ckpt", "python", "bare", "python_api", "python_api_torchscript",
                             "python_api_builtin"}));
  cmd.add_option("--api-python", o->api_python,
                 "Python of the API contenders (default: the project venv's)");
  cmd.add_flag("--bare-only", o->bare_only, "run the bare loop alone (internal)");
  cmd.add_option("--ckpt-args", o->ckpt_args,
                 "extra arguments of `ckpt-scheduler run`, split at spaces (give it with =)");
  return [o] { return Seed(*o); };
}

CKPT_BENCHMARK("seed", "the seed workload: ckpt-scheduler run vs the user's Python pool",
               SeedFlags);

}  // namespace
}  // namespace ckpt::bench
