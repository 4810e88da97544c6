// StoreImpl: ckpt::store::Store over RocksDB. Its methods are defined by job:
//   store_open.cc    opening and closing RocksDB, loading the retention index,
//                    Flush, Compact, SizeForWorkingSet, Store::Open;
//   store_read.cc    reads (experiments, members, versions, lineage, blobs,
//                    events), which go to RocksDB directly;
//   store_write.cc   the write path: every mutation under mu_, the retention
//                    changes it brings, the failed-write policy;
//   store_verify.cc  Verify and Stats.
// How RocksDB is configured is in rocks_adapter.h; RocksDB statuses become
// ckpt Statuses there (FromRocks) and in these files.
//
// Thread-safety: as Store (ckpt/store/store.h). Writes hold mu_; reads do not.
#ifndef CKPT_STORE_SRC_STORE_IMPL_H_
#define CKPT_STORE_SRC_STORE_IMPL_H_

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "blob_log.h"
#include "ckpt/base/status.h"
#include "ckpt/format/checksum.h"
#include "ckpt/store/store.h"
#include "retention.h"
#include "rocks_adapter.h"

namespace ckpt::store {

// Names a member and a version in messages: "exp/member", "exp/member v3".
inline std::string Id(const std::string& exp, const std::string& member) {
  return exp + "/" + member;
}
inline std::string Id(const std::string& exp, const std::string& member, int64_t version) {
  return exp + "/" + member + " v" + std::to_string(version);
}

// Manifests and reference counts a write will change, collected before any of
// it goes into the batch so that several changes to one manifest (unpin, then
// release by retention) end up as one final value.
struct PendingWrite {
  rocksdb::WriteBatch batch;
  std::map<std::string, std::optional<Manifest>> manifests;  // key -> value; nullopt = delete
  std::map<BlobId, int64_t> ref_deltas;
  // The blob the write adds, if its bytes may need storing.
  std::optional<BlobId> new_blob;
  rocksdb::Slice new_blob_bytes;
  // The write appended the blob's bytes to the blob log (synced before the
  // batch when the batch is).
  bool blob_appended = false;
};

class StoreImpl final : public Store {
 public:
  StoreImpl(StoreOptions options, bool read_only)
      : options_(std::move(options)),
        read_only_(read_only),
        blob_cache_(NewBlobCache(options_.blob_cache_bytes)),
        blob_memtable_bytes_(options_.blob_memtable_bytes),
        index_(RetentionPolicy{options_.keep_last_n, options_.keep_best_k, options_.keep_lineage}) {
  }

  ~StoreImpl() override { CloseDb(); }

  Status OpenDb();
  // Opens the blob log when StoreOptions::blob_log is on or the store has one.
  Status OpenBlobLog();
  // Loads the retention index and reference counts (writer open).
  Status LoadIndex();
  // LoadIndex's part for the blob log (StoreOptions::blob_log).
  Status LoadBlobLocations(const rocksdb::ReadOptions& ro);
  // Sweeps retention with the current options and writes what it changed.
  Status SweepRetention();

  Status Refresh() override {
    if (!read_only_) return Status::OK();
    CloseDb();
    return OpenDb();
  }

  void CloseDb() {
    log_.reset();
    if (!db_) return;
    for (auto* h : handles_) db_->DestroyColumnFamilyHandle(h);
    handles_.clear();
    db_->Close().PermitUncheckedError();
    db_.reset();
  }

  Status CreateExperiment(const std::string& id, const std::string& config_json) override;
  StatusOr<ExperimentInfo> GetExperiment(const std::string& id) override;
  StatusOr<std::vector<ExperimentInfo>> ListExperiments() override;
  Status SetExperimentStatus(const std::string& id, const std::string& status) override;
  Status DeleteExperiment(const std::string& id) override;

  Status CreateMember(const std::string& exp, const std::string& member,
                      const std::map<std::string, double>& hparams) override {
    return CreateMembers(exp, {{member, hparams}});
  }
  Status CreateMembers(
      const std::string& exp,
      const std::map<std::string, std::map<std::string, double>>& hparams_by_member) override;
  StatusOr<MemberHead> GetMember(const std::string& exp, const std::string& member) override;
  StatusOr<std::vector<MemberHead>> ListMembers(const std::string& exp) override;
  Status SetMemberState(const std::string& exp, const std::string& member,
                        const std::string& state) override;

