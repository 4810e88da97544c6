// RetentionIndex: the writer's in-memory picture of every stored version,
// enough to decide retention without reading manifests: per member its head
// record and versions (blob, score, pinned, parent, number of children, and
// the whole manifest while it holds a blob, which bounds that cache by the
// retained versions), per experiment the best-K set and the last event
// sequence number. The write path reads heads and retained manifests from
// here instead of RocksDB.
//
// Retention rules are those of ckpt/store/store.h. Every mutation appends the
// consequences to a list of RetentionChange, which the store turns into
// WriteBatch operations; the index has already applied them to itself.
// RocksDB-free.
//
// Thread-safety: none; the store calls it under its write mutex.
#ifndef CKPT_STORE_SRC_RETENTION_H_
#define CKPT_STORE_SRC_RETENTION_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/store/store.h"

namespace ckpt::store {

struct RetentionPolicy {
  int keep_last_n = 3;
  int keep_best_k = 5;
  bool keep_lineage = true;
};

// A version whose blob reference retention released and/or whose manifest it erased.
struct RetentionChange {
  std::string exp;
  VersionRef ref;
  BlobId blob;
  bool release_blob = false;  // the manifest stops holding `blob`: one reference less
  bool erase = false;         // the manifest is deleted
  // The manifest as it was before the change, when the index had it cached.
  std::shared_ptr<const Manifest> manifest;
};

class RetentionIndex {
 public:
  struct VersionInfo {
    BlobId blob;
    uint64_t bytes = 0;
    bool holds_blob = true;
    bool pinned = false;
    // A trained version with a finite score takes part in best-K.
    bool scored = false;
    double score = std::numeric_limits<double>::quiet_NaN();
    std::optional<VersionRef> parent;
    int children = 0;  // stored manifests of this experiment whose parent this is
    bool in_best = false;
    // The stored manifest, kept while holds_blob.
    std::shared_ptr<const Manifest> manifest;
  };

  explicit RetentionIndex(RetentionPolicy policy) : policy_(policy) {}

  const RetentionPolicy& policy() const { return policy_; }

  // ---- loading (Open) and structure ----
  void AddExperiment(const std::string& exp);
  bool HasExperiment(const std::string& exp) const;
  // Adds a member with its head record (head.version is its head version).
  void AddMember(const std::string& exp, MemberHead head);
  bool HasMember(const std::string& exp, const std::string& member) const;
  // Head version of the member; -1 when the member (or experiment) is absent.
  int64_t Head(const std::string& exp, const std::string& member) const;
  // The member's head record; nullptr when absent.
  const MemberHead* HeadRecord(const std::string& exp, const std::string& member) const;
  // Replaces the head record. REQUIRES: the member exists; head.version == Head().
  void SetHeadRecord(const std::string& exp, MemberHead head);
  // Records a stored version without applying retention.
  // REQUIRES: the member exists; FinishLoad() before any mutation below.
  void LoadVersion(const std::string& exp, const std::string& member, int64_t version,
                   VersionInfo info);
  // Counts children and builds the best-K sets of loaded versions.
  void FinishLoad();
  // nullptr when absent.
  const VersionInfo* Find(const std::string& exp, const std::string& member, int64_t version) const;

  // ---- mutations ----
  // Adds `version` as the member's new head, with `head` as its record, and
  // applies retention. REQUIRES: version > Head(exp, member), head.version == version.
  void AddVersion(const std::string& exp, const std::string& member, int64_t version,
                  VersionInfo info, MemberHead head, std::vector<RetentionChange>* changes);
  // Pins or unpins a stored version (`updated`: its manifest with the new
  // flag); unpinning applies retention to it.
  void SetPinned(const std::string& exp, const std::string& member, int64_t version, bool pinned,
                 std::shared_ptr<const Manifest> updated, std::vector<RetentionChange>* changes);
  // Applies retention to every version (after Open, when options may have changed).
  void SweepAll(std::vector<RetentionChange>* changes);
  // Forgets the experiment; returns every version it had that held a blob.
  std::vector<RetentionChange> RemoveExperiment(const std::string& exp);

  // ---- events ----
  uint64_t LastEventSeq(const std::string& exp) const;
  void SetLastEventSeq(const std::string& exp, uint64_t seq);

 private:
  struct Member {
    int64_t head = 0;
    MemberHead record;
    std::map<int64_t, VersionInfo> versions;
  };
  struct BestKey {
    double score;
    std::string member;
    int64_t version;
    // Best first; ties broken by member then version, so the order is total.
    bool operator<(const BestKey& o) const {
      if (score != o.score) return score > o.score;
      if (member != o.member) return member < o.member;
      return version < o.version;
    }
  };
  struct Experiment {
    std::map<std::string, Member> members;
    std::set<BestKey> best;
    uint64_t last_event_seq = 0;
  };

  bool KeepsBlob(const Member& m, int64_t version, const VersionInfo& v) const;
  // Inserts into best-K; returns the version it pushed out, if any.
  std::optional<VersionRef> InsertBest(Experiment* e, const std::string& member, int64_t version,
                                       VersionInfo* v);
  // Releases / erases `start` and, transitively, parents left without reason to stay.
  void Evaluate(const std::string& exp, Experiment* e, VersionRef start,
                std::vector<RetentionChange>* changes);
  VersionInfo* FindMutable(Experiment* e, const VersionRef& ref);

  RetentionPolicy policy_;
  std::map<std::string, Experiment> experiments_;
};

}  // namespace ckpt::store

#endif  // CKPT_STORE_SRC_RETENTION_H_
