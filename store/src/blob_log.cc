// The blob log of blob_log.h.
#include "blob_log.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <utility>

namespace ckpt::store {

namespace {

constexpr uint32_t kMagic = 0x4C424B43;  // "CKBL" little-endian
constexpr uint32_t kRecordFormat = 1;
constexpr char kSuffix[] = ".seg";

void PutLE64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLE64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void PutLE32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t GetLE32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct Header {
  uint64_t length = 0;
  BlobId id;
  uint64_t payload_hash = 0;
};

void EncodeHeader(const Header& h, uint8_t out[kBlobRecordHeaderBytes]) {
  PutLE32(out, kMagic);
  PutLE32(out + 4, kRecordFormat);
  PutLE64(out + 8, h.length);
  const std::string id = h.id.Bytes();
  std::memcpy(out + 16, id.data(), 16);
  PutLE64(out + 32, h.payload_hash);
  PutLE64(out + 40, Xxh3_64(out, 40));
}

// False when the header fails its checksum, magic or format.
bool DecodeHeader(const uint8_t in[kBlobRecordHeaderBytes], Header* h) {
  if (GetLE32(in) != kMagic || GetLE32(in + 4) != kRecordFormat) return false;
  if (GetLE64(in + 40) != Xxh3_64(in, 40)) return false;
  h->length = GetLE64(in + 8);
  h->payload_hash = GetLE64(in + 32);
  return BlobId::FromBytes(std::string_view(reinterpret_cast<const char*>(in + 16), 16), &h->id);
}

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

// Reads exactly n bytes at `at`; false on a short read or an error.
bool PreadAll(int fd, void* buf, size_t n, uint64_t at) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    at += static_cast<uint64_t>(r);
  }
  return true;
}

bool ParseSegmentName(const std::string& name, uint64_t* n) {
  if (name.size() != 16 + std::strlen(kSuffix) || name.substr(16) != kSuffix) return false;
  return ParseHexU64(name.substr(0, 16), n) && *n > 0;
}

Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(Errno("blob log " + dir));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (rc != 0) {
    errno = err;
    return Status::IOError(Errno("blob log " + dir + ": fsync of the directory"));
  }
  return Status::OK();
}

}  // namespace

std::string EncodeLocation(const BlobLocation& loc) {
  uint8_t b[24];
  PutLE64(b, loc.segment);
  PutLE64(b + 8, loc.offset);
  PutLE64(b + 16, loc.length);
  return std::string(reinterpret_cast<const char*>(b), sizeof(b));
}

bool DecodeLocation(std::string_view v, BlobLocation* loc) {
  if (v.size() != 24) return false;
  const auto* b = reinterpret_cast<const uint8_t*>(v.data());
  loc->segment = GetLE64(b);
  loc->offset = GetLE64(b + 8);
  loc->length = GetLE64(b + 16);
  return loc->segment > 0;
}

MappedRecord::~MappedRecord() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
}

BlobLog::~BlobLog() {
  if (active_fd_ >= 0) ::close(active_fd_);
}

std::string BlobLog::SegmentPath(uint64_t segment) const {
  return dir_ + "/" + HexU64(segment) + kSuffix;
}

std::map<uint64_t, uint64_t> BlobLog::SegmentBytes() const {
  std::map<uint64_t, uint64_t> out;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir_, ec)) {
    uint64_t n = 0;
    if (!ParseSegmentName(entry.path().filename().string(), &n)) continue;
    const uint64_t size = std::filesystem::file_size(entry.path(), ec);
    if (!ec) out[n] = size;
  }
  return out;
}

StatusOr<std::unique_ptr<BlobLog>> BlobLog::Open(std::string dir, bool read_only,
                                                 uint64_t segment_bytes) {
  std::unique_ptr<BlobLog> log(new BlobLog(std::move(dir), read_only, segment_bytes));
  if (read_only) return log;
  std::error_code ec;
  std::filesystem::create_directories(log->dir_, ec);
  if (ec) return Status::IOError("blob log " + log->dir_ + ": " + ec.message());
  const std::map<uint64_t, uint64_t> segments = log->SegmentBytes();
  CKPT_RETURN_IF_ERROR(log->OpenActive(segments.empty() ? 1 : segments.rbegin()->first));
  CKPT_RETURN_IF_ERROR(log->Recover());
  return log;
}

