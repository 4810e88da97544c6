// StoreImpl: ckpt::store::Store over RocksDB. The only file of the store that
// talks to RocksDB besides refcount_merge.cc; RocksDB statuses become ckpt
// Statuses here.
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/listener.h>
#include <rocksdb/merge_operator.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <utility>

#include "ckpt/format/checkpoint.h"
#include "ckpt/format/checksum.h"
#include "ckpt/store/store.h"
#include "codec.h"
#include "keys.h"
#include "refcount_merge.h"
#include "retention.h"

namespace ckpt::store {

double Manifest::score() const {
  auto it = metrics.find(kScoreMetric);
  return it == metrics.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
}

struct PinnedBlob::Impl {
  rocksdb::PinnableSlice slice;
};

PinnedBlob::PinnedBlob() = default;
PinnedBlob::~PinnedBlob() = default;
PinnedBlob::PinnedBlob(PinnedBlob&&) noexcept = default;
PinnedBlob& PinnedBlob::operator=(PinnedBlob&&) noexcept = default;

const uint8_t* PinnedBlob::data() const {
  return impl_ ? reinterpret_cast<const uint8_t*>(impl_->slice.data()) : nullptr;
}

size_t PinnedBlob::size() const { return impl_ ? impl_->slice.size() : 0; }

namespace {

// Column families, in the order they are opened; kDefault is RocksDB's own.
enum Family : int {
  kDefault = 0,
  kExperiments,
  kMembers,
  kCheckpoints,
  kBlobs,
  kRefs,
  kEvents,
  kNumFamilies
};
constexpr const char* kFamilyNames[kNumFamilies] = {
    "default", "experiments", "members", "checkpoints", "blobs", "refs", "events"};

// Written next to RocksDB's LOCK so a refused opener can name the holder.
constexpr const char kOwnerFile[] = "ckpt-owner";

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

std::string Id(const std::string& exp, const std::string& member) { return exp + "/" + member; }
std::string Id(const std::string& exp, const std::string& member, int64_t version) {
  return exp + "/" + member + " v" + std::to_string(version);
}

// OK when `data` hashes to `id` and parses as a checkpoint. Corruption naming
// the blob, and the tensor when one is at fault, otherwise.
Status CheckBlob(const BlobId& id, const uint8_t* data, size_t size) {
  format::ReadOptions structure;
  structure.verify_checksums = false;
  if (BlobId::Of(data, size) != id) {
    // The content hash covers every byte; the per-tensor checksums say where.
    auto parsed = format::ParseCheckpoint(data, size);
    return Status::Corruption(
        "blob " + id.Hex() + ": bytes do not hash to the blob id (" +
        (parsed.ok() ? std::string("no tensor checksum fails") : parsed.status().message()) + ")");
  }
  auto parsed = format::ParseCheckpoint(data, size, structure);
  if (!parsed.ok()) return parsed.status().WithPrefix("blob " + id.Hex());
  return Status::OK();
}

std::string ReadOwner(const std::string& path) {
  std::ifstream in(path + "/" + kOwnerFile);
  std::string line;
  std::getline(in, line);
  return line;
}

bool IsLockError(const rocksdb::Status& s) {
  return s.IsIOError() && (s.ToString().find("LOCK") != std::string::npos ||
                           s.ToString().find("lock") != std::string::npos);
}

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
      o.enable_blob_garbage_collection = true;
      o.blob_garbage_collection_age_cutoff = 0.5;
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

std::vector<rocksdb::ColumnFamilyDescriptor> Descriptors(
    const std::shared_ptr<rocksdb::Cache>& blob_cache, size_t blob_memtable_bytes) {
  std::vector<rocksdb::ColumnFamilyDescriptor> d;
  for (int f = 0; f < kNumFamilies; ++f) {
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
};

}  // namespace

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
  // Loads the retention index and reference counts (writer open).
  Status LoadIndex();
  // Sweeps retention with the current options and writes what it changed.
  Status SweepRetention();

  Status Refresh() override {
    if (!read_only_) return Status::OK();
    CloseDb();
    return OpenDb();
  }

  void CloseDb() {
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
  StatusOr<int64_t> Restore(const std::string& exp, const std::string& member,
                            int64_t version) override;
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

  StatusOr<PinnedBlob> ReadBlob(const BlobId& id, bool verify) override;
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
  uint64_t blob_memtable_bytes() const override { return blob_memtable_bytes_.load(); }

 private:
  rocksdb::ColumnFamilyHandle* cf(Family f) const { return handles_[f]; }

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
                                   const std::string& event_json, bool sync);

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
  std::unique_ptr<rocksdb::DB> db_;
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;

