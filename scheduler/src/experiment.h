// Experiment: one experiment's population-based-training logic, and nothing
// else (private to ckpt::scheduler).
//
// It holds the members' scheduling state, the queue of member-intervals ready
// to run, the synchronous barrier and the final evaluation, asks the policy
// for decisions and applies them. It is driven by events (a result committed,
// an evaluation back, a failure, a task returned by a lost worker, a control
// verb) and hands out work (TakeNext). It owns no thread, process, socket or
// timer, reads no clock (callers pass `now`) and does its few writes through
// ExperimentIo, so a unit test drives it alone, in any order of events.
//
// Sync mode: generation g is decided once, when every active member has
// finished interval g and none is queued or running: the policy sees every
// member at g (Decide), its exploits and stops are applied, and the members
// at g are queued for g+1. A member past g (only in a resumed run) means the
// barrier of g was already applied before the crash: it is not decided again.
// Decisions are pure functions of the committed generation and the seed, so an
// interrupted run ends with the same heads as an uninterrupted one.
// Running ahead (sync): a member that finished g while others still run it
// starts g+1 at once when the policy's margins (Policy::RunAhead) show that
// g's barrier can neither exploit it nor take it as a donor, whatever the
// others score. Its record is marked (MemberRecord::ahead_of = g, with its
// score at g), so that barrier g still ranks it at g (even after it committed
// g+1, or failed there), neither waits for it nor takes it for a sign that g
// was decided. The mark is stored in its record before g+1 is handed out, so
// that a resumed run decides g the same way, even when the scheduler died
// between g+1's commit and the record after it. Deciding is then the same as
// without running ahead. A mark left in a record after g was decided (the
// record written after the commit carries the mark given with the interval)
// is harmless: a resumed run either sees members past g (decided) or decides
// g again, to the same decisions minus those applied (an exploited member is
// not ready again; scores at g do not change).
// Async mode: each member is decided on as soon as its own interval ends.
//
// Cost: what the decisions read of the members (the next barrier, who is busy
// or past it, the idle members, the ranking of who may run ahead) is kept in
// a PopulationIndex as members change, so an event costs O(log population),
// not a pass over it, and rankings compare integers, not names. What still
// passes over the population: deciding a sync barrier (once per generation)
// and deciding for one async member (the policy's view of its peers).
//
// Ownership: the caller owns the ExperimentIo, which must outlive this.
// Thread-safety: none; one thread (the scheduler's event loop) calls it.
#ifndef CKPT_SCHEDULER_EXPERIMENT_H_
#define CKPT_SCHEDULER_EXPERIMENT_H_

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/records/config.h"
#include "ckpt/records/events.h"
#include "ckpt/records/member_record.h"
#include "ckpt/records/status.h"
#include "ckpt/scheduler/policy.h"
#include "ckpt/scheduler/summary.h"
#include "population_index.h"

namespace ckpt::scheduler {

using Clock = std::chrono::steady_clock;

// One member as the scheduler tracks it: its head and its state record.
struct Member {
  std::string name;
  records::MemberRecord
      state;        // index, interval, last exploit, score, status, failures, test accuracy
  HParams hparams;  // of the head
  int64_t version = 0;
  int64_t step = 0;

