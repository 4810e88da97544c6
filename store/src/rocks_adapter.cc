// The RocksDB adapter of rocks_adapter.h.
#include "rocks_adapter.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/options.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <utility>

#include "refcount_merge.h"

namespace ckpt::store {

Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  if (s.ok()) return Status::OK();
  std::string msg = context + ": " + s.ToString();
  switch (s.code()) {
    case rocksdb::Status::kNotFound:
      return Status::NotFound(msg);
    case rocksdb::Status::kCorruption:
      return Status::Corruption(msg);
    case rocksdb::Status::kIOError:
      if (s.IsNoSpace()) return Status::ResourceExhausted(msg);
      return Status::IOError(msg);
    case rocksdb::Status::kInvalidArgument:
    case rocksdb::Status::kNotSupported:
      return Status::InvalidArgument(msg);
    case rocksdb::Status::kBusy:
    case rocksdb::Status::kTimedOut:
    case rocksdb::Status::kTryAgain:
    case rocksdb::Status::kIncomplete:
      return Status::Unavailable(msg);
    case rocksdb::Status::kAborted:
      return Status::Aborted(msg);
    default:
      return Status::Internal(msg);
  }
}

namespace {

rocksdb::ColumnFamilyOptions FamilyOptions(int family,
                                           const std::shared_ptr<rocksdb::Cache>& blob_cache,
                                           size_t blob_memtable_bytes) {
  rocksdb::ColumnFamilyOptions o;
  o.compression = rocksdb::kNoCompression;
  switch (family) {
    case kBlobs:
      // Checkpoints are written once and read whole: keep them out of the LSM
      // (integrated BlobDB) so compactions move 16-byte index entries, not states.
      o.enable_blob_files = true;
      o.min_blob_size = 0;
      o.blob_file_size = 256ull << 20;
      o.blob_compression_type = rocksdb::kNoCompression;
      // No relocation of live blobs during compactions. A blob file is
      // deleted once none of its blobs is referenced, which retention makes
      // the usual case within a few intervals; relocating the live ones of
      // the oldest files (age cutoff 0.5) rewrote every head about once more,
      // since in PBT every member writes each interval: 10,000 members, 3
      // intervals, LeNet-5 states wrote 66 GB for a 6 GB store at 246-260
      // member-intervals/s, against 30 GB at 587-605 without it; 300 members
      // over 40 intervals end at 238 MB instead of 208 (bench/RESULTS.md).
      // Files kept alive by a few old blobs (pins, stopped members' heads)
      // are reclaimed by Compact(), which forces the collection.
      o.enable_blob_garbage_collection = false;
      o.write_buffer_size = blob_memtable_bytes;
      if (blob_cache) {
        o.blob_cache = blob_cache;
        // Fresh results are the next heads to be read.
        o.prepopulate_blob_cache = rocksdb::PrepopulateBlobCache::kFlushOnly;
      }
      break;
    case kRefs:
      o.merge_operator = NewRefCountMergeOperator();
      o.write_buffer_size = 8ull << 20;
      break;
    default:
      o.write_buffer_size = 16ull << 20;
      break;
  }
  return o;
}

// RocksDB's info log (the LOG file of the store directory), written with
// stdio instead of RocksDB's own log writer: Debian's librocksdb is built with
// assertions, and that writer aborts the process on the next append after one
// failed (a full disk: WritableFileWriter::AssertFalseAndGetStatusForPrevError).
// Here a line that does not fit is dropped. Rolls to LOG.old past
// kMaxInfoLogBytes.
class InfoLog final : public rocksdb::Logger {
 public:
  static constexpr long kMaxInfoLogBytes = 4 << 20;

  explicit InfoLog(std::string path)
      : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), path_(std::move(path)) {
    file_ = std::fopen(path_.c_str(), "ae");
  }
  ~InfoLog() override {
    if (file_ != nullptr) std::fclose(file_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (file_ == nullptr) return;
    if (std::ftell(file_) > kMaxInfoLogBytes) {
      std::fclose(file_);
      std::rename(path_.c_str(), (path_ + ".old").c_str());
      file_ = std::fopen(path_.c_str(), "ae");
      if (file_ == nullptr) return;
    }
    const auto now = std::chrono::system_clock::now();
    const std::time_t t = std::chrono::system_clock::to_time_t(now);
    std::tm tm{};
    gmtime_r(&t, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof(stamp), "%Y/%m/%d-%H:%M:%S ", &tm);
    std::fputs(stamp, file_);
    std::vfprintf(file_, format, ap);
    std::fputc('\n', file_);
    std::fflush(file_);
    std::clearerr(file_);  // a full disk: the line is lost, the next one may fit
  }

 private:
  const std::string path_;
  std::mutex mu_;
  std::FILE* file_ = nullptr;  // GUARDED_BY(mu_)
};

}  // namespace

std::vector<rocksdb::ColumnFamilyDescriptor> Descriptors(
    const std::shared_ptr<rocksdb::Cache>& blob_cache, size_t blob_memtable_bytes,
    bool with_blob_log) {
  std::vector<rocksdb::ColumnFamilyDescriptor> d;
  for (int f = 0; f < (with_blob_log ? kNumFamilies : kBlobLog); ++f) {
    d.emplace_back(kFamilyNames[f], FamilyOptions(f, blob_cache, blob_memtable_bytes));
  }
  return d;
}

std::shared_ptr<rocksdb::Cache> NewBlobCache(size_t bytes) {
  if (bytes == 0) return nullptr;
  rocksdb::LRUCacheOptions o;
  o.capacity = bytes;
  // One shard: a shard holds at most its share of the capacity, and states
  // are large.
  o.num_shard_bits = 0;
  // RocksDB inserts blobs at bottom priority; with no high/low pools every
  // entry shares one LRU order, so a blob just read or flushed is not the
  // first one evicted.
  o.high_pri_pool_ratio = 0.0;
  o.low_pri_pool_ratio = 0.0;
  return rocksdb::NewLRUCache(o);
}

std::shared_ptr<rocksdb::Logger> NewInfoLog(std::string path) {
  return std::make_shared<InfoLog>(std::move(path));
}

}  // namespace ckpt::store
