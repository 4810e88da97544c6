// ckpt-worker (--segment NAME | --connect HOST:PORT --secret-file PATH)
//             --device cpu|cuda:N|auto [--slots N] [--fusion auto|plain|fused]
//             [--fusion-width K] [--intra-op-threads T] [--connect-timeout-s S]
// ckpt-worker --blas-kernels
// --segment: started by ckpt-scheduler, one per device. --connect: started by
// hand or by a cluster's resource manager (Slurm), on any host that reaches
// the scheduler's [workers] listen address. Thin: flags -> WorkerOptions ->
// RunWorker. --blas-kernels prints the BLAS kernels it runs (blas_kernels.h:
// where OpenBLAS does not know the CPU, the worker starts again with
// OPENBLAS_CORETYPE naming the CPU's own). Exit status: 0 after SHUTDOWN, 3
// when the scheduler is gone or unreachable, 1 otherwise.
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <string>

#include "ckpt/logging/logging.h"
#include "ckpt/model/blas_kernels.h"
#include "ckpt/worker/allocator.h"
#include "ckpt/worker/worker_loop.h"

int main(int argc, char** argv) {
  // OpenBLAS's kernels for this CPU where it fell back to SSE3 ones: may
  // execute the worker again, first of all (blas_kernels.h).
  const std::string blas_exec_error = ckpt::model::UseTheCpusBlasKernels(argv);
  // CUDA reads this once, when the process first calls it: load each kernel
  // on first use instead of all of LibTorch's at context creation (hundreds
  // of MB of device memory). ckpt-scheduler sets it for its workers; this
  // covers a worker started by hand. An explicit setting wins.
  setenv("CUDA_MODULE_LOADING", "LAZY", /*overwrite=*/0);
  // Training buffers stay in the heap between steps (allocator.h).
  ckpt::worker::TuneAllocatorForTraining();
  CLI::App app{"ckpt-worker: trains population members for ckpt-scheduler"};
  ckpt::worker::WorkerOptions o;
  auto* segment =
      app.add_option("--segment", o.segment, "shared-memory segment made by the scheduler");
  auto* connect = app.add_option("--connect", o.connect,
                                 "HOST:PORT of a scheduler listening for workers (TCP)");
  segment->excludes(connect);
  connect->excludes(segment);
  auto* secret = app.add_option("--secret-file", o.secret_file,
                                "with --connect: file holding the experiment's secret (mode 0600)");
  secret->needs(connect);
  connect->needs(secret);
  double connect_timeout_s = 60;
  app.add_option("--connect-timeout-s", connect_timeout_s,
                 "with --connect: seconds to keep trying to reach the scheduler")
      ->check(CLI::Range(0.0, 86400.0))
      ->needs(connect);
  app.add_option("--device", o.device, "cpu, cuda:N or auto");
  app.add_option("--slots", o.slots, "members (or fused groups) trained at once")
      ->check(CLI::Range(1, 256));
  std::map<std::string, ckpt::ipc::FusionMode> fusion_modes;
  for (auto m : ckpt::ipc::kFusionModes) fusion_modes[ckpt::ipc::FusionModeName(m)] = m;
  app.add_option("--fusion", o.fusion, "auto, plain or fused")
      ->transform(CLI::CheckedTransformer(fusion_modes));
  app.add_option("--fusion-width", o.fusion_width, "members per fused group")
      ->check(CLI::Range(1, 1024));
  app.add_option("--intra-op-threads", o.intra_op_threads, "threads per slot")
      ->check(CLI::Range(1, 256));
  app.add_option("--probe-seconds", o.probe_seconds, "plain-vs-fused measurement per mode");
  app.add_flag("--tf32", o.allow_tf32,
               "on a GPU, let float32 convolutions and matrix products run in TF32");
  bool print_blas = false;
  app.add_flag(
      "--blas-kernels", print_blas,
      "print the BLAS and the CPU kernels it runs (LIBRARY CORE BETTER_CORE, tab-separated) "
      "and exit");
  CLI11_PARSE(app, argc, argv);
  const auto blas = ckpt::model::DescribeBlasKernels();
  if (print_blas) {
    std::printf("%s\t%s\t%s\n", blas.library.c_str(), blas.core.c_str(), blas.better_core.c_str());
    return 0;
  }
  if (o.segment.empty() == o.connect.empty()) {
    std::fprintf(stderr, "ckpt-worker: give exactly one of --segment and --connect\n");
    return 2;
  }
  o.connect_timeout = std::chrono::milliseconds(static_cast<int64_t>(connect_timeout_s * 1000));
  const std::string name = o.connect.empty() ? o.segment : "tcp:" + o.connect;
  if (!blas.better_core.empty()) {
    // OPENBLAS_CORETYPE was set to a fallback, or the exec failed.
    ckpt::logging::Logger().warn(
        "ckpt-worker {}: {} (the linear layers train that much slower){}{}", name,
        ckpt::model::DescribeFallback(blas), blas_exec_error.empty() ? "" : "; ", blas_exec_error);
  }
  ckpt::Status s;
  // Process root: an escaping exception (none is expected) is reported and
  // the worker exits non-zero; the scheduler restarts it.
  try {
    s = ckpt::worker::RunWorker(o);
  } catch (const std::exception& e) {
    ckpt::logging::Logger().critical("ckpt-worker {}: unexpected exception: {}", name, e.what());
    return 1;
  } catch (...) {
    ckpt::logging::Logger().critical("ckpt-worker {}: unexpected non-standard exception", name);
    return 1;
  }
  if (!s.ok()) {
    ckpt::logging::Logger().error("ckpt-worker {}: {}", name, s.ToString());
    return s.IsUnavailable() ? 3 : 1;
  }
  return 0;
}
