// StoreImpl: opening RocksDB, loading the retention index, tuning and
// compaction, and Store::Open / Store::OpenReadOnly.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "codec.h"
#include "keys.h"
#include "store_impl.h"

namespace ckpt::store {

namespace {

// Written next to RocksDB's LOCK so a refused opener can name the holder.
constexpr const char kOwnerFile[] = "ckpt-owner";

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
    db_options.info_log = NewInfoLog(path + "/LOG");
    // RocksDB's own line about its CRC32C ("Fast CRC32 supported") speaks
    // of its loop, which ckpt's may replace (crc32c_isal.cc).
    rocksdb::Log(rocksdb::InfoLogLevel::INFO_LEVEL, db_options.info_log,
                 "ckpt: the CRC32C of WAL and blob-file records is computed by %s",
                 Crc32cImplementation());
    db_options.listeners.push_back(background_errors_);
  }
  db_options.max_background_jobs = 2;
  // No fallocate: RocksDB would reserve a WAL's worth of space past the
  // memtable size (17.6 MiB for a 16 MiB memtable) per file and give it back
  // at close, so a full disk would show up late and go away by itself at
  // random; without it a write fails exactly when its bytes do not fit.
  db_options.allow_fallocate = false;
  // The blob_log family is opened when the store has it (any open) or the
  // writer is to create it (StoreOptions::blob_log), so that a store from
  // before the blob log stays as it was unless the option asks otherwise.
  bool with_blob_log = options_.blob_log && !read_only_;
  {
    std::vector<std::string> names;
    if (rocksdb::DB::ListColumnFamilies(db_options, path, &names).ok()) {
      for (const auto& n : names) with_blob_log |= n == kFamilyNames[kBlobLog];
    }
  }
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
      s = rocksdb::DB::OpenForReadOnly(
          db_options, path, Descriptors(blob_cache_, blob_memtable_bytes_, with_blob_log),
          &handles_, &raw, /*error_if_wal_file_exists=*/false);
      if (s.ok() || !(s.IsIOError() || s.IsCorruption() || s.IsPathNotFound())) break;
    }
  } else {
    s = rocksdb::DB::Open(db_options, path,
                          Descriptors(blob_cache_, blob_memtable_bytes_, with_blob_log), &handles_,
                          &raw);
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
  return OpenBlobLog();
}

Status StoreImpl::OpenBlobLog() {
  const std::string dir = options_.path + "/" + kBlobLogDir;
  if (cf(kBlobLog) == nullptr) return Status::OK();
  if (read_only_ && !std::filesystem::exists(dir)) return Status::OK();
  CKPT_ASSIGN_OR_RETURN(log_, BlobLog::Open(dir, read_only_, options_.blob_log_segment_bytes));
  if (log_->truncated_bytes() > 0) {
    rocksdb::Log(rocksdb::InfoLogLevel::WARN_LEVEL, db_->GetOptions().info_log,
                 "ckpt: blob log segment %s: cut a torn tail of %llu bytes at open",
                 log_->SegmentPath(log_->active_segment()).c_str(),
                 static_cast<unsigned long long>(log_->truncated_bytes()));
  }
  return Status::OK();
}

// The blob log's locations, the live bytes of each segment, and the segments
// no location names (their last blob dropped before a crash).
Status StoreImpl::LoadBlobLocations(const rocksdb::ReadOptions& ro) {
  locations_.clear();
  live_bytes_.clear();
  dead_segments_.clear();
  if (cf(kBlobLog) != nullptr) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kBlobLog)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      BlobId id;
      BlobLocation loc;
      if (!BlobId::FromBytes(it->key().ToStringView(), &id) ||
          !DecodeLocation(it->value().ToStringView(), &loc)) {
        return Status::Corruption("store " + options_.path + ": malformed blob_log entry");
      }
      live_bytes_[loc.segment] += loc.record_bytes();
      locations_.emplace(id, loc);
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "load blob locations"));
  }
  if (log_ != nullptr && !read_only_) {
    // Segments no location names (their last blob dropped before a crash).
    for (const auto& [segment, bytes] : log_->SegmentBytes()) {
      if (segment != log_->active_segment() && live_bytes_.count(segment) == 0) {
        dead_segments_.insert(segment);
      }
    }
  }
  return Status::OK();
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
  CKPT_RETURN_IF_ERROR(LoadBlobLocations(ro));
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
    const bool fits = want <= options_.blob_cache_bytes;
    blob_cache_->SetCapacity(fits ? clamp(want, kMinWorkingSetBytes, options_.blob_cache_bytes)
                                  : kMinWorkingSetBytes);
    if (fits != blob_cache_fills_.load()) {
      rocksdb::Status s = db_->SetOptions(
          cf(kBlobs), {{"prepopulate_blob_cache", fits ? "kFlushOnly" : "kDisable"}});
      if (!s.ok()) return FromRocks(s, "store " + options_.path + ": blob cache prepopulation");
      blob_cache_fills_.store(fits);
    }
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

