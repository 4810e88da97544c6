// StoreImpl: the write path. Every mutation takes mu_, builds one
// PendingWrite (its WriteBatch, the manifests and reference counts it
// changes, and what retention releases as a consequence) and writes it in one
// RocksDB write; a failed write stops the store accepting writes (see "Failed
// writes" in ckpt/store/store.h).
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>
#include <rocksdb/write_batch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/base/kill_point.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/checksum.h"
#include "codec.h"
#include "keys.h"
#include "store_impl.h"

namespace ckpt::store {

namespace kp = base::kill_points;

Status StoreImpl::SweepRetention() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RetentionChange> changes;
  index_.SweepAll(&changes);
  // Segments found dead at open: the WAL that emptied them was read from disk.
  if (changes.empty()) return DropDeadSegmentsLocked(/*wal_synced=*/true);
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
      KillPoint(kp::kRetentionRelease);
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
      CKPT_RETURN_IF_ERROR(PutBlobBytesLocked(w, id));
      w->batch.Put(cf(kRefs), key, keys::EncodeCount(after));
    } else if (after == 0) {
      DeleteBlobBytesLocked(w, id);
      w->batch.Delete(cf(kRefs), key);
    } else {
      // A write that brings the bytes of a blob already stored writes them
      // again: a stored copy damaged on disk is replaced by this intact one
      // (a member that fell back from a damaged head retrains to the very
      // same bytes, and would otherwise get the damaged copy back as its head).
      if (delta > 0 && w->new_blob && *w->new_blob == id) {
        CKPT_RETURN_IF_ERROR(PutBlobBytesLocked(w, id));
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

Status StoreImpl::PutBlobBytesLocked(PendingWrite* w, const BlobId& id) {
  const std::string key = id.Bytes();
  auto old = locations_.find(id);
  if (!options_.blob_log) {
    w->batch.Put(cf(kBlobs), key, w->new_blob_bytes);
    if (old != locations_.end()) {
      w->batch.Delete(cf(kBlobLog), key);
      ReleaseRecordLocked(old->second);
      locations_.erase(old);
    }
    return Status::OK();
  }
  // The same bytes again (a 0-step interval, a member retraining to the state
  // it fell back from): the stored record stays unless it fails its checksum,
  // so a deduplicated commit writes no state bytes.
  if (old != locations_.end() && log_->Read(id, old->second, /*verify=*/true).ok()) {
    return Status::OK();
  }
  const uint64_t was_active = log_->active_segment();
  CKPT_ASSIGN_OR_RETURN(BlobLocation loc,
                        log_->Append(id, w->new_blob_bytes.data(), w->new_blob_bytes.size()));
  w->blob_appended = true;
  NoteRolledLocked(was_active);
  w->batch.Put(cf(kBlobLog), key, EncodeLocation(loc));
  live_bytes_[loc.segment] += loc.record_bytes();
  if (old != locations_.end()) {
    ReleaseRecordLocked(old->second);
    old->second = loc;
  } else {
    // A copy in the blobs family (from before the blob log) goes.
    if (refcounts_.count(id) != 0) w->batch.Delete(cf(kBlobs), key);
    locations_.emplace(id, loc);
  }
  return Status::OK();
}

void StoreImpl::DeleteBlobBytesLocked(PendingWrite* w, const BlobId& id) {
  const std::string key = id.Bytes();
  auto old = locations_.find(id);
  if (old == locations_.end()) {
    w->batch.Delete(cf(kBlobs), key);
    return;
  }
  w->batch.Delete(cf(kBlobLog), key);
  ReleaseRecordLocked(old->second);
  locations_.erase(old);
}

void StoreImpl::NoteRolledLocked(uint64_t was_active) {
  if (log_->active_segment() == was_active) return;
  auto live = live_bytes_.find(was_active);
  if (live == live_bytes_.end() || live->second == 0) dead_segments_.insert(was_active);
}

void StoreImpl::ReleaseRecordLocked(const BlobLocation& loc) {
  auto it = live_bytes_.find(loc.segment);
  if (it == live_bytes_.end()) return;
  it->second -= std::min(it->second, loc.record_bytes());
  if (it->second == 0 && loc.segment != log_->active_segment()) dead_segments_.insert(loc.segment);
}

Status StoreImpl::DropDeadSegmentsLocked(bool wal_synced) {
  if (dead_segments_.empty() || !log_ || segment_deletions_held_.load() > 0) return Status::OK();
  // The batch that dropped a segment's last blob must be on disk before the
  // segment goes: a power loss could otherwise bring back a location into it.
  if (!wal_synced) {
    CKPT_RETURN_IF_ERROR(FromRocks(db_->SyncWAL(), "store " + options_.path + ": sync of the WAL"));
  }
  for (auto it = dead_segments_.begin(); it != dead_segments_.end();) {
    auto live = live_bytes_.find(*it);
    if (*it == log_->active_segment() || (live != live_bytes_.end() && live->second > 0)) {
      it = dead_segments_.erase(it);
      continue;
    }
    CKPT_RETURN_IF_ERROR(log_->RemoveSegment(*it));
    if (live != live_bytes_.end()) live_bytes_.erase(live);
    it = dead_segments_.erase(it);
  }
  return Status::OK();
}

Status StoreImpl::WriteLocked(PendingWrite* w, const std::string& what, bool sync,
                              const char* before, const char* after) {
  if (w->blob_appended) KillPoint(kp::kBlobBeforeSync);
  // The bytes reach the disk before the WAL record that names them, and
  // before a synced WAL makes earlier unsynced commits' locations durable.
  if (sync && log_ != nullptr && log_->dirty()) {
    Status s = log_->Sync();
    if (!s.ok()) {
      BreakLocked(s.WithPrefix("store " + options_.path + ": blob log of " + what), false);
      return broken_;
    }
  }
  if (w->blob_appended) KillPoint(kp::kBlobAfterSync);
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
  Status dropped = DropDeadSegmentsLocked(sync);
  if (!dropped.ok()) {
    // The write itself is done; a segment left behind is collected later.
    dead_segments_.clear();
  }
  return Status::OK();
}

void StoreImpl::BreakLocked(const Status& s, bool recoverable) {
  broken_ = recoverable ? s : s.WithPrefix("store refuses writes after a failed write; reopen it");
  broken_recoverable_ = recoverable;
}

Status StoreImpl::WritableLocked() {
  if (broken_.ok()) return Status::OK();
  if (!broken_recoverable_) return broken_;
  if (blob_space_needed_ > 0 && log_ != nullptr) {
    Status probe = log_->ProbeSpace(blob_space_needed_);
    if (!probe.ok()) {
      return Status::ResourceExhausted("store " + options_.path + ": still no space to write (" +
                                       probe.message() + "); first failure: " + broken_.message());
    }
  }
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
  // A blob appended by the failed write is garbage: LoadIndex recounts.
  Status loaded = LoadIndex();
  if (!loaded.ok()) {
    BreakLocked(loaded.WithPrefix("store " + options_.path + ": reloading after no space"), false);
    return broken_;
  }
  broken_ = Status::OK();
  broken_recoverable_ = false;
  blob_space_needed_ = 0;
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
    // A full disk under the blob log's append is recoverable as RocksDB's is;
    // the store refuses writes until that record fits.
    if (s.IsResourceExhausted()) {
      blob_space_needed_ = kBlobRecordHeaderBytes + w->new_blob_bytes.size();
      s = Status::ResourceExhausted("store " + options_.path +
                                    ": no space left on the device to write " + manifest_what +
                                    " (" + s.message() + ")");
    }
    BreakLocked(s, /*recoverable=*/s.IsResourceExhausted());
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
                                            bool sync, const format::CheckpointView* verified,
                                            BlobId* id_out) {
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
  // A caller's verified parse of these very bytes stands for the store's own.
  std::optional<format::CheckpointView> parsed;
  if (verified != nullptr) {
    if (verified->bytes() != blob || verified->total_bytes() != size) {
      return Status::InvalidArgument(Id(exp, member) + ": " + reason +
                                     " rejected: the verified view given is of other bytes");
    }
    if (!verified->fully_verified()) {
      return Status::InvalidArgument(Id(exp, member) + ": " + reason +
                                     " rejected: the view given was parsed without verifying "
                                     "its checksums");
    }
  } else {
    auto p = format::ParseCheckpoint(blob, size);
    if (!p.ok()) {
      return Status::Corruption(Id(exp, member) + ": " + reason +
                                " rejected: " + p.status().message());
    }
    parsed = std::move(*p);
    verified = &*parsed;
  }
  const int64_t blob_step = step ? *step : verified->meta().step;
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
  auto added = AddVersionLocked(exp, member, std::move(m), std::move(head), std::move(event), &w,
                                sync, trained ? kp::kCommitBeforeWrite : kp::kImportBeforeWrite,
                                trained ? kp::kCommitAfterWrite : kp::kImportAfterWrite);
  if (added.ok() && id_out != nullptr) *id_out = id;
  return added;
}

StatusOr<int64_t> StoreImpl::CommitResult(const CommitRequest& r) {
  return AddBlobVersion(r.exp, r.member, r.expected_head_version, r.blob, r.blob_size, r.step,
                        r.metrics, r.hparams, kReasonTrained, r.event_json,
                        options_.sync_interval_commits, r.verified, r.committed_blob);
}

StatusOr<int64_t> StoreImpl::Import(const std::string& exp, const std::string& member,
                                    const void* blob, size_t blob_size,
                                    const std::map<std::string, double>& hparams) {
  return AddBlobVersion(exp, member, std::nullopt, blob, blob_size, std::nullopt, {}, hparams,
                        kReasonImport, "", /*sync=*/true, /*verified=*/nullptr, /*id_out=*/nullptr);
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
                          options_.sync_interval_commits, kp::kExploitBeforeWrite,
                          kp::kExploitAfterWrite);
}

StatusOr<int64_t> StoreImpl::Restore(const std::string& exp, const std::string& member,
                                     int64_t version, const std::string& event_json) {
  CKPT_RETURN_IF_ERROR(CheckWritable());
  std::lock_guard<std::mutex> lock(mu_);
  CKPT_RETURN_IF_ERROR(WritableLocked());
  CKPT_RETURN_IF_ERROR(MemberExistsLocked(exp, member));
  CKPT_ASSIGN_OR_RETURN(Manifest old, RetainedManifestLocked(exp, member, version));
  MemberHead head = *index_.HeadRecord(exp, member);
  const int64_t new_version = index_.Head(exp, member) + 1;
  CKPT_ASSIGN_OR_RETURN(
      std::string event,
      codec::BuildEvent(event_json, kReasonRestore, exp,
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
                          /*sync=*/true, kp::kRestoreBeforeWrite, kp::kRestoreAfterWrite);
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
                     /*sync=*/true, kp::kPinBeforeWrite, kp::kPinAfterWrite);
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
  return WriteLocked(&w, "the deletion of experiment " + id, /*sync=*/true, kp::kDeleteBeforeWrite,
                     kp::kDeleteAfterWrite);
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

}  // namespace ckpt::store
