#include "idx_shape.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <functional>
#include <string_view>
#include <utility>
#include <vector>

#include "ckpt/format/regular_file.h"

namespace ckpt::records {
namespace {

// The worker's cap on an IDX file's elements (kMaxIdxBytes, worker/src/dataset.cc).
constexpr uint64_t kMaxIdxElements = uint64_t{1} << 30;
// The most of a file (gzipped or not) read: its elements, with room for
// gzip's framing of incompressible bytes.
constexpr uint64_t kMaxIdxFileBytes = kMaxIdxElements + (kMaxIdxElements >> 8);

// A file's bytes as they are, or gunzipped when it starts as gzip does, handed
// on in pieces as they come. `sink` returns false once it has what it wants:
// nothing more is inflated, so a gzip bomb costs no more than what was asked.
class Unzipper {
 public:
  using Sink = std::function<bool(const uint8_t* bytes, size_t n)>;
  Unzipper(std::string path, Sink sink) : path_(std::move(path)), sink_(std::move(sink)) {}
  Unzipper(const Unzipper&) = delete;
  Unzipper& operator=(const Unzipper&) = delete;
  ~Unzipper() {
    if (inflating_) inflateEnd(&z_);
  }

  // The next piece of the file.
  Status Feed(std::string_view piece) {
    if (!status_.ok() || done_ || piece.empty()) return status_;
    if (first_) {
      first_ = false;
      if (piece.size() >= 2 && static_cast<uint8_t>(piece[0]) == 0x1f &&
          static_cast<uint8_t>(piece[1]) == 0x8b) {
        if (inflateInit2(&z_, 15 + 16) != Z_OK) return Fail("zlib cannot start");
        inflating_ = true;
      }
    }
    if (!inflating_) {
      done_ = !sink_(reinterpret_cast<const uint8_t*>(piece.data()), piece.size());
      return status_;
    }
    z_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(piece.data()));
    z_.avail_in = static_cast<uInt>(piece.size());
    while (z_.avail_in > 0 && !done_) {
      z_.next_out = out_.data();
      z_.avail_out = static_cast<uInt>(out_.size());
      const int r = inflate(&z_, Z_NO_FLUSH);
      if (r != Z_OK && r != Z_STREAM_END) return Fail("not a valid gzip stream");
      const size_t n = out_.size() - z_.avail_out;
      done_ = (n > 0 && !sink_(out_.data(), n)) || r == Z_STREAM_END;
    }
    return status_;
  }

 private:
  Status Fail(const std::string& why) {
    status_ = Status::Corruption(path_ + ": " + why);
    return status_;
  }

  std::string path_;
  Sink sink_;
  z_stream z_{};
  std::vector<Bytef> out_ = std::vector<Bytef>(size_t{1} << 16);
  bool first_ = true;
  bool inflating_ = false;
  bool done_ = false;
  Status status_;
};

// The plain file when it exists, else its ".gz", as the worker picks; opened
// once, as a regular file (a FIFO or a device is refused without blocking).
StatusOr<format::RegularFile> OpenIdx(const std::string& dir, const std::string& base) {
  std::string path = dir + "/" + base;
  struct stat st;
  if (stat(path.c_str(), &st) != 0) path += ".gz";
  return format::RegularFile::Open(path, kMaxIdxFileBytes, "IDX file");
}

// The dimensions of an IDX header of u8 elements at the start of `bytes`;
// 0 dimensions while too few bytes are in.
StatusOr<std::vector<uint32_t>> ParseHeader(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 4) return std::vector<uint32_t>{};
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  if (p[0] != 0 || p[1] != 0 || p[2] != 0x08 || p[3] < 1 || p[3] > 4) {
    return Status::Corruption(path + ": not an IDX file of u8");
  }
  const size_t rank = p[3];
  if (bytes.size() < 4 + 4 * rank) return std::vector<uint32_t>{};
  std::vector<uint32_t> dims;
  for (size_t i = 0; i < rank; ++i) {
    const uint8_t* d = p + 4 + 4 * i;
    dims.push_back((uint32_t{d[0]} << 24) | (uint32_t{d[1]} << 16) | (uint32_t{d[2]} << 8) | d[3]);
  }
  return dims;
}