  bool active() const {
    return state.status != records::MemberStatus::kStopped &&
           state.status != records::MemberStatus::kFailed;
  }
};

// One member-interval (or final evaluation) to hand to a worker.
struct WorkItem {
  std::string member;
  int64_t head_version = 0;  // the state it trains from (0: initialise)
  int64_t steps = 0;         // 0 for an evaluation
  HParams hparams;
  uint64_t init_seed = 0;
  bool eval_only = false;  // steps 0, evaluate validation and test, commit nothing
  int interval_after = 0;  // the member's interval count once committed
  // The member's state record once the result is committed (its score is
  // filled in from the result); written right after the commit.
  records::MemberRecord state_after;
};

// A member's stored version that reads back intact (ExperimentIo::NewestGoodVersion).
struct GoodVersion {
  int64_t version = 0;
  int64_t step = 0;
  HParams hparams;
  int interval = 0;  // the member's interval count when it was made
  double score = 0;  // the score it was committed with (NaN: none)
};

// The experiment's writes. Implemented over the store (StoreExperimentIo) for
// the scheduler and its tests.
class ExperimentIo {
 public:
  virtual ~ExperimentIo() = default;
  // PBT exploit: `member`'s new head points at `donor`'s head blob, with
  // `hparams`; logs `event_json`. Returns the new version.
  virtual StatusOr<int64_t> Exploit(const std::string& member, const std::string& donor,
                                    const HParams& hparams, const std::string& event_json) = 0;
  // Writes a member's state record. Failures are logged by the implementation
  // and returned (the store's errors); most callers go on, as the record is
  // reconciled from the head at the next start, but a run-ahead mark that is
  // not stored is not given.
  virtual Status SaveState(const std::string& member, const records::MemberRecord& state) = 0;
  // Appends one event (a JSON object) to the experiment's log. Failures are
  // logged by the implementation and returned (the store's errors).
  virtual Status AppendEvent(const std::string& json) = 0;
  // Records the experiment's status. Errors: the store's.
  virtual Status SetStatus(records::ExperimentStatus status) = 0;
  // Crash-test seam (SchedulerOptions::kill_point).
  virtual void KillPoint(std::string_view point) = 0;
  // When `bad_version`'s blob no longer reads back intact (its stored bytes
  // were damaged): the newest older version of `member` whose blob does.
  // NotFound when `bad_version`'s blob is intact (the failure was not the
  // store's); FailedPrecondition when no older version is intact; the store's
  // errors otherwise.
  virtual StatusOr<GoodVersion> NewestGoodVersion(const std::string& member,
                                                  int64_t bad_version) = 0;
  // Makes `version` the member's head again as a new version (a restore),
  // `event_json` logged in the same write (Store::Restore); returns it.
  // Errors: the store's.
  virtual StatusOr<int64_t> Restore(const std::string& member, int64_t version,
                                    const std::string& event_json) = 0;
};

struct ExperimentOptions {
  // FAILED results in a row before a member is stopped. Default: 3.
  int max_member_failures = 3;
  // Members evaluated on the test split when the experiment ends. Default: 5.
  int final_eval_top = 5;
  // Sync mode: members certain to continue start their next interval before
  // the barrier (see the top). Default: true; false waits for every barrier.
  bool run_ahead = true;
};

using Phase = records::ExperimentPhase;  // ckpt/records/status.h

class Experiment {
 public:
  // `members` as LoadMembers derived them from the store (in population order);
  // `status` the stored one: kDone/kStopped/kFailed start ended, kPaused paused.
  // `history`: every interval committed before (LoadHistory), which the
  // policies read; the experiment adds its own commits to it.
  Experiment(records::ExperimentConfig config, std::unique_ptr<Policy> policy,
             std::vector<Member> members, records::ExperimentStatus status,
             const ExperimentOptions& options, ExperimentIo* io, Clock::time_point now,
             History history = {});

  // Queues what can run now (and decides a barrier that a crash left
  // undecided). Call once, after construction.
  void Start();

  const std::string& id() const { return config_.name; }
  const records::ExperimentConfig& config() const { return config_; }
  records::ExperimentStatus status() const { return status_; }
  Phase phase() const { return phase_; }
  // Ended, and its end stored (see WaitingForStore).
  bool ended() const { return phase_ == Phase::kDone && !WaitingForStore(); }
  // Whether TakeNext has work to give (running, not paused, queue not empty).
  bool Runnable() const {
    return status_ == records::ExperimentStatus::kRunning && !ready_.empty();
  }
  int in_flight() const { return in_flight_; }
  int generation() const { return generation_; }
  int64_t exploits() const { return exploits_; }
  const std::vector<Member>& members() const { return members_; }
  // Every interval committed, what the policies decide from.
  const History& history() const { return history_; }
  // Member-intervals queued, oldest first (for tests and progress).
  size_t queued() const { return ready_.size(); }

