// PopulationIndex: what an Experiment's decisions read of its members, kept
// up to date as members change, so that an event costs O(log population)
// instead of a pass over the population (private to ckpt::scheduler).
//
// The Experiment files each member it changed (Update) before it asks; every
// query answers what a scan of the members as last filed would (the scans
// are in Experiment::CheckIndex, which the random event-order test runs
// after every event). Rankings compare (score, name rank), the ranks fixed
// at construction from the names, so that ties break by name as RanksBefore
// does without comparing strings.
//
// Ownership: holds no pointer into the members. Thread-safety: none (the
// Experiment's one thread).
#ifndef CKPT_SCHEDULER_POPULATION_INDEX_H_
#define CKPT_SCHEDULER_POPULATION_INDEX_H_

#include <ext/pb_ds/assoc_container.hpp>
#include <ext/pb_ds/tree_policy.hpp>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/records/member_record.h"
#include "ckpt/records/status.h"

namespace ckpt::scheduler {

struct Member;

class PopulationIndex {
 public:
  // No barrier filed (barrier()).
  static constexpr int kNoBarrier = std::numeric_limits<int>::min();

  // Files every member of `members` (population order).
  explicit PopulationIndex(const std::vector<Member>& members);

  // Files member `i` again from its current state (a no-op when unchanged).
  void Update(int i, const Member& m);

  // --- Sync barriers (Experiment::SyncGeneration, MaybeAdvance) ---
  // The highest barrier known decided: over marked members ahead_of - 1,
  // over unmarked active ones interval - 1; -1 when none is.
  int Decided() const;
  // Members whose mark is of a barrier <= `g`, in population order.
  std::vector<int> MarkedUpTo(int g) const;
  // Members marked as running ahead of barrier `g`, in population order.
  std::vector<int> MarkedAt(int g) const;
  // min(`cap`, the lowest of active members' barrier: ahead_of when marked,
  // else interval).
  int LowestBarrier(int cap) const;
  // Whether an active member not marked at `g` is queued or running.
  bool BusyExcept(int g) const;
  // Whether an active member not marked at `g` is past interval `g`.
  bool PastExcept(int g) const;
  // Idle members at `interval`, in population order.
  std::vector<int> IdleAt(int interval) const;
  // Every idle member, in population order.
  std::vector<int> Idle() const;
  // min(`cap`, the lowest interval of an active member).
  int LowestActiveInterval(int cap) const;
  // Whether a member is queued or running.
  bool AnyBusy() const { return busy_ > 0; }
  // Whether an idle member has an interval below `intervals`.
  bool AnyIdleBelow(int intervals) const {
    return !idle_at_.empty() && idle_at_.begin()->first < intervals;
  }

  // --- Running ahead of barrier barrier() (Experiment::RunAheadOfBarrier) ---
  // Files the members for barrier `g` (a pass over the population, once per
  // barrier).
  void SetBarrier(int g, const std::vector<Member>& members);
  int barrier() const { return barrier_; }
  // Members ranked at the barrier: marked at it (at their ahead_score), or
  // active and at its interval (at their score).
  int finished() const { return static_cast<int>(finished_.size()); }
  // Active members not marked at the barrier and below its interval.
  int running() const { return running_; }
  // Idle active members at the barrier's interval, not marked at it, by
  // last_exploit (the policy's margins depend on it): one member of each
  // class, the lowest ranked key's.
  std::vector<std::pair<int, int>> WaitingClasses() const;
  // Appends the waiting members of class `last_exploit` with at least
  // `above` finished members ranked before them and `below` after them.
  // REQUIRES: above + below < finished().
  void AppendWaitingWithin(int last_exploit, int above, int below, std::vector<int>* out) const;

  // A canonical text of everything filed, to compare with a fresh index.
  std::string Dump() const;

 private:
  // What a member was filed under.
  struct Filed {
    records::MemberStatus status = records::MemberStatus::kIdle;
    int interval = 0;
    int ahead_of = -1;
    double ahead_score = 0;
    double score = 0;
    int last_exploit = 0;
    bool active() const {
      return status != records::MemberStatus::kStopped && status != records::MemberStatus::kFailed;
    }
    bool busy() const {
      return status == records::MemberStatus::kRunning || status == records::MemberStatus::kQueued;
    }
    bool operator==(const Filed& o) const;
  };
  // A member's place in a ranking: score (NaN last), then name rank.
  struct RankKey {
    double score;
    int name_rank;
  };
  struct RankLess {
    bool operator()(const RankKey& a, const RankKey& b) const;
  };
  using RankTree =
      __gnu_pbds::tree<RankKey, __gnu_pbds::null_type, RankLess, __gnu_pbds::rb_tree_tag,
                       __gnu_pbds::tree_order_statistics_node_update>;

  static Filed FiledOf(const Member& m);
  // Adds (+1) or removes (-1) member `i` filed as `f`.
  void File(int i, const Filed& f, int sign);
  void FileAtBarrier(int i, const Filed& f, int sign);
  static void Count(std::map<int, int>* counts, int key, int sign);

  std::vector<int> name_rank_;       // member -> position in name order
  std::vector<int> member_of_rank_;  // name rank -> member
  std::vector<Filed> filed_;
  std::map<int, int> decided_keys_;               // ahead_of - 1 (marked), interval - 1 (active)
  std::map<int, int> barrier_keys_;               // active: ahead_of when marked, else interval
  std::map<int, int> active_intervals_;           // active members' intervals
  std::map<std::pair<int, int>, int> mark_past_;  // active: (ahead_of, interval)
  std::map<int, int> busy_marks_;                 // busy members' ahead_of (-1 included)
  int busy_ = 0;
  std::set<std::pair<int, int>> marked_;  // (ahead_of, member) of marked members
  std::map<int, std::set<int>> idle_at_;  // interval -> idle members
  std::set<int> idle_;                    // idle members
  int barrier_ = kNoBarrier;
  RankTree finished_;
  std::map<int, std::set<RankKey, RankLess>> waiting_;  // last_exploit -> waiting
  int running_ = 0;
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_POPULATION_INDEX_H_
