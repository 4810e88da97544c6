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

// What an IDX header (the first bytes of `bytes`) says the whole file holds;
// 0 while too few bytes are in or the header is not an IDX one of u8 (for
// ParseIdx to name).
uint64_t IdxClaimedBytes(const std::string& bytes) {
  if (bytes.size() < 4 || bytes[0] != 0 || bytes[1] != 0 || bytes[2] != 0x08) return 0;
  const int rank = static_cast<uint8_t>(bytes[3]);
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (rank < 1 || rank > 4 || bytes.size() < header) return 0;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    const auto* p =
        reinterpret_cast<const uint8_t*>(bytes.data() + 4 + size_t{4} * static_cast<size_t>(i));
    count *= (uint64_t{p[0]} << 24) | (uint64_t{p[1]} << 16) | (uint64_t{p[2]} << 8) | p[3];
    if (count > (uint64_t{1} << 40)) break;  // past any cap; no overflow
  }
  return header + count;
}

// Reads a file, gunzipping it when it is gzipped. What it holds (after
// decompression) is checked while streaming against `cap` and, once its IDX
// header is in, against what the header claims (which must itself be under
// the cap): the string grows with what the stream yields, never by a claim,
// and stops at the smaller bound, whatever a gzip stream expands to.
StatusOr<std::string> ReadMaybeGz(const std::string& dir, const std::string& name, size_t cap) {
  std::string path = dir + "/" + name;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) path += ".gz";
  if (!std::filesystem::exists(path, ec)) {
    return Status::NotFound("dataset file " + dir + "/" + name + "[.gz] not found");
  }
  std::unique_ptr<gzFile_s, int (*)(gzFile)> f(gzopen(path.c_str(), "rb"), &gzclose);
  if (f == nullptr) return Status::IOError(path + ": " + std::strerror(errno));
  const std::string limit = std::to_string(cap) + " bytes, the cap of an IDX file (docs/LIMITS.md)";
  std::string out;
  uint64_t claimed = 0;
  // The refusals, built only when one is returned.
  auto past_cap = [&] {
    return Status::InvalidArgument(path + ": holds more than " + limit + "; refused while reading");
  };
  auto claim_past_cap = [&] {
    return Status::InvalidArgument(path + ": its IDX dimensions claim " + std::to_string(claimed) +
                                   " bytes, more than " + limit);
  };
  auto past_claim = [&] {
    return Status::Corruption(path + ": holds more than the " + std::to_string(claimed) +
                              " bytes its IDX header claims; refused while reading");
  };
  char buf[1 << 16];
  int n;
  while ((n = gzread(f.get(), buf, sizeof(buf))) > 0) {
    if (out.size() + static_cast<size_t>(n) > cap) return past_cap();
    if (claimed != 0 && out.size() + static_cast<size_t>(n) > claimed) return past_claim();
    out.append(buf, static_cast<size_t>(n));
    if (claimed == 0 && (claimed = IdxClaimedBytes(out)) != 0) {
      if (claimed > cap) return claim_past_cap();
      if (out.size() > claimed) return past_claim();
    }
  }
  int errnum = 0;
  const std::string err = n < 0 ? gzerror(f.get(), &errnum) : "";
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

StatusOr<InputNormalization> IdxNormalization(const std::string& dir, size_t cap) {
  CKPT_ASSIGN_OR_RETURN(std::string images, ReadMaybeGz(dir, "train-images-idx3-ubyte", cap));
  CKPT_ASSIGN_OR_RETURN(std::string labels, ReadMaybeGz(dir, "train-labels-idx1-ubyte", cap));
  CKPT_ASSIGN_OR_RETURN(std::string test_labels, ReadMaybeGz(dir, "t10k-labels-idx1-ubyte", cap));
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

StatusOr<InputNormalization> ComputeInputNormalization(const records::ExperimentConfig& config,
                                                       size_t max_idx_file_bytes) {
  if (config.data_format == format::DatasetFormat::kIdx) {
    return IdxNormalization(config.dataset_path, max_idx_file_bytes);
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
