// What an exported model needs to know of its data: the input normalization
// ckpt trains with, the input's shape and dtype, and what the model outputs.
// IDX (the MNIST family): computed from the files exactly as
// ckpt::model::LoadDataset does (ckpt/model/dataset.h): train split = the
// first N - 10,000 images of the train file; mean and std of its pixels / 255
// from integer sums; classes = 1 + the largest label of the train and test
// files. Tensor files (safetensors, .npz): ckpt::format::TensorDataset opened
// with the experiment's own [data] options, so the per-channel values are the
// workers' (ckpt/format/tensor_dataset.h). Either way a worker feeds a model
// x' = x * scale[c] + shift[c] (float32) per channel c of x.
//
// Thread-safety: a free function.
#ifndef CKPT_TOOLS_SRC_DATASET_STATS_H_
#define CKPT_TOOLS_SRC_DATASET_STATS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"

namespace ckpt::tool {

struct InputNormalization {
  // Per channel (dim 1 of x; per feature for [N, F] data): the train split's
  // mean and std (U8 values / 255), and what a worker multiplies and adds.
  std::vector<double> mean, std, scale, shift;
  // "uint8", "float16" or "float32": the raw input the scale applies to.
  std::string input_dtype;
  std::vector<int64_t> input_shape;  // [C, H, W] or [F]
  // "classes" (num_classes > 0) or "values" (regression, num_classes 0).
  std::string target;
  int64_t num_classes = 0;
  int64_t num_outputs = 0;  // classes, or the regression target's width
};

// The most an IDX file holds, after gunzipping (docs/LIMITS.md): 1 GiB of
// elements, the worker's own cap (kMaxIdxBytes, worker/src/dataset.cc), and
// the largest header.
inline constexpr size_t kMaxIdxFileBytes = (size_t{1} << 30) + 4 + size_t{4} * 4;

// The normalization of `config`'s data. IDX: reads train-images-idx3-ubyte,
// train-labels-idx1-ubyte and t10k-labels-idx1-ubyte (each plain or ".gz") of
// dataset_path; NotFound naming a missing file; Corruption naming one that is
// not an IDX file of u8 or holds more than its header claims; InvalidArgument
// naming a file (or a gzip stream) that holds, or whose header claims, more
// than `max_idx_file_bytes`. Both bounds are checked while reading, so memory
// grows with what the stream yields and stops at the smaller. A tensor file:
// TensorDataset::Open's errors, naming the file and tensor.
StatusOr<InputNormalization> ComputeInputNormalization(
    const records::ExperimentConfig& config, size_t max_idx_file_bytes = kMaxIdxFileBytes);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_DATASET_STATS_H_