  // Serializes writes. Guards index_, refcounts_ and broken_.
  std::mutex mu_;
  RetentionIndex index_;
  std::map<BlobId, int64_t> refcounts_;
  // The first failed write; every later write returns it, unless
  // broken_recoverable_ (no space) and the store could resume.
  Status broken_;
  bool broken_recoverable_ = false;
};

namespace {
Status ValidateOptions(const StoreOptions& o);
}  // namespace

Status StoreImpl::OpenDb() {
  const std::string& path = options_.path;
  rocksdb::DBOptions db_options;
  db_options.create_if_missing = options_.create_if_missing && !read_only_;
  db_options.create_missing_column_families = !read_only_;
  db_options.keep_log_file_num = 4;
  db_options.max_log_file_size = 4u << 20;
  if (!read_only_) {
    std::error_code ec;
    if (options_.create_if_missing) std::filesystem::create_directories(path, ec);
    db_options.info_log = std::make_shared<InfoLog>(path + "/LOG");
    db_options.listeners.push_back(background_errors_);
  }
  db_options.max_background_jobs = 2;
  // No fallocate: RocksDB would reserve a WAL's worth of space past the
  // memtable size (17.6 MiB for a 16 MiB memtable) per file and give it back
  // at close, so a full disk would show up late and go away by itself at
  // random; without it a write fails exactly when its bytes do not fit.
  db_options.allow_fallocate = false;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s;
  if (read_only_) {
    if (!std::filesystem::exists(path + "/CURRENT")) {
      return Status::NotFound("no store at " + path);
    }
    // Every table file is opened now, so a writer deleting one later does not
    // take it from under the view.
    db_options.max_open_files = -1;
    // RocksDB secondary instances do not support integrated blob files
    // (upstream issue 13296; 7.8 crashes reading one), so the view is a
    // read-only instance: a consistent image of the store as of the open.
    // The writer may delete files under it; opening retries, Refresh() reopens.
    for (int attempt = 0; attempt < 3; ++attempt) {
      s = rocksdb::DB::OpenForReadOnly(db_options, path,
                                       Descriptors(blob_cache_, blob_memtable_bytes_), &handles_,
                                       &raw, /*error_if_wal_file_exists=*/false);
      if (s.ok() || !(s.IsIOError() || s.IsCorruption() || s.IsPathNotFound())) break;
    }
  } else {
    s = rocksdb::DB::Open(db_options, path, Descriptors(blob_cache_, blob_memtable_bytes_),
                          &handles_, &raw);
  }
  if (!s.ok()) {
    if (!read_only_ && IsLockError(s)) {
      if (s.ToString().find("current process") != std::string::npos) {
        return Status::Unavailable("store " + path + " is already open in this process (" +
                                   s.ToString() + ")");
      }
      std::string owner = ReadOwner(path);
      return Status::Unavailable("store " + path + " is held by another process" +
                                 (owner.empty() ? std::string() : " (" + owner + ")") +
                                 "; open it read-only to inspect it (" + s.ToString() + ")");
    }
    if (s.IsInvalidArgument() && s.ToString().find("does not exist") != std::string::npos) {
      return Status::NotFound("no store at " + path + " (" + s.ToString() + ")");
    }
    return FromRocks(s, "store " + path + ": open");
  }
  db_.reset(raw);
  if (!read_only_) {
    std::ofstream owner(path + "/" + kOwnerFile, std::ios::trunc);
    owner << "pid " << getpid() << "\n";
  }
  return Status::OK();
}

Status StoreImpl::Get(Family f, const std::string& key, const std::string& what,
                      std::string* value) const {
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf(f), key, value);
  if (s.IsNotFound()) return Status::NotFound(what + " not found");
  return FromRocks(s, what);
}

Status StoreImpl::ExperimentExists(const std::string& exp) const {
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  std::string v;
  return Get(kExperiments, keys::Experiment(exp), "experiment " + exp, &v);
}

StatusOr<MemberHead> StoreImpl::ReadHead(const std::string& exp, const std::string& member) const {
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  CKPT_RETURN_IF_ERROR(keys::ValidateId("member id", member));
  std::string v;
  Status s = Get(kMembers, keys::Member(exp, member), "member " + Id(exp, member), &v);
  if (s.IsNotFound()) {
    CKPT_RETURN_IF_ERROR(ExperimentExists(exp));
  }
  CKPT_RETURN_IF_ERROR(s);
  auto head = codec::DecodeHead(member, v);
  if (!head.ok()) return head.status().WithPrefix("experiment " + exp);
  return head;
}

StatusOr<Manifest> StoreImpl::ReadManifest(const std::string& exp, const std::string& member,
                                           int64_t version) const {
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  CKPT_RETURN_IF_ERROR(keys::ValidateId("member id", member));
  std::string v;
  CKPT_RETURN_IF_ERROR(Get(kCheckpoints, keys::Manifest(exp, member, version),
                           "manifest " + Id(exp, member, version), &v));
  auto m = codec::DecodeManifest(member, v);
  if (!m.ok()) return m.status().WithPrefix(Id(exp, member, version));
  if (m->version != version) {
    return Status::Corruption("manifest " + Id(exp, member, version) + " holds version " +
                              std::to_string(m->version));
  }
  return m;
}

Status StoreImpl::LoadIndex() {
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kExperiments)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) index_.AddExperiment(it->key().ToString());
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load experiments"));
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kMembers)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      std::string exp, member;
      if (!keys::ParseMember(it->key().ToStringView(), &exp, &member)) {
        return Status::Corruption("store " + options_.path + ": malformed members key");
      }
      CKPT_ASSIGN_OR_RETURN(MemberHead head, codec::DecodeHead(member, it->value().ToStringView()));
      index_.AddMember(exp, std::move(head));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load members"));
  }
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kCheckpoints)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      std::string exp, member;
      int64_t version;
      if (!keys::ParseManifest(it->key().ToStringView(), &exp, &member, &version)) {
        return Status::Corruption("store " + options_.path + ": malformed checkpoints key");
      }
      auto m = codec::DecodeManifest(member, it->value().ToStringView());
      if (!m.ok()) return m.status().WithPrefix(Id(exp, member, version));
      if (!index_.HasMember(exp, member)) {
        return Status::Corruption("manifest " + Id(exp, member, version) + " belongs to no member");
      }
      RetentionIndex::VersionInfo info;
      info.blob = m->blob;
      info.bytes = m->bytes;
      info.holds_blob = m->holds_blob;
      info.pinned = m->pinned;
      info.score = m->score();
      info.scored = m->reason == kReasonTrained && std::isfinite(info.score);
      info.parent = m->parent;
      if (m->holds_blob) info.manifest = std::make_shared<const Manifest>(std::move(*m));
      index_.LoadVersion(exp, member, version, std::move(info));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load manifests"));
  }
  index_.FinishLoad();
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kRefs)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      BlobId id;
      int64_t n;
      if (!BlobId::FromBytes(it->key().ToStringView(), &id) ||
          !keys::DecodeCount(it->value().ToStringView(), &n)) {
        return Status::Corruption("store " + options_.path + ": malformed refs entry");
      }
      refcounts_[id] = n;
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load refs"));
  }
  {
    // The last event of each experiment: the key just before the next prefix.
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kEvents)));
    for (it->SeekToLast(); it->Valid();) {
      std::string exp;
      uint64_t seq;
      if (!keys::ParseEvent(it->key().ToStringView(), &exp, &seq)) {
        return Status::Corruption("store " + options_.path + ": malformed events key");
      }
      index_.SetLastEventSeq(exp, seq);
      it->SeekForPrev(keys::ExperimentPrefix(exp));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load events"));
  }
  return Status::OK();
}

