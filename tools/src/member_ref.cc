#include "member_ref.h"

namespace ckpt::tool {
namespace {

bool IsIdChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '-';
}

Status Malformed(std::string_view text, const std::string& why) {
  return Status::InvalidArgument("malformed reference \"" + std::string(text) + "\": " + why +
                                 " (expected EXPERIMENT/MEMBER[@VERSION])");
}

}  // namespace

std::string MemberRef::ToString() const {
  std::string s = exp;
  if (!member.empty()) s += "/" + member;
  if (version) s += "@" + std::to_string(*version);
  return s;
}

bool IsValidId(std::string_view id) {
  if (id.empty() || id.size() > 128) return false;
  for (char c : id) {
    if (!IsIdChar(c)) return false;
  }
  return true;
}

StatusOr<MemberRef> ParseMemberRef(std::string_view text) {
  const size_t slash = text.find('/');
  if (slash == std::string_view::npos) return Malformed(text, "no member");
  MemberRef ref;
  ref.exp = std::string(text.substr(0, slash));
  std::string_view rest = text.substr(slash + 1);
  const size_t at = rest.find('@');
  ref.member = std::string(rest.substr(0, at));
  if (!IsValidId(ref.exp)) return Malformed(text, "bad experiment id \"" + ref.exp + "\"");
  if (!IsValidId(ref.member)) return Malformed(text, "bad member id \"" + ref.member + "\"");
  if (at != std::string_view::npos) {
    std::string_view v = rest.substr(at + 1);
    if (v.empty() || v.size() > 16)
      return Malformed(text, "bad version \"" + std::string(v) + "\"");
    int64_t version = 0;
    for (char c : v) {
      if (c < '0' || c > '9') return Malformed(text, "bad version \"" + std::string(v) + "\"");
      version = version * 10 + (c - '0');
    }
    if (version < 1 || version > kMaxVersion) {
      return Malformed(text, "version " + std::string(v) + " is out of range [1, 2^53]");
    }
    ref.version = version;
  }
  return ref;
}

StatusOr<MemberRef> ParseExperimentOrMemberRef(std::string_view text) {
  if (text.find('/') != std::string_view::npos) return ParseMemberRef(text);
  CKPT_ASSIGN_OR_RETURN(std::string exp, ParseExperimentId(text));
  MemberRef ref;
  ref.exp = std::move(exp);
  return ref;
}

StatusOr<std::string> ParseExperimentId(std::string_view text) {
  if (!IsValidId(text)) {
    return Status::InvalidArgument("malformed experiment id \"" + std::string(text) +
                                   "\" (1 to 128 of A-Z a-z 0-9 . _ : -)");
  }
  return std::string(text);
}

}  // namespace ckpt::tool
