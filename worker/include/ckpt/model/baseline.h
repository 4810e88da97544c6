// The reference point for the trainer's throughput: one LeNet-5 trained by the
// bare LibTorch loop (torch::nn modules, torch::optim::SGD), without ckpt's
// state handling, on the same device and data, by the calling thread.
//
// Thread-safety: a free function; it sets the calling thread's OpenMP thread
// count like Trainer does (see trainer.h).
#ifndef CKPT_MODEL_BASELINE_H_
#define CKPT_MODEL_BASELINE_H_

#include <cstdint>
#include <string>

#include "ckpt/base/status.h"
#include "ckpt/model/trainer.h"

namespace ckpt::model {

struct BaselineOptions {
  // Device, batch size, intra-op threads and dataset are taken from here;
  // model_spec and optimizer are ignored (LeNet-5, SGD with momentum 0.9).
  TrainerOptions trainer;
  // Wall time measured after `warmup_steps`. Default: 3.
  double seconds = 3.0;
  // Default: 10.
  int32_t warmup_steps = 10;
};

// Training samples per second of the bare loop. Returns the dataset errors of
// LoadDataset, InvalidArgument / Unavailable for the device, Internal for a
// LibTorch failure.
StatusOr<double> MeasureBareLibTorchLoop(const BaselineOptions& options);

struct SgemmOptions {
  // "cpu" or "cuda:N". Default: "cpu".
  std::string device = "cpu";
  // Intra-op threads on a CPU. Default: 1. REQUIRES: >= 1.
  int32_t threads = 1;
  // C[n, n] = A[n, n] B[n, n] in float32. Default: 1024. REQUIRES: >= 1.
  int64_t n = 1024;
  // Wall time measured after one unmeasured product. Default: 1.
  double seconds = 1.0;
};

// Floating-point operations per second (2 n^3 per product) of LibTorch's
// float32 matrix product on the device (its CPU BLAS, cuBLAS on a GPU, TF32
// off as LibTorch's default): the peak `ckpt-bench train` sets a training
// step's FLOP/s against, measured in the same process. InvalidArgument for
// bad options, Unavailable for a CUDA device that is not there, Internal for
// a LibTorch failure.
StatusOr<double> MeasureSgemmFlops(const SgemmOptions& options);

}  // namespace ckpt::model

#endif  // CKPT_MODEL_BASELINE_H_