Status StoreImpl::SweepRetention() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RetentionChange> changes;
  index_.SweepAll(&changes);
  if (changes.empty()) return Status::OK();
  PendingWrite w;
  CKPT_RETURN_IF_ERROR(AddChangesLocked(changes, &w));
  CKPT_RETURN_IF_ERROR(FinishLocked(&w));
  return WriteLocked(&w, "the retention sweep", /*sync=*/true, nullptr, nullptr);
}

Status StoreImpl::MemberExistsLocked(const std::string& exp, const std::string& member) const {
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  CKPT_RETURN_IF_ERROR(keys::ValidateId("member id", member));
  if (!index_.HasExperiment(exp)) return Status::NotFound("experiment " + exp + " not found");
  if (!index_.HasMember(exp, member)) {
    return Status::NotFound("member " + Id(exp, member) + " not found");
  }
  return Status::OK();
}

StatusOr<Manifest> StoreImpl::RetainedManifestLocked(const std::string& exp,
                                                     const std::string& member,
                                                     int64_t version) const {
  const RetentionIndex::VersionInfo* info = index_.Find(exp, member, version);
  if (info == nullptr) {
    return Status::NotFound("manifest " + Id(exp, member, version) + " not found");
  }
  if (!info->holds_blob) {
    return Status::FailedPrecondition(Id(exp, member, version) +
                                      ": its blob was released by retention");
  }
  if (info->manifest) return *info->manifest;
  return ReadManifest(exp, member, version);
}

Status StoreImpl::AddChangesLocked(const std::vector<RetentionChange>& changes, PendingWrite* w) {
  for (const RetentionChange& c : changes) {
    std::string key = keys::Manifest(c.exp, c.ref.member, c.ref.version);
    if (c.release_blob) {
      KillPoint("retention.release");
      w->ref_deltas[c.blob] -= 1;
    }
    if (c.erase) {
      w->manifests[key] = std::nullopt;
      continue;
    }
    if (c.release_blob) {
      auto it = w->manifests.find(key);
      if (it == w->manifests.end()) {
        if (c.manifest) {
          it = w->manifests.emplace(key, *c.manifest).first;
        } else {
          CKPT_ASSIGN_OR_RETURN(Manifest m, ReadManifest(c.exp, c.ref.member, c.ref.version));
          it = w->manifests.emplace(key, std::move(m)).first;
        }
      }
      if (it->second) it->second->holds_blob = false;
    }
  }
  return Status::OK();
}

Status StoreImpl::FinishLocked(PendingWrite* w) {
  for (const auto& [key, m] : w->manifests) {
    if (m) {
      w->batch.Put(cf(kCheckpoints), key, codec::EncodeManifest(*m));
    } else {
      w->batch.Delete(cf(kCheckpoints), key);
    }
  }
  for (const auto& [id, delta] : w->ref_deltas) {
    if (delta == 0) continue;
    auto it = refcounts_.find(id);
    int64_t before = it == refcounts_.end() ? 0 : it->second;
    int64_t after = before + delta;
    std::string key = id.Bytes();
    if (after < 0) {
      return Status::Internal("blob " + id.Hex() + ": reference count would drop to " +
                              std::to_string(after));
    }
    if (before == 0 && after > 0) {
      if (!w->new_blob || *w->new_blob != id) {
        return Status::Internal("blob " + id.Hex() + " gains a reference but is not stored");
      }
      w->batch.Put(cf(kBlobs), key, w->new_blob_bytes);
      w->batch.Put(cf(kRefs), key, keys::EncodeCount(after));
    } else if (after == 0) {
      w->batch.Delete(cf(kBlobs), key);
      w->batch.Delete(cf(kRefs), key);
    } else {
      // A write that brings the bytes of a blob already stored writes them
      // again: a stored copy damaged on disk is replaced by this intact one
      // (a member that fell back from a damaged head retrains to the very
      // same bytes, and would otherwise get the damaged copy back as its head).
      if (delta > 0 && w->new_blob && *w->new_blob == id) {
        w->batch.Put(cf(kBlobs), key, w->new_blob_bytes);
      }
      w->batch.Merge(cf(kRefs), key, keys::EncodeCount(delta));
    }
    if (after == 0) {
      refcounts_.erase(id);
    } else {
      refcounts_[id] = after;
    }
  }
  return Status::OK();
}

Status StoreImpl::WriteLocked(PendingWrite* w, const std::string& what, bool sync,
                              const char* before, const char* after) {
  KillPoint(before);
  rocksdb::WriteOptions wo;
  wo.sync = sync;
  const rocksdb::Status rs = db_->Write(wo, &w->batch);
  if (!rs.ok()) {
    // RocksDB reports a full disk as NoSpace, from this write's WAL append or
    // from an earlier flush or compaction (its background error).
    const bool no_space = rs.IsNoSpace();
    Status s = no_space ? Status::ResourceExhausted("store " + options_.path +
                                                    ": no space left on the device to write " +
                                                    what + " (" + rs.ToString() + ")")
                        : FromRocks(rs, "store " + options_.path + ": write of " + what);
    BreakLocked(s, no_space);
    return s;
  }
  KillPoint(after);
  return Status::OK();
}

void StoreImpl::BreakLocked(const Status& s, bool recoverable) {
  broken_ = recoverable ? s : s.WithPrefix("store refuses writes after a failed write; reopen it");
  broken_recoverable_ = recoverable;
}

Status StoreImpl::WritableLocked() {
  if (broken_.ok()) return Status::OK();
  if (!broken_recoverable_) return broken_;
  // Resume() flushes the memtables (which needs space too) and clears
  // RocksDB's background error; Busy while RocksDB's own recovery
  // (SstFileManager) is at it. The failed batch never reached the memtable,
  // so the disk is the truth: the index is reloaded from it.
  const rocksdb::Status r = db_->Resume();
  if (!r.ok()) {
    if (r.IsNoSpace() || r.IsBusy() || r.IsIOError()) {
      return Status::ResourceExhausted("store " + options_.path +
                                       ": still no space to write (resume: " + r.ToString() +
                                       "); first failure: " + broken_.message());
    }
    BreakLocked(FromRocks(r, "store " + options_.path + ": resuming after no space"), false);
    return broken_;
  }
  index_ = RetentionIndex(index_.policy());
  refcounts_.clear();
  Status loaded = LoadIndex();
  if (!loaded.ok()) {
    BreakLocked(loaded.WithPrefix("store " + options_.path + ": reloading after no space"), false);
    return broken_;
  }
  broken_ = Status::OK();
  broken_recoverable_ = false;
  return Status::OK();
}

