#include "ckpt/ipc/fusion_mode.h"

#include <string>

namespace ckpt::ipc {

const char* FusionModeName(FusionMode mode) {
  switch (mode) {
    case FusionMode::kAuto:
      return "auto";
    case FusionMode::kPlain:
      return "plain";
    case FusionMode::kFused:
      return "fused";
  }
  return "?";
}

StatusOr<FusionMode> ParseFusionMode(std::string_view name) {
  for (FusionMode m : kFusionModes) {
    if (name == FusionModeName(m)) return m;
  }
  return Status::InvalidArgument("fusion mode '" + std::string(name) +
                                 "' is not one of auto, plain, fused");
}

}  // namespace ckpt::ipc
