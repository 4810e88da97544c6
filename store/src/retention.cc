#include "retention.h"

#include <utility>

namespace ckpt::store {

void RetentionIndex::AddExperiment(const std::string& exp) { experiments_[exp]; }

bool RetentionIndex::HasExperiment(const std::string& exp) const {
  return experiments_.count(exp) > 0;
}

void RetentionIndex::AddMember(const std::string& exp, MemberHead head) {
  Member& m = experiments_[exp].members[head.member];
  m.head = head.version;
  m.record = std::move(head);
}

const MemberHead* RetentionIndex::HeadRecord(const std::string& exp,
                                             const std::string& member) const {
  auto e = experiments_.find(exp);
  if (e == experiments_.end()) return nullptr;
  auto m = e->second.members.find(member);
  return m == e->second.members.end() ? nullptr : &m->second.record;
}

void RetentionIndex::SetHeadRecord(const std::string& exp, MemberHead head) {
  Member& m = experiments_[exp].members[head.member];
  m.record = std::move(head);
}

bool RetentionIndex::HasMember(const std::string& exp, const std::string& member) const {
  return Head(exp, member) >= 0;
}

int64_t RetentionIndex::Head(const std::string& exp, const std::string& member) const {
  auto e = experiments_.find(exp);
  if (e == experiments_.end()) return -1;
  auto m = e->second.members.find(member);
  return m == e->second.members.end() ? -1 : m->second.head;
}

void RetentionIndex::LoadVersion(const std::string& exp, const std::string& member, int64_t version,
                                 VersionInfo info) {
  info.children = 0;
  info.in_best = false;
  experiments_[exp].members[member].versions[version] = std::move(info);
}

void RetentionIndex::FinishLoad() {
  for (auto& [exp, e] : experiments_) {
    e.best.clear();
    for (auto& [name, m] : e.members) {
      for (auto& [ver, v] : m.versions) {
        if (v.parent) {
          if (VersionInfo* p = FindMutable(&e, *v.parent)) ++p->children;
        }
        // A released version lost its place for good; only holders compete.
        if (v.scored && v.holds_blob) InsertBest(&e, name, ver, &v);
      }
    }
  }
}

const RetentionIndex::VersionInfo* RetentionIndex::Find(const std::string& exp,
                                                        const std::string& member,
                                                        int64_t version) const {
  auto e = experiments_.find(exp);
  if (e == experiments_.end()) return nullptr;
  auto m = e->second.members.find(member);
  if (m == e->second.members.end()) return nullptr;
  auto v = m->second.versions.find(version);
  return v == m->second.versions.end() ? nullptr : &v->second;
}

RetentionIndex::VersionInfo* RetentionIndex::FindMutable(Experiment* e, const VersionRef& ref) {
  auto m = e->members.find(ref.member);
  if (m == e->members.end()) return nullptr;
  auto v = m->second.versions.find(ref.version);
  return v == m->second.versions.end() ? nullptr : &v->second;
}

bool RetentionIndex::KeepsBlob(const Member& m, int64_t version, const VersionInfo& v) const {
  return version == m.head || version > m.head - policy_.keep_last_n || v.pinned || v.in_best;
}

std::optional<VersionRef> RetentionIndex::InsertBest(Experiment* e, const std::string& member,
                                                     int64_t version, VersionInfo* v) {
  if (policy_.keep_best_k <= 0) return std::nullopt;
  e->best.insert(BestKey{v->score, member, version});
  v->in_best = true;
  if (e->best.size() <= static_cast<size_t>(policy_.keep_best_k)) return std::nullopt;
  auto last = std::prev(e->best.end());
  VersionRef out{last->member, last->version};
  e->best.erase(last);
  if (out.member == member && out.version == version) {
    v->in_best = false;
  } else if (VersionInfo* o = FindMutable(e, out)) {
    o->in_best = false;
  }
  return out;
}

void RetentionIndex::Evaluate(const std::string& exp, Experiment* e, VersionRef start,
                              std::vector<RetentionChange>* changes) {
  std::vector<VersionRef> work{std::move(start)};
  while (!work.empty()) {
    VersionRef ref = std::move(work.back());
    work.pop_back();
    auto mit = e->members.find(ref.member);
    if (mit == e->members.end()) continue;
    Member& m = mit->second;
    auto vit = m.versions.find(ref.version);
    if (vit == m.versions.end()) continue;
    VersionInfo& v = vit->second;
    if (KeepsBlob(m, ref.version, v)) continue;
    RetentionChange change{exp, ref, v.blob, false, false, nullptr};
    if (v.holds_blob) {
      v.holds_blob = false;
      change.release_blob = true;
      change.manifest = std::move(v.manifest);
      v.manifest.reset();
    }
    if (!policy_.keep_lineage || v.children == 0) {
      change.erase = true;
      std::optional<VersionRef> parent = v.parent;
      m.versions.erase(vit);
      if (parent) {
        if (VersionInfo* p = FindMutable(e, *parent)) {
          --p->children;
          work.push_back(*parent);
        }
      }
    }
    if (change.release_blob || change.erase) changes->push_back(std::move(change));
  }
}

void RetentionIndex::AddVersion(const std::string& exp, const std::string& member, int64_t version,
                                VersionInfo info, MemberHead head,
                                std::vector<RetentionChange>* changes) {
  Experiment& e = experiments_[exp];
  Member& m = e.members[member];
  m.record = std::move(head);
  info.children = 0;
  info.in_best = false;
  if (info.parent) {
    if (VersionInfo* p = FindMutable(&e, *info.parent)) ++p->children;
  }
  VersionInfo& v = m.versions[version] = std::move(info);
  m.head = version;
  std::vector<VersionRef> candidates;
  candidates.push_back(VersionRef{member, version - policy_.keep_last_n});
  if (v.scored) {
    if (auto out = InsertBest(&e, member, version, &v)) candidates.push_back(std::move(*out));
  }
  for (auto& c : candidates) Evaluate(exp, &e, std::move(c), changes);
}

void RetentionIndex::SetPinned(const std::string& exp, const std::string& member, int64_t version,
                               bool pinned, std::shared_ptr<const Manifest> updated,
                               std::vector<RetentionChange>* changes) {
  auto e = experiments_.find(exp);
  if (e == experiments_.end()) return;
  VersionInfo* v = FindMutable(&e->second, VersionRef{member, version});
  if (v == nullptr) return;
  v->pinned = pinned;
  if (v->holds_blob) v->manifest = std::move(updated);
  if (!pinned) Evaluate(exp, &e->second, VersionRef{member, version}, changes);
}

void RetentionIndex::SweepAll(std::vector<RetentionChange>* changes) {
  for (auto& [exp, e] : experiments_) {
    std::vector<VersionRef> all;
    for (const auto& [name, m] : e.members) {
      for (const auto& [ver, v] : m.versions) all.push_back(VersionRef{name, ver});
    }
    for (auto& ref : all) Evaluate(exp, &e, std::move(ref), changes);
  }
}

std::vector<RetentionChange> RetentionIndex::RemoveExperiment(const std::string& exp) {
  std::vector<RetentionChange> out;
  auto e = experiments_.find(exp);
  if (e == experiments_.end()) return out;
  for (const auto& [name, m] : e->second.members) {
    for (const auto& [ver, v] : m.versions) {
      out.push_back(
          RetentionChange{exp, VersionRef{name, ver}, v.blob, v.holds_blob, true, v.manifest});
    }
  }
  experiments_.erase(e);
  return out;
}

uint64_t RetentionIndex::LastEventSeq(const std::string& exp) const {
  auto e = experiments_.find(exp);
  return e == experiments_.end() ? 0 : e->second.last_event_seq;
}

void RetentionIndex::SetLastEventSeq(const std::string& exp, uint64_t seq) {
  experiments_[exp].last_event_seq = seq;
}

}  // namespace ckpt::store
