#include "ckpt/ipc/failure_code.h"

#include <string>

#include "ckpt/base/status.h"

namespace ckpt::ipc {

const char* FailureCodeName(FailureCode code) {
  switch (code) {
    case FailureCode::kNonFinite:
      return "non_finite";
    case FailureCode::kOutOfMemory:
      return "out_of_memory";
    case FailureCode::kBadState:
      return "bad_state";
    case FailureCode::kBadRequest:
      return "bad_request";
    case FailureCode::kInternal:
      return "internal";
    case FailureCode::kCommitError:
      return "commit_error";
    case FailureCode::kWorkerLost:
      return "worker_lost";
    case FailureCode::kStoreFull:
      return "store_full";
    case FailureCode::kBadResult:
      return "bad_result";
    case FailureCode::kAborted:
      return "aborted";
    case FailureCode::kConfigureRefused:
      return "configure_refused";
  }
  return "internal";
}

std::optional<FailureCode> ParseFailureCode(std::string_view name) {
  // Earlier spellings: the worker's codes were hyphenated.
  std::string canonical(name);
  for (char& c : canonical) {
    if (c == '-') c = '_';
  }
  for (int i = 0; i < kFailureCodeCount; ++i) {
    const auto code = static_cast<FailureCode>(i);
    if (canonical == FailureCodeName(code)) return code;
  }
  // Earlier "failed" events of a refused commit carried its Status code name.
  for (int i = 1; i <= static_cast<int>(StatusCode::kFailedPrecondition); ++i) {
    if (name == StatusCodeName(static_cast<StatusCode>(i))) return FailureCode::kCommitError;
  }
  return std::nullopt;
}

FailureCode FailureCodeFromWorker(std::string_view name) {
  return ParseFailureCode(name).value_or(FailureCode::kInternal);
}

}  // namespace ckpt::ipc
