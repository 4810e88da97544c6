#include "ckpt/base/kill_point.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <utility>

namespace ckpt::base {

StatusOr<KillAt> ParseKillAt(std::string_view text) {
  const size_t colon = text.rfind(':');
  const auto malformed = [&] {
    return Status::InvalidArgument(std::string(kKillAtVariable) + "=" + std::string(text) +
                                   " is not POINT:N (N >= 1)");
  };
  if (colon == std::string_view::npos || colon == 0) return malformed();
  const std::string_view digits = text.substr(colon + 1);
  if (digits.empty() || digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return malformed();
  }
  KillAt at;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), at.n);
  if (ec != std::errc() || end != digits.data() + digits.size() || at.n < 1) return malformed();
  at.point = std::string(text.substr(0, colon));
  return at;
}

StatusOr<std::optional<KillAt>> KillAtFromEnvironment() {
  const char* spec = std::getenv(kKillAtVariable);
  if (spec == nullptr || *spec == '\0') return std::optional<KillAt>();
  CKPT_ASSIGN_OR_RETURN(KillAt at, ParseKillAt(spec));
  return std::optional<KillAt>(std::move(at));
}

}  // namespace ckpt::base
