// ckpt-bench train: training throughput of a LeNet-5 population on one device.
//
//   build/bench/ckpt-bench train [--members 30] [--batch 64] [--steps 20]
//       [--seconds 5] [--slots N] [--fused-intra-op 1] [--device cpu]
//       [--fused-k 1,8,30] [--dataset-path DIR] [--sgemm-seconds 0.5]
//
// Measures, each for --seconds of wall time after a warm-up:
//   single_model_samples_s  one member, one thread, the bare LibTorch loop
//   plain_samples_s         --slots threads (default: hardware cores), each
//                           training one member at a time with one intra-op
//                           thread, intervals of --steps steps, every member's
//                           state going through its checkpoint blob per interval
//   fused_kK_samples_s      for each K of --fused-k, the population (--members,
//                           or K members when K is larger) in groups of K
//                           trained fused by min(slots,
//                           groups) threads with --fused-intra-op intra-op threads
//                           each (default 1; 0 shares the cores out among the
//                           threads, which OpenMP does badly when other work
//                           shares the cores)
// and the time per member spent on state handling: pack_unpack_us_per_member
// (fused K=8: blob -> device tensors -> packed, and back) and
// plain_load_store_us_per_member (plain: blob -> tensors -> blob). Training
// samples only; no evaluation runs in the measured intervals.
//
// The limit: each rate is also given in GFLOP/s (samples/s x the model's
// training FLOPs per sample, ModelSpec::TrainingFlopsPerSample: conv and
// linear multiply-adds of forward, weight and input gradients) and as a
// fraction of the float32 matrix product's GFLOP/s measured in the same run
// on the same device (the best of n = 256, 512, 1024, 2048) with the same
// threads: single against one thread, plain and fused against as many threads
// as they run (or one thread's, when that is higher: two vCPUs of one core).
// The JSON names the CPU ("cpu", from /proc/cpuinfo).
//
// On a GPU (--device cuda:N) each slot thread trains on its own CUDA stream.
// The JSON line's "phases" gives each measurement's wall-clock interval
// (Unix seconds) and the CUDA allocator's bytes in use at its end, so that an
// outside NVML sampler (scripts/gpu-check) can attribute utilization and the
// process's device memory to each phase.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench.h"
#include "ckpt/model/baseline.h"
#include "ckpt/model/model_spec.h"
#include "ckpt/model/trainer.h"
#include "fma_peak.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct RunResult {
  double samples_s = 0;
  double state_us_per_member = 0;  // pack_s + unpack_s per member interval
  int threads = 0;
  int intra_op_threads = 0;
  int64_t failures = 0;
  std::string first_failure;
};

// A population of member blobs; one interval takes a member (or a group of
// them) out, trains it, and puts the new blobs back.
class Population {
 public:
  explicit Population(std::vector<std::string> blobs) : blobs_(std::move(blobs)) {}
  size_t size() const { return blobs_.size(); }
  std::string Get(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return blobs_[i];
  }
  void Put(size_t i, std::string blob) {
    std::lock_guard<std::mutex> lock(mu_);
    blobs_[i] = std::move(blob);
  }

 private:
  std::mutex mu_;
  std::vector<std::string> blobs_;
};

// 1-minute load average: the numbers mean little when other work shares the cores.
double LoadAverage() {
  double load = -1;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  return load;
}

std::map<std::string, double> Hparams(size_t member) {
  return {{"lr", 0.01 + 0.002 * static_cast<double>(member % 10)}, {"momentum", 0.9}};
}

model::MemberTask MakeTask(size_t member, const std::string& blob, int64_t steps) {
  model::MemberTask t;
  t.member = "m" + std::to_string(member);
  t.state = reinterpret_cast<const uint8_t*>(blob.data());
  t.state_size = blob.size();
  t.steps = steps;
  t.hparams = Hparams(member);
  return t;
}

