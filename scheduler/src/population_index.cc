#include "population_index.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "experiment.h"

namespace ckpt::scheduler {
namespace {

// Equal, NaN equal to NaN.
bool Same(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

template <typename C>
void Erase(C* c, const typename C::key_type& key) {
  auto it = c->find(key);
  CKPT_CHECK(it != c->end());
  c->erase(it);
}

}  // namespace

bool PopulationIndex::Filed::operator==(const Filed& o) const {
  return status == o.status && interval == o.interval && ahead_of == o.ahead_of &&
         Same(ahead_score, o.ahead_score) && Same(score, o.score) && last_exploit == o.last_exploit;
}

// RanksBefore's order: higher score first, NaN last, ties by name.
bool PopulationIndex::RankLess::operator()(const RankKey& a, const RankKey& b) const {
  const bool an = std::isnan(a.score), bn = std::isnan(b.score);
  if (an != bn) return bn;
  if (!an && a.score != b.score) return a.score > b.score;
  return a.name_rank < b.name_rank;
}

PopulationIndex::PopulationIndex(const std::vector<Member>& members)
    : name_rank_(members.size()), member_of_rank_(members.size()), filed_(members.size()) {
  std::iota(member_of_rank_.begin(), member_of_rank_.end(), 0);
  std::sort(member_of_rank_.begin(), member_of_rank_.end(),
            [&](int a, int b) { return members[a].name < members[b].name; });
  for (size_t r = 0; r < member_of_rank_.size(); ++r) {
    name_rank_[member_of_rank_[r]] = static_cast<int>(r);
  }
  for (size_t i = 0; i < members.size(); ++i) {
    filed_[i] = FiledOf(members[i]);
    File(static_cast<int>(i), filed_[i], +1);
  }
}

PopulationIndex::Filed PopulationIndex::FiledOf(const Member& m) {
  Filed f;
  f.status = m.state.status;
  f.interval = m.state.interval;
  f.ahead_of = m.state.ahead_of;
  f.ahead_score = m.state.ahead_score;
  f.score = m.state.score;
  f.last_exploit = m.state.last_exploit;
  return f;
}

void PopulationIndex::Update(int i, const Member& m) {
  const Filed now = FiledOf(m);
  if (now == filed_[i]) return;
  File(i, filed_[i], -1);
  filed_[i] = now;
  File(i, now, +1);
}

void PopulationIndex::Count(std::map<int, int>* counts, int key, int sign) {
  int& n = (*counts)[key];
  n += sign;
  CKPT_CHECK(n >= 0);
  if (n == 0) counts->erase(key);
}

void PopulationIndex::File(int i, const Filed& f, int sign) {
  const bool marked = f.ahead_of >= 0;
  if (marked) {
    Count(&decided_keys_, f.ahead_of - 1, sign);
  } else if (f.active()) {
    Count(&decided_keys_, f.interval - 1, sign);
  }
  if (f.active()) {
    Count(&barrier_keys_, marked ? f.ahead_of : f.interval, sign);
    Count(&active_intervals_, f.interval, sign);
    int& n = mark_past_[{f.ahead_of, f.interval}];
    n += sign;
    if (n == 0) mark_past_.erase({f.ahead_of, f.interval});
  }
  if (f.busy()) {
    busy_ += sign;
    Count(&busy_marks_, f.ahead_of, sign);
  }
  if (marked) {
    if (sign > 0) {
      marked_.insert({f.ahead_of, i});
    } else {
      Erase(&marked_, {f.ahead_of, i});
    }
  }
  if (f.status == records::MemberStatus::kIdle) {
    if (sign > 0) {
      idle_at_[f.interval].insert(i);
      idle_.insert(i);
    } else {
      auto& at = idle_at_[f.interval];
      Erase(&at, i);
      if (at.empty()) idle_at_.erase(f.interval);
      Erase(&idle_, i);
    }
  }
  if (barrier_ != kNoBarrier) FileAtBarrier(i, f, sign);
}

void PopulationIndex::FileAtBarrier(int i, const Filed& f, int sign) {
  const int g = barrier_;
  const int rank = name_rank_[i];
  if (f.ahead_of == g || (f.active() && f.interval == g)) {
    const RankKey key{f.ahead_of == g ? f.ahead_score : f.score, rank};
    if (sign > 0) {
      finished_.insert(key);
    } else {
      CKPT_CHECK(finished_.erase(key) == 1);
    }
  }
  if (!f.active() || f.ahead_of == g) return;
  if (f.interval < g) running_ += sign;
  if (f.interval == g && f.status == records::MemberStatus::kIdle) {
    const RankKey key{f.score, rank};
    if (sign > 0) {
      waiting_[f.last_exploit].insert(key);
    } else {
      auto& w = waiting_[f.last_exploit];
      Erase(&w, key);
      if (w.empty()) waiting_.erase(f.last_exploit);
    }
  }
}

int PopulationIndex::Decided() const {
  return decided_keys_.empty() ? -1 : std::max(-1, decided_keys_.rbegin()->first);
}

std::vector<int> PopulationIndex::MarkedUpTo(int g) const {
  std::vector<int> out;
  for (auto it = marked_.begin(); it != marked_.end() && it->first <= g; ++it) {
    out.push_back(it->second);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> PopulationIndex::MarkedAt(int g) const {
  std::vector<int> out;
  for (auto it = marked_.lower_bound({g, -1}); it != marked_.end() && it->first == g; ++it) {
    out.push_back(it->second);
  }
  return out;  // (g, member) pairs are in member order
}

int PopulationIndex::LowestBarrier(int cap) const {
  return barrier_keys_.empty() ? cap : std::min(cap, barrier_keys_.begin()->first);
}

bool PopulationIndex::BusyExcept(int g) const {
  auto it = busy_marks_.find(g);
  return busy_ - (it == busy_marks_.end() ? 0 : it->second) > 0;
}

bool PopulationIndex::PastExcept(int g) const {
  // Active members past g, less those of them marked at g; the intervals
  // past g are few (a barrier's and the one after it).
  int past = 0;
  for (auto it = active_intervals_.upper_bound(g); it != active_intervals_.end(); ++it) {
    past += it->second;
  }
  for (auto it = mark_past_.upper_bound({g, g}); it != mark_past_.end() && it->first.first == g;
       ++it) {
    past -= it->second;
  }
  return past > 0;
}

std::vector<int> PopulationIndex::IdleAt(int interval) const {
  auto it = idle_at_.find(interval);
  if (it == idle_at_.end()) return {};
  return std::vector<int>(it->second.begin(), it->second.end());
}

std::vector<int> PopulationIndex::Idle() const {
  return std::vector<int>(idle_.begin(), idle_.end());
}

int PopulationIndex::LowestActiveInterval(int cap) const {
  return active_intervals_.empty() ? cap : std::min(cap, active_intervals_.begin()->first);
}

void PopulationIndex::SetBarrier(int g, const std::vector<Member>& members) {
  finished_.clear();
  waiting_.clear();
  running_ = 0;
  barrier_ = g;
  if (g == kNoBarrier) return;
  for (size_t i = 0; i < members.size(); ++i) FileAtBarrier(static_cast<int>(i), filed_[i], +1);
}

std::vector<std::pair<int, int>> PopulationIndex::WaitingClasses() const {
  std::vector<std::pair<int, int>> out;
  for (const auto& [last_exploit, keys] : waiting_) {
    out.push_back({last_exploit, member_of_rank_[keys.begin()->name_rank]});
  }
  return out;
}

void PopulationIndex::AppendWaitingWithin(int last_exploit, int above, int below,
                                          std::vector<int>* out) const {
  CKPT_CHECK(above >= 0 && below >= 0 && above + below < finished());
  auto cls = waiting_.find(last_exploit);
  if (cls == waiting_.end()) return;
  // Positions above .. finished - 1 - below of the ranking (0-based).
  const RankKey lo = *finished_.find_by_order(static_cast<size_t>(above));
  const RankKey hi = *finished_.find_by_order(static_cast<size_t>(finished() - 1 - below));
  const RankLess less;
  for (auto it = cls->second.lower_bound(lo); it != cls->second.end() && !less(hi, *it); ++it) {
    out->push_back(member_of_rank_[it->name_rank]);
  }
}

std::string PopulationIndex::Dump() const {
  std::ostringstream os;
  auto counts = [&os](const char* what, const std::map<int, int>& c) {
    os << what << ":";
    for (const auto& [k, n] : c) os << " " << k << "x" << n;
    os << "\n";
  };
  counts("decided", decided_keys_);
  counts("barrier", barrier_keys_);
  counts("active intervals", active_intervals_);
  counts("busy marks", busy_marks_);
  os << "busy: " << busy_ << "\nmark, interval:";
  for (const auto& [k, n] : mark_past_) os << " " << k.first << "," << k.second << "x" << n;
  os << "\nmarked:";
  for (const auto& [g, i] : marked_) os << " " << g << ":" << i;
  os << "\nidle:";
  for (const auto& [iv, members] : idle_at_) {
    for (int i : members) os << " " << iv << ":" << i;
  }
  os << " (" << idle_.size() << ")\nbarrier " << barrier_ << ", running " << running_
     << ", finished:";
  for (const RankKey& k : finished_) os << " " << k.score << "/" << k.name_rank;
  os << "\nwaiting:";
  for (const auto& [le, keys] : waiting_) {
    for (const RankKey& k : keys) os << " " << le << ":" << k.score << "/" << k.name_rank;
  }
  os << "\n";
  return os.str();
}

}  // namespace ckpt::scheduler
