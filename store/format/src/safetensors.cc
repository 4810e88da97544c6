#include "ckpt/format/safetensors.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "little_endian.h"
#include "safetensors_header.h"

namespace ckpt::format {
namespace {

using Fault = SafetensorsFault;
using Kind = SafetensorsFault::Kind;
using internal::HeaderEntry;
using internal::HeaderField;

// A check's outcome: nullopt when the bytes pass it.
using MaybeFault = std::optional<SafetensorsFault>;

Fault FileFault(Kind kind, uint64_t count = 0, uint64_t limit = 0) {
  Fault f;
  f.kind = kind;
  f.count = count;
  f.limit = limit;
  return f;
}

// A fault of one tensor, or of one __metadata__ key.
Fault NamedFault(Kind kind, const std::string& name) {
  Fault f;
  f.kind = kind;
  f.name = name;
  return f;
}

// ckpt::format's words for a fault, after "<origin>: ".
std::string Describe(const Fault& f) {
  using std::to_string;
  const std::string tensor = "tensor " + f.name + ": ";
  switch (f.kind) {
    case Kind::kShortFile:
      return "file of " + to_string(f.count) + " bytes is shorter than 8";
    // The length is the file's first 8 bytes: not repeated, since the file
    // may be anything (a secret) rather than safetensors.
    case Kind::kHeaderBeyondFile:
      return "header length (its first 8 bytes) beyond the file of " + to_string(f.limit) +
             " bytes: not a safetensors file";
    case Kind::kHeaderAboveCap:
      return "header length (its first 8 bytes) above the cap of " + to_string(f.limit);
    case Kind::kNotJson:
      return "header is not valid JSON";
    case Kind::kNotObject:
      return "header is not a JSON object";
    case Kind::kMetadataNotObject:
      return "__metadata__ is not an object";
    case Kind::kMetadataNotString:
      return "__metadata__ value of " + f.name + " is not a string";
    case Kind::kEntryNotObject:
      return tensor + "entry is not an object";
    case Kind::kNoDtype:
      return tensor + "missing or non-string dtype";
    case Kind::kNoShape:
      return tensor + "missing or non-array shape";
    case Kind::kOffsetsNotPair:
      return tensor + "data_offsets is not a pair";
    case Kind::kUnknownDtype:
      return tensor + "unknown dtype '" + f.text + "'";
    case Kind::kRankAboveMax:
      return tensor + "rank " + to_string(f.count) + " above " + to_string(f.limit);
    case Kind::kNonNaturalDimension:
      return tensor + "shape has a non-natural dimension";
    case Kind::kDimensionTooLarge:
      return tensor + "dimension too large";
    case Kind::kShapeOverflow:
      return tensor + "shape product overflows";
    case Kind::kOffsetsNotNatural:
      return tensor + "data_offsets are not natural numbers";
    case Kind::kOffsetsOutOfBounds:
      return tensor + "data_offsets [" + to_string(f.begin) + ", " + to_string(f.end) +
             "] out of bounds of " + to_string(f.limit) + " data bytes";
    case Kind::kBytesMismatch:
      return tensor + to_string(f.end - f.begin) + " bytes do not match " +
             std::string(DTypeName(f.dtype)) + " x shape";
    case Kind::kOverlap:
      return tensor + "overlaps the previous tensor";
    case Kind::kHole:
      return tensor + "leaves a hole before it";
    case Kind::kTrailingBytes:
      return to_string(f.count) + " trailing bytes after the last tensor";
  }
  return "?";
}

// The JSON header's end (8 + N): N from the first 8 bytes, within the file
// and the cap.
MaybeFault ReadHeaderLength(const uint8_t* bytes, size_t size, size_t cap, size_t* header_end) {
  if (size < 8) return FileFault(Kind::kShortFile, size);
  const uint64_t n = internal::LoadLE64(bytes);
  if (n > size - 8) return FileFault(Kind::kHeaderBeyondFile, n, size);
  if (n > cap) return FileFault(Kind::kHeaderAboveCap, n, cap);
  *header_end = 8 + static_cast<size_t>(n);
  return std::nullopt;
}

MaybeFault ReadMetadata(internal::SafetensorsHeader* header, SafetensorsView* view) {
  if (!header->has_metadata) return std::nullopt;
  view->has_metadata = true;
  if (!header->metadata_is_object) return FileFault(Kind::kMetadataNotObject);
  for (auto& [key, value] : header->metadata) {
    if (!value) return NamedFault(Kind::kMetadataNotString, key);
    view->metadata.emplace_hint(view->metadata.end(), key, std::move(*value));
  }
  return std::nullopt;
}

// An entry has the three fields, each of the JSON type it needs.
MaybeFault CheckEntryFields(const std::string& name, const HeaderEntry& t) {
  using FieldKind = HeaderField::Kind;
  if (!t.is_object) return NamedFault(Kind::kEntryNotObject, name);
  if (t.dtype.kind != FieldKind::kString) return NamedFault(Kind::kNoDtype, name);
  if (t.shape.kind != FieldKind::kArray) return NamedFault(Kind::kNoShape, name);
  if (t.data_offsets.kind != FieldKind::kArray || t.data_offsets.count != 2) {
    return NamedFault(Kind::kOffsetsNotPair, name);
  }
  return std::nullopt;
}

// A tensor's shape into tv->shape, and its element count.
MaybeFault ReadShape(const HeaderField& shape, uint64_t max_elements, TensorView* tv,
                     uint64_t* numel) {
  if (shape.count > static_cast<size_t>(kMaxRank)) {
    Fault f = NamedFault(Kind::kRankAboveMax, tv->name);
    f.count = shape.count;
    f.limit = kMaxRank;
    return f;
  }
  for (const auto& d : shape.items) {
    if (!d) return NamedFault(Kind::kNonNaturalDimension, tv->name);
    if (*d > max_elements) {
      Fault f = NamedFault(Kind::kDimensionTooLarge, tv->name);
      f.count = *d;
      f.limit = max_elements;
      return f;
    }
    tv->shape.push_back(static_cast<int64_t>(*d));
  }
  uint64_t n = 1;
  for (int64_t d : tv->shape) {
    const auto dim = static_cast<uint64_t>(d);
    if (dim != 0 && n > max_elements / dim) {
      Fault f = NamedFault(Kind::kShapeOverflow, tv->name);
      f.limit = max_elements;
      return f;
    }
    n *= dim;
  }
  *numel = n;
  return std::nullopt;
}

// Where a tensor's bytes lie in the data area, and which tensor it is.
struct Range {
  uint64_t begin, end;
  size_t index;
};

// The data area: the bytes after the JSON header.
struct DataArea {
  const uint8_t* begin;
  uint64_t size;
};

// The byte range of a tensor whose dtype and shape are read, and its view's
// data.
MaybeFault ReadOffsets(const HeaderField& offsets, uint64_t numel, const DataArea& area,
                       TensorView* tv, Range* range) {
  const auto& b = offsets.items[0];
  const auto& e = offsets.items[1];
  if (!b || !e) return NamedFault(Kind::kOffsetsNotNatural, tv->name);
  const uint64_t begin = *b, end = *e;
  if (begin > end || end > area.size) {
    Fault f = NamedFault(Kind::kOffsetsOutOfBounds, tv->name);
    f.begin = begin;
    f.end = end;
    f.limit = area.size;
    return f;
  }
  const uint64_t esize = DTypeSize(tv->dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / esize || numel * esize != end - begin) {
    Fault f = NamedFault(Kind::kBytesMismatch, tv->name);
    f.begin = begin;
    f.end = end;
    f.dtype = tv->dtype;
    f.shape = tv->shape;
    return f;
  }
  tv->data = area.begin + begin;
  tv->nbytes = static_cast<size_t>(end - begin);
  range->begin = begin;
  range->end = end;
  return std::nullopt;
}

MaybeFault ReadEntry(const std::string& name, const HeaderEntry& t, const DataArea& area,
                     uint64_t max_elements, TensorView* tv, Range* range) {
  if (MaybeFault f = CheckEntryFields(name, t)) return f;
  tv->name = name;
  auto dtype = ParseDType(t.dtype.text);
  if (!dtype.ok()) {
    Fault f = NamedFault(Kind::kUnknownDtype, name);
    f.text = t.dtype.text;
    return f;
  }
  tv->dtype = *dtype;
  uint64_t numel = 0;
  if (MaybeFault f = ReadShape(t.shape, max_elements, tv, &numel)) return f;
  return ReadOffsets(t.data_offsets, numel, area, tv, range);
}

// Tensors must tile the data area exactly: sorted, no overlap, no hole.
// Sorts `ranges` by offset.
MaybeFault CheckTiling(const std::vector<TensorView>& tensors, uint64_t data_size,
                       std::vector<Range>* ranges) {
  std::sort(ranges->begin(), ranges->end(), [](const Range& a, const Range& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t pos = 0;
  for (const Range& r : *ranges) {
    const std::string& name = tensors[r.index].name;
    if (r.begin < pos) return NamedFault(Kind::kOverlap, name);
    if (r.begin > pos) return NamedFault(Kind::kHole, name);
    pos = r.end;
  }
  if (pos != data_size) return FileFault(Kind::kTrailingBytes, data_size - pos);
  return std::nullopt;
}

MaybeFault ReadSafetensors(const uint8_t* bytes, size_t size, const SafetensorsOptions& options,
                           SafetensorsView* view) {
  size_t header_end = 0;
  if (MaybeFault f = ReadHeaderLength(bytes, size, options.max_header_bytes, &header_end)) {
    return f;
  }
  internal::SafetensorsHeader header;
  if (!internal::ParseSafetensorsHeader(bytes + 8, bytes + header_end, &header)) {
    return FileFault(Kind::kNotJson);
  }
  if (!header.is_object) return FileFault(Kind::kNotObject);
  view->header_bytes = header_end;
  view->total_bytes = size;
  if (MaybeFault f = ReadMetadata(&header, view)) return f;

  const DataArea area{bytes + header_end, size - header_end};
  std::vector<Range> ranges;
  std::vector<TensorView> tensors;
  ranges.reserve(header.entries.size());
  tensors.reserve(header.entries.size());
  for (auto& [name, entry] : header.entries) {
    TensorView tv;
    Range range{0, 0, tensors.size()};
    if (MaybeFault f = ReadEntry(name, entry, area, options.max_elements, &tv, &range)) return f;
    ranges.push_back(range);
    tensors.push_back(std::move(tv));
  }
  if (MaybeFault f = CheckTiling(tensors, area.size, &ranges)) return f;
  // Present tensors in data order (the writer's insertion order).
  view->tensors.reserve(ranges.size());
  for (const Range& r : ranges) view->tensors.push_back(std::move(tensors[r.index]));
  return std::nullopt;
}

}  // namespace

StatusOr<SafetensorsView> ParseSafetensors(const void* data, size_t size,
                                           const SafetensorsOptions& options,
                                           SafetensorsFault* fault) {
  SafetensorsView view;
  MaybeFault refused = ReadSafetensors(static_cast<const uint8_t*>(data), size, options, &view);
  if (!refused) return view;
  Status status = Status::Corruption(options.origin + ": " + Describe(*refused));
  if (fault != nullptr) *fault = std::move(*refused);
  return status;
}

const TensorView* SafetensorsView::Find(std::string_view name) const {
  for (const auto& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

}  // namespace ckpt::format