// Runs `threads` threads, each taking the next unit of work (a group of
// members) round-robin until `seconds` pass.
RunResult Run(model::Trainer& trainer, Population& pop, size_t group_size, int threads,
              int64_t steps, double seconds, bool fused) {
  const size_t groups = (pop.size() + group_size - 1) / group_size;
  std::atomic<size_t> next{0};
  std::atomic<int64_t> samples{0};
  std::mutex mu;
  double state_s = 0;
  int64_t member_intervals = 0;
  RunResult result;
  auto interval = [&](size_t g) {
    const size_t begin = g * group_size, end = std::min(pop.size(), begin + group_size);
    std::vector<std::string> blobs;
    for (size_t i = begin; i < end; ++i) blobs.push_back(pop.Get(i));
    std::vector<model::MemberTask> tasks;
    for (size_t i = begin; i < end; ++i) tasks.push_back(MakeTask(i, blobs[i - begin], steps));
    std::vector<model::MemberOutcome> out;
    if (fused) {
      out = trainer.TrainFused(tasks);
    } else {
      out.push_back(trainer.TrainPlain(tasks.front()));
    }
    int64_t n = 0;
    double s = 0;
    for (size_t j = 0; j < out.size(); ++j) {
      if (!out[j].ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (result.failures++ == 0) result.first_failure = out[j].status.ToString();
        continue;
      }
      pop.Put(begin + j, out[j].EncodeState());
      n += out[j].samples;
      s += out[j].pack_s + out[j].unpack_s;
    }
    return std::make_pair(n, s);
  };
  // Warm-up: one interval per thread's worth, unmeasured.
  interval(0);
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(seconds);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (Clock::now() < deadline) {
        const size_t g = next.fetch_add(1) % groups;
        auto [n, s] = interval(g);
        samples += n;
        std::lock_guard<std::mutex> lock(mu);
        state_s += s;
        member_intervals += n / trainer.options().batch_size / steps;
      }
    });
  }
  for (auto& t : pool) t.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  result.samples_s = static_cast<double>(samples.load()) / elapsed;
  result.state_us_per_member =
      member_intervals > 0 ? 1e6 * state_s / static_cast<double>(member_intervals) : 0;
  result.threads = threads;
  return result;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int HardwareCores() { return static_cast<int>(std::max(1u, std::thread::hardware_concurrency())); }

// The float32 matrix product's best GFLOP/s over a few sizes with `threads`
// intra-op threads, and each size's figure.
struct Peak {
  double gflops = 0;
  nlohmann::json by_n = nlohmann::json::object();
};

StatusOr<Peak> MeasurePeak(const std::string& device, int threads, double seconds) {
  Peak peak;
  for (int64_t n : {256, 512, 1024, 2048}) {
    model::SgemmOptions o;
    o.device = device;
    o.threads = threads;
    o.n = n;
    o.seconds = seconds;
    CKPT_ASSIGN_OR_RETURN(double flops, model::MeasureSgemmFlops(o));
    peak.by_n[std::to_string(n)] = flops / 1e9;
    peak.gflops = std::max(peak.gflops, flops / 1e9);
  }
  return peak;
}

struct TrainBenchOptions {
  int members = 30;
  int batch = 64;
  int64_t steps = 20;
  double seconds = 5;
  int slots = HardwareCores();
  std::string device = "cpu";
  int fused_intra_op = 1;
  std::vector<int> fused_k = {1, 8, 30};
  std::string dataset_path;
  double sgemm_seconds = 0.5;  // per size and thread count
};

// What the measurements share: the dataset, the trainer of the plain slots
// (one intra-op thread) and the initial population, identical for every mode.
struct TrainSetup {
  int cores = 0;
  std::shared_ptr<const model::DatasetSplits> data;
  std::unique_ptr<model::Trainer> plain_trainer;
  std::vector<std::string> initial;
  // Per measurement: its wall-clock interval and the allocator's bytes at its end.
  nlohmann::json phases = nlohmann::json::object();

  void RecordPhase(const std::string& name, double start, model::Trainer& t) {
    phases[name] = {{"start", start},
                    {"end", UnixSeconds()},
                    {"allocated_bytes", t.GetDeviceMemory().allocated_bytes}};
  }
};

StatusOr<std::unique_ptr<model::Trainer>> MakeTrainer(const TrainBenchOptions& opt,
                                                      const TrainSetup& s, int intra_op_threads) {
  model::TrainerOptions o;
  o.device = opt.device;
  o.model_spec = "lenet5";
  o.optimizer = format::OptimizerKind::kSgd;
  o.batch_size = opt.batch;
  o.eval_size = 0;
  o.data = s.data;
  o.intra_op_threads = intra_op_threads;
  return model::Trainer::Create(o);
}

