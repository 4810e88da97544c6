// safetensors in general: the byte layout of ckpt/format/checkpoint.h (u64
// header length, JSON header, data area) as any writer makes it (Python's
// safetensors.*.save_file, a ckpt blob, a tensor dataset), without ckpt's
// metadata, alignment or checksum rules. ParseCheckpoint, the tensor dataset
// reader (ckpt/format/tensor_dataset.h) and ckpt-tool import are built on it.
//
// Thread-safety: a pure function; a SafetensorsView is immutable.
#ifndef CKPT_FORMAT_SAFETENSORS_H_
#define CKPT_FORMAT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"

namespace ckpt::format {

// Any safetensors file (Python's safetensors.*.save_file, a ckpt blob, a
// dataset): its tensors in data order and its "__metadata__" strings. Holds
// pointers into the bytes it was parsed from: REQUIRES: those bytes outlive
// the view and do not change.
struct SafetensorsView {
  std::vector<TensorView> tensors;  // checksum = 0: plain safetensors has none
  std::map<std::string, std::string> metadata;
  bool has_metadata = false;
  size_t header_bytes = 0;  // 8 + N
  size_t total_bytes = 0;
  // nullptr when there is no tensor of that name.
  const TensorView* Find(std::string_view name) const;
};

// The largest dimension and element count ParseSafetensors accepts by
// default: any accepted element count is an int64_t.
inline constexpr uint64_t kDefaultMaxElements = uint64_t{1} << 62;

struct SafetensorsOptions {
  // Header length cap. Default: kDefaultMaxHeaderBytes.
  size_t max_header_bytes = kDefaultMaxHeaderBytes;
  // Cap on each dimension of a shape and on its product; at most
  // kDefaultMaxElements. Default: kDefaultMaxElements.
  uint64_t max_elements = kDefaultMaxElements;
  // Prefix of every error message (the file's name). Default: "safetensors".
  std::string origin = "safetensors";
};

// Which check ParseSafetensors refused a file by, and what it found there:
// for a caller that words its errors itself (ckpt-tool import keeps the
// wording its users know). The fields that are not named beside a kind are
// left at their defaults.
struct SafetensorsFault {
  enum class Kind {
    kShortFile,         // count: the file's bytes
    kHeaderBeyondFile,  // count: the header length; limit: the file's bytes
    kHeaderAboveCap,    // count: the header length; limit: max_header_bytes
    kNotJson,
    kNotObject,
    kMetadataNotObject,
    kMetadataNotString,  // name: the __metadata__ key
    kEntryNotObject,     // name: the tensor, here and below
    kNoDtype,
    kNoShape,
    kOffsetsNotPair,
    kUnknownDtype,  // text: the dtype
    kRankAboveMax,  // count: the rank; limit: kMaxRank
    kNonNaturalDimension,
    kDimensionTooLarge,  // count: the dimension; limit: max_elements
    kShapeOverflow,      // limit: max_elements
    kOffsetsNotNatural,
    kOffsetsOutOfBounds,  // begin, end: the offsets; limit: the data area's bytes
    kBytesMismatch,       // begin, end: the offsets; dtype, shape
    kOverlap,
    kHole,
    kTrailingBytes,  // name: "" (the file); count: the bytes after the last tensor
  };
  Kind kind = Kind::kNotJson;
  std::string name;
  std::string text;
  uint64_t count = 0;
  uint64_t limit = 0;
  uint64_t begin = 0;
  uint64_t end = 0;
  DType dtype = DType::kU8;
  std::vector<int64_t> shape;
};

// Parses `size` untrusted bytes at `data` as safetensors: the generic rules of
// the format, no alignment, metadata or checksum demands (ParseCheckpoint adds
// those). Returns Corruption "<origin>: ..." ("<origin>: tensor NAME: ..."
// where a tensor is at fault) for: a header length beyond the bytes or the
// cap, malformed JSON, a header that is not an object of objects, a
// __metadata__ that is not an object of strings, an unknown dtype, a bad
// shape (negative, rank > kMaxRank, a dimension or product above
// options.max_elements), a byte count that does not match dtype x shape,
// offsets out of bounds, overlapping, with holes or leaving trailing bytes.
// Sizes are checked before anything is allocated. When it refuses the bytes
// and `fault` is not null, *fault says why (the Status is that fault in
// ckpt::format's words).
StatusOr<SafetensorsView> ParseSafetensors(const void* data, size_t size,
                                           const SafetensorsOptions& options = {},
                                           SafetensorsFault* fault = nullptr);

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_SAFETENSORS_H_
