// Fuzz target for the .pt importer without LibTorch: the restricted
// unpickler (data.pkl), the filling of tensors from their storage records,
// and the reading of the object as a state_dict, optimizer state and ckpt
// metadata (foreign_state.h StateFromPt) - what `ckpt-tool import FILE.pt`
// runs on the archive's records.
//
// The input is the pickle. Storage "<key>" holds 8 * (key length) + (first
// byte of the key) bytes of a fixed pattern, so some tensors fit and some
// reach past their storage; a key starting with 'x' is missing. Any input
// must give a value or a Status, never a crash, a leak (every value is a
// tree) or a read out of bounds; a filled tensor's bytes must match its
// shape.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "foreign_state.h"
#include "pickle_reader.h"

namespace {

using ckpt::tool::PyValue;

void CheckTensors(const PyValue& v, int depth) {
  if (depth > ckpt::tool::kMaxPickleNesting + 1) std::abort();
  for (const auto& x : v.items) CheckTensors(*x, depth + 1);
  for (const auto& [k, x] : v.dict) {
    CheckTensors(*k, depth + 1);
    CheckTensors(*x, depth + 1);
  }
  if (v.kind != PyValue::Kind::kTensor) return;
  uint64_t numel = 1;
  for (int64_t d : v.shape) numel *= static_cast<uint64_t>(d);
  if (numel * ckpt::format::DTypeSize(v.dtype) != v.data.size()) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view pickle(reinterpret_cast<const char*>(data), size);
  auto value = ckpt::tool::Unpickle(pickle);
  if (!value.ok()) return 0;
  static const std::string kPattern = [] {
    std::string p(1 << 14, '\0');
    for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>(i * 37 + 11);
    return p;
  }();
  auto storage = [](const std::string& key) -> ckpt::StatusOr<std::string_view> {
    if (!key.empty() && key[0] == 'x') return ckpt::Status::NotFound(key);
    const size_t n = 8 * key.size() + (key.empty() ? 0 : static_cast<uint8_t>(key[0]));
    return std::string_view(kPattern.data(), n);
  };
  // ReadPt's cap, twice the file; here the file is the pickle and the
  // pattern its storages are cut from.
  const uint64_t cap = 2 * (uint64_t{size} + kPattern.size());
  ckpt::Status filled = ckpt::tool::FillTensorData(value->get(), storage, "fuzz.pt", cap);
  if (!filled.ok()) {
    if (!filled.IsCorruption()) std::abort();
    return 0;
  }
  CheckTensors(**value, 0);
  const std::vector<std::string> trainable = {"conv1.weight", "conv1.bias", "fc.weight"};
  for (auto optimizer : {ckpt::format::OptimizerKind::kSgd, ckpt::format::OptimizerKind::kAdam}) {
    auto state = ckpt::tool::StateFromPt(*value, "fuzz.pt", trainable, optimizer);
    if (!state.ok()) continue;
    for (const auto& [name, t] : state->tensors) {
      uint64_t numel = 1;
      for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
      if (numel * ckpt::format::DTypeSize(t.dtype) != t.data.size()) std::abort();
    }
  }
  return 0;
}
