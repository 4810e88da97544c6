// The store's blob log (StoreOptions::blob_log): state bytes appended once to
// segment files of ckpt's own, WiscKey style, while RocksDB keeps only a
// 24-byte location per blob (the blob_log family). The bytes go through the
// page cache once, never into the WAL or a memtable.
//
// Files: <store>/blob-log/<16 hex digits>.seg, numbered from 1; the highest
// is the active one, appended to until it holds segment_bytes.
// Record: a 48-byte header, then the payload (the checkpoint blob):
//   0  u32le magic 0x4C424B43 ("CKBL")
//   4  u32le record format, 1
//   8  u64le payload length
//   16 16 bytes BlobId (big-endian, as its keys)
//   32 u64le XXH3-64 of the payload
//   40 u64le XXH3-64 of header bytes [0, 40)
//
// Durability: Append() writes with pwritev and does not sync; Sync()
// fdatasyncs the active segment (and the directory after a new segment was
// created). The store syncs the log before the WAL record that names a
// record, so no synced location ever names bytes that are not on disk.
// Recovery (Open for writing): the last segment's headers are read in order
// and the file is cut at the first header that fails its checksum, runs past
// the end of the file, or (for the last record) whose payload fails its
// checksum: what lies past that point was never acknowledged by a synced
// commit.
//
// Thread-safety: Read() and the static helpers from any thread; everything
// else REQUIRES the caller's serialization (the store's write mutex).
#ifndef CKPT_STORE_SRC_BLOB_LOG_H_
#define CKPT_STORE_SRC_BLOB_LOG_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "ckpt/base/status.h"
#include "ckpt/format/checksum.h"

namespace ckpt::store {

inline constexpr size_t kBlobRecordHeaderBytes = 48;
inline constexpr char kBlobLogDir[] = "blob-log";

// Where a blob's record lies: its segment, the offset of its header, and the
// payload's length.
struct BlobLocation {
  uint64_t segment = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  // Header and payload.
  uint64_t record_bytes() const { return kBlobRecordHeaderBytes + length; }
};

// 24 bytes: segment, offset, length, u64 little-endian each.
std::string EncodeLocation(const BlobLocation& loc);
bool DecodeLocation(std::string_view v, BlobLocation* loc);

// A record's payload mapped read-only from its segment (MAP_POPULATE): no
// copy. The mapping stays valid after the segment is deleted.
class MappedRecord {
 public:
  MappedRecord(void* map, size_t map_bytes, size_t payload_at, size_t payload_bytes)
      : map_(map), map_bytes_(map_bytes), payload_at_(payload_at), payload_bytes_(payload_bytes) {}
  ~MappedRecord();
  MappedRecord(const MappedRecord&) = delete;
  MappedRecord& operator=(const MappedRecord&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(map_) + payload_at_; }
  size_t size() const { return payload_bytes_; }

 private:
  void* map_;
  size_t map_bytes_;
  size_t payload_at_;
  size_t payload_bytes_;
};

class BlobLog {
 public:
  // Opens the log in `dir`. Writer (!read_only): creates the directory,
  // truncates a torn tail of the last segment (see above) and appends to it.
  // A read-only log only reads.
  static StatusOr<std::unique_ptr<BlobLog>> Open(std::string dir, bool read_only,
                                                 uint64_t segment_bytes);
  ~BlobLog();
  BlobLog(const BlobLog&) = delete;
  BlobLog& operator=(const BlobLog&) = delete;

  // Appends a record of `id` with `size` bytes at `data` (not synced) and
  // returns where it lies. Rolls to a new segment first when the active one
  // holds segment_bytes. On failure nothing of the record stays in the file:
  // ResourceExhausted when the device is full, IOError otherwise.
  StatusOr<BlobLocation> Append(const BlobId& id, const void* data, size_t size);
  // fdatasync of what Append wrote since the last Sync (no-op when nothing).
  Status Sync();
  // True when Append wrote since the last Sync.
  bool dirty() const { return dirty_; }

  // Maps the payload of the record of `id` at `loc`. Checks the header
  // (checksum, id, length) always, the payload's checksum when `verify`.
  // NotFound when the segment file is gone (deleted by garbage collection);
  // Corruption naming the segment and offset when a check fails.
  StatusOr<std::unique_ptr<MappedRecord>> Read(const BlobId& id, const BlobLocation& loc,
                                               bool verify) const;

  // Bytes of each segment file now, by number.
  std::map<uint64_t, uint64_t> SegmentBytes() const;
  uint64_t active_segment() const { return active_; }
  // ResourceExhausted while `bytes` more do not fit in the active segment's
  // file system (reserved with fallocate, then given back); OK when they do,
  // or when the file system cannot say (no fallocate).
  Status ProbeSpace(uint64_t bytes);
  // Starts a new active segment (garbage collection copies live records
  // there, away from the segments it collects).
  Status Roll();
  // Deletes a segment that is not the active one.
  Status RemoveSegment(uint64_t segment);
  // Bytes cut from the last segment by the open (a torn tail); 0 when none.
  uint64_t truncated_bytes() const { return truncated_bytes_; }
  const std::string& dir() const { return dir_; }
  std::string SegmentPath(uint64_t segment) const;

 private:
  BlobLog(std::string dir, bool read_only, uint64_t segment_bytes)
      : dir_(std::move(dir)), read_only_(read_only), segment_bytes_(segment_bytes) {}
  // Opens segment `n` for appending, creating it when missing.
  Status OpenActive(uint64_t n);
  // Cuts the torn tail of the active segment (writer open).
  Status Recover();

  const std::string dir_;
  const bool read_only_;
  const uint64_t segment_bytes_;
  uint64_t active_ = 0;       // 0: none yet
  int active_fd_ = -1;        // writer only
  uint64_t active_size_ = 0;  // bytes of the active segment
  bool dirty_ = false;
  bool dir_dirty_ = false;  // a segment was created since the last Sync
  uint64_t truncated_bytes_ = 0;
};

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_BLOB_LOG_H_