Status StoreImpl::CollectBlobLogLocked() {
  if (log_ == nullptr || segment_deletions_held_.load() > 0) return Status::OK();
  const auto below = [this](uint64_t segment, uint64_t bytes) {
    auto live = live_bytes_.find(segment);
    const uint64_t live_bytes = live == live_bytes_.end() ? 0 : live->second;
    return static_cast<double>(live_bytes) < options_.blob_log_gc_live_fraction * bytes;
  };
  // The active segment too: a new one takes its place, so that the space of
  // what was dropped last (a deleted experiment) comes back as well.
  const std::map<uint64_t, uint64_t> sizes = log_->SegmentBytes();
  auto active = sizes.find(log_->active_segment());
  if (active != sizes.end() && active->second > 0 && below(active->first, active->second)) {
    CKPT_RETURN_IF_ERROR(log_->Roll().WithPrefix("store " + options_.path + ": blob log gc"));
  }
  std::set<uint64_t> victims;
  for (const auto& [segment, bytes] : sizes) {
    if (segment != log_->active_segment() && below(segment, bytes)) victims.insert(segment);
  }
  if (victims.empty()) return Status::OK();
  rocksdb::WriteBatch batch;
  std::vector<std::pair<BlobId, BlobLocation>> moved;
  std::set<uint64_t> kept;  // a live record there fails its checks: Verify names it
  for (const auto& [id, loc] : locations_) {
    if (victims.count(loc.segment) == 0) continue;
    auto record = log_->Read(id, loc, /*verify=*/true);
    if (!record.ok()) {
      kept.insert(loc.segment);
      continue;
    }
    const uint64_t was_active = log_->active_segment();
    CKPT_ASSIGN_OR_RETURN(BlobLocation to, log_->Append(id, (*record)->data(), (*record)->size()));
    NoteRolledLocked(was_active);
    batch.Put(cf(kBlobLog), id.Bytes(), EncodeLocation(to));
    moved.emplace_back(id, to);
  }
  // Copies on disk, then their locations (synced), then the old segments go.
  CKPT_RETURN_IF_ERROR(log_->Sync().WithPrefix("store " + options_.path + ": blob log gc"));
  rocksdb::WriteOptions wo;
  wo.sync = true;
  CKPT_RETURN_IF_ERROR(
      FromRocks(db_->Write(wo, &batch), "store " + options_.path + ": blob log gc"));
  for (const auto& [id, to] : moved) {
    auto it = locations_.find(id);
    ReleaseRecordLocked(it->second);
    it->second = to;
    live_bytes_[to.segment] += to.record_bytes();
  }
  for (uint64_t segment : victims) {
    if (kept.count(segment) == 0) dead_segments_.insert(segment);
  }
  return DropDeadSegmentsLocked(/*wal_synced=*/true);
}

Status StoreImpl::Compact() {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A store refusing writes (see "Failed writes") is compacted by RocksDB only.
    if (WritableLocked().ok()) CKPT_RETURN_IF_ERROR(CollectBlobLogLocked());
  }
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  co.blob_garbage_collection_policy = rocksdb::BlobGarbageCollectionPolicy::kForce;
  co.blob_garbage_collection_age_cutoff = 1.0;
  for (int f = kExperiments; f < kNumFamilies; ++f) {
    if (cf(static_cast<Family>(f)) == nullptr) continue;
    CKPT_RETURN_IF_ERROR(
        FromRocks(db_->CompactRange(co, cf(static_cast<Family>(f)), nullptr, nullptr),
                  std::string("store ") + options_.path + ": compact " + kFamilyNames[f]));
  }
  return Status::OK();
}

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