// Loads the dataset, creates the plain trainer and trains the initial
// population's states from their seeds.
Status Prepare(const TrainBenchOptions& opt, TrainSetup* s) {
  s->cores = HardwareCores();
  CKPT_ASSIGN_OR_RETURN(s->data, model::LoadDataset("fashion-mnist", opt.dataset_path));
  CKPT_ASSIGN_OR_RETURN(s->plain_trainer, MakeTrainer(opt, *s, 1));
  const int population =
      std::max(opt.members, *std::max_element(opt.fused_k.begin(), opt.fused_k.end()));
  for (int i = 0; i < population; ++i) {
    model::MemberTask t;
    t.member = "m" + std::to_string(i);
    t.init_seed = static_cast<uint64_t>(i);
    t.hparams = Hparams(static_cast<size_t>(i));
    model::MemberOutcome o = s->plain_trainer->TrainPlain(t);
    if (!o.ok()) return o.status;
    s->initial.push_back(o.EncodeState());
  }
  return Status::OK();
}

// The bare LibTorch loop's samples/s: one member, one thread.
StatusOr<double> MeasureSingle(const TrainBenchOptions& opt, TrainSetup* s) {
  model::BaselineOptions base;
  base.trainer = s->plain_trainer->options();
  base.trainer.intra_op_threads = 1;
  base.seconds = opt.seconds;
  const double phase_start = UnixSeconds();
  auto single = model::MeasureBareLibTorchLoop(base);
  s->RecordPhase("single", phase_start, *s->plain_trainer);
  if (!single.ok()) return single.status();
  std::printf("single model (bare LibTorch loop, 1 thread): %.0f samples/s\n", *single);
  return single;
}

// The limit the rates are held to: the model's training FLOPs per sample and
// the float32 matrix product's peak on one thread and on the plain slots'.
struct Limits {
  double single = 0;  // samples/s of the bare loop
  double gflop_per_sample = 0;
  Peak peak_1;
  Peak peak_all;
  // The widest-vector FMA loop's peak on one thread and on the plain slots':
  // the machine's, where the sgemm figure is OpenBLAS's.
  FmaPeak fma_1;
  FmaPeak fma_all;

  // `samples_s` of `threads` threads as a fraction of the FMA peak of as
  // many threads (at most the slots').
  double FractionOfFmaPeak(double samples_s, int threads) const {
    const double peak = threads == 1 ? fma_1.gflops : std::max(fma_1.gflops, fma_all.gflops);
    return peak > 0 ? samples_s * gflop_per_sample / peak : 0.0;
  }

  // `samples_s` of `threads` threads as a fraction of their peak. Several
  // threads are held to the better of the two peaks: where two vCPUs share
  // one core, two threads of matrix product are no faster than one.
  double FractionOfPeak(double samples_s, int threads) const {
    const double peak_many = std::max(peak_1.gflops, peak_all.gflops);
    const double peak = threads == 1 ? peak_1.gflops : peak_many;
    return peak > 0 ? samples_s * gflop_per_sample / peak : 0.0;
  }
};

// The limit, on the same device in the same run: one thread, and as many
// as the plain slots run.
Status MeasureLimits(const TrainBenchOptions& opt, TrainSetup* s, Limits* limits) {
  CKPT_ASSIGN_OR_RETURN(const model::ModelSpec spec, model::ModelSpec::Parse("lenet5"));
  limits->gflop_per_sample = static_cast<double>(spec.TrainingFlopsPerSample()) / 1e9;
  const double phase_start = UnixSeconds();
  auto peak_1 = MeasurePeak(opt.device, 1, opt.sgemm_seconds);
  auto peak_all = opt.slots == 1 ? peak_1 : MeasurePeak(opt.device, opt.slots, opt.sgemm_seconds);
  limits->fma_1 = MeasureFmaPeak(1, opt.sgemm_seconds * 2);
  limits->fma_all =
      opt.slots == 1 ? limits->fma_1 : MeasureFmaPeak(opt.slots, opt.sgemm_seconds * 2);
  s->RecordPhase("sgemm", phase_start, *s->plain_trainer);
  if (!peak_1.ok()) return peak_1.status();
  if (!peak_all.ok()) return peak_all.status();
  limits->peak_1 = *peak_1;
  limits->peak_all = *peak_all;
  std::printf(
      "float32 matrix product peak: %.1f GFLOP/s on 1 thread, %.1f on %d; the training step is "
      "%.2f MFLOP/sample, single %.1f GFLOP/s (%.0f%% of the 1-thread peak)\n",
      limits->peak_1.gflops, limits->peak_all.gflops, opt.slots, limits->gflop_per_sample * 1e3,
      limits->single * limits->gflop_per_sample,
      100 * limits->single * limits->gflop_per_sample / limits->peak_1.gflops);
  std::printf(
      "%s FMA loop peak: %.1f GFLOP/s on 1 thread, %.1f on %d; single %.0f%% of the 1-thread "
      "FMA peak\n",
      limits->fma_1.isa.c_str(), limits->fma_1.gflops, limits->fma_all.gflops, opt.slots,
      100 * limits->FractionOfFmaPeak(limits->single, 1));
  return Status::OK();
}

