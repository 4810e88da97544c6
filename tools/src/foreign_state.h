// Import's readers of states saved elsewhere: a safetensors file (Python's
// safetensors.torch.save_file, or a ckpt export) and the object of a .pt file
// (torch.save of a state_dict, or {"model", "optimizer", "ckpt"}).
//
// Both take untrusted input: every length, offset, shape and type is checked,
// and a malformed input is a Corruption naming `origin` (the file) and what is
// wrong, never a crash. Nothing here touches files or LibTorch, so the fuzz
// targets (tests/fuzz/) run these exact functions.
//
// Thread-safety: pure functions.
#ifndef CKPT_TOOLS_SRC_FOREIGN_STATE_H_
#define CKPT_TOOLS_SRC_FOREIGN_STATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/optimizer.h"
#include "pickle_reader.h"

namespace ckpt::tool {

// The largest file `ckpt-tool import` reads.
inline constexpr size_t kMaxImportBytes = size_t{1} << 30;

struct ForeignTensor {
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> shape;
  std::string data;  // row-major, exactly numel * DTypeSize(dtype) bytes
};

// A state read from a file, before it is checked against the experiment.
struct ForeignState {
  std::map<std::string, ForeignTensor> tensors;
  std::optional<std::map<std::string, double>> hparams;
  std::optional<int64_t> step;
  std::string model_spec;  // "" when the file does not say
};

// Checkpoint names of optimizer state: "optim.<param>.<slot>".
inline constexpr const char kOptimPrefix[] = "optim.";

// The tensors (and, when it says, hyperparameters, step and model spec) of a
// safetensors file's bytes, read by format::ParseSafetensors. A ckpt blob (its
// __metadata__ holds ckpt.checksums) is also checked by the checkpoint reader.
// Corruption naming `origin` for anything malformed: header length, JSON,
// __metadata__ values that are not strings, dtype, rank above 8, a dimension
// or shape above 2^40 elements, data_offsets outside the data, not matching
// the shape or not tiling the data area.
StatusOr<ForeignState> ParseSafetensors(std::string_view bytes, const std::string& origin);

// The state of a .pt file's object, its tensors' data filled
// (pickle_reader.h FillTensorData): a bare state_dict, or {"model" |
// "state_dict": ..., "optimizer": torch.optim state_dict, "ckpt": ...}.
// `trainable` maps torch.optim's parameter indices to names; `optimizer`
// names its slots. Corruption naming `origin` for another shape of object;
// FailedPrecondition when the optimizer's parameter count is not the model's.
StatusOr<ForeignState> StateFromPt(const PyRef& root, const std::string& origin,
                                   const std::vector<std::string>& trainable,
                                   format::OptimizerKind optimizer);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_FOREIGN_STATE_H_
