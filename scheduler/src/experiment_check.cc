// Experiment::CheckIndex: the scans of the population that the experiment
// made at every event before it kept a PopulationIndex, kept as the
// reference the index must answer as (the random event-order test calls it
// after every event).
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <sstream>
#include <vector>

#include "experiment.h"

namespace ckpt::scheduler {
namespace {

using records::MemberStatus;

bool Busy(const Member& m) {
  return m.state.status == MemberStatus::kRunning || m.state.status == MemberStatus::kQueued;
}

// SyncGeneration's `decided`, scanned.
int ScanDecided(const std::vector<Member>& members) {
  int decided = -1;
  for (const auto& m : members) {
    if (m.state.ahead()) {
      decided = std::max(decided, m.state.ahead_of - 1);
    } else if (m.active()) {
      decided = std::max(decided, m.state.interval - 1);
    }
  }
  return decided;
}

// Members for which `pred` holds, in population order.
template <typename Pred>
std::vector<int> Scan(const std::vector<Member>& members, Pred pred) {
  std::vector<int> out;
  for (size_t i = 0; i < members.size(); ++i) {
    if (pred(members[i])) out.push_back(static_cast<int>(i));
  }
  return out;
}

template <typename T>
void Compare(const char* what, int g, const T& kept, const T& scanned, std::ostringstream* diff) {
  if (kept == scanned) return;
  *diff << what << "(" << g << "): the index differs from the scan\n";
}

std::string Ints(const std::vector<int>& v) {
  std::string s;
  for (int i : v) s += " " + std::to_string(i);
  return s;
}

}  // namespace

// RunAheadOfBarrier as it was: who may run ahead of barrier g, by scanning
// the members and ranking the finished ones with nth_element.
std::vector<int> Experiment::ScanRunAhead(int g) const {
  struct Finished {
    double score;
    const std::string* name;
  };
  std::vector<Finished> finished;
  std::vector<int> waiting, sure;
  int running = 0;
  for (size_t i = 0; i < members_.size(); ++i) {
    const Member& m = members_[i];
    if (m.state.ahead_of == g) {
      finished.push_back({m.state.ahead_score, &m.name});
    } else if (!m.active()) {
      continue;
    } else if (m.state.interval < g) {
      ++running;
    } else if (m.state.interval == g) {
      finished.push_back({m.state.score, &m.name});
      if (m.state.status == MemberStatus::kIdle) waiting.push_back(static_cast<int>(i));
    }
  }
  if (waiting.empty() || running == 0) return sure;
  const int f = static_cast<int>(finished.size());
  const auto before = [](const Finished& a, const Finished& b) {
    return RanksBefore(a.score, *a.name, b.score, *b.name);
  };
  const auto nth = [&](int n) {
    std::nth_element(finished.begin(), finished.begin() + (n - 1), finished.end(), before);
    return finished[static_cast<size_t>(n - 1)];
  };
  for (int i : waiting) {
    const Member& m = members_[static_cast<size_t>(i)];
    const auto margins = policy_->RunAhead(g, Progress(m), f + running);
    if (!margins || margins->above + margins->below >= f) continue;
    const Finished self{m.state.score, &m.name};
    if (margins->above > 0 && !before(nth(margins->above), self)) continue;
    if (margins->below > 0 && !before(self, nth(f - margins->below + 1))) continue;
    sure.push_back(i);
  }
  return sure;
}

// RunAheadOfBarrier's choice from the index, at its barrier.
std::vector<int> Experiment::IndexRunAhead() const {
  std::vector<int> sure;
  const int g = index_.barrier();
  if (index_.running() == 0) return sure;
  const int f = index_.finished();
  for (const auto& [last_exploit, example] : index_.WaitingClasses()) {
    const auto margins = policy_->RunAhead(g, Progress(members_[static_cast<size_t>(example)]),
                                           f + index_.running());
    if (!margins || margins->above + margins->below >= f) continue;
    index_.AppendWaitingWithin(last_exploit, margins->above, margins->below, &sure);
  }
  std::sort(sure.begin(), sure.end());
  return sure;
}

std::string Experiment::CheckIndex() {
  Flush();
  std::ostringstream diff;
  const auto& ms = members_;
  const int intervals = config_.intervals;
  const int decided = ScanDecided(ms);
  Compare("Decided", 0, index_.Decided(), decided, &diff);
  Compare("MarkedUpTo", decided, index_.MarkedUpTo(decided),
          Scan(ms, [&](const Member& m) { return m.state.ahead() && m.state.ahead_of <= decided; }),
          &diff);
  int lowest = intervals, lowest_active = intervals;
  for (const auto& m : ms) {
    if (!m.active()) continue;
    lowest = std::min(lowest, m.state.ahead() ? m.state.ahead_of : m.state.interval);
    lowest_active = std::min(lowest_active, m.state.interval);
  }
  Compare("LowestBarrier", intervals, index_.LowestBarrier(intervals), lowest, &diff);
  Compare("LowestActiveInterval", intervals, index_.LowestActiveInterval(intervals), lowest_active,
          &diff);
  for (int g : {lowest, generation_, generation_ + 1}) {
    const auto busy =
        Scan(ms, [g](const Member& m) { return m.active() && m.state.ahead_of != g && Busy(m); });
    const auto past = Scan(ms, [g](const Member& m) {
      return m.active() && m.state.ahead_of != g && m.state.interval > g;
    });
    Compare("BusyExcept", g, index_.BusyExcept(g), !busy.empty(), &diff);
    Compare("PastExcept", g, index_.PastExcept(g), !past.empty(), &diff);
    Compare("MarkedAt", g, index_.MarkedAt(g),
            Scan(ms, [g](const Member& m) { return m.state.ahead_of == g; }), &diff);
    Compare("IdleAt", g, index_.IdleAt(g),
            Scan(ms,
                 [g](const Member& m) {
                   return m.active() && m.state.status == MemberStatus::kIdle &&
                          m.state.interval == g;
                 }),
            &diff);
  }
  const auto idle = Scan(ms, [](const Member& m) { return m.state.status == MemberStatus::kIdle; });
  Compare("Idle", 0, index_.Idle(), idle, &diff);
  Compare("AnyBusy", 0, index_.AnyBusy(), !Scan(ms, Busy).empty(), &diff);
  Compare("AnyIdleBelow", intervals, index_.AnyIdleBelow(intervals),
          !Scan(ms,
                [&](const Member& m) {
                  return m.state.status == MemberStatus::kIdle && m.state.interval < intervals;
                })
               .empty(),
          &diff);
  if (const int g = generation_ + 1; policy_->synchronous() && g > 0 && g < intervals) {
    if (index_.barrier() != g) index_.SetBarrier(g, members_);
    const auto kept = IndexRunAhead(), scanned = ScanRunAhead(g);
    if (kept != scanned) {
      diff << "run ahead of " << g << ": index" << Ints(kept) << ", scan" << Ints(scanned) << "\n";
    }
  }
  PopulationIndex fresh(members_);
  fresh.SetBarrier(index_.barrier(), members_);
  if (fresh.Dump() != index_.Dump()) {
    diff << "index kept:\n" << index_.Dump() << "index afresh:\n" << fresh.Dump();
  }
  return diff.str();
}

}  // namespace ckpt::scheduler