  StatusOr<int64_t> CommitResult(const CommitRequest& request) override;
  StatusOr<int64_t> Exploit(const std::string& exp, const std::string& dst, const std::string& src,
                            const std::map<std::string, double>& hparams,
                            const std::string& event_json) override;
  StatusOr<int64_t> Restore(const std::string& exp, const std::string& member, int64_t version,
                            const std::string& event_json) override;
  StatusOr<int64_t> Import(const std::string& exp, const std::string& member, const void* blob,
                           size_t blob_size, const std::map<std::string, double>& hparams) override;
  Status Pin(const std::string& exp, const std::string& member, int64_t version) override {
    return SetPinned(exp, member, version, true);
  }
  Status Unpin(const std::string& exp, const std::string& member, int64_t version) override {
    return SetPinned(exp, member, version, false);
  }

  StatusOr<Manifest> GetManifest(const std::string& exp, const std::string& member,
                                 int64_t version) override;
  StatusOr<std::vector<Manifest>> ListVersions(const std::string& exp,
                                               const std::string& member) override;
  StatusOr<std::vector<Manifest>> Lineage(const std::string& exp,
                                          const std::string& member) override;

  StatusOr<PinnedBlob> ReadBlob(const BlobId& id, bool verify) override {
    return ReadBlobImpl(id, verify, /*check_record=*/false);
  }
  // ReadBlob; `check_record`: a blob in the blob log also has its record's
  // own checksum checked (Verify).
  StatusOr<PinnedBlob> ReadBlobImpl(const BlobId& id, bool verify, bool check_record);
  StatusOr<PinnedBlob> ReadHeadBlob(const std::string& exp, const std::string& member,
                                    bool verify) override;

  StatusOr<uint64_t> AppendEvent(const std::string& exp, const std::string& json) override;
  StatusOr<std::vector<Event>> ListEvents(const std::string& exp, uint64_t from_seq,
                                          size_t limit) override;

  StatusOr<VerifyReport> Verify() override;
  // Verify() through this instance's own reads.
  StatusOr<VerifyReport> VerifyHere();
  StatusOr<StoreStats> Stats() override;
  Status Flush() override;
  Status Compact() override;
  std::vector<std::string> TakeBackgroundErrors() override {
    std::vector<std::string> out = background_errors_->Take();
    for (auto& e : out) e = "store " + options_.path + ": " + e + " (set aside, writes go on)";
    return out;
  }
  Status Recover() override {
    CKPT_RETURN_IF_ERROR(CheckWritable());
    std::lock_guard<std::mutex> lock(mu_);
    return WritableLocked();
  }
  Status SizeForWorkingSet(uint64_t head_bytes) override;
  uint64_t blob_cache_capacity() const override {
    return blob_cache_ ? blob_cache_->GetCapacity() : 0;
  }
  uint64_t blob_cache_usage() const override { return blob_cache_ ? blob_cache_->GetUsage() : 0; }
  uint64_t blob_memtable_bytes() const override { return blob_memtable_bytes_.load(); }

 private:
  // nullptr for kBlobLog when the store has no blob_log family (a store from
  // before the blob log, opened without StoreOptions::blob_log).
  rocksdb::ColumnFamilyHandle* cf(Family f) const {
    return static_cast<size_t>(f) < handles_.size() ? handles_[f] : nullptr;
  }

  Status CheckWritable() const {
    if (read_only_) {
      return Status::FailedPrecondition("store " + options_.path + " is open read-only");
    }
    return Status::OK();
  }

  // Reads one value; NotFound carries `what`.
  Status Get(Family f, const std::string& key, const std::string& what, std::string* value) const;
  StatusOr<MemberHead> ReadHead(const std::string& exp, const std::string& member) const;
  StatusOr<Manifest> ReadManifest(const std::string& exp, const std::string& member,
                                  int64_t version) const;
  Status ExperimentExists(const std::string& exp) const;

