// ckpt-worker --segment NAME --device cpu|cuda:N [--slots N] [--fusion auto|plain|fused]
//             [--fusion-width K] [--intra-op-threads T]
// Started by ckpt-scheduler, one per device. Thin: flags -> WorkerOptions -> RunWorker.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "ckpt/worker/worker_loop.h"

int main(int argc, char** argv) {
  // CUDA reads this once, when the process first calls it: load each kernel
  // on first use instead of all of LibTorch's at context creation (hundreds
  // of MB of device memory). ckpt-scheduler sets it for its workers; this
  // covers a worker started by hand. An explicit setting wins.
  setenv("CUDA_MODULE_LOADING", "LAZY", /*overwrite=*/0);
  CLI::App app{"ckpt-worker: trains population members for ckpt-scheduler"};
  ckpt::worker::WorkerOptions o;
  app.add_option("--segment", o.segment, "shared-memory segment made by the scheduler")->required();
  app.add_option("--device", o.device, "cpu or cuda:N");
  app.add_option("--slots", o.slots, "members (or fused groups) trained at once")
      ->check(CLI::Range(1, 256));
  app.add_option("--fusion", o.fusion, "auto, plain or fused")
      ->check(CLI::IsMember({"auto", "plain", "fused"}));
  app.add_option("--fusion-width", o.fusion_width, "members per fused group")
      ->check(CLI::Range(1, 1024));
  app.add_option("--intra-op-threads", o.intra_op_threads, "threads per slot")
      ->check(CLI::Range(1, 256));
  app.add_option("--probe-seconds", o.probe_seconds, "plain-vs-fused measurement per mode");
  CLI11_PARSE(app, argc, argv);
  ckpt::Status s;
  // Process root: an escaping exception (none is expected) is reported and
  // the worker exits non-zero; the scheduler restarts it.
  try {
    s = ckpt::worker::RunWorker(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ckpt-worker %s: unexpected exception: %s\n", o.segment.c_str(), e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "ckpt-worker %s: unexpected non-standard exception\n", o.segment.c_str());
    return 1;
  }
  if (!s.ok()) {
    std::fprintf(stderr, "ckpt-worker %s: %s\n", o.segment.c_str(), s.ToString().c_str());
    return s.IsUnavailable() ? 3 : 1;
  }
  return 0;
}
