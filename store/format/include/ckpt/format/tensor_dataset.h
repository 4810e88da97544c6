// Tensor datasets: a user's data as tensors in one file, read as untrusted
// bytes, mapped read-only, validated completely before anything trains.
//
// Layout (one file, safetensors or NumPy .npz):
//   train.x   U8, F16 or F32; [N, C, H, W] (images) or [N, F] (features)
//   train.y   I64 [N] (class labels) or F32 [N] / [N, T] (regression targets)
//   val.x, val.y     optional; without them the last `val_size` train rows
//                    are the validation split
//   test.x, test.y   optional
// Every split's x has train.x's dtype and sample shape; every y has train.y's
// dtype and shape after N. Other tensors are an error (a typo such as
// "valid.x" would otherwise be ignored silently).
//
// safetensors: the format of ckpt/format/checkpoint.h (ParseSafetensors),
// without ckpt's metadata, alignment or checksums: what Python's
// safetensors.numpy.save_file / safetensors.torch.save_file write.
// .npz: the zip archive np.savez writes (entries "train.x.npy", ...),
// uncompressed ("stored") entries only, each an .npy of version 1-3, C order,
// little-endian dtype '|u1', '<f2', '<f4' or '<i8'. np.savez_compressed
// archives are refused (they cannot be mapped).
//
// Validation (each error is Corruption "<file>: <tensor>: <what>", naming the
// value and row where there is one, e.g. "d.safetensors: val.y: label 12 at
// row 407 is outside [0, 10)"): sizes against the file size before any
// allocation (ParseSafetensors; the zip directory and .npy headers likewise),
// dtypes, ranks, N agreeing between x and y, shapes agreeing between splits,
// labels in [0, classes), every float finite. InvalidArgument for options
// that do not fit the data (val_size with a val split, or none without one;
// classes below the largest label + 1; mean/std of the wrong length).
//
// Normalization: per channel (dim 1 of x; per feature for [N, F]) a model is
// fed x' = x * scale[c] + shift[c] (float32), with mean and std of the train
// split's values (U8 read as value / 255, exactly: integer sums, then
// double), or those given in the options: scale = 1 / (255 * std) for U8,
// 1 / std for floats, shift = -mean / std. This is the IDX rule of
// ckpt/model/dataset.h, so a U8 one-channel dataset normalizes bit for bit as
// its IDX copy.
//
// Thread-safety: a TensorDataset is immutable after Open; share it freely.
#ifndef CKPT_FORMAT_TENSOR_DATASET_H_
#define CKPT_FORMAT_TENSOR_DATASET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/safetensors.h"

namespace ckpt::format {

// How a dataset is stored. kIdx: the MNIST family's IDX files (read by the
// worker, ckpt/model/dataset.h); the others by TensorDataset::Open.
enum class DatasetFormat { kIdx, kSafetensors, kNpz };

// "idx", "safetensors", "npz".
std::string_view DatasetFormatName(DatasetFormat format);
// InvalidArgument for another name.
StatusOr<DatasetFormat> ParseDatasetFormat(std::string_view name);

// What y holds.
enum class TargetKind {
  kClasses,  // I64 class labels, [N]
  kValues,   // F32 regression targets, [N] or [N, T]
};

struct TensorDatasetOptions {
  // kSafetensors or kNpz. Default: kSafetensors.
  DatasetFormat format = DatasetFormat::kSafetensors;
  // The file. Default: "".
  std::string path;
  // Train rows held out (the last ones) as the validation split when the
  // file has none; must be 0 when it has one. Default: 0.
  int64_t val_size = 0;
  // Number of classes (labels in [0, classes)); 0 = the largest label + 1
  // over all splits. Ignored for regression targets. Default: 0.
  int64_t classes = 0;
  // Per-channel normalization; empty = computed from the train split. When
  // given, both have one value per channel, std > 0. Default: empty.
  std::vector<double> mean;
  std::vector<double> std;
};

// One split: rows [0, count) of x and y, row-major, pointing into the file's
// mapping (x rows of TensorDataset::sample_numel() elements, y rows of
// target_width()).
struct TensorSplit {
  int64_t count = 0;
  const void* x = nullptr;
  const void* y = nullptr;
};

class TensorDataset {
 public:
  // Maps `options.path` read-only, parses and validates it (see the top of
  // this file). NotFound / IOError for a file that cannot be opened or
  // mapped, Corruption for bad contents, InvalidArgument for options that do
  // not fit the data. Reads the whole train split once (statistics) and every
  // label and float once (validation).
  static StatusOr<std::shared_ptr<const TensorDataset>> Open(const TensorDatasetOptions& options);

  ~TensorDataset();
  TensorDataset(const TensorDataset&) = delete;
  TensorDataset& operator=(const TensorDataset&) = delete;

  const std::string& path() const { return path_; }
  DType x_dtype() const { return x_dtype_; }
  // [C, H, W] or [F].
  const std::vector<int64_t>& sample_shape() const { return sample_shape_; }
  int64_t sample_numel() const;
  int64_t channels() const { return sample_shape_[0]; }

  TargetKind target() const { return target_; }
  // Elements per y row: 1 for labels and [N] targets, T for [N, T].
  int64_t target_width() const { return target_width_; }
  // Rank of y (1 or 2).
  int target_rank() const { return target_rank_; }
  // Classes (kClasses) or 0.
  int64_t num_classes() const { return num_classes_; }
  // What a model must output per sample: classes, or T.
  int64_t num_outputs() const {
    return target_ == TargetKind::kClasses ? num_classes_ : target_width_;
  }

  const TensorSplit& train() const { return train_; }
  const TensorSplit& validation() const { return validation_; }
  const TensorSplit& test() const { return test_; }  // count 0 when the file has none

  // Per channel (see the top of this file).
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& stddev() const { return stddev_; }
  const std::vector<double>& scale() const { return scale_; }
  const std::vector<double>& shift() const { return shift_; }

 private:
  TensorDataset() = default;
  friend class TensorDatasetBuilder;

  std::string path_;
  const uint8_t* map_ = nullptr;
  size_t map_bytes_ = 0;
  DType x_dtype_ = DType::kU8;
  std::vector<int64_t> sample_shape_;
  TargetKind target_ = TargetKind::kClasses;
  int64_t target_width_ = 1;
  int target_rank_ = 1;
  int64_t num_classes_ = 0;
  TensorSplit train_, validation_, test_;
  std::vector<double> mean_, stddev_, scale_, shift_;
};

// Parses the bytes of an uncompressed .npz archive: its arrays by name
// (without ".npy"), as TensorViews into `data`. Corruption "<origin>: ..." for
// anything malformed (zip directory, local headers, sizes beyond the bytes, a
// compressed entry, an .npy header, a dtype other than |u1 <f2 <f4 <i8, Fortran
// order). Exposed for the fuzz target.
StatusOr<std::vector<TensorView>> ParseNpz(const void* data, size_t size,
                                           const std::string& origin);

// Validates the tensors of a dataset file (as Open does after parsing) and
// computes its statistics, without a mapping: the fuzz target's entry.
// `tensors` must outlive the result.
StatusOr<std::shared_ptr<const TensorDataset>> ValidateTensorDataset(
    const std::vector<TensorView>& tensors, const TensorDatasetOptions& options);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_TENSOR_DATASET_H_
