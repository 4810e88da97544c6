#include "keys.h"

namespace ckpt::store::keys {

Status ValidateId(std::string_view what, std::string_view id) {
  if (id.empty() || id.size() > kMaxIdBytes) {
    return Status::InvalidArgument(std::string(what) + " '" + std::string(id.substr(0, 64)) +
                                   "' must be 1.." + std::to_string(kMaxIdBytes) + " bytes");
  }
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == ':' || c == '-';
    if (!ok) {
      return Status::InvalidArgument(std::string(what) + " '" + std::string(id) +
                                     "' may only hold [A-Za-z0-9._:-]");
    }
  }
  return Status::OK();
}

void PutBE64(std::string* dst, uint64_t v) {
  for (int i = 7; i >= 0; --i) dst->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetBE64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string Experiment(std::string_view exp) { return std::string(exp); }

std::string ExperimentPrefix(std::string_view exp) {
  std::string k(exp);
  k.push_back('\0');
  return k;
}

std::string Member(std::string_view exp, std::string_view member) {
  std::string k = ExperimentPrefix(exp);
  k.append(member);
  return k;
}

std::string ManifestPrefix(std::string_view exp, std::string_view member) {
  std::string k = Member(exp, member);
  k.push_back('\0');
  return k;
}

std::string Manifest(std::string_view exp, std::string_view member, int64_t version) {
  std::string k = ManifestPrefix(exp, member);
  PutBE64(&k, static_cast<uint64_t>(version));
  return k;
}

std::string Event(std::string_view exp, uint64_t seq) {
  std::string k = ExperimentPrefix(exp);
  PutBE64(&k, seq);
  return k;
}

std::string PrefixEnd(std::string_view prefix) {
  std::string end(prefix);
  end.back() = '\x01';
  return end;
}

bool ParseMember(std::string_view key, std::string* exp, std::string* member) {
  size_t sep = key.find('\0');
  if (sep == std::string_view::npos || sep == 0 || sep + 1 >= key.size()) return false;
  if (key.find('\0', sep + 1) != std::string_view::npos) return false;
  *exp = std::string(key.substr(0, sep));
  *member = std::string(key.substr(sep + 1));
  return true;
}

bool ParseManifest(std::string_view key, std::string* exp, std::string* member, int64_t* version) {
  size_t sep = key.find('\0');
  if (sep == std::string_view::npos || sep == 0) return false;
  size_t sep2 = key.find('\0', sep + 1);
  if (sep2 == std::string_view::npos || sep2 == sep + 1 || key.size() != sep2 + 9) return false;
  *exp = std::string(key.substr(0, sep));
  *member = std::string(key.substr(sep + 1, sep2 - sep - 1));
  *version = static_cast<int64_t>(GetBE64(key.data() + sep2 + 1));
  return true;
}

bool ParseEvent(std::string_view key, std::string* exp, uint64_t* seq) {
  size_t sep = key.find('\0');
  if (sep == std::string_view::npos || sep == 0 || key.size() != sep + 9) return false;
  *exp = std::string(key.substr(0, sep));
  *seq = GetBE64(key.data() + sep + 1);
  return true;
}

std::string EncodeCount(int64_t n) {
  std::string v(8, '\0');
  uint64_t u = static_cast<uint64_t>(n);
  for (int i = 0; i < 8; ++i) v[i] = static_cast<char>((u >> (8 * i)) & 0xff);
  return v;
}

bool DecodeCount(std::string_view v, int64_t* n) {
  if (v.size() != 8) return false;
  uint64_t u = 0;
  for (int i = 7; i >= 0; --i) u = (u << 8) | static_cast<uint8_t>(v[i]);
  *n = static_cast<int64_t>(u);
  return true;
}

}  // namespace ckpt::store::keys
