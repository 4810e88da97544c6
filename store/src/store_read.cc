// StoreImpl: the reads. They go to RocksDB directly, without the write
// mutex, and see the store before or after any write.
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/slice.h>

#include <limits>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/format/checksum.h"
#include "codec.h"
#include "keys.h"
#include "store_impl.h"

namespace ckpt::store {

double Manifest::score() const {
  auto it = metrics.find(kScoreMetric);
  return it == metrics.end() ? std::numeric_limits<double>::quiet_NaN() : it->second;
}

struct PinnedBlob::Impl {
  rocksdb::PinnableSlice slice;
  // Set instead of `slice` for a blob in the blob log.
  std::unique_ptr<MappedRecord> record;
};

PinnedBlob::PinnedBlob() = default;
PinnedBlob::~PinnedBlob() = default;
PinnedBlob::PinnedBlob(PinnedBlob&&) noexcept = default;
PinnedBlob& PinnedBlob::operator=(PinnedBlob&&) noexcept = default;

const uint8_t* PinnedBlob::data() const {
  if (!impl_) return nullptr;
  if (impl_->record) return impl_->record->data();
  return reinterpret_cast<const uint8_t*>(impl_->slice.data());
}

size_t PinnedBlob::size() const {
  if (!impl_) return 0;
  return impl_->record ? impl_->record->size() : impl_->slice.size();
}

namespace {

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

}  // namespace

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

// ---- experiments and members ----

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

StatusOr<PinnedBlob> StoreImpl::ReadBlobImpl(const BlobId& id, bool verify, bool check_record) {
  PinnedBlob out;
  out.impl_ = std::make_unique<PinnedBlob::Impl>();
  out.id_ = id;
  // The blob log first; a blob not there is in the blobs family.
  // A writer's garbage collection may move a record between the lookup and
  // the read (its old segment is then gone): one more lookup finds it.
  for (int attempt = 0; log_ != nullptr && attempt < 2; ++attempt) {
    std::string v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf(kBlobLog), id.Bytes(), &v);
    if (s.IsNotFound()) break;
    CKPT_RETURN_IF_ERROR(FromRocks(s, "blob " + id.Hex()));
    BlobLocation loc;
    if (!DecodeLocation(v, &loc)) {
      return Status::Corruption("blob " + id.Hex() + ": malformed blob_log location");
    }
    auto record = log_->Read(id, loc, check_record);
    if (record.status().IsNotFound() && !read_only_ && attempt == 0) continue;
    if (record.status().IsNotFound()) return Status::IOError(record.status().message());
    CKPT_RETURN_IF_ERROR(record.status());
    out.impl_->record = std::move(*record);
    if (verify) CKPT_RETURN_IF_ERROR(CheckBlob(id, out.data(), out.size()));
    return out;
  }
  rocksdb::ReadOptions ro;
  // The content hash below covers every byte; RocksDB's CRC pass would be a second one.
  ro.verify_checksums = false;
  // Off while the heads outgrow the blob cache (SizeForWorkingSet): a blob
  // put in would be evicted before its next read. The blobs family's table
  // blocks (16-byte index entries) then stay out of the block cache too.
  ro.fill_cache = blob_cache_fills_.load();
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

}  // namespace ckpt::store
