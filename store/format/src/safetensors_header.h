// SafetensorsHeader: what a safetensors header's JSON holds, read in one pass
// of nlohmann's SAX parser (private to ckpt::format; ParseSafetensors
// validates it). A header is parsed at every load, result check, commit and
// send of a state (3 KB for LeNet-5): the document tree nlohmann::json::parse
// builds, with a map node and a string per key and a value per number, was
// most of that cost, and only the fields below are ever read.
//
// The values are kept as the tree would hold them: a later duplicate of a key
// replaces the earlier one (in the top object, in __metadata__ and in a
// tensor's object), keys iterate in byte order, and a tensor's other keys are
// skipped whatever they hold. Natural numbers are JSON integers without a
// sign that fit in 64 bits (nlohmann's number_unsigned).
//
// Thread-safety: a value type; ParseSafetensorsHeader is reentrant.
#ifndef CKPT_FORMAT_SAFETENSORS_HEADER_H_
#define CKPT_FORMAT_SAFETENSORS_HEADER_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/format/checkpoint.h"

namespace ckpt::format::internal {

inline constexpr size_t kKeptItems = kMaxRank + 1;

// One field of a tensor's entry ("dtype", "shape", "data_offsets").
struct HeaderField {
  enum class Kind { kAbsent, kString, kArray, kOther };
  Kind kind = Kind::kAbsent;
  std::string text;  // kString
  // kArray: how many elements it has, and the first kKeptItems of them,
  // nullopt where one is not a natural number (a negative or fractional
  // number, a string, a nested array or object...). Enough for any shape or
  // offset pair that can be accepted: a longer array is refused by its count,
  // and costs no memory while it is read.
  size_t count = 0;
  std::vector<std::optional<uint64_t>> items;
};

struct HeaderEntry {
  bool is_object = false;
  HeaderField dtype, shape, data_offsets;
};

struct SafetensorsHeader {
  bool is_object = false;     // the document is an object
  bool has_metadata = false;  // it has a "__metadata__" key
  bool metadata_is_object = false;
  // "__metadata__"'s values; nullopt where one is not a string.
  std::map<std::string, std::optional<std::string>> metadata;
  // Every other key of the top object: the tensors.
  std::map<std::string, HeaderEntry> entries;
};

// Parses the JSON text [begin, end) (strict: nothing may follow the value).
// Returns false when it is not valid JSON; `out` is then unspecified.
bool ParseSafetensorsHeader(const uint8_t* begin, const uint8_t* end, SafetensorsHeader* out);

}  // namespace ckpt::format::internal

#endif  // CKPT_FORMAT_SAFETENSORS_HEADER_H_