StatusOr<int64_t> StoreImpl::AddVersionLocked(const std::string& exp, const std::string& member,
                                              Manifest manifest, MemberHead head, std::string event,
                                              PendingWrite* w, bool sync, const char* before,
                                              const char* after) {
  const int64_t version = manifest.version;
  const std::string manifest_what =
      "the " + manifest.reason + " of " + Id(exp, member, version) +
      (w->new_blob ? " (" + std::to_string(w->new_blob_bytes.size()) + " bytes)" : "");
  RetentionIndex::VersionInfo info;
  info.blob = manifest.blob;
  info.bytes = manifest.bytes;
  info.score = manifest.score();
  info.scored = manifest.reason == kReasonTrained && std::isfinite(info.score);
  info.parent = manifest.parent;
  info.manifest = std::make_shared<const Manifest>(manifest);

  uint64_t seq = index_.LastEventSeq(exp) + 1;
  w->ref_deltas[manifest.blob] += 1;
  w->manifests[keys::Manifest(exp, member, version)] = std::move(manifest);
  w->batch.Put(cf(kMembers), keys::Member(exp, member), codec::EncodeHead(head));
  w->batch.Put(cf(kEvents), keys::Event(exp, seq), event);

  std::vector<RetentionChange> changes;
  index_.AddVersion(exp, member, version, std::move(info), std::move(head), &changes);
  index_.SetLastEventSeq(exp, seq);
  // From here on the index is ahead of the disk: a failure breaks the store.
  Status s = AddChangesLocked(changes, w);
  if (s.ok()) s = FinishLocked(w);
  if (!s.ok()) {
    BreakLocked(s, /*recoverable=*/false);
    return s;
  }
  CKPT_RETURN_IF_ERROR(WriteLocked(w, manifest_what, sync, before, after));
  return version;
}

StatusOr<int64_t> StoreImpl::AddBlobVersion(const std::string& exp, const std::string& member,
                                            std::optional<int64_t> expected_head, const void* blob,
                                            size_t size, std::optional<int64_t> step,
                                            const std::map<std::string, double>& metrics,
                                            const std::map<std::string, double>& hparams,
                                            const char* reason, const std::string& event_json,
                                            bool sync) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  CKPT_RETURN_IF_ERROR(keys::ValidateId("member id", member));
  if (blob == nullptr || size == 0) {
    return Status::InvalidArgument(Id(exp, member) + ": empty blob");
  }
  if (size > options_.max_blob_bytes) {
    return Status::InvalidArgument(Id(exp, member) + ": blob of " + std::to_string(size) +
                                   " bytes exceeds max_blob_bytes " +
                                   std::to_string(options_.max_blob_bytes));
  }
  // Validation and hashing run before taking the lock: they read every byte.
  auto parsed = format::ParseCheckpoint(blob, size);
  if (!parsed.ok()) {
    return Status::Corruption(Id(exp, member) + ": " + reason +
                              " rejected: " + parsed.status().message());
  }
  const int64_t blob_step = step ? *step : parsed->meta().step;
  const BlobId id = BlobId::Of(blob, size);

  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, member));
  const int64_t head_version = index_.Head(exp, member);
  if (expected_head && *expected_head != head_version) {
    return Status::Aborted(Id(exp, member) + ": head is v" + std::to_string(head_version) +
                           ", the result was trained from v" + std::to_string(*expected_head));
  }
  MemberHead head = *index_.HeadRecord(exp, member);
  const int64_t version = head_version + 1;

  Manifest m;
  m.member = member;
  m.version = version;
  m.blob = id;
  m.bytes = size;
  m.step = blob_step;
  m.metrics = metrics;
  m.hparams = hparams;
  if (std::string(reason) == kReasonTrained && head_version > 0 &&
      index_.Find(exp, member, head_version) != nullptr) {
    m.parent = VersionRef{member, head_version};
  }
  m.reason = reason;
  m.unix_ms = codec::NowUnixMs();
  const bool trained = std::string(reason) == kReasonTrained;
  CKPT_ASSIGN_OR_RETURN(
      std::string event,
      codec::BuildEvent(event_json, trained ? "commit" : reason, exp,
                        {{"member", member}, {"reason", reason}, {"blob", id.Hex()}},
                        {{"version", version}, {"step", blob_step}}));

  head.version = version;
  head.last_score = m.score();
  head.hparams = hparams;
  head.step = blob_step;
  head.blob = id;
  head.updated_unix_ms = m.unix_ms;

  PendingWrite w;
  w.new_blob = id;
  w.new_blob_bytes = rocksdb::Slice(static_cast<const char*>(blob), size);
  return AddVersionLocked(exp, member, std::move(m), std::move(head), std::move(event), &w, sync,
                          trained ? "commit.before_write" : "import.before_write",
                          trained ? "commit.after_write" : "import.after_write");
}

StatusOr<int64_t> StoreImpl::CommitResult(const CommitRequest& r) {
  return AddBlobVersion(r.exp, r.member, r.expected_head_version, r.blob, r.blob_size, r.step,
                        r.metrics, r.hparams, kReasonTrained, r.event_json,
                        options_.sync_interval_commits);
}

StatusOr<int64_t> StoreImpl::Import(const std::string& exp, const std::string& member,
                                    const void* blob, size_t blob_size,
                                    const std::map<std::string, double>& hparams) {
  return AddBlobVersion(exp, member, std::nullopt, blob, blob_size, std::nullopt, {}, hparams,
                        kReasonImport, "", /*sync=*/true);
}

