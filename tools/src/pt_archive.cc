#include "pt_archive.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

namespace ckpt::tool {
namespace {

constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kEntrySignature = 0x02014b50;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kEntrySize = 46;
constexpr uint16_t kZip64ExtraId = 0x0001;

// Corruption naming `path` as ReadPt names an archive LibTorch cannot read.
Status NotAnArchive(const std::string& path, const std::string& why) {
  return Status::Corruption(path + " is not a readable .pt archive: " + why);
}

uint64_t LoadLe(std::string_view b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(b[at + i]);
  return v;
}

// An open file read at offsets.
class File {
 public:
  explicit File(std::string path) : path_(std::move(path)) {}
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() {
    if (fd_ >= 0) close(fd_);
  }

  Status Open() {
    fd_ = open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (fd_ < 0 || fstat(fd_, &st) != 0)
      return Status::IOError(path_ + ": " + std::strerror(errno));
    if (!S_ISREG(st.st_mode)) return Status::InvalidArgument(path_ + " is not a regular file");
    size_ = static_cast<uint64_t>(st.st_size);
    return Status::OK();
  }

  // `n` bytes at `offset`, which the caller has checked lie inside the file.
  StatusOr<std::string> Read(uint64_t offset, size_t n) const {
    std::string out(n, '\0');
    size_t done = 0;
    while (done < n) {
      const ssize_t got =
          pread(fd_, out.data() + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) return Status::IOError(path_ + ": " + std::strerror(errno));
      if (got == 0) return NotAnArchive(path_, "shorter than its zip directory says");
      done += static_cast<size_t>(got);
    }
    return out;
  }

  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

struct Directory {
  uint64_t entries = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
};

// The central directory's place, from the end record (and the ZIP64 record
// when its locator precedes the end record, as miniz reads it).
StatusOr<Directory> FindDirectory(const File& f) {
  auto bad = [&] { return NotAnArchive(f.path(), "no end of a zip directory"); };
  if (f.size() < kEndSize) return bad();
  const uint64_t tail_size = std::min<uint64_t>(f.size(), kEndSize + 0xffff);
  CKPT_ASSIGN_OR_RETURN(std::string tail,
                        f.Read(f.size() - tail_size, static_cast<size_t>(tail_size)));
  size_t at = tail.size() - kEndSize;
  while (LoadLe(tail, at, 4) != kEndSignature) {
    if (at == 0) return bad();
    --at;
  }
  const uint64_t end_offset = f.size() - tail_size + at;
  Directory d{LoadLe(tail, at + 10, 2), LoadLe(tail, at + 16, 4), LoadLe(tail, at + 12, 4)};
  if (end_offset >= kZip64LocatorSize + kZip64EndSize) {
    CKPT_ASSIGN_OR_RETURN(std::string loc,
                          f.Read(end_offset - kZip64LocatorSize, kZip64LocatorSize));
    if (LoadLe(loc, 0, 4) == kZip64LocatorSignature) {
      const uint64_t end64 = LoadLe(loc, 8, 8);
      if (end64 > f.size() - kZip64EndSize) {
        return NotAnArchive(f.path(), "its ZIP64 directory record lies outside the file");
      }
      CKPT_ASSIGN_OR_RETURN(std::string rec, f.Read(end64, kZip64EndSize));
      if (LoadLe(rec, 0, 4) != kZip64EndSignature) {
        return NotAnArchive(f.path(), "no ZIP64 directory record where its locator says");
      }
      d = Directory{LoadLe(rec, 32, 8), LoadLe(rec, 48, 8), LoadLe(rec, 40, 8)};
    }
  }
  if (d.offset > f.size() || d.size > f.size() - d.offset) {
    return NotAnArchive(f.path(), "its zip directory lies outside the file");
  }
  return d;
}

// The uncompressed size of the entry at `at` of `dir`: the 32-bit field, or
// the ZIP64 extra field's first u64 when it is 0xFFFFFFFF.
StatusOr<uint64_t> UncompressedSize(std::string_view dir, size_t at, const std::string& what) {
  const uint64_t size32 = LoadLe(dir, at + 24, 4);
  if (size32 != 0xffffffff) return size32;
  const size_t name_len = LoadLe(dir, at + 28, 2);
  const size_t extra_len = LoadLe(dir, at + 30, 2);
  size_t x = at + kEntrySize + name_len;
  const size_t end = x + extra_len;
  while (x + 4 <= end) {
    const uint64_t id = LoadLe(dir, x, 2);
    const size_t len = LoadLe(dir, x + 2, 2);
    if (id == kZip64ExtraId && len >= 8 && x + 4 + 8 <= end) return LoadLe(dir, x + 4, 8);
    x += 4 + len;
  }
  return Status::Corruption(what + ": its size is 0xFFFFFFFF and no ZIP64 field gives it");
}

}  // namespace

Status CheckPtRecordsStored(const std::string& path) {
  File f(path);
  CKPT_RETURN_IF_ERROR(f.Open());
  CKPT_ASSIGN_OR_RETURN(Directory d, FindDirectory(f));
  CKPT_ASSIGN_OR_RETURN(std::string dir, f.Read(d.offset, static_cast<size_t>(d.size)));
  size_t at = 0;
  for (uint64_t i = 0; i < d.entries; ++i) {
    if (dir.size() - at < kEntrySize || LoadLe(dir, at, 4) != kEntrySignature) {
      return NotAnArchive(path, "its zip directory is truncated at entry " + std::to_string(i) +
                                    " of " + std::to_string(d.entries));
    }
    const size_t name_len = LoadLe(dir, at + 28, 2);
    const size_t rest = name_len + LoadLe(dir, at + 30, 2) + LoadLe(dir, at + 32, 2);
    if (dir.size() - at - kEntrySize < rest) {
      return NotAnArchive(path, "its zip directory is truncated at entry " + std::to_string(i) +
                                    " of " + std::to_string(d.entries));
    }
    const std::string name = dir.substr(at + kEntrySize, name_len);
    std::string what = path;
    what += ": record ";
    what += name;
    const uint64_t method = LoadLe(dir, at + 10, 2);
    if (method != 0) {
      return Status::Corruption(what + " is compressed (zip method " + std::to_string(method) +
                                "); torch.save stores records as they are, and a compressed "
                                "one may expand past any bound: refused");
    }
    CKPT_ASSIGN_OR_RETURN(uint64_t size, UncompressedSize(dir, at, what));
    if (size > f.size()) {
      return Status::Corruption(what + " claims " + std::to_string(size) +
                                " bytes, more than the " + std::to_string(f.size()) +
                                " of the file");
    }
    at += kEntrySize + rest;
  }
  return Status::OK();
}

}  // namespace ckpt::tool