Status BlobLog::OpenActive(uint64_t n) {
  const std::string path = SegmentPath(n);
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(Errno("blob log segment " + path));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IOError(Errno("blob log segment " + path));
  }
  if (active_fd_ >= 0) ::close(active_fd_);
  active_fd_ = fd;
  active_ = n;
  active_size_ = static_cast<uint64_t>(st.st_size);
  if (st.st_size == 0) dir_dirty_ = true;
  return Status::OK();
}

Status BlobLog::Recover() {
  uint64_t at = 0;
  uint64_t last = 0;  // offset of the last whole record
  Header last_header;
  bool any = false;
  uint8_t buf[kBlobRecordHeaderBytes];
  while (at + kBlobRecordHeaderBytes <= active_size_) {
    Header h;
    if (!PreadAll(active_fd_, buf, sizeof(buf), at) || !DecodeHeader(buf, &h) ||
        h.length > active_size_ - at - kBlobRecordHeaderBytes) {
      break;
    }
    last = at;
    last_header = h;
    any = true;
    at += kBlobRecordHeaderBytes + h.length;
  }
  // The last record's payload may be torn while its header is whole (the
  // file grew but its blocks never reached the disk).
  if (any && at == active_size_) {
    std::string payload(last_header.length, '\0');
    if (!PreadAll(active_fd_, payload.data(), payload.size(), last + kBlobRecordHeaderBytes) ||
        Xxh3_64(payload.data(), payload.size()) != last_header.payload_hash) {
      at = last;
    }
  }
  if (at == active_size_) return Status::OK();
  if (::ftruncate(active_fd_, static_cast<off_t>(at)) != 0 || ::fdatasync(active_fd_) != 0) {
    return Status::IOError(Errno("blob log segment " + SegmentPath(active_) +
                                 ": truncating its torn tail at " + std::to_string(at)));
  }
  truncated_bytes_ = active_size_ - at;
  active_size_ = at;
  return Status::OK();
}

Status BlobLog::Roll() {
  if (read_only_) return Status::FailedPrecondition("blob log " + dir_ + " is read-only");
  CKPT_RETURN_IF_ERROR(Sync());
  return OpenActive(active_ + 1);
}

StatusOr<BlobLocation> BlobLog::Append(const BlobId& id, const void* data, size_t size) {
  if (read_only_) return Status::FailedPrecondition("blob log " + dir_ + " is read-only");
  if (active_size_ > 0 && active_size_ + kBlobRecordHeaderBytes + size > segment_bytes_) {
    CKPT_RETURN_IF_ERROR(Roll());
  }
  Header h;
  h.length = size;
  h.id = id;
  h.payload_hash = Xxh3_64(data, size);
  uint8_t header[kBlobRecordHeaderBytes];
  EncodeHeader(h, header);
  iovec iov[2] = {{header, sizeof(header)}, {const_cast<void*>(data), size}};
  const uint64_t start = active_size_;
  uint64_t at = start;
  size_t done = 0;
  const size_t total = sizeof(header) + size;
  while (done < total) {
    // Skips what is already written of the two buffers.
    iovec rest[2];
    int n = 0;
    if (done < sizeof(header)) {
      rest[n++] = {header + done, sizeof(header) - done};
      rest[n++] = iov[1];
    } else {
      rest[n++] = {static_cast<uint8_t*>(iov[1].iov_base) + (done - sizeof(header)), total - done};
    }
    const ssize_t w = ::pwritev(active_fd_, rest, n, static_cast<off_t>(at));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : ENOSPC;
      // Nothing of a failed record stays: the next append starts at `start`.
      if (::ftruncate(active_fd_, static_cast<off_t>(start)) != 0) {
        // The next Open cuts it as a torn tail.
      }
      errno = err;
      const std::string what = Errno("blob log segment " + SegmentPath(active_) + ": append of " +
                                     std::to_string(size) + " bytes of blob " + id.Hex());
      if (err == ENOSPC || err == EDQUOT) return Status::ResourceExhausted(what);
      return Status::IOError(what);
    }
    done += static_cast<size_t>(w);
    at += static_cast<uint64_t>(w);
  }
  active_size_ = at;
  dirty_ = true;
  return BlobLocation{active_, start, size};
}