// --slots threads, each training one member at a time.
RunResult MeasurePlain(const TrainBenchOptions& opt, TrainSetup* s, double single) {
  Population plain_pop(
      std::vector<std::string>(s->initial.begin(), s->initial.begin() + opt.members));
  const double phase_start = UnixSeconds();
  RunResult plain = Run(*s->plain_trainer, plain_pop, 1, opt.slots, opt.steps, opt.seconds, false);
  s->RecordPhase("plain", phase_start, *s->plain_trainer);
  std::printf(
      "plain, %d slots x 1 intra-op thread: %.0f samples/s (%.2fx single), "
      "blob<->tensors %.0f us/member\n",
      opt.slots, plain.samples_s, plain.samples_s / single, plain.state_us_per_member);
  return plain;
}

// One fused width K: its threads, their intra-op threads, and what it measured.
struct FusedRun {
  int k = 0;
  int threads = 0;
  int intra = 0;
  RunResult result;
};

StatusOr<FusedRun> MeasureFused(const TrainBenchOptions& opt, TrainSetup* s, int k, double single) {
  FusedRun f;
  f.k = k;
  const int k_members = std::max(opt.members, k);
  const int groups = (k_members + k - 1) / k;
  f.threads = std::max(1, std::min(opt.slots, groups));
  f.intra = opt.fused_intra_op > 0 ? opt.fused_intra_op : std::max(1, s->cores / f.threads);
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<model::Trainer> trainer, MakeTrainer(opt, *s, f.intra));
  Population pop(std::vector<std::string>(s->initial.begin(), s->initial.begin() + k_members));
  const double phase_start = UnixSeconds();
  f.result = Run(*trainer, pop, static_cast<size_t>(k), f.threads, opt.steps, opt.seconds, true);
  s->RecordPhase("k" + std::to_string(k), phase_start, *trainer);
  const RunResult& r = f.result;
  std::printf(
      "fused K=%d, %d threads x %d intra-op: %.0f samples/s (%.2fx single), "
      "pack/unpack %.0f us/member\n",
      k, f.threads, f.intra, r.samples_s, r.samples_s / single, r.state_us_per_member);
  return f;
}

