// The datasets a trainer reads: IDX files of the MNIST family (here), tensor
// files (safetensors, .npz: ckpt/format/tensor_dataset.h) as the same
// DatasetSplits, and each member's data order.
//
// IDX (http://yann.lecun.com/exdb/mnist/): big-endian; bytes 0-1 zero, byte 2
// the element type (0x08 = u8 is the only one read here), byte 3 the rank,
// then rank u32 dimensions, then the elements row-major. A file ending in
// ".gz" is gunzipped first. A directory holds train-images-idx3-ubyte,
// train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte,
// each plain or with ".gz".
//
// Splits: train = the first N - 10,000 images of the train file (50,000 for
// the MNIST family), validation = its last 10,000, test = the t10k file.
// Inputs are normalized on the fly: x = u8 * scale + shift (float32), with
// scale = 1 / (255 * std) and shift = -mean / std, where mean and std are of
// the train split's pixels / 255 (computed exactly: integer sums, then double).
//
// Data order of a member: an endless sequence of epochs, each a permutation
// of the train split; the batch at cursor c is the `batch` indices at positions
// c, c+1, ... of that sequence (a batch may straddle two epochs). The
// permutation of epoch e for data seed s is a Fisher-Yates shuffle:
//   state = s ^ (0x9E3779B97F4A7C15 * (e + 1))            (mod 2^64)
//   p = [0, 1, ..., n-1]; for i = n-1 down to 1: j = SplitMix64(&state) % (i+1); swap p[i], p[j]
// where SplitMix64 is Vigna's: state += 0x9E3779B97F4A7C15; z = state;
// z = (z ^ z>>30) * 0xBF58476D1CE4E5B9; z = (z ^ z>>27) * 0x94D049BB133111EB; z ^ z>>31.
// A member saves (data_seed, data_cursor) in its checkpoint, so a restored
// member sees exactly the batches it would have seen.
//
// Thread-safety: a loaded DatasetSplits is immutable and may be shared.
#ifndef CKPT_MODEL_DATASET_H_
#define CKPT_MODEL_DATASET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/tensor_dataset.h"

namespace ckpt::model {

// Samples held out of the train file for validation.
inline constexpr int64_t kValidationSize = 10000;

// An IDX array of u8: `dims` are the file's; its rows (along dims[0]) are in
// `data`, except the last `tail_rows` given to ReadIdxFile, which are in
// `tail`.
struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;
  std::vector<uint8_t> tail;
};

// Reads an IDX file, gunzipping when the name ends in ".gz"; its last
// `tail_rows` rows (all of them when it has fewer) go to `tail`, each byte read
// once straight into the array it stays in. Returns NotFound for a missing
// file, IOError for a read or gunzip failure, Corruption naming the file for a
// bad magic, an element type other than u8, a rank of 0 or above 4, or a size
// that does not match the dimensions.
StatusOr<IdxArray> ReadIdxFile(const std::string& path, int64_t tail_rows = 0);

// Rows [0, count) of a split: x rows of DatasetSplits::sample_numel()
// elements of x_dtype, y rows of target_width elements of y_dtype, row-major,
// pointing into memory DatasetSplits::storage keeps alive (a file mapping, or
// the arrays an IDX file was read into).
struct DataSplit {
  int64_t count = 0;
  const void* x = nullptr;
  const void* y = nullptr;
};

// A dataset as the trainer sees it, whatever file it came from.
struct DatasetSplits {
  std::string name;                            // "fashion-mnist", or the tensor file's path
  format::DType x_dtype = format::DType::kU8;  // U8, F16 or F32
  std::vector<int64_t> sample_shape;           // [C, H, W] or [F]
  format::DType y_dtype = format::DType::kU8;  // U8 (IDX labels), I64 labels, F32 targets
  format::TargetKind target = format::TargetKind::kClasses;
  int64_t target_width = 1;  // elements per y row: 1, or T of [N, T] targets
  int64_t num_classes = 0;   // classification: 1 + the largest label, or as configured
  DataSplit train;
  DataSplit validation;
  DataSplit test;  // count 0 when there is none
  // Per channel (dim 1 of x): a model is fed x * scale[c] + shift[c];
  // mean and stddev are of the train split's values (U8 / 255).
  std::vector<double> mean, stddev, scale, shift;
  std::shared_ptr<const void> storage;

  int64_t channels() const { return sample_shape.empty() ? 0 : sample_shape[0]; }
  int64_t sample_numel() const;
  // Logits or targets a model produces per sample.
  int64_t num_outputs() const {
    return target == format::TargetKind::kClasses ? num_classes : target_width;
  }
};

// Directory used when a dataset's path is "": "fashion-mnist" ->
// /usr/share/datasets/fashion-mnist, "mnist" -> /usr/share/datasets/mnist.
// InvalidArgument for another name.
StatusOr<std::string> DefaultDatasetDir(const std::string& name);

// Loads the four IDX files of `dir` (or DefaultDatasetDir(name) when `dir` is
// "") and splits them. Errors as ReadIdxFile, plus Corruption when images and
// labels disagree in count, the train file has no more than kValidationSize
// images, or the test images differ in shape from the train images.
StatusOr<std::shared_ptr<const DatasetSplits>> LoadDataset(const std::string& name,
                                                           const std::string& dir);

// Opens a tensor dataset (ckpt/format/tensor_dataset.h: mapped read-only,
// validated) as DatasetSplits; its errors are TensorDataset::Open's.
StatusOr<std::shared_ptr<const DatasetSplits>> LoadTensorDataset(
    const format::TensorDatasetOptions& options);

// One SplitMix64 step (see the top of this file).
uint64_t SplitMix64(uint64_t* state);

// The data seed of a member initialised from `init_seed` in an experiment
// seeded with `experiment_seed`: SplitMix64 of state
// experiment_seed ^ (SplitMix64 of state init_seed).
uint64_t MemberDataSeed(uint64_t experiment_seed, uint64_t init_seed);

// The permutation of epoch `epoch` of [0, n).
std::vector<int32_t> EpochPermutation(uint64_t data_seed, uint64_t epoch, int64_t n);

// Writes the `batch` sample indices at `cursor` of the data order of
// `data_seed` over n samples into `out` (resized). `epoch_cache` may hold the
// last permutation used (epoch number in `cached_epoch`) to avoid recomputing
// it; pass the same pair for consecutive calls.
void BatchIndices(uint64_t data_seed, uint64_t cursor, int64_t batch, int64_t n,
                  std::vector<int64_t>* out, std::vector<int32_t>* epoch_cache,
                  int64_t* cached_epoch);

}  // namespace ckpt::model

#endif  // CKPT_MODEL_DATASET_H_