// The train images' sample shape: [1, H, W] of [N, H, W], [C, H, W] of
// [N, C, H, W]. Reads the file's first 64 KiB, which hold the header however
// it is compressed.
StatusOr<std::vector<int64_t>> SampleShape(const std::string& dir) {
  CKPT_ASSIGN_OR_RETURN(format::RegularFile file, OpenIdx(dir, "train-images-idx3-ubyte"));
  CKPT_ASSIGN_OR_RETURN(std::string prefix, file.ReadPrefix(size_t{1} << 16));
  std::string head;
  Unzipper unzip(file.path(), [&](const uint8_t* bytes, size_t n) {
    head.append(reinterpret_cast<const char*>(bytes), std::min<size_t>(n, 20 - head.size()));
    return head.size() < 20;
  });
  CKPT_RETURN_IF_ERROR(unzip.Feed(prefix));
  CKPT_ASSIGN_OR_RETURN(std::vector<uint32_t> dims, ParseHeader(head, file.path()));
  if (dims.size() == 3) return std::vector<int64_t>{1, dims[1], dims[2]};
  if (dims.size() == 4) return std::vector<int64_t>{dims[1], dims[2], dims[3]};
  return Status::Corruption(file.path() + ": the train images are not [N, H, W] or [N, C, H, W]");
}

// 1 + the largest label of a label file (at least 1, as the worker counts),
// streamed: no more than the header's count is inflated.
StatusOr<int64_t> LabelClasses(const std::string& dir, const std::string& base) {
  CKPT_ASSIGN_OR_RETURN(format::RegularFile file, OpenIdx(dir, base));
  std::string head;
  std::vector<uint32_t> dims;
  Status bad;
  uint64_t left = 0;
  int top = 0;
  Unzipper unzip(file.path(), [&](const uint8_t* bytes, size_t n) {
    if (dims.empty()) {
      const size_t take = std::min<size_t>(n, 8 - head.size());
      head.append(reinterpret_cast<const char*>(bytes), take);
      auto parsed = ParseHeader(head, file.path());
      if (!parsed.ok()) bad = parsed.status();
      if (!bad.ok() || head.size() < 8) return bad.ok();
      dims = *parsed;
      if (dims.size() != 1) bad = Status::Corruption(file.path() + ": labels must have rank 1");
      if (bad.ok() && dims[0] > kMaxIdxElements) {
        bad = Status::Corruption(file.path() + ": more labels than an IDX file may hold");
      }
      left = dims.empty() ? 0 : dims[0];
      bytes += take;
      n -= take;
    }
    const size_t use = static_cast<size_t>(std::min<uint64_t>(n, left));
    for (size_t i = 0; i < use; ++i) top = std::max<int>(top, bytes[i]);
    left -= use;
    return bad.ok() && left > 0;
  });
  CKPT_RETURN_IF_ERROR(file.ReadInPieces([&](std::string_view piece) { (void)unzip.Feed(piece); }));
  CKPT_RETURN_IF_ERROR(unzip.Feed({}));
  CKPT_RETURN_IF_ERROR(bad);
  if (dims.size() != 1 || left > 0) {
    return Status::Corruption(file.path() + ": fewer labels than its header says");
  }
  return top + 1;
}

}  // namespace

StatusOr<IdxShape> ReadIdxShape(const std::string& dir) {
  IdxShape shape;
  CKPT_ASSIGN_OR_RETURN(shape.sample_shape, SampleShape(dir));
  CKPT_ASSIGN_OR_RETURN(int64_t train, LabelClasses(dir, "train-labels-idx1-ubyte"));
  CKPT_ASSIGN_OR_RETURN(int64_t test, LabelClasses(dir, "t10k-labels-idx1-ubyte"));
  shape.classes = std::max(train, test);
  return shape;
}

}  // namespace ckpt::records
