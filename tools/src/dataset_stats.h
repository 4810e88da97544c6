// What an exported model needs to know of its data: the input normalization
// ckpt trains with and the number of classes, computed from the dataset's
// IDX files exactly as ckpt::model::LoadDataset does (ckpt/model/dataset.h):
// train split = the first N - 10,000 images of the train file; mean and std of
// its pixels / 255 from integer sums; classes = 1 + the largest label of the
// train and test files. A worker feeds a model x = u8 * scale + shift
// (float32), scale = 1 / (255 * std), shift = -mean / std.
//
// Thread-safety: a free function.
#ifndef CKPT_TOOLS_SRC_DATASET_STATS_H_
#define CKPT_TOOLS_SRC_DATASET_STATS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/format/status.h"

namespace ckpt::tool {

struct InputNormalization {
  double mean = 0;
  double std = 1;
  int64_t num_classes = 0;
  std::vector<int64_t> input_shape;  // [C, H, W]
};

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte and
// t10k-labels-idx1-ubyte (each plain or ".gz") of `dir`. NotFound naming the
// file when one is missing; Corruption naming it when it is not an IDX file
// of u8.
StatusOr<InputNormalization> ComputeInputNormalization(const std::string& dir);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_DATASET_STATS_H_
