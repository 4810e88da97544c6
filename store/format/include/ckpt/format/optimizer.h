// The optimizers a member trains with, with their one spelling and the
// optimizer-state slots a checkpoint keeps per trainable tensor: the
// scheduler's [model] optimizer key, the worker's trainers, ckpt-tool's .pt
// and safetensors export and import.
//
// Thread-safety: constants and pure functions.
#ifndef CKPT_FORMAT_OPTIMIZER_H_
#define CKPT_FORMAT_OPTIMIZER_H_

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::format {

enum class OptimizerKind { kSgd, kAdam, kAdamW };
inline constexpr std::array<OptimizerKind, 3> kOptimizerKinds = {
    OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW};

// "sgd", "adam", "adamw".
const char* OptimizerKindName(OptimizerKind kind);
// The names above. InvalidArgument quoting any other name.
StatusOr<OptimizerKind> ParseOptimizerKind(std::string_view name);

// Optimizer slots kept per trainable tensor, in checkpoint order:
// SGD {"momentum_buffer"}; Adam/AdamW {"exp_avg", "exp_avg_sq", "step"}.
std::vector<std::string> OptimizerSlots(OptimizerKind kind);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_OPTIMIZER_H_
