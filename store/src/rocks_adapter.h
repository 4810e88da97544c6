// The store's RocksDB adapter: the column families and their options, the
// blob cache, the info log, the background-error policy, and the mapping of
// RocksDB statuses to ckpt Statuses. StoreImpl (store_impl.h) opens RocksDB
// with these, so one file says how the store sets RocksDB up.
//
// Thread-safety: the functions are pure; BackgroundErrorPolicy and the info
// log are called from RocksDB's background threads and lock their own state.
#ifndef CKPT_STORE_SRC_ROCKS_ADAPTER_H_
#define CKPT_STORE_SRC_ROCKS_ADAPTER_H_

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/env.h>
#include <rocksdb/listener.h>
#include <rocksdb/options.h>
#include <rocksdb/status.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::store {

// Column families, in the order they are opened; kDefault is RocksDB's own.
enum Family : int {
  kDefault = 0,
  kExperiments,
  kMembers,
  kCheckpoints,
  kBlobs,
  kRefs,
  kEvents,
  // Where each blob of the blob log lies (blob_log.h); opened only when the
  // store has it or StoreOptions::blob_log creates it.
  kBlobLog,
  kNumFamilies
};
inline constexpr const char* kFamilyNames[kNumFamilies] = {
    "default", "experiments", "members", "checkpoints", "blobs", "refs", "events", "blob_log"};

// `s` as a ckpt Status whose message starts with `context`: NoSpace is
// ResourceExhausted, Busy/TimedOut/TryAgain/Incomplete are Unavailable,
// NotSupported is InvalidArgument; OK stays OK.
Status FromRocks(const rocksdb::Status& s, const std::string& context);

// The descriptors of every family, in Family order, with their options: no
// compression; the blobs family keeps its values in blob files (write buffer
// `blob_memtable_bytes`, cache `blob_cache` when not null); the refs family
// counts with the reference-count merge operator.
// `with_blob_log`: kBlobLog's too (otherwise every family before it).
std::vector<rocksdb::ColumnFamilyDescriptor> Descriptors(
    const std::shared_ptr<rocksdb::Cache>& blob_cache, size_t blob_memtable_bytes,
    bool with_blob_log);

// An LRU cache of `bytes` for blobs, or null when `bytes` is 0.
std::shared_ptr<rocksdb::Cache> NewBlobCache(size_t bytes);

// RocksDB's info log, appended to `path` (see InfoLog in rocks_adapter.cc):
// never aborts on a full disk, drops the line that does not fit.
std::shared_ptr<rocksdb::Logger> NewInfoLog(std::string path);

// How the store takes RocksDB's background errors (see "Failed writes" in
// store.h):
//   - no space: RocksDB's own recovery is turned off. It waits for free space
//     of a whole memtable (16 MiB and more) that a nearly full disk may never
//     get back, and while it waits DB::Resume() answers Busy; the store calls
//     Resume() itself on the next write instead.
//   - a compaction that read a damaged blob or table (Corruption): set aside,
//     so that writes go on. The compaction's output is dropped and its inputs
//     stay as they were (nothing is lost); RocksDB tries it again later. The
//     damaged blob is found by Verify and by every verified read, and once no
//     manifest holds it its key is deleted and the compaction drops it without
//     reading it. Each one set aside is kept for TakeBackgroundErrors().
class BackgroundErrorPolicy final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason reason, rocksdb::Status* error) override {
    if (reason != rocksdb::BackgroundErrorReason::kCompaction || !error->IsCorruption()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (set_aside_.size() < kMaxKept) set_aside_.push_back("compaction: " + error->ToString());
    *error = rocksdb::Status::OK();
  }

  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason, rocksdb::Status error,
                            bool* auto_recovery) override {
    if (error.IsNoSpace()) *auto_recovery = false;
  }

  std::vector<std::string> Take() {
    std::lock_guard<std::mutex> lock(mu_);
    return std::exchange(set_aside_, {});
  }

 private:
  static constexpr size_t kMaxKept = 100;
  std::mutex mu_;
  std::vector<std::string> set_aside_;  // GUARDED_BY(mu_)
};

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_ROCKS_ADAPTER_H_