Status BlobLog::ProbeSpace(uint64_t bytes) {
  if (read_only_) return Status::OK();
  const int rc =
      ::fallocate(active_fd_, 0, static_cast<off_t>(active_size_), static_cast<off_t>(bytes));
  const int err = errno;
  if (rc == 0) {
    if (::ftruncate(active_fd_, static_cast<off_t>(active_size_)) != 0) {
      return Status::IOError(Errno("blob log segment " + SegmentPath(active_) + ": ftruncate"));
    }
    return Status::OK();
  }
  if (err == ENOSPC || err == EDQUOT) {
    errno = err;
    return Status::ResourceExhausted(Errno("blob log segment " + SegmentPath(active_) +
                                           ": reserving " + std::to_string(bytes) + " bytes"));
  }
  return Status::OK();
}

Status BlobLog::Sync() {
  if (!dirty_ && !dir_dirty_) return Status::OK();
  if (dirty_ && ::fdatasync(active_fd_) != 0) {
    return Status::IOError(Errno("blob log segment " + SegmentPath(active_) + ": fdatasync"));
  }
  dirty_ = false;
  if (dir_dirty_) {
    CKPT_RETURN_IF_ERROR(SyncDir(dir_));
    dir_dirty_ = false;
  }
  return Status::OK();
}

Status BlobLog::RemoveSegment(uint64_t segment) {
  if (segment == active_) {
    return Status::Internal("blob log " + dir_ + ": removing the active segment");
  }
  if (::unlink(SegmentPath(segment).c_str()) != 0 && errno != ENOENT) {
    return Status::IOError(Errno("blob log segment " + SegmentPath(segment) + ": unlink"));
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<MappedRecord>> BlobLog::Read(const BlobId& id, const BlobLocation& loc,
                                                      bool verify) const {
  const std::string path = SegmentPath(loc.segment);
  const std::string where =
      "blob " + id.Hex() + " in blob log segment " + path + " at " + std::to_string(loc.offset);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(where + ": the segment is gone");
    return Status::IOError(Errno(where));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    Status s = Status::IOError(Errno(where));
    ::close(fd);
    return s;
  }
  if (loc.offset + loc.record_bytes() > static_cast<uint64_t>(st.st_size)) {
    ::close(fd);
    return Status::Corruption(where + ": the record (" + std::to_string(loc.record_bytes()) +
                              " bytes) runs past the segment's end (" + std::to_string(st.st_size) +
                              " bytes)");
  }
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t map_at = loc.offset / page * page;
  const size_t map_bytes = static_cast<size_t>(loc.offset + loc.record_bytes() - map_at);
  void* map = ::mmap(nullptr, map_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                     static_cast<off_t>(map_at));
  const int err = errno;
  ::close(fd);
  if (map == MAP_FAILED) {
    errno = err;
    return Status::IOError(Errno(where + ": mmap"));
  }
  const size_t header_at = static_cast<size_t>(loc.offset - map_at);
  auto record = std::make_unique<MappedRecord>(map, map_bytes, header_at + kBlobRecordHeaderBytes,
                                               static_cast<size_t>(loc.length));
  Header h;
  if (!DecodeHeader(static_cast<const uint8_t*>(map) + header_at, &h)) {
    return Status::Corruption(where + ": the record header fails its checksum");
  }
  if (h.id != id || h.length != loc.length) {
    return Status::Corruption(where + ": the record holds blob " + h.id.Hex() + " of " +
                              std::to_string(h.length) + " bytes, not " +
                              std::to_string(loc.length));
  }
  if (verify && Xxh3_64(record->data(), record->size()) != h.payload_hash) {
    return Status::Corruption(where + ": the record's payload fails its checksum");
  }
  return record;
}

}  // namespace ckpt::store
