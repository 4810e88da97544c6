#include "ckpt/format/checkpoint.h"

#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/format/checksum.h"
#include "ckpt/format/safetensors.h"
#include "little_endian.h"

namespace ckpt::format {
namespace {

using internal::LoadLE64;
using internal::StoreLE64;
using json = nlohmann::json;

constexpr const char* kMetadataKey = "__metadata__";
// The header checksum is stored inside the header it covers: it is computed
// with its own 16 digits set to '0' and then written over them.
constexpr std::string_view kHeaderSumKey = "\"ckpt.header_xxh3\":\"";
constexpr std::string_view kZeroSum = "0000000000000000";

struct DTypeInfo {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::kF64, "F64", 8},   {DType::kF32, "F32", 4}, {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2}, {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

// Parses a decimal unsigned integer that must fill the whole string.
bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

bool ParseI64(const std::string& s, int64_t* out) {
  bool neg = !s.empty() && s[0] == '-';
  uint64_t v;
  if (!ParseU64(neg ? s.substr(1) : s, &v)) return false;
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
  *out = neg ? -static_cast<int64_t>(v) : static_cast<int64_t>(v);
  return true;
}

Status Bad(const std::string& what) { return Status::Corruption("checkpoint: " + what); }
Status BadTensor(const std::string& name, const std::string& what) {
  return Status::Corruption("checkpoint: tensor " + name + ": " + what);
}

// numel of `shape`, or false on a negative dimension or overflow past 2^62.
bool ShapeNumel(const std::vector<int64_t>& shape, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > (int64_t{1} << 62) / d) return false;
    n *= d;
  }
  *numel = n;
  return true;
}

Status ParseMetadata(const std::map<std::string, std::string>& meta, CheckpointMeta* out,
                     std::map<std::string, uint64_t>* checksums) {
  bool have_version = false;
  for (const auto& [key, v] : meta) {
    if (key == "ckpt.format_version") {
      int64_t version;
      if (!ParseI64(v, &version) || version < 1) return Bad("bad ckpt.format_version '" + v + "'");
      if (version > kFormatVersion) {
        return Status::InvalidArgument("checkpoint: format version " + v +
                                       " is newer than this build reads (" +
                                       std::to_string(kFormatVersion) + ")");
      }
      out->format_version = static_cast<int>(version);
      have_version = true;
    } else if (key == "ckpt.model_spec") {
      out->model_spec = v;
    } else if (key == "ckpt.optimizer") {
      out->optimizer = v;
    } else if (key == "ckpt.hparams") {
      json h = json::parse(v, nullptr, /*allow_exceptions=*/false);
      if (!h.is_object()) return Bad("ckpt.hparams is not a JSON object");
      for (auto hi = h.begin(); hi != h.end(); ++hi) {
        if (!hi.value().is_number()) return Bad("hyperparameter " + hi.key() + " is not a number");
        out->hparams[hi.key()] = hi.value().get<double>();
      }
    } else if (key == "ckpt.step") {
      if (!ParseI64(v, &out->step)) return Bad("bad ckpt.step '" + v + "'");
    } else if (key == "ckpt.data_seed") {
      if (!ParseU64(v, &out->data_seed)) return Bad("bad ckpt.data_seed '" + v + "'");
    } else if (key == "ckpt.data_cursor") {
      if (!ParseU64(v, &out->data_cursor)) return Bad("bad ckpt.data_cursor '" + v + "'");
    } else if (key == "ckpt.header_xxh3") {
      // Verified over the raw header bytes in ParseCheckpoint.
    } else if (key == "ckpt.checksums") {
      json c = json::parse(v, nullptr, /*allow_exceptions=*/false);
      if (!c.is_object()) return Bad("ckpt.checksums is not a JSON object");
      for (auto ci = c.begin(); ci != c.end(); ++ci) {
        uint64_t sum;
        if (!ci.value().is_string() ||
            !ParseHexU64(ci.value().get_ref<const std::string&>(), &sum)) {
          return BadTensor(ci.key(), "checksum is not 16 hex digits");
        }
        (*checksums)[ci.key()] = sum;
      }
    } else {
      out->extra[key] = v;
    }
  }
  if (!have_version) return Bad("__metadata__ has no ckpt.format_version");
  return Status::OK();
}

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.name;
  }
  return "?";
}

