#include "ckpt/format/optimizer.h"

namespace ckpt::format {

const char* OptimizerKindName(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdam:
      return "adam";
    case OptimizerKind::kAdamW:
      return "adamw";
  }
  return "?";
}

StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  for (OptimizerKind k : kOptimizerKinds) {
    if (name == OptimizerKindName(k)) return k;
  }
  return Status::InvalidArgument("unknown optimizer \"" + std::string(name) +
                                 "\" (expected sgd, adam or adamw)");
}

std::vector<std::string> OptimizerSlots(OptimizerKind kind) {
  if (kind == OptimizerKind::kSgd) return {"momentum_buffer"};
  return {"exp_avg", "exp_avg_sq", "step"};
}

}  // namespace ckpt::format
