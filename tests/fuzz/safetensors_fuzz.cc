// Fuzz target for `ckpt-tool import FILE.safetensors`'s parser
// (foreign_state.h ParseSafetensors): any bytes must give a state or a
// Corruption naming the problem, never a crash or a read out of bounds; every
// tensor of an accepted state has exactly the bytes its dtype and shape need.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "foreign_state.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // An exactly-sized copy, so that ASan sees a read past the end.
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto state = ckpt::tool::ParseSafetensors(bytes, "fuzz.safetensors");
  if (!state.ok()) {
    if (!state.status().IsCorruption()) std::abort();
    return 0;
  }
  for (const auto& [name, t] : state->tensors) {
    if (t.shape.size() > static_cast<size_t>(ckpt::format::kMaxRank)) std::abort();
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) std::abort();
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * ckpt::format::DTypeSize(t.dtype) != t.data.size()) std::abort();
  }
  return 0;
}
