// How a worker trains its slots' members, with its one spelling: the
// [[devices]] fusion key, ckpt-worker --fusion, the HELLO and STATS records'
// mode and the control API's worker status.
//
// Thread-safety: pure functions.
#ifndef CKPT_IPC_FUSION_MODE_H_
#define CKPT_IPC_FUSION_MODE_H_

#include <array>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::ipc {

// kPlain: one model per slot; kFused: K members as one wide model; kAuto
// (asked for, never in effect): whichever a short probe at CONFIGURE finds
// faster.
enum class FusionMode { kAuto, kPlain, kFused };
inline constexpr std::array<FusionMode, 3> kFusionModes = {FusionMode::kAuto, FusionMode::kPlain,
                                                           FusionMode::kFused};

// "auto", "plain", "fused".
const char* FusionModeName(FusionMode mode);
// The names above. InvalidArgument quoting any other name.
StatusOr<FusionMode> ParseFusionMode(std::string_view name);

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_FUSION_MODE_H_
