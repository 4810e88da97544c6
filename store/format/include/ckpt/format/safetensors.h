// safetensors in general: the byte layout of ckpt/format/checkpoint.h (u64
// header length, JSON header, data area) as any writer makes it (Python's
// safetensors.*.save_file, a ckpt blob, a tensor dataset), without ckpt's
// metadata, alignment or checksum rules. ParseCheckpoint and the tensor
// dataset reader (ckpt/format/tensor_dataset.h) are built on it.
//
// Thread-safety: a pure function; a SafetensorsView is immutable.
#ifndef CKPT_FORMAT_SAFETENSORS_H_
#define CKPT_FORMAT_SAFETENSORS_H_

#include <cstddef>
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

struct SafetensorsOptions {
  // Header length cap. Default: kDefaultMaxHeaderBytes.
  size_t max_header_bytes = kDefaultMaxHeaderBytes;
  // Prefix of every error message (the file's name). Default: "safetensors".
  std::string origin = "safetensors";
};

// Parses `size` untrusted bytes at `data` as safetensors: the generic rules of
// the format, no alignment, metadata or checksum demands (ParseCheckpoint adds
// those). Returns Corruption "<origin>: ..." ("<origin>: tensor NAME: ..."
// where a tensor is at fault) for: a header length beyond the bytes or the
// cap, malformed JSON, a header that is not an object of objects, a
// __metadata__ that is not an object of strings, an unknown dtype, a bad
// shape (negative, rank > kMaxRank, product overflow), a byte count that does
// not match dtype x shape, offsets out of bounds, overlapping, with holes or
// leaving trailing bytes. Sizes are checked before anything is allocated.
StatusOr<SafetensorsView> ParseSafetensors(const void* data, size_t size,
                                           const SafetensorsOptions& options = {});

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_SAFETENSORS_H_