StatusOr<int64_t> StoreImpl::Exploit(const std::string& exp, const std::string& dst,
                                     const std::string& src,
                                     const std::map<std::string, double>& hparams,
                                     const std::string& event_json) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  if (dst == src) return Status::InvalidArgument(Id(exp, dst) + ": exploit of itself");
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, dst));
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, src));
  const int64_t src_version = index_.Head(exp, src);
  if (src_version == 0) {
    return Status::FailedPrecondition(Id(exp, dst) + ": donor " + src + " has no version yet");
  }
  CKPT_ASSIGN_OR_RETURN(Manifest donor, RetainedManifestLocked(exp, src, src_version));
  MemberHead head = *index_.HeadRecord(exp, dst);
  const int64_t version = index_.Head(exp, dst) + 1;
  CKPT_ASSIGN_OR_RETURN(
      std::string event,
      codec::BuildEvent(
          event_json, kReasonExploit, exp,
          {{"member", dst}, {"donor", src}, {"reason", kReasonExploit}, {"blob", donor.blob.Hex()}},
          {{"version", version}, {"donor_version", src_version}}));
  Manifest m = donor;
  m.member = dst;
  m.version = version;
  m.hparams = hparams;
  m.parent = VersionRef{src, src_version};
  m.reason = kReasonExploit;
  m.unix_ms = codec::NowUnixMs();
  m.pinned = false;
  m.holds_blob = true;

  head.version = version;
  head.last_score = donor.score();
  head.hparams = hparams;
  head.step = donor.step;
  head.blob = donor.blob;
  head.updated_unix_ms = m.unix_ms;
  PendingWrite w;
  return AddVersionLocked(exp, dst, std::move(m), std::move(head), std::move(event), &w,
                          options_.sync_interval_commits, "exploit.before_write",
                          "exploit.after_write");
}

StatusOr<int64_t> StoreImpl::Restore(const std::string& exp, const std::string& member,
                                     int64_t version) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, member));
  CKPT_ASSIGN_OR_RETURN(Manifest old, RetainedManifestLocked(exp, member, version));
  MemberHead head = *index_.HeadRecord(exp, member);
  const int64_t new_version = index_.Head(exp, member) + 1;
  CKPT_ASSIGN_OR_RETURN(
      std::string event,
      codec::BuildEvent("", kReasonRestore, exp,
                        {{"member", member}, {"reason", kReasonRestore}, {"blob", old.blob.Hex()}},
                        {{"version", new_version}, {"restored_version", version}}));
  Manifest m = old;
  m.version = new_version;
  m.parent = VersionRef{member, version};
  m.reason = kReasonRestore;
  m.unix_ms = codec::NowUnixMs();
  m.pinned = false;

  head.version = new_version;
  head.last_score = old.score();
  head.hparams = old.hparams;
  head.step = old.step;
  head.blob = old.blob;
  head.updated_unix_ms = m.unix_ms;
  PendingWrite w;
  return AddVersionLocked(exp, member, std::move(m), std::move(head), std::move(event), &w,
                          /*sync=*/true, "restore.before_write", "restore.after_write");
}

Status StoreImpl::SetPinned(const std::string& exp, const std::string& member, int64_t version,
                            bool pinned) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, member));
  const RetentionIndex::VersionInfo* info = index_.Find(exp, member, version);
  if (info == nullptr) {
    return Status::NotFound("manifest " + Id(exp, member, version) + " not found");
  }
  if (pinned && !info->holds_blob) {
    return Status::FailedPrecondition(Id(exp, member, version) +
                                      ": its blob was released by retention");
  }
  if (info->pinned == pinned) return Status::OK();
  Manifest m;
  if (info->manifest) {
    m = *info->manifest;
  } else {
    CKPT_ASSIGN_OR_RETURN(m, ReadManifest(exp, member, version));
  }
  m.pinned = pinned;
  auto updated = std::make_shared<const Manifest>(m);
  PendingWrite w;
  w.manifests[keys::Manifest(exp, member, version)] = std::move(m);
  std::vector<RetentionChange> changes;
  index_.SetPinned(exp, member, version, pinned, std::move(updated), &changes);
  Status s = AddChangesLocked(changes, &w);
  if (s.ok()) s = FinishLocked(&w);
  if (!s.ok()) {
    BreakLocked(s, /*recoverable=*/false);
    return s;
  }
  return WriteLocked(&w, (pinned ? "the pin of " : "the unpin of ") + Id(exp, member, version),
                     /*sync=*/true, "pin.before_write", "pin.after_write");
}

// ---- experiments and members ----

Status StoreImpl::CreateExperiment(const std::string& id, const std::string& config_json) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", id));
  CKPT_RETURN_IF_ERROR(codec::ValidateJson("config of experiment " + id, config_json));
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  if (index_.HasExperiment(id)) return Status::AlreadyExists("experiment " + id + " exists");
  ExperimentInfo info{id, config_json, "created", codec::NowUnixMs()};
  PendingWrite w;
  w.batch.Put(cf(kExperiments), keys::Experiment(id), codec::EncodeExperiment(info));
  CKPT_RETURN_IF_ERROR(WriteLocked(&w, "experiment " + id, /*sync=*/true, nullptr, nullptr));
  index_.AddExperiment(id);
  return Status::OK();
}

StatusOr<ExperimentInfo> StoreImpl::GetExperiment(const std::string& id) {
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", id));
  std::string v;
  CKPT_RETURN_IF_ERROR(Get(kExperiments, keys::Experiment(id), "experiment " + id, &v));
  return codec::DecodeExperiment(id, v);
}

StatusOr<std::vector<ExperimentInfo>> StoreImpl::ListExperiments() {
  std::vector<ExperimentInfo> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf(kExperiments)));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    CKPT_ASSIGN_OR_RETURN(ExperimentInfo info, codec::DecodeExperiment(it->key().ToString(),
                                                                       it->value().ToStringView()));
    out.push_back(std::move(info));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "list experiments"));
  return out;
}

