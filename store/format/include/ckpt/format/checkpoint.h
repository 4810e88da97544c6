// The checkpoint blob: one member's model + optimizer state, in the byte layout
// of safetensors, so an exported blob loads in Python with `safetensors`.
//
// Byte layout (all integers little-endian):
//
//   offset 0        u64   N = length of the JSON header in bytes
//   offset 8        N     JSON header, UTF-8, padded with spaces (0x20) so that
//                         the data area starts at a multiple of 64 (kDataAlignment)
//   offset 8+N      ...   data area: the tensors' bytes, row-major, contiguous
//
// The JSON header is an object. Each key but "__metadata__" is a tensor:
//   "conv1.weight": {"dtype": "F32", "shape": [6, 1, 5, 5], "data_offsets": [begin, end]}
// with offsets relative to the data area. The writer lays tensors out in
// insertion order with no gaps; a reader demands exactly that: sorted by
// offset, no overlap, no hole, ending at the end of the blob.
//
// Names: model tensors keep PyTorch state_dict names ("conv1.weight");
// optimizer state is "optim.<param>.<slot>" ("optim.conv1.weight.exp_avg").
//
// "__metadata__" is an object of strings (the safetensors rule):
//   "ckpt.format_version"  "1"; a reader refuses a version above kFormatVersion
//   "ckpt.model_spec"      the model spec (a name such as "lenet5", or JSON)
//   "ckpt.optimizer"       "sgd" | "adam" | "adamw" | ""
//   "ckpt.hparams"         JSON object of name -> number
//   "ckpt.step"            decimal training step
//   "ckpt.data_seed"       decimal seed of the member's data order
//   "ckpt.data_cursor"     decimal position in that order
//   "ckpt.checksums"       JSON object of tensor name -> 16 hex digits of XXH3-64
//   "ckpt.header_xxh3"     16 hex digits of XXH3-64 over bytes [0, 8+N) computed with
//                          these 16 digits set to '0': any flipped header byte is caught
//   anything else          kept as is in CheckpointMeta::extra
//
// A reader treats every blob as untrusted (see ParseCheckpoint).
//
// Thread-safety: CheckpointWriter is not thread-safe; a CheckpointView is
// immutable after parsing and may be read from any thread while its bytes live.
#ifndef CKPT_FORMAT_CHECKPOINT_H_
#define CKPT_FORMAT_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::format {

inline constexpr int kFormatVersion = 1;
inline constexpr size_t kDataAlignment = 64;
// Default cap on the JSON header; a reader refuses a larger header.
inline constexpr size_t kDefaultMaxHeaderBytes = 16u << 20;
inline constexpr int kMaxRank = 8;

// safetensors dtypes ckpt reads and writes.
enum class DType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

// "F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "BOOL".
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);
// InvalidArgument naming `name` for an unknown dtype.
StatusOr<DType> ParseDType(std::string_view name);

struct CheckpointMeta {
  int format_version = kFormatVersion;
  std::string model_spec;
  std::string optimizer;
  std::map<std::string, double> hparams;
  int64_t step = 0;
  uint64_t data_seed = 0;
  uint64_t data_cursor = 0;
  // Other "__metadata__" strings, kept verbatim.
  std::map<std::string, std::string> extra;
};

// One tensor of a parsed blob. `data` points into the blob's bytes (no copy).
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  uint64_t checksum = 0;  // XXH3-64 recorded in the header

  int64_t numel() const;
};

struct ReadOptions {
  // Header length cap. Default: kDefaultMaxHeaderBytes.
  size_t max_header_bytes = kDefaultMaxHeaderBytes;
  // Recompute every tensor's XXH3 and compare. Default: true.
  bool verify_checksums = true;
  // Check ckpt.header_xxh3. Default: true. Off only to fuzz the JSON parsing
  // behind it, which a checksum would otherwise shield from mutated inputs.
  bool verify_header_checksum = true;
};

// A parsed, validated blob. Holds pointers into the bytes it was parsed from:
// REQUIRES: those bytes outlive the view and do not change.
class CheckpointView {
 public:
  const CheckpointMeta& meta() const { return meta_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  // nullptr when there is no tensor of that name.
  const TensorView* Find(std::string_view name) const;
  size_t header_bytes() const { return header_bytes_; }  // 8 + N
  size_t total_bytes() const { return total_bytes_; }
  // The bytes it was parsed from (total_bytes() of them), and whether every
  // tensor's checksum was recomputed and matched (ReadOptions::verify_checksums
  // and verify_header_checksum both on): what lets a reader of the same bytes
  // take this view instead of parsing them again (store::CommitRequest).
  const uint8_t* bytes() const { return bytes_; }
  bool fully_verified() const { return fully_verified_; }

 private:
  friend StatusOr<CheckpointView> ParseCheckpoint(const void*, size_t, const ReadOptions&);
  CheckpointMeta meta_;
  std::vector<TensorView> tensors_;
  size_t header_bytes_ = 0;
  size_t total_bytes_ = 0;
  const uint8_t* bytes_ = nullptr;
  bool fully_verified_ = false;
};

// Parses and validates `size` bytes at `data`. Returns Corruption, naming the
// tensor where there is one, for: a header length beyond the blob or the cap,
// malformed JSON, a header that is not an object of objects, an unknown dtype,
// a bad shape (negative, rank > kMaxRank, product overflow), a byte count that
// does not match dtype x shape, offsets out of bounds, overlapping or with
// holes, a data area not 64-byte aligned, a checksum missing or mismatched, a
// bad metadata value, a header checksum missing or mismatched. InvalidArgument for a format version
// above kFormatVersion.
StatusOr<CheckpointView> ParseCheckpoint(const void* data, size_t size,
                                         const ReadOptions& options = ReadOptions());

// Builds a blob. Tensor bytes are referenced, not copied, until Encode*:
// REQUIRES: every `data` passed to AddTensor stays valid until the last Encode call.
class CheckpointWriter {
 public:
  void SetMeta(CheckpointMeta meta) { meta_ = std::move(meta); }
  CheckpointMeta& mutable_meta() { return meta_; }

  // InvalidArgument for an empty or duplicate name, "__metadata__", a negative
  // dimension, or nbytes != numel * DTypeSize(dtype).
  Status AddTensor(std::string name, DType dtype, std::vector<int64_t> shape, const void* data,
                   size_t nbytes);

  // Size of the encoded blob. Computes checksums on the first call.
  size_t EncodedSize();
  // Writes the blob into [dst, dst + size). InvalidArgument when size != EncodedSize().
  Status EncodeTo(void* dst, size_t size);
  std::string Encode();

 private:
  struct Entry {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    const void* data;
    size_t nbytes;
  };
  void Prepare();

  CheckpointMeta meta_;
  std::vector<Entry> entries_;
  std::string header_;  // 8-byte length + padded JSON, valid when prepared_
  size_t data_bytes_ = 0;
  bool prepared_ = false;
};

}  // namespace ckpt::format

#endif  // CKPT_FORMAT_CHECKPOINT_H_
