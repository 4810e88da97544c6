// Names of what ckpt-tool works on: `EXPERIMENT`, `EXPERIMENT/MEMBER` and
// `EXPERIMENT/MEMBER@VERSION`.
//
// Ids follow the store's rule (ckpt/store/store.h): ASCII [A-Za-z0-9._:-],
// 1..128 bytes. A version is a decimal integer in [1, kMaxVersion]; no version
// means the member's head.
//
// Thread-safety: values and pure functions.
#ifndef CKPT_TOOLS_SRC_MEMBER_REF_H_
#define CKPT_TOOLS_SRC_MEMBER_REF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::tool {

// Versions above this are refused as malformed (a store could not hold them).
inline constexpr int64_t kMaxVersion = int64_t{1} << 53;

struct MemberRef {
  std::string exp;
  std::string member;  // "" for a reference to a whole experiment
  std::optional<int64_t> version;

  // "exp", "exp/member" or "exp/member@7".
  std::string ToString() const;
};

// True when `id` is a valid store id.
bool IsValidId(std::string_view id);

// Parses `EXPERIMENT/MEMBER[@VERSION]`. InvalidArgument quoting `text` for
// anything else (a missing part, a bad character, a version that is not a
// decimal integer in [1, kMaxVersion]).
StatusOr<MemberRef> ParseMemberRef(std::string_view text);

// Parses `EXPERIMENT` or `EXPERIMENT/MEMBER[@VERSION]`.
StatusOr<MemberRef> ParseExperimentOrMemberRef(std::string_view text);

// Parses `EXPERIMENT`. InvalidArgument quoting `text` otherwise.
StatusOr<std::string> ParseExperimentId(std::string_view text);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_MEMBER_REF_H_
