// StoreImpl: Verify (every manifest, reference count and blob checked) and
// Stats (keys and bytes per family).
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include "ckpt/format/checksum.h"
#include "codec.h"
#include "keys.h"
#include "store_impl.h"

namespace ckpt::store {

StatusOr<VerifyReport> StoreImpl::Verify() {
  if (options_.blob_cache_bytes == 0) return VerifyHere();
  StoreOptions o = options_;
  o.blob_cache_bytes = 0;
  o.kill_point = nullptr;
  // The writer keeps every file while the uncached view reads them.
  if (!read_only_) {
    CKPT_RETURN_IF_ERROR(FromRocks(db_->DisableFileDeletions(), "verify: hold files"));
    segment_deletions_held_.fetch_add(1);
  }
  StatusOr<VerifyReport> report = Status::Internal("verify did not run");
  {
    auto view = Store::OpenReadOnly(o);
    report = view.ok() ? (*view)->Verify() : StatusOr<VerifyReport>(view.status());
  }
  if (!read_only_) {
    segment_deletions_held_.fetch_sub(1);
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
  // Locations in the blob log that no reference count keeps.
  if (cf(kBlobLog) != nullptr) {
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kBlobLog)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      BlobId id;
      if (!BlobId::FromBytes(it->key().ToStringView(), &id)) {
        report.problems.push_back("malformed blob_log key");
      } else if (refs.count(id) == 0 && holders.count(id) == 0) {
        report.problems.push_back("blob " + id.Hex() + ": in the blob log but not referenced");
      }
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "verify: scan blob locations"));
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
    auto blob = ReadBlobImpl(id, /*verify=*/true, /*check_record=*/true);
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
  for (int f = kExperiments; f <= kEvents; ++f) {
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
  if (log_ != nullptr) {
    for (const auto& [segment, bytes] : log_->SegmentBytes()) {
      ++stats.blob_log_segments;
      stats.blob_log_bytes += bytes;
    }
    stats.families[kBlobs - kExperiments].blob_file_bytes += stats.blob_log_bytes;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf(kBlobLog)));
    for (it->SeekToFirst(); it->Valid(); it->Next()) {
      BlobLocation loc;
      if (DecodeLocation(it->value().ToStringView(), &loc)) {
        stats.blob_log_live_bytes += loc.record_bytes();
      }
    }
    CKPT_RETURN_IF_ERROR(FromRocks(it->status(), "stats of blob_log"));
  }
  return stats;
}

}  // namespace ckpt::store