Status StoreImpl::SetExperimentStatus(const std::string& id, const std::string& status) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_ASSIGN_OR_RETURN(ExperimentInfo info, GetExperiment(id));
  info.status = status;
  PendingWrite w;
  w.batch.Put(cf(kExperiments), keys::Experiment(id), codec::EncodeExperiment(info));
  return WriteLocked(&w, "the status of experiment " + id, /*sync=*/true, nullptr, nullptr);
}

Status StoreImpl::DeleteExperiment(const std::string& id) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", id));
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  if (!index_.HasExperiment(id)) return Status::NotFound("experiment " + id + " not found");
  PendingWrite w;
  const std::string prefix = keys::ExperimentPrefix(id);
  const std::string end = keys::PrefixEnd(prefix);
  w.batch.Delete(cf(kExperiments), keys::Experiment(id));
  w.batch.DeleteRange(cf(kMembers), prefix, end);
  w.batch.DeleteRange(cf(kCheckpoints), prefix, end);
  w.batch.DeleteRange(cf(kEvents), prefix, end);
  for (const RetentionChange& c : index_.RemoveExperiment(id)) {
    if (c.release_blob) w.ref_deltas[c.blob] -= 1;
  }
  Status s = FinishLocked(&w);
  if (!s.ok()) {
    BreakLocked(s, /*recoverable=*/false);
    return s;
  }
  return WriteLocked(&w, "the deletion of experiment " + id, /*sync=*/true, "delete.before_write",
                     "delete.after_write");
}

Status StoreImpl::CreateMembers(
    const std::string& exp,
    const std::map<std::string, std::map<std::string, double>>& hparams_by_member) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  for (const auto& [member, hp] : hparams_by_member) {
    CKPT_RETURN_IF_ERROR(keys::ValidateId("member id", member));
  }
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  if (!index_.HasExperiment(exp)) return Status::NotFound("experiment " + exp + " not found");
  PendingWrite w;
  const int64_t now = codec::NowUnixMs();
  std::vector<MemberHead> heads;
  for (const auto& [member, hp] : hparams_by_member) {
    if (index_.HasMember(exp, member)) {
      return Status::AlreadyExists("member " + Id(exp, member) + " exists");
    }
    MemberHead head;
    head.member = member;
    head.state = "created";
    head.hparams = hp;
    head.updated_unix_ms = now;
    w.batch.Put(cf(kMembers), keys::Member(exp, member), codec::EncodeHead(head));
    heads.push_back(std::move(head));
  }
  CKPT_RETURN_IF_ERROR(
      WriteLocked(&w, "the members of experiment " + exp, /*sync=*/true, nullptr, nullptr));
  for (auto& head : heads) index_.AddMember(exp, std::move(head));
  return Status::OK();
}

StatusOr<MemberHead> StoreImpl::GetMember(const std::string& exp, const std::string& member) {
  return ReadHead(exp, member);
}

StatusOr<std::vector<MemberHead>> StoreImpl::ListMembers(const std::string& exp) {
  CKPT_RETURN_IF_ERROR(ExperimentExists(exp));
  const std::string prefix = keys::ExperimentPrefix(exp);
  const std::string end = keys::PrefixEnd(prefix);
  rocksdb::Slice upper(end);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper;
  std::vector<MemberHead> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kMembers)));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    std::string e, member;
    if (!keys::ParseMember(it->key().ToStringView(), &e, &member)) {
      return Status::Corruption("experiment " + exp + ": malformed members key");
    }
    CKPT_ASSIGN_OR_RETURN(MemberHead head, codec::DecodeHead(member, it->value().ToStringView()));
    out.push_back(std::move(head));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "list members of " + exp));
  return out;
}

Status StoreImpl::SetMemberState(const std::string& exp, const std::string& member,
                                 const std::string& state) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, member));
  MemberHead head = *index_.HeadRecord(exp, member);
  head.state = state;
  head.updated_unix_ms = codec::NowUnixMs();
  PendingWrite w;
  w.batch.Put(cf(kMembers), keys::Member(exp, member), codec::EncodeHead(head));
  CKPT_RETURN_IF_ERROR(WriteLocked(&w, "the state of member " + Id(exp, member),
                                   options_.sync_interval_commits, nullptr, nullptr));
  index_.SetHeadRecord(exp, std::move(head));
  return Status::OK();
}

// ---- versions ----

StatusOr<Manifest> StoreImpl::GetManifest(const std::string& exp, const std::string& member,
                                          int64_t version) {
  return ReadManifest(exp, member, version);
}

StatusOr<std::vector<Manifest>> StoreImpl::ListVersions(const std::string& exp,
                                                        const std::string& member) {
  CKPT_ASSIGN_OR_RETURN(MemberHead head, ReadHead(exp, member));
  const std::string prefix = keys::ManifestPrefix(exp, member);
  const std::string end = keys::PrefixEnd(prefix);
  rocksdb::Slice upper(end);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper;
  std::vector<Manifest> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kCheckpoints)));
  for (it->Seek(prefix); it->Valid(); it->Next()) {
    auto m = codec::DecodeManifest(member, it->value().ToStringView());
    if (!m.ok()) return m.status().WithPrefix("experiment " + exp);
    out.push_back(std::move(*m));
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "list versions of " + Id(exp, member)));
  return out;
}

StatusOr<std::vector<Manifest>> StoreImpl::Lineage(const std::string& exp,
                                                   const std::string& member) {
  CKPT_ASSIGN_OR_RETURN(MemberHead head, ReadHead(exp, member));
  std::vector<Manifest> out;
  if (head.version == 0) return out;
  std::optional<VersionRef> next = VersionRef{member, head.version};
  std::set<std::pair<std::string, int64_t>> seen;
  while (next) {
    if (!seen.insert({next->member, next->version}).second) {
      return Status::Corruption("lineage of " + Id(exp, member) + " loops at " +
                                Id(exp, next->member, next->version));
    }
    auto m = ReadManifest(exp, next->member, next->version);
    if (m.status().IsNotFound()) break;  // retention deleted the rest
    if (!m.ok()) return m.status();
    next = m->parent;
    out.push_back(std::move(*m));
  }
  return out;
}

// ---- blobs ----