  // ---- write path; all REQUIRE mu_ held ----
  Status MemberExistsLocked(const std::string& exp, const std::string& member) const;
  // A version that holds its blob, from the index's cache. NotFound when
  // absent; FailedPrecondition when retention released its blob.
  StatusOr<Manifest> RetainedManifestLocked(const std::string& exp, const std::string& member,
                                            int64_t version) const;
  // Turns retention changes into manifest rewrites/deletes and ref deltas.
  Status AddChangesLocked(const std::vector<RetentionChange>& changes, PendingWrite* w);
  // Puts manifests, blob and refs into the batch; updates refcounts_.
  Status FinishLocked(PendingWrite* w);
  // Stores w->new_blob_bytes as blob `id`: appended to the blob log (the
  // batch gets its location) when StoreOptions::blob_log, unless its record
  // there is intact, else put into the blobs family; a copy in the other
  // place goes.
  Status PutBlobBytesLocked(PendingWrite* w, const BlobId& id);
  // Deletes blob `id` from wherever it lives; its record becomes garbage.
  void DeleteBlobBytesLocked(PendingWrite* w, const BlobId& id);
  // After an append: when the log rolled past segment `was_active` and no
  // live record is left there, it is dead.
  void NoteRolledLocked(uint64_t was_active);
  // Counts a record of the blob log as garbage.
  void ReleaseRecordLocked(const BlobLocation& loc);
  // Deletes the segments with no live record (not the active one) once the
  // WAL records that dropped their last blob are synced; none while a
  // Verify holds deletions.
  Status DropDeadSegmentsLocked(bool wal_synced);
  // Garbage collection of the blob log (Compact): rewrites the live records
  // of each segment whose live bytes are below
  // StoreOptions::blob_log_gc_live_fraction into the active segment, syncs
  // it, moves their locations in one synced batch, then deletes the segment.
  Status CollectBlobLogLocked();
  // Writes the batch. On failure the store stops accepting writes (the index
  // may be ahead of the disk): for good, or until the disk has space again
  // when RocksDB ran out of it (ResourceExhausted). `what` names the write in
  // the error.
  Status WriteLocked(PendingWrite* w, const std::string& what, bool sync, const char* before,
                     const char* after);
  // OK when writes are accepted. After a no-space failure: DB::Resume() and a
  // reload of the index from disk, OK when both succeed, ResourceExhausted
  // while the disk is still full. After any other failure: that failure.
  Status WritableLocked();
  // Refuses writes from now on with `s` (recoverable: only a no-space failure).
  void BreakLocked(const Status& s, bool recoverable);
  // New version of `member` (commit, exploit, restore, import): everything
  // but the blob validation, under mu_.
  StatusOr<int64_t> AddVersionLocked(const std::string& exp, const std::string& member,
                                     Manifest manifest, MemberHead head, std::string event,
                                     PendingWrite* w, bool sync, const char* before,
                                     const char* after);
  Status SetPinned(const std::string& exp, const std::string& member, int64_t version, bool pinned);
  StatusOr<int64_t> AddBlobVersion(const std::string& exp, const std::string& member,
                                   std::optional<int64_t> expected_head, const void* blob,
                                   size_t size, std::optional<int64_t> step,
                                   const std::map<std::string, double>& metrics,
                                   const std::map<std::string, double>& hparams, const char* reason,
                                   const std::string& event_json, bool sync,
                                   const format::CheckpointView* verified, BlobId* id_out);

  void KillPoint(const char* point) const {
    if (options_.kill_point && point != nullptr) options_.kill_point(point);
  }

  const StoreOptions options_;
  const bool read_only_;
  const std::shared_ptr<BackgroundErrorPolicy> background_errors_ =
      std::make_shared<BackgroundErrorPolicy>();
  // Shared by every open of this store object (Refresh reopens with it).
  const std::shared_ptr<rocksdb::Cache> blob_cache_;
  // The blobs family's write_buffer_size as last set (SizeForWorkingSet).
  std::atomic<uint64_t> blob_memtable_bytes_;
  // Whether new blobs enter the blob cache (at flush: prepopulate_blob_cache;
  // on a read that misses: fill_cache); false while the working set is past
  // the cache's ceiling (SizeForWorkingSet).
  std::atomic<bool> blob_cache_fills_{true};
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  // The blob log, or null (StoreOptions::blob_log off and none on disk).
  // Read() from any thread; the rest under mu_.
  std::unique_ptr<BlobLog> log_;
  // Segment deletions wait while > 0 (a Verify reads through a view).
  std::atomic<int> segment_deletions_held_{0};

  // Serializes writes. Guards index_, refcounts_ and broken_.
  std::mutex mu_;
  RetentionIndex index_;
  std::map<BlobId, int64_t> refcounts_;
  // Blobs in the blob log and where; live record bytes per segment; segments
  // left with none (deleted after the write that emptied them).
  std::map<BlobId, BlobLocation> locations_;
  std::map<uint64_t, uint64_t> live_bytes_;
  std::set<uint64_t> dead_segments_;
  // The first failed write; every later write returns it, unless
  // broken_recoverable_ (no space) and the store could resume.
  Status broken_;
  bool broken_recoverable_ = false;
  // Bytes of the blob log record whose append found the disk full; writes
  // wait until that much fits again (0: none).
  uint64_t blob_space_needed_ = 0;
};

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_STORE_IMPL_H_
