// TomlTableReader: reads one table of a TOML file (experiment or service
// configuration), checking each value's type and range and that every key is
// known; every error names the key with its table prefix, the file and the line
// (used by ckpt::records and the scheduler's service file).
#ifndef CKPT_RECORDS_SRC_TOML_READER_H_
#define CKPT_RECORDS_SRC_TOML_READER_H_

#include <toml++/toml.h>

#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <istream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::records {

// The largest TOML document read (experiment and service files, and TOML
// submitted over the control socket): real ones are a few KiB.
inline constexpr size_t kMaxTomlBytes = size_t{1} << 20;

// Parses a TOML document; a syntax error is InvalidArgument naming `origin`,
// the line and what is wrong; a document above kMaxTomlBytes is
// InvalidArgument naming its size. toml++'s exception stops here.
inline StatusOr<toml::table> ParseToml(const std::string& text, const std::string& origin) {
  if (text.size() > kMaxTomlBytes) {
    return Status::InvalidArgument(origin + ": " + std::to_string(text.size()) +
                                   " bytes of TOML, above the limit of " +
                                   std::to_string(kMaxTomlBytes) + " bytes (1 MiB)");
  }
  try {
    return toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    return Status::InvalidArgument(origin + " line " + std::to_string(e.source().begin.line) +
                                   ": " + std::string(e.description()));
  }
}

// The text of an opened TOML file, at most kMaxTomlBytes + 1 bytes (so that
// ParseToml names a longer one; /dev/zero is not read forever). False when a
// read fails.
inline bool ReadBoundedToml(std::istream& in, std::string* text) {
  text->assign(kMaxTomlBytes + 1, '\0');
  in.read(text->data(), static_cast<std::streamsize>(text->size()));
  text->resize(static_cast<size_t>(in.gcount()));
  return !in.bad();
}

// Reads one TOML table, checking types and that every key is known; errors
// name the key with its table prefix, the file and the line.
class TomlTableReader {
 public:
  TomlTableReader(const toml::table& table, std::string prefix, std::string origin)
      : table_(table), prefix_(std::move(prefix)), origin_(std::move(origin)) {}

  Status Error(const std::string& key, const std::string& what) const {
    return Error(key, table_.get(key), what);
  }
  Status Error(const std::string& key, const toml::node* node, const std::string& what) const {
    std::string w = prefix_.empty() ? key : prefix_ + "." + key;
    if (node != nullptr && node->source().begin.line > 0) {
      w += " (" + origin_ + " line " + std::to_string(node->source().begin.line) + ")";
    } else {
      w += " (" + origin_ + ")";
    }
    return Status::InvalidArgument(w + ": " + what);
  }

  const toml::node* Use(const std::string& key) {
    known_.insert(key);
    return table_.get(key);
  }

  Status String(const std::string& key, std::string* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    if (!n->is_string()) return Error(key, "must be a string");
    *out = *n->value<std::string>();
    return Status::OK();
  }
  Status Bool(const std::string& key, bool* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    if (!n->is_boolean()) return Error(key, "must be true or false");
    *out = *n->value<bool>();
    return Status::OK();
  }
  Status Int(const std::string& key, int64_t lo, int64_t hi, int64_t* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    if (!n->is_integer()) return Error(key, "must be an integer");
    const int64_t v = *n->value<int64_t>();
    if (v < lo || v > hi) {
      return Error(key, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], not " + std::to_string(v));
    }
    *out = v;
    return Status::OK();
  }
  Status Int(const std::string& key, int64_t lo, int64_t hi, int* out) {
    int64_t v = *out;
    CKPT_RETURN_IF_ERROR(Int(key, lo, hi, &v));
    *out = static_cast<int>(v);
    return Status::OK();
  }
  // Seconds (integer or fraction) into milliseconds.
  Status Seconds(const std::string& key, double lo, double hi, std::chrono::milliseconds* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    if (!n->is_number()) return Error(key, "must be a number of seconds");
    const double v = *n->value<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream os;
      os << "must be in [" << lo << ", " << hi << "] seconds, not " << v;
      return Error(key, os.str());
    }
    *out = std::chrono::milliseconds(static_cast<int64_t>(std::llround(v * 1000)));
    return Status::OK();
  }
  Status Double(const std::string& key, double lo, double hi, double* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    if (!n->is_number()) return Error(key, "must be a number");
    const double v = *n->value<double>();
    if (!std::isfinite(v) || v < lo || v > hi) {
      std::ostringstream os;
      os << "must be in [" << lo << ", " << hi << "], not " << v;
      return Error(key, os.str());
    }
    *out = v;
    return Status::OK();
  }
  Status Doubles(const std::string& key, std::vector<double>* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    const toml::array* a = n->as_array();
    if (a == nullptr) return Error(key, "must be an array of numbers");
    out->clear();
    for (const auto& e : *a) {
      if (!e.is_number()) return Error(key, &e, "must be an array of numbers");
      out->push_back(*e.value<double>());
    }
    return Status::OK();
  }
  Status Strings(const std::string& key, std::vector<std::string>* out) {
    const toml::node* n = Use(key);
    if (n == nullptr) return Status::OK();
    const toml::array* a = n->as_array();
    if (a == nullptr) return Error(key, "must be an array of strings");
    out->clear();
    for (const auto& e : *a) {
      if (!e.is_string()) return Error(key, &e, "must be an array of strings");
      std::string s = *e.value<std::string>();
      if (s.empty()) return Error(key, &e, "entries must not be empty");
      out->push_back(std::move(s));
    }
    return Status::OK();
  }
  Status OneOf(const std::string& key, const std::set<std::string>& allowed, std::string* out) {
    CKPT_RETURN_IF_ERROR(String(key, out));
    if (table_.get(key) != nullptr && allowed.count(*out) == 0) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return Error(key, "must be one of " + list + ", not '" + *out + "'");
    }
    return Status::OK();
  }
  // An enum by its one spelling, `name(v)` for each of `values`: as OneOf
  // over those names; *out is the default and receives the value named.
  template <typename E, size_t N>
  Status Enum(const std::string& key, const std::array<E, N>& values, const char* (*name)(E),
              E* out) {
    std::set<std::string> allowed;
    for (E v : values) allowed.insert(name(v));
    std::string chosen = name(*out);
    CKPT_RETURN_IF_ERROR(OneOf(key, allowed, &chosen));
    for (E v : values) {
      if (chosen == name(v)) *out = v;
    }
    return Status::OK();
  }
  StatusOr<const toml::table*> Table(const std::string& key) {
    const toml::node* n = Use(key);
    if (n == nullptr) return static_cast<const toml::table*>(nullptr);
    if (!n->is_table()) return Error(key, "must be a table");
    return n->as_table();
  }
  Status CheckNoUnknownKeys() const {
    for (const auto& [k, v] : table_) {
      const std::string key(k.str());
      if (known_.count(key) != 0) continue;
      const std::string w = prefix_.empty() ? key : prefix_ + "." + key;
      const int line = k.source().begin.line > 0 ? static_cast<int>(k.source().begin.line)
                                                 : static_cast<int>(v.source().begin.line);
      return Status::InvalidArgument(w + " (" + origin_ + " line " + std::to_string(line) +
                                     "): unknown key");
    }
    return Status::OK();
  }

 private:
  const toml::table& table_;
  std::string prefix_;
  std::string origin_;
  std::set<std::string> known_;
};

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_SRC_TOML_READER_H_