StatusOr<PinnedBlob> StoreImpl::ReadBlob(const BlobId& id, bool verify) {
  PinnedBlob out;
  out.impl_ = std::make_unique<PinnedBlob::Impl>();
  out.id_ = id;
  rocksdb::ReadOptions ro;
  // The content hash below covers every byte; RocksDB's CRC pass would be a second one.
  ro.verify_checksums = false;
  rocksdb::Status s = db_->Get(ro, cf(kBlobs), id.Bytes(), &out.impl_->slice);
  if (s.IsNotFound()) return Status::NotFound("blob " + id.Hex() + " not found");
  CKPT_RETURN_IF_ERROR(FromRocks(s, "blob " + id.Hex()));
  if (verify) CKPT_RETURN_IF_ERROR(CheckBlob(id, out.data(), out.size()));
  return out;
}

StatusOr<PinnedBlob> StoreImpl::ReadHeadBlob(const std::string& exp, const std::string& member,
                                             bool verify) {
  CKPT_ASSIGN_OR_RETURN(MemberHead head, ReadHead(exp, member));
  if (!head.blob) return Status::NotFound(Id(exp, member) + " has no version yet");
  auto blob = ReadBlob(*head.blob, verify);
  if (!blob.ok()) return blob.status().WithPrefix(Id(exp, member, head.version));
  return blob;
}

// ---- events ----

StatusOr<uint64_t> StoreImpl::AppendEvent(const std::string& exp, const std::string& json) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  CKPT_RETURN_IF_ERROR(keys::ValidateId("experiment id", exp));
  if (json.empty()) return Status::InvalidArgument("event of " + exp + " is empty");
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  if (!index_.HasExperiment(exp)) return Status::NotFound("experiment " + exp + " not found");
  CKPT_ASSIGN_OR_RETURN(std::string event, codec::BuildEvent(json, "note", exp, {}, {}));
  const uint64_t seq = index_.LastEventSeq(exp) + 1;
  PendingWrite w;
  w.batch.Put(cf(kEvents), keys::Event(exp, seq), event);
  CKPT_RETURN_IF_ERROR(WriteLocked(&w, "event " + std::to_string(seq) + " of experiment " + exp,
                                   options_.sync_interval_commits, nullptr, nullptr));
  index_.SetLastEventSeq(exp, seq);
  return seq;
}

StatusOr<std::vector<Event>> StoreImpl::ListEvents(const std::string& exp, uint64_t from_seq,
                                                   size_t limit) {
  CKPT_RETURN_IF_ERROR(ExperimentExists(exp));
  const std::string end = keys::PrefixEnd(keys::ExperimentPrefix(exp));
  rocksdb::Slice upper(end);
  rocksdb::ReadOptions ro;
  ro.iterate_upper_bound = &upper;
  std::vector<Event> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kEvents)));
  for (it->Seek(keys::Event(exp, from_seq)); it->Valid() && out.size() < limit; it->Next()) {
    std::string e;
    uint64_t seq;
    if (!keys::ParseEvent(it->key().ToStringView(), &e, &seq)) {
      return Status::Corruption("experiment " + exp + ": malformed events key");
    }
    out.push_back(Event{seq, it->value().ToString()});
  }
  CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "list events of " + exp));
  return out;
}

// ---- maintenance ----

StatusOr<VerifyReport> StoreImpl::Verify() {
  if (options_.blob_cache_bytes == 0) return VerifyHere();
  StoreOptions o = options_;
  o.blob_cache_bytes = 0;
  o.kill_point = nullptr;
  // The writer keeps every file while the uncached view reads them.
  if (!read_only_) {
    CKPT_RETURN_IF_ERROR(FromRocks(db_->DisableFileDeletions(), "verify: hold files"));
  }
  StatusOr<VerifyReport> report = Status::Internal("verify did not run");
  {
    auto view = Store::OpenReadOnly(o);
    report = view.ok() ? (*view)->Verify() : StatusOr<VerifyReport>(view.status());
  }
  if (!read_only_) {
    Status s = FromRocks(db_->EnableFileDeletions(/*force=*/false), "verify: release files");
    if (!s.ok() && report.ok()) return s;
  }
  return report;
}

StatusOr<VerifyReport> StoreImpl::VerifyHere() {
  VerifyReport report;
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  // Manifests holding a blob, per blob: the count refs must hold.
  std::map<BlobId, int64_t> holders;
  std::map<BlobId, std::string> first_holder;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kCheckpoints)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ++report.manifests_checked;
      std::string exp, member;
      int64_t version;
      if (!keys::ParseManifest(it->key().ToStringView(), &exp, &member, &version)) {
        report.problems.push_back("malformed checkpoints key");
        continue;
      }
      auto m = codec::DecodeManifest(member, it->value().ToStringView());
      if (!m.ok()) {
        report.problems.push_back(Id(exp, member, version) + ": " + m.status().message());
        continue;
      }
      if (!m->holds_blob) continue;
      ++holders[m->blob];
      first_holder.emplace(m->blob, Id(exp, member, version));
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "verify: scan manifests"));
  }
  std::map<BlobId, int64_t> refs;
  {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kRefs)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      BlobId id;
      int64_t n;
      if (!BlobId::FromBytes(it->key().ToStringView(), &id) ||
          !keys::DecodeCount(it->value().ToStringView(), &n)) {
        report.problems.push_back("malformed refs entry");
        continue;
      }
      refs[id] = n;
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "verify: scan refs"));
  }
  // Each blob is read once, by point lookups, so that one unreadable blob
  // does not hide the others.
  std::set<BlobId> all;
  for (const auto& [id, n] : holders) all.insert(id);
  for (const auto& [id, n] : refs) all.insert(id);
  for (const BlobId& id : all) {
    const int64_t held = holders.count(id) ? holders[id] : 0;
    const int64_t counted = refs.count(id) ? refs[id] : 0;
    if (held != counted) {
      report.problems.push_back("blob " + id.Hex() + ": reference count " +
                                std::to_string(counted) + " but " + std::to_string(held) +
                                " manifests hold it");
    }
    auto blob = ReadBlob(id, /*verify=*/true);
    if (blob.status().IsNotFound()) {
      report.problems.push_back(
          "blob " + id.Hex() + " is missing" +
          (held ? " but manifest " + first_holder[id] + " points at it" : std::string()));
      continue;
    }
    ++report.blobs_checked;
    if (!blob.ok()) {
      report.problems.push_back(blob.status().message() +
                                (held ? " (held by " + first_holder[id] + ")" : std::string()));
      continue;
    }
    report.bytes_checked += blob->size();
  }
  return report;
}

