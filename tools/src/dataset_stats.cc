#include "dataset_stats.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>

#include "ckpt/format/tensor_dataset.h"

namespace ckpt::tool {
namespace {

constexpr int64_t kValidationSize = 10000;

StatusOr<std::string> ReadMaybeGz(const std::string& dir, const std::string& name) {
  std::string path = dir + "/" + name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) path += ".gz";
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound("dataset file " + dir + "/" + name + "[.gz] not found");
  }
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files as they are
  if (f == nullptr) return Status::IOError(path + ": " + std::strerror(errno));
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  int errnum = 0;
  std::string err = n < 0 ? gzerror(f, &errnum) : "";
  gzclose(f);
  if (n < 0) return Status::IOError(path + ": " + err);
  return out;
}

struct Idx {
  std::vector<int64_t> dims;
  const uint8_t* data = nullptr;
  size_t size = 0;
};

StatusOr<Idx> ParseIdx(const std::string& bytes, const std::string& what) {
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08) {
    return Status::Corruption(what + " is not an IDX file of u8");
  }
  const int rank = static_cast<uint8_t>(bytes[3]);
  if (rank < 1 || rank > 4 || bytes.size() < 4 + 4 * static_cast<size_t>(rank)) {
    return Status::Corruption(what + ": bad IDX rank " + std::to_string(rank));
  }
  Idx idx;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data() + 4 + 4 * i);
    int64_t d = (int64_t{p[0]} << 24) | (int64_t{p[1]} << 16) | (int64_t{p[2]} << 8) | p[3];
    idx.dims.push_back(d);
    count *= static_cast<uint64_t>(d);
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (bytes.size() - header != count) {
    return Status::Corruption(what + ": " + std::to_string(bytes.size() - header) +
                              " bytes of data, the dimensions say " + std::to_string(count));
  }
  idx.data = reinterpret_cast<const uint8_t*>(bytes.data() + header);
  idx.size = count;
  return idx;
}

StatusOr<InputNormalization> IdxNormalization(const std::string& dir) {
  CKPT_ASSIGN_OR_RETURN(std::string images, ReadMaybeGz(dir, "train-images-idx3-ubyte"));
  CKPT_ASSIGN_OR_RETURN(std::string labels, ReadMaybeGz(dir, "train-labels-idx1-ubyte"));
  CKPT_ASSIGN_OR_RETURN(std::string test_labels, ReadMaybeGz(dir, "t10k-labels-idx1-ubyte"));
  CKPT_ASSIGN_OR_RETURN(Idx x, ParseIdx(images, dir + "/train-images-idx3-ubyte"));
  CKPT_ASSIGN_OR_RETURN(Idx y, ParseIdx(labels, dir + "/train-labels-idx1-ubyte"));
  CKPT_ASSIGN_OR_RETURN(Idx ty, ParseIdx(test_labels, dir + "/t10k-labels-idx1-ubyte"));
  if (x.dims.size() < 3 || x.dims[0] <= kValidationSize) {
    return Status::Corruption(dir + ": the train images are not [N > 10000, H, W]");
  }
  const int64_t n_train = x.dims[0] - kValidationSize;
  const size_t per = x.size / static_cast<size_t>(x.dims[0]);
  uint64_t sum = 0, sum_sq = 0;
  const size_t total = static_cast<size_t>(n_train) * per;
  for (size_t i = 0; i < total; ++i) {
    sum += x.data[i];
    sum_sq += uint64_t{x.data[i]} * x.data[i];
  }
  InputNormalization n;
  const double count = static_cast<double>(total);
  const double mean = static_cast<double>(sum) / (count * 255.0);
  const double mean_sq = static_cast<double>(sum_sq) / (count * 255.0 * 255.0);
  const double std = std::sqrt(std::max(mean_sq - mean * mean, 1e-12));
  n.mean = {mean};
  n.std = {std};
  n.scale = {1.0 / (255.0 * std)};
  n.shift = {-mean / std};
  n.input_dtype = "uint8";
  n.target = "classes";
  int max_label = 0;
  for (const Idx* l : {&y, &ty}) {
    for (size_t i = 0; i < l->size; ++i) max_label = std::max<int>(max_label, l->data[i]);
  }
  n.num_classes = max_label + 1;
  n.num_outputs = n.num_classes;
  if (x.dims.size() == 4) {
    n.input_shape = {x.dims[1], x.dims[2], x.dims[3]};
  } else {
    n.input_shape = {1, x.dims[1], x.dims[2]};
  }
  return n;
}

std::string InputDTypeName(format::DType dtype) {
  switch (dtype) {
    case format::DType::kU8:
      return "uint8";
    case format::DType::kF16:
      return "float16";
    default:
      return "float32";
  }
}

}  // namespace

StatusOr<InputNormalization> ComputeInputNormalization(const records::ExperimentConfig& config) {
  if (config.data_format == format::DatasetFormat::kIdx) {
    return IdxNormalization(config.dataset_path);
  }
  CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const format::TensorDataset> data,
                        format::TensorDataset::Open(config.TensorData()));
  InputNormalization n;
  n.mean = data->mean();
  n.std = data->stddev();
  n.scale = data->scale();
  n.shift = data->shift();
  n.input_dtype = InputDTypeName(data->x_dtype());
  n.input_shape = data->sample_shape();
  n.target = data->target() == format::TargetKind::kClasses ? "classes" : "values";
  n.num_classes = data->num_classes();
  n.num_outputs = data->num_outputs();
  return n;
}

}  // namespace ckpt::tool
