// How an experiment names its model (model.spec): the models built into the
// worker by name (ckpt/model/model_spec.h defines them), a TorchScript file
// by "torchscript:PATH", or else a JSON layer list. Named here once for the
// worker, which builds them, and the scheduler's configuration check, which
// accepts them without LibTorch.
//
// Thread-safety: constants and pure functions.
#ifndef CKPT_FORMAT_MODEL_NAMES_H_
#define CKPT_FORMAT_MODEL_NAMES_H_

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace ckpt::format {

inline constexpr std::string_view kLenet5Model = "lenet5";
inline constexpr std::string_view kResnet20Model = "resnet20";
inline constexpr std::array<std::string_view, 2> kBuiltinModels = {kLenet5Model, kResnet20Model};

inline constexpr std::string_view kTorchScriptPrefix = "torchscript:";
// The largest TorchScript file the scheduler accepts and a worker reads into
// memory to load (docs/LIMITS.md).
inline constexpr uint64_t kMaxTorchScriptFileBytes = uint64_t{2} << 30;  // 2 GiB

inline bool IsBuiltinModel(std::string_view spec) {
  for (std::string_view m : kBuiltinModels) {
    if (spec == m) return true;
  }
  return false;
}

// "lenet5, resnet20", for messages.
inline std::string BuiltinModelList() {
  std::string out;
  for (std::string_view m : kBuiltinModels) out += (out.empty() ? "" : ", ") + std::string(m);
  return out;
}

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_MODEL_NAMES_H_