StatusOr<StoreStats> StoreImpl::Stats() {
  StoreStats stats;
  rocksdb::ReadOptions ro;
  ro.fill_cache = false;
  std::map<BlobId, uint64_t> blob_sizes;
  for (int f = kExperiments; f < kNumFamilies; ++f) {
    FamilyStats fs;
    fs.name = kFamilyNames[f];
    uint64_t v = 0;
    if (db_->GetIntProperty(cf(static_cast<Family>(f)), "rocksdb.total-sst-files-size", &v)) {
      fs.sst_bytes = v;
    }
    if (db_->GetIntProperty(cf(static_cast<Family>(f)), "rocksdb.total-blob-file-size", &v)) {
      fs.blob_file_bytes = v;
    }
    // Blob values are counted from the manifests below, not read.
    Family scan = f == kBlobs ? kRefs : static_cast<Family>(f);
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(scan)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      ++fs.keys;
      fs.logical_bytes += it->key().size() + (f == kBlobs ? 0 : it->value().size());
      if (f == kCheckpoints) {
        std::string exp, member;
        int64_t version;
        if (!keys::ParseManifest(it->key().ToStringView(), &exp, &member, &version)) continue;
        auto m = codec::DecodeManifest(member, it->value().ToStringView());
        if (!m.ok()) continue;
        ++stats.manifests;
        if (m->holds_blob) {
          ++stats.manifests_holding;
          blob_sizes[m->blob] = m->bytes;
        }
      }
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), std::string("stats of ") + fs.name));
    if (f == kBlobs) {
      stats.blobs = fs.keys;
      for (const auto& [id, size] : blob_sizes) fs.logical_bytes += size;
    }
    if (f == kExperiments) stats.experiments = fs.keys;
    if (f == kMembers) stats.members = fs.keys;
    if (f == kEvents) stats.events = fs.keys;
    stats.families.push_back(std::move(fs));
  }
  for (const auto& [id, size] : blob_sizes) stats.blob_bytes += size;
  return stats;
}

Status StoreImpl::Flush() {
  if (read_only_) return Status::OK();
  rocksdb::FlushOptions fo;
  std::vector<rocksdb::ColumnFamilyHandle*> all(handles_.begin(), handles_.end());
  return FromRocks(db_->Flush(fo, all), "store " + options_.path + ": flush");
}

Status StoreImpl::SizeForWorkingSet(uint64_t head_bytes) {
  if (read_only_) return Status::OK();
  const auto clamp = [](uint64_t v, uint64_t floor, uint64_t ceiling) {
    return std::min(std::max(v, floor), ceiling);  // a ceiling under the floor wins
  };
  if (blob_cache_) {
    // Heads are read back in about the order they were written: an LRU that
    // cannot hold the cycle evicts each blob before its read and never hits,
    // so a working set past the ceiling gets the floor, not the ceiling.
    const uint64_t want = head_bytes + head_bytes / 4;
    blob_cache_->SetCapacity(want <= options_.blob_cache_bytes
                                 ? clamp(want, kMinWorkingSetBytes, options_.blob_cache_bytes)
                                 : kMinWorkingSetBytes);
  }
  const uint64_t memtable =
      clamp(head_bytes / 4, kMinBlobMemtableBytes, options_.blob_memtable_bytes);
  if (memtable == blob_memtable_bytes_.load()) return Status::OK();
  rocksdb::Status s =
      db_->SetOptions(cf(kBlobs), {{"write_buffer_size", std::to_string(memtable)}});
  if (!s.ok()) return FromRocks(s, "store " + options_.path + ": sizing the blobs memtable");
  blob_memtable_bytes_.store(memtable);
  return Status::OK();
}

Status StoreImpl::Compact() {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  co.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  co.blob_garbage_collection_age_cutoff = 1.0;
  for (int f = kExperiments; f < kNumFamilies; ++f) {
    CKPT_RETURN_IF_ERROR(
        FromRocks(db_->CompactRange(co, cf(static_cast<Family>(f)), nullptr, nullptr),
                  std::string("store ") + options_.path + ": compact " + kFamilyNames[f]));
  }
  return Status::OK();
}

namespace {

Status ValidateOptions(const StoreOptions& o) {
  if (o.path.empty()) return Status::InvalidArgument("StoreOptions.path is empty");
  if (o.keep_last_n < 1) return Status::InvalidArgument("StoreOptions.keep_last_n must be >= 1");
  if (o.keep_best_k < 0) return Status::InvalidArgument("StoreOptions.keep_best_k must be >= 0");
  if (o.max_blob_bytes == 0 || o.max_blob_bytes > (size_t{1} << 32) - (size_t{1} << 20)) {
    return Status::InvalidArgument("StoreOptions.max_blob_bytes must be in (0, 4 GiB - 1 MiB]");
  }
  if (o.blob_memtable_bytes < (size_t{1} << 20)) {
    return Status::InvalidArgument("StoreOptions.blob_memtable_bytes must be >= 1 MiB");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Store>> Store::Open(const StoreOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  auto store = std::make_unique<StoreImpl>(options, /*read_only=*/false);
  CKPT_RETURN_IF_ERROR(store->OpenDb());
  CKPT_RETURN_IF_ERROR(store->LoadIndex().WithPrefix("store " + options.path));
  CKPT_RETURN_IF_ERROR(store->SweepRetention());
  return std::unique_ptr<Store>(std::move(store));
}

StatusOr<std::unique_ptr<Store>> Store::OpenReadOnly(const StoreOptions& options) {
  CKPT_RETURN_IF_ERROR(ValidateOptions(options));
  auto store = std::make_unique<StoreImpl>(options, /*read_only=*/true);
  CKPT_RETURN_IF_ERROR(store->OpenDb());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace ckpt::store
