// Fuzz target for the tensor-dataset reader (ckpt/format/tensor_dataset.h):
// the first byte picks safetensors or .npz, the rest is the file. Any bytes
// must give a dataset or a Corruption / InvalidArgument, never a crash or a
// read out of bounds; an accepted dataset's splits lie inside the bytes.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/format/tensor_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool npz = (data[0] & 1) != 0;
  // An exactly-sized copy, so that ASan sees a read past the end.
  const std::string bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  ckpt::format::TensorDatasetOptions options;
  options.path = "fuzz";
  options.val_size = data[0] >> 1;
  std::vector<ckpt::format::TensorView> tensors;
  if (npz) {
    auto arrays = ckpt::format::ParseNpz(bytes.data(), bytes.size(), "fuzz");
    if (!arrays.ok()) {
      if (!arrays.status().IsCorruption()) std::abort();
      return 0;
    }
    tensors = std::move(arrays).value();
  } else {
    auto file = ckpt::format::ParseSafetensors(bytes.data(), bytes.size());
    if (!file.ok()) {
      if (!file.status().IsCorruption()) std::abort();
      return 0;
    }
    tensors = std::move(file->tensors);
  }
  const auto* begin = reinterpret_cast<const uint8_t*>(bytes.data());
  for (const auto& t : tensors) {
    if (t.data < begin || t.data + t.nbytes > begin + bytes.size()) std::abort();
  }
  auto d = ckpt::format::ValidateTensorDataset(tensors, options);
  if (!d.ok()) {
    if (!d.status().IsCorruption() && !d.status().IsInvalidArgument()) std::abort();
    return 0;
  }
  const auto& ds = **d;
  if (ds.train().count < 1 || ds.validation().count < 1) std::abort();
  if (ds.scale().size() != static_cast<size_t>(ds.channels())) std::abort();
  return 0;
}
