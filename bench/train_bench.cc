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

int TrainBench(const TrainBenchOptions& opt) {
  // Before the first CUDA call of the process (see worker_main.cc).
  setenv("CUDA_MODULE_LOADING", "LAZY", /*overwrite=*/0);
  const int members = opt.members;
  const int batch = opt.batch;
  const int64_t steps = opt.steps;
  const double seconds = opt.seconds;
  const int cores = HardwareCores();
  const int slots = opt.slots;
  const std::string device = opt.device;
  const int fused_intra_op = opt.fused_intra_op;
  const std::vector<int>& widths = opt.fused_k;
  const int population = std::max(members, *std::max_element(widths.begin(), widths.end()));
  // Per measurement: its wall-clock interval and the allocator's bytes at its end.
  nlohmann::json phases = nlohmann::json::object();
  auto phase = [&phases](const std::string& name, double start, model::Trainer& t) {
    phases[name] = {{"start", start},
                    {"end", UnixSeconds()},
                    {"allocated_bytes", t.GetDeviceMemory().allocated_bytes}};
  };

  const double load_start = LoadAverage();
  auto data = model::LoadDataset("fashion-mnist", opt.dataset_path);
  if (!data.ok()) {
    std::fprintf(stderr, "train: %s\n", data.status().ToString().c_str());
    return 1;
  }
  auto make = [&](int intra_op_threads) {
    model::TrainerOptions o;
    o.device = device;
    o.model_spec = "lenet5";
    o.optimizer = "sgd";
    o.batch_size = batch;
    o.eval_size = 0;
    o.data = *data;
    o.intra_op_threads = intra_op_threads;
    return model::Trainer::Create(o);
  };
  auto plain_trainer = make(1);
  if (!plain_trainer.ok()) {
    std::fprintf(stderr, "train: %s\n", plain_trainer.status().ToString().c_str());
    return 1;
  }

  // Fresh population, identical for every mode.
  std::vector<std::string> initial;
  for (int i = 0; i < population; ++i) {
    model::MemberTask t;
    t.member = "m" + std::to_string(i);
    t.init_seed = static_cast<uint64_t>(i);
    t.hparams = Hparams(static_cast<size_t>(i));
    model::MemberOutcome o = (*plain_trainer)->TrainPlain(t);
    if (!o.ok()) {
      std::fprintf(stderr, "train: %s\n", o.status.ToString().c_str());
      return 1;
    }
    initial.push_back(o.EncodeState());
  }
  const size_t state_bytes = initial.front().size();

  model::BaselineOptions base;
  base.trainer = (*plain_trainer)->options();
  base.trainer.intra_op_threads = 1;
  base.seconds = seconds;
  double phase_start = UnixSeconds();
  auto single = model::MeasureBareLibTorchLoop(base);
  phase("single", phase_start, **plain_trainer);
  if (!single.ok()) {
    std::fprintf(stderr, "train: %s\n", single.status().ToString().c_str());
    return 1;
  }
  std::printf("single model (bare LibTorch loop, 1 thread): %.0f samples/s\n", *single);

  // The limit, on the same device in the same run: one thread, and as many
  // as the plain slots run.
  auto spec = model::ModelSpec::Parse("lenet5");
  if (!spec.ok()) {
    std::fprintf(stderr, "train: %s\n", spec.status().ToString().c_str());
    return 1;
  }
  const double gflop_per_sample = static_cast<double>(spec->TrainingFlopsPerSample()) / 1e9;
  phase_start = UnixSeconds();
  auto peak_1 = MeasurePeak(device, 1, opt.sgemm_seconds);
  auto peak_all = slots == 1 ? peak_1 : MeasurePeak(device, slots, opt.sgemm_seconds);
  phase("sgemm", phase_start, **plain_trainer);
  if (!peak_1.ok() || !peak_all.ok()) {
    std::fprintf(stderr, "train: %s\n",
                 (peak_1.ok() ? peak_all.status() : peak_1.status()).ToString().c_str());
    return 1;
  }
  std::printf(
      "float32 matrix product peak: %.1f GFLOP/s on 1 thread, %.1f on %d; the training step is "
      "%.2f MFLOP/sample, single %.1f GFLOP/s (%.0f%% of the 1-thread peak)\n",
      peak_1->gflops, peak_all->gflops, slots, gflop_per_sample * 1e3, *single * gflop_per_sample,
      100 * *single * gflop_per_sample / peak_1->gflops);

  Population plain_pop(std::vector<std::string>(initial.begin(), initial.begin() + members));
  phase_start = UnixSeconds();
  RunResult plain = Run(**plain_trainer, plain_pop, 1, slots, steps, seconds, false);
  phase("plain", phase_start, **plain_trainer);
  std::printf(
      "plain, %d slots x 1 intra-op thread: %.0f samples/s (%.2fx single), "
      "blob<->tensors %.0f us/member\n",
      slots, plain.samples_s, plain.samples_s / *single, plain.state_us_per_member);

  // Several threads are held to the better of the two peaks: where two vCPUs
  // share one core, two threads of matrix product are no faster than one.
  const double peak_many = std::max(peak_1->gflops, peak_all->gflops);
  auto fraction = [&](double samples_s, int threads) {
    const double peak = threads == 1 ? peak_1->gflops : peak_many;
    return peak > 0 ? samples_s * gflop_per_sample / peak : 0.0;
  };
  nlohmann::json out = {{"bench", "train"},
                        {"device", (*plain_trainer)->device()},
                        {"cpu", CpuDescription()},
                        {"threads", cores},
                        {"slots", slots},
                        {"members", members},
                        {"batch", batch},
                        {"steps_per_interval", steps},
                        {"model", "lenet5"},
                        {"optimizer", "sgd"},
                        {"single_model_samples_s", *single},
                        {"plain_samples_s", plain.samples_s},
                        {"plain_vs_single", plain.samples_s / *single},
                        {"train_mflop_per_sample", gflop_per_sample * 1e3},
                        {"sgemm_gflops_1_thread", peak_1->gflops},
                        {"sgemm_gflops_by_n_1_thread", peak_1->by_n},
                        {"sgemm_gflops", peak_all->gflops},
                        {"sgemm_threads", slots},
                        {"sgemm_gflops_by_n", peak_all->by_n},
                        {"single_gflops", *single * gflop_per_sample},
                        {"single_fraction_of_peak", fraction(*single, 1)},
                        {"plain_gflops", plain.samples_s * gflop_per_sample},
                        {"plain_fraction_of_peak", fraction(plain.samples_s, slots)}};
  nlohmann::json fused_fraction = nlohmann::json::object();
  nlohmann::json fused_samples_s = nlohmann::json::object();
  double pack_unpack_k8 = 0;
  int64_t failures = plain.failures;
  std::string first_failure = plain.first_failure;
  for (int k : widths) {
    const int k_members = std::max(members, k);
    const int groups = (k_members + k - 1) / k;
    const int threads = std::max(1, std::min(slots, groups));
    const int intra = fused_intra_op > 0 ? fused_intra_op : std::max(1, cores / threads);
    auto trainer = make(intra);
    if (!trainer.ok()) {
      std::fprintf(stderr, "train: %s\n", trainer.status().ToString().c_str());
      return 1;
    }
    Population pop(std::vector<std::string>(initial.begin(), initial.begin() + k_members));
    phase_start = UnixSeconds();
    RunResult r = Run(**trainer, pop, static_cast<size_t>(k), threads, steps, seconds, true);
    phase("k" + std::to_string(k), phase_start, **trainer);
    std::printf(
        "fused K=%d, %d threads x %d intra-op: %.0f samples/s (%.2fx single), "
        "pack/unpack %.0f us/member\n",
        k, threads, intra, r.samples_s, r.samples_s / *single, r.state_us_per_member);
    const std::string fused = "fused_k" + std::to_string(k);
    out[fused + "_samples_s"] = r.samples_s;
    out[fused + "_threads"] = threads;
    out[fused + "_intra_op"] = intra;
    fused_samples_s["k" + std::to_string(k)] = r.samples_s;
    // Against the peak of as many threads as it ran (intra-op threads count:
    // each fused thread runs `intra` of them).
    fused_fraction["k" + std::to_string(k)] = fraction(r.samples_s, threads * intra);
    if (k == 8) pack_unpack_k8 = r.state_us_per_member;
    if (r.failures > 0 && failures == 0) first_failure = r.first_failure;
    failures += r.failures;
  }
  if (failures > 0)
    std::printf("failures: %lld (%s)\n", static_cast<long long>(failures), first_failure.c_str());

  out["fused_samples_s"] = fused_samples_s;
  out["fused_fraction_of_peak"] = fused_fraction;
  out["pack_unpack_us_per_member"] = pack_unpack_k8;
  out["plain_load_store_us_per_member"] = plain.state_us_per_member;
  out["state_bytes"] = state_bytes;
  out["failures"] = failures;
  out["loadavg_start"] = load_start;
  out["loadavg_end"] = LoadAverage();
  out["peak_rss_bytes"] = PeakRssBytes();
  out["phases"] = phases;
  PrintJsonLine(out);
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
