// Element access for the tensors of a checkpoint (ckpt/format/checkpoint.h),
// for `diff` and import validation: every dtype read as a double.
//
// Thread-safety: pure functions.
#ifndef CKPT_TOOLS_SRC_TENSOR_MATH_H_
#define CKPT_TOOLS_SRC_TENSOR_MATH_H_

#include <cstddef>
#include <cstdint>

#include "ckpt/format/checkpoint.h"

namespace ckpt::tool {

// Element `i` of a tensor of `dtype` whose bytes start at `data`.
// REQUIRES: i < numel.
double ElementAsDouble(format::DType dtype, const uint8_t* data, size_t i);

// True for F64, F32, F16, BF16.
bool IsFloating(format::DType dtype);

// The index of the first element that is NaN or infinite; -1 when none.
int64_t FirstNonFinite(format::DType dtype, const uint8_t* data, size_t numel);

// L2 norm of b - a (or of b when a is nullptr). REQUIRES: same dtype and numel.
double L2Distance(format::DType dtype, const uint8_t* a, const uint8_t* b, size_t numel);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_TENSOR_MATH_H_