  // The next member-interval. REQUIRES: Runnable().
  WorkItem TakeNext(Clock::time_point now);

  // A dispatched interval's result was committed as `version`.
  void OnCommitted(const WorkItem& item, int64_t version, int64_t step, double score,
                   int64_t samples, Clock::time_point now);
  // A dispatched evaluation came back.
  void OnEvaluated(const WorkItem& item, double test_score);
  // A dispatched item failed: the worker's FAILED (`code`, `reason`), or a
  // commit error. `head_moved`: the commit was refused because the head moved
  // (a restore): no failure is counted, the member reruns from its new head.
  // A training item refused as kBadState whose head blob is damaged in the
  // store falls back instead: the member's newest intact version becomes its
  // head again (a restore), its interval count goes back to that version's,
  // a "corrupt_state" event is logged (in the restore's own write), and it
  // retrains from there; no failure is counted.
  void OnFailed(const WorkItem& item, ipc::FailureCode code, const std::string& reason,
                bool head_moved);
  // A dispatched item will never be reported (its worker was lost): it goes
  // back to the front of the queue, from the committed head.
  void OnReturned(const WorkItem& item);
  // A worker refused the experiment's CONFIGURE (its model or dataset cannot
  // be loaded): the experiment ends at once as failed, with the reason.
  void OnConfigureRefused(const std::string& reason);

  // Writes the store refused for want of space (ResourceExhausted) are kept,
  // not dropped, so a full disk changes when the run ends, never what it ends
  // with:
  // - a decision (an exploit it could not write): the members it concerns
  //   (in sync mode, the whole generation) are not queued until it is
  //   applied;
  // - a member's state record (its failures in a row, its test score), an
  //   event, the experiment's end (its status): written again later, events
  //   in their order. The experiment has not ended() until its end and the
  //   records and events before it are stored (the final evaluation's test
  //   scores are not lost to a full disk).
  // The caller pauses dispatch while WaitingForStore() and calls
  // RetryDeferred() once the store takes writes again; a write refused for
  // any other reason is logged and skipped, as before (the records are
  // reconciled from the heads at the next start).
  bool WaitingForStore() const {
    return !deferred_.empty() || !unsaved_records_.empty() || !unlogged_events_.empty() ||
           end_unrecorded_;
  }
  // The store's refusal of the first write kept (empty when none).
  const std::string& store_refusal() const { return store_refusal_; }
  // Writes what was kept (records, events, the end), then applies the
  // deferred decisions in their order and queues what they held back; what
  // is refused again stays kept.
  void RetryDeferred();
  // The state record the scheduler wrote for `member` after a commit was
  // refused for want of space: it is written again with the rest.
  void OnRecordRefused(const std::string& member, const Status& refusal);

  // Control verbs. FailedPrecondition when the experiment has ended.
  Status Pause();
  Status Resume();
  Status Stop();
  // The store made `version` the member's head (a restore): later intervals
  // train from it. NotFound naming the member.
  Status OnRestored(const std::string& member, int64_t version, const HParams& hparams,
                    int64_t step);

  ExperimentSummary Summary(Clock::time_point now) const;
  // Member position by name, -1 when unknown.
  int Find(const std::string& member) const;

  // For tests: compares what the incremental bookkeeping (PopulationIndex)
  // answers with scans of the whole population, as the experiment made them
  // before it kept an index (the barrier, who is busy or past it, the idle
  // members, who may run ahead), and the index with one built afresh. Returns
  // the differences; empty when none.
  std::string CheckIndex();