size_t DTypeSize(DType dtype) {
  for (const auto& d : kDTypes) {
    if (d.dtype == dtype) return d.size;
  }
  return 0;
}

StatusOr<DType> ParseDType(std::string_view name) {
  for (const auto& d : kDTypes) {
    if (name == d.name) return d.dtype;
  }
  return Status::InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorView* CheckpointView::Find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

StatusOr<CheckpointView> ParseCheckpoint(const void* data, size_t size,
                                         const ReadOptions& options) {
  const uint8_t* bytes = static_cast<const uint8_t*>(data);
  if (size < 8) return Bad("blob of " + std::to_string(size) + " bytes is shorter than 8");
  const uint64_t n = LoadLE64(bytes);
  if (n > size - 8) {
    return Bad("header length " + std::to_string(n) + " beyond the blob of " +
               std::to_string(size) + " bytes");
  }
  if (n > options.max_header_bytes) {
    return Bad("header length " + std::to_string(n) + " above the cap of " +
               std::to_string(options.max_header_bytes));
  }
  const size_t header_end = 8 + static_cast<size_t>(n);
  if (header_end % kDataAlignment != 0) {
    return Bad("data area at offset " + std::to_string(header_end) + " is not 64-byte aligned");
  }
  if (options.verify_header_checksum) {
    // The header checksum covers the length, the JSON and its padding.
    std::string_view text(reinterpret_cast<const char*>(bytes), header_end);
    const size_t at = text.find(kHeaderSumKey);
    if (at == std::string_view::npos ||
        text.find(kHeaderSumKey, at + 1) != std::string_view::npos) {
      return Bad("header has no single ckpt.header_xxh3");
    }
    const size_t digits = at + kHeaderSumKey.size();
    uint64_t recorded;
    if (digits + kZeroSum.size() > header_end ||
        !ParseHexU64(text.substr(digits, kZeroSum.size()), &recorded)) {
      return Bad("ckpt.header_xxh3 is not 16 hex digits");
    }
    std::string copy(text);
    copy.replace(digits, kZeroSum.size(), kZeroSum);
    if (Xxh3_64(copy.data(), copy.size()) != recorded) return Bad("header checksum mismatch");
  }
  SafetensorsOptions st_options;
  st_options.max_header_bytes = options.max_header_bytes;
  st_options.origin = "checkpoint";
  CKPT_ASSIGN_OR_RETURN(SafetensorsView file, ParseSafetensors(data, size, st_options));

  CheckpointView view;
  view.header_bytes_ = file.header_bytes;
  view.total_bytes_ = size;
  view.bytes_ = bytes;
  view.fully_verified_ = options.verify_checksums && options.verify_header_checksum;
  if (!file.has_metadata) return Bad("header has no __metadata__");
  std::map<std::string, uint64_t> checksums;
  CKPT_RETURN_IF_ERROR(ParseMetadata(file.metadata, &view.meta_, &checksums));
  for (TensorView& tv : file.tensors) {
    auto cs = checksums.find(tv.name);
    if (cs == checksums.end()) return BadTensor(tv.name, "no checksum in __metadata__");
    tv.checksum = cs->second;
    checksums.erase(cs);
  }
  if (!checksums.empty()) {
    return BadTensor(checksums.begin()->first, "checksum for a tensor that is not in the header");
  }
  if (options.verify_checksums) {
    for (const auto& t : file.tensors) {
      if (Xxh3_64(t.data, t.nbytes) != t.checksum) return BadTensor(t.name, "checksum mismatch");
    }
  }
  view.tensors_ = std::move(file.tensors);
  return view;
}

Status CheckpointWriter::AddTensor(std::string name, DType dtype, std::vector<int64_t> shape,
                                   const void* data, size_t nbytes) {
  if (name.empty() || name == kMetadataKey) {
    return Status::InvalidArgument("bad tensor name '" + name + "'");
  }
  for (const auto& e : entries_) {
    if (e.name == name) return Status::InvalidArgument("duplicate tensor " + name);
  }
  if (shape.size() > static_cast<size_t>(kMaxRank)) {
    return Status::InvalidArgument("tensor " + name + ": rank above " + std::to_string(kMaxRank));
  }
  int64_t numel;
  if (!ShapeNumel(shape, &numel)) return Status::InvalidArgument("tensor " + name + ": bad shape");
  if (static_cast<uint64_t>(numel) * DTypeSize(dtype) != nbytes) {
    return Status::InvalidArgument("tensor " + name + ": " + std::to_string(nbytes) +
                                   " bytes do not match dtype x shape");
  }
  entries_.push_back(Entry{std::move(name), dtype, std::move(shape), data, nbytes});
  prepared_ = false;
  return Status::OK();
}

void CheckpointWriter::Prepare() {
  if (prepared_) return;
  json header = json::object();
  json sums = json::object();
  uint64_t offset = 0;
  for (const auto& e : entries_) {
    header[e.name] = {{"dtype", DTypeName(e.dtype)},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.nbytes}}};
    sums[e.name] = HexU64(Xxh3_64(e.data, e.nbytes));
    offset += e.nbytes;
  }
  json hp = json::object();
  for (const auto& [k, v] : meta_.hparams) hp[k] = v;
  json meta = json::object();
  for (const auto& [k, v] : meta_.extra) meta[k] = v;
  meta["ckpt.format_version"] = std::to_string(meta_.format_version);
  meta["ckpt.model_spec"] = meta_.model_spec;
  meta["ckpt.optimizer"] = meta_.optimizer;
  meta["ckpt.hparams"] = hp.dump();
  meta["ckpt.step"] = std::to_string(meta_.step);
  meta["ckpt.data_seed"] = std::to_string(meta_.data_seed);
  meta["ckpt.data_cursor"] = std::to_string(meta_.data_cursor);
  meta["ckpt.checksums"] = sums.dump();
  meta["ckpt.header_xxh3"] = std::string(kZeroSum);
  header[kMetadataKey] = meta;
  std::string text = header.dump();
  size_t padded = 8 + text.size();
  padded = (padded + kDataAlignment - 1) / kDataAlignment * kDataAlignment;
  header_.assign(padded, ' ');
  StoreLE64(reinterpret_cast<uint8_t*>(header_.data()), padded - 8);
  std::memcpy(header_.data() + 8, text.data(), text.size());
  const size_t digits = header_.find(kHeaderSumKey) + kHeaderSumKey.size();
  const std::string sum = HexU64(Xxh3_64(header_.data(), header_.size()));
  header_.replace(digits, sum.size(), sum);
  data_bytes_ = offset;
  prepared_ = true;
}

size_t CheckpointWriter::EncodedSize() {
  Prepare();
  return header_.size() + data_bytes_;
}

Status CheckpointWriter::EncodeTo(void* dst, size_t size) {
  if (size != EncodedSize()) {
    return Status::InvalidArgument("checkpoint: destination of " + std::to_string(size) +
                                   " bytes for a blob of " + std::to_string(EncodedSize()));
  }
  uint8_t* p = static_cast<uint8_t*>(dst);
  std::memcpy(p, header_.data(), header_.size());
  p += header_.size();
  for (const auto& e : entries_) {
    if (e.nbytes) std::memcpy(p, e.data, e.nbytes);
    p += e.nbytes;
  }
  return Status::OK();
}

std::string CheckpointWriter::Encode() {
  std::string out(EncodedSize(), '\0');
  CKPT_CHECK_OK(EncodeTo(out.data(), out.size()));
  return out;
}

}  // namespace ckpt::format