void Report(const TrainBenchOptions& opt, const TrainSetup& s, const Limits& limits,
            const RunResult& plain, const std::vector<FusedRun>& fused_runs, double load_start) {
  const double single = limits.single;
  const double gflop_per_sample = limits.gflop_per_sample;
  nlohmann::json out = {
      {"bench", "train"},
      {"device", s.plain_trainer->device()},
      {"cpu", CpuDescription()},
      {"threads", s.cores},
      {"slots", opt.slots},
      {"members", opt.members},
      {"batch", opt.batch},
      {"steps_per_interval", opt.steps},
      {"model", "lenet5"},
      {"optimizer", "sgd"},
      {"single_model_samples_s", single},
      {"plain_samples_s", plain.samples_s},
      {"plain_vs_single", plain.samples_s / single},
      {"train_mflop_per_sample", gflop_per_sample * 1e3},
      {"sgemm_gflops_1_thread", limits.peak_1.gflops},
      {"sgemm_gflops_by_n_1_thread", limits.peak_1.by_n},
      {"sgemm_gflops", limits.peak_all.gflops},
      {"sgemm_threads", opt.slots},
      {"sgemm_gflops_by_n", limits.peak_all.by_n},
      {"single_gflops", single * gflop_per_sample},
      {"single_fraction_of_peak", limits.FractionOfPeak(single, 1)},
      {"plain_gflops", plain.samples_s * gflop_per_sample},
      {"plain_fraction_of_peak", limits.FractionOfPeak(plain.samples_s, opt.slots)},
      {"fma_isa", limits.fma_1.isa},
      {"fma_peak_gflops_1_thread", limits.fma_1.gflops},
      {"fma_peak_gflops", limits.fma_all.gflops},
      {"single_fraction_of_fma_peak", limits.FractionOfFmaPeak(single, 1)},
      {"plain_fraction_of_fma_peak", limits.FractionOfFmaPeak(plain.samples_s, opt.slots)}};
  nlohmann::json fused_fraction = nlohmann::json::object();
  nlohmann::json fused_fma_fraction = nlohmann::json::object();
  nlohmann::json fused_samples_s = nlohmann::json::object();
  double pack_unpack_k8 = 0;
  int64_t failures = plain.failures;
  std::string first_failure = plain.first_failure;
  for (const FusedRun& f : fused_runs) {
    const RunResult& r = f.result;
    const std::string fused = "fused_k" + std::to_string(f.k);
    out[fused + "_samples_s"] = r.samples_s;
    out[fused + "_threads"] = f.threads;
    out[fused + "_intra_op"] = f.intra;
    fused_samples_s["k" + std::to_string(f.k)] = r.samples_s;
    // Against the peak of as many threads as it ran (intra-op threads count:
    // each fused thread runs `intra` of them).
    fused_fraction["k" + std::to_string(f.k)] =
        limits.FractionOfPeak(r.samples_s, f.threads * f.intra);
    fused_fma_fraction["k" + std::to_string(f.k)] =
        limits.FractionOfFmaPeak(r.samples_s, f.threads * f.intra);
    if (f.k == 8) pack_unpack_k8 = r.state_us_per_member;
    if (r.failures > 0 && failures == 0) first_failure = r.first_failure;
    failures += r.failures;
  }
  if (failures > 0)
    std::printf("failures: %lld (%s)\n", static_cast<long long>(failures), first_failure.c_str());

  out["fused_samples_s"] = fused_samples_s;
  out["fused_fraction_of_peak"] = fused_fraction;
  out["fused_fraction_of_fma_peak"] = fused_fma_fraction;
  out["pack_unpack_us_per_member"] = pack_unpack_k8;
  out["plain_load_store_us_per_member"] = plain.state_us_per_member;
  out["state_bytes"] = s.initial.front().size();
  out["failures"] = failures;
  out["loadavg_start"] = load_start;
  out["loadavg_end"] = LoadAverage();
  out["peak_rss_bytes"] = PeakRssBytes();
  out["phases"] = s.phases;
  PrintJsonLine(out);
}

int Fail(const Status& s) {
  std::fprintf(stderr, "train: %s\n", s.ToString().c_str());
  return 1;
}

int TrainBench(const TrainBenchOptions& opt) {
  // Before the first CUDA call of the process (see worker_main.cc).
  setenv("CUDA_MODULE_LOADING", "LAZY", /*overwrite=*/0);
  const double load_start = LoadAverage();
  TrainSetup s;
  if (Status st = Prepare(opt, &s); !st.ok()) return Fail(st);
  Limits limits;
  auto single = MeasureSingle(opt, &s);
  if (!single.ok()) return Fail(single.status());
  limits.single = *single;
  if (Status st = MeasureLimits(opt, &s, &limits); !st.ok()) return Fail(st);
  const RunResult plain = MeasurePlain(opt, &s, limits.single);
  std::vector<FusedRun> fused_runs;
  for (int k : opt.fused_k) {
    auto f = MeasureFused(opt, &s, k, limits.single);
    if (!f.ok()) return Fail(f.status());
    fused_runs.push_back(*std::move(f));
  }
  Report(opt, s, limits, plain, fused_runs, load_start);
  return 0;
}

BenchRun TrainFlags(CLI::App& cmd) {
  auto o = std::make_shared<TrainBenchOptions>();
  cmd.add_option("--members", o->members, "population (at least K for each --fused-k)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--batch", o->batch, "batch size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--steps", o->steps, "steps per interval")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--seconds", o->seconds, "wall time of each measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--slots", o->slots, "training threads (default: the hardware cores)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--device", o->device, "cpu or cuda:N")->capture_default_str();
  cmd.add_option("--fused-intra-op", o->fused_intra_op,
                 "intra-op threads per fused thread (0: the cores shared out)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--fused-k", o->fused_k, "comma-separated widths K of fused training")
      ->delimiter(',')
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_option("--dataset-path", o->dataset_path, "Fashion-MNIST directory (default: the cache)");
  cmd.add_option("--sgemm-seconds", o->sgemm_seconds,
                 "wall time of each matrix-product size measured for the peak")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return [o] { return TrainBench(*o); };
}

}  // namespace

CKPT_BENCHMARK("train", "LeNet-5 population training throughput: plain, fused, bare LibTorch",
               TrainFlags);

}  // namespace ckpt::bench