 private:
  void AfterInterval(Member* m, Clock::time_point now);
  // The corrupt-head fallback of OnFailed; false when it does not apply or
  // could not be made (the failure is then counted as usual).
  bool FallBackFromCorruptHead(int member, const WorkItem& item, const std::string& reason);
  void MaybeAdvance();
  // Sync mode's part of MaybeAdvance: decides the next barrier when it may
  // be and queues its members. False when a decision waits for the store
  // (nothing more is queued).
  bool AdvanceSync();
  // Decides barrier `gen` (REQUIRES: no member busy at or past it).
  void DecideBarrier(int gen);
  // `members_[i]` to change: filed again in index_ at the next Flush.
  Member& Edit(int i) {
    dirty_.push_back(i);
    return members_[static_cast<size_t>(i)];
  }
  // Files the members changed since the last Flush; before index_ is read.
  void Flush();
  // CheckIndex's two ways to choose who runs ahead of a barrier: scanning
  // the members (as RunAheadOfBarrier did) and from index_ (at its barrier).
  std::vector<int> ScanRunAhead(int g) const;
  std::vector<int> IndexRunAhead() const;
  // Sync mode: the generation whose barrier is next (the lowest interval of
  // an active member, one running ahead counted at the barrier it ran ahead
  // of); drops marks of barriers already decided (left in records by a
  // resumed run).
  int SyncGeneration();
  // `m` as barrier `gen` ranks it: at gen, and active, when it runs ahead of it.
  MemberProgress BarrierProgress(const Member& m, int gen) const;
  // Sync mode: queues the idle members at the undecided barrier that the
  // policy's margins let run ahead of it.
  void RunAheadOfBarrier();
  // False when the store refused one for want of space: it and the ones
  // after it are in deferred_.
  bool ApplyDecisions(const std::map<std::string, Decision>& decisions);
  void Enqueue(int member, bool eval, bool front = false);
  // The experiment's writes (ExperimentIo) that keep a refusal for want of
  // space to redo (see WaitingForStore); they return the store's status.
  Status SaveRecord(const Member& m);
  void LogEvent(std::string json);
  // Keeps `s`'s message as store_refusal() when it is the first kept.
  void NoteRefusal(const Status& s);
  // Writes what was kept, oldest first; false when the store refused one for
  // want of space again (it and those after it stay kept).
  bool WriteKept();
  void StartFinalEval();
  void Finish();
  void End(records::ExperimentStatus status);
  MemberProgress Progress(const Member& m) const;

  struct Pending {
    int member;
    bool eval;
  };

  const records::ExperimentConfig config_;
  const std::unique_ptr<Policy> policy_;
  const ExperimentOptions options_;
  ExperimentIo* const io_;
  std::vector<Member> members_;
  // What the decisions read of members_, kept as they change (Edit, Flush).
  PopulationIndex index_;
  std::vector<int> dirty_;  // members changed since the last Flush
  std::unordered_map<std::string, int> by_name_;
  History history_;
  std::deque<Pending> ready_;
  records::ExperimentStatus status_ = records::ExperimentStatus::kRunning;
  Phase phase_ = Phase::kTraining;
  bool training_closed_ = false;  // target reached / wall time: no new intervals
  int generation_ = 0;
  int in_flight_ = 0;
  int evals_pending_ = 0;
  int64_t exploits_ = 0;
  std::map<std::string, Decision> deferred_;  // refused for want of space
  std::set<int> unsaved_records_;             // members whose record is to write again
  std::deque<std::string> unlogged_events_;   // events to append, in order
  bool end_unrecorded_ = false;               // status_ (an end) is to record
  std::string store_refusal_;
  int64_t samples_ = 0;
  int64_t intervals_this_run_ = 0;
  Clock::time_point start_;
  Clock::time_point first_dispatch_{};
  Clock::time_point first_result_{};
  Clock::time_point last_result_{};
};

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_EXPERIMENT_H_
