#include "experiment.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <utility>

#include "ckpt/base/kill_point.h"
#include "log.h"

namespace ckpt::scheduler {
namespace {

// Salt of the per-member initial-weights seed (kept: stores depend on it).
constexpr uint64_t kInitSeedSalt = 0x1A1A;

}  // namespace

Experiment::Experiment(records::ExperimentConfig config, std::unique_ptr<Policy> policy,
                       std::vector<Member> members, records::ExperimentStatus status,
                       const ExperimentOptions& options, ExperimentIo* io, Clock::time_point now,
                       History history)
    : config_(std::move(config)),
      policy_(std::move(policy)),
      options_(options),
      io_(io),
      members_(std::move(members)),
      index_(members_),
      history_(std::move(history)),
      status_(status),
      start_(now) {
  for (size_t i = 0; i < members_.size(); ++i) by_name_[members_[i].name] = static_cast<int>(i);
  if (status_ == records::ExperimentStatus::kDone ||
      status_ == records::ExperimentStatus::kStopped ||
      status_ == records::ExperimentStatus::kFailed) {
    phase_ = Phase::kDone;
  }
}

void Experiment::Start() {
  if (phase_ == Phase::kDone) return;
  MaybeAdvance();
}

int Experiment::Find(const std::string& member) const {
  auto it = by_name_.find(member);
  return it == by_name_.end() ? -1 : it->second;
}

MemberProgress Experiment::Progress(const Member& m) const {
  return MemberProgress{m.name,        m.state.index, m.state.interval, m.state.last_exploit,
                        m.state.score, m.hparams,     m.active()};
}

void Experiment::Enqueue(int member, bool eval, bool front) {
  Member& m = Edit(member);
  if (!eval) m.state.status = records::MemberStatus::kQueued;
  if (front) {
    ready_.push_front(Pending{member, eval});
  } else {
    ready_.push_back(Pending{member, eval});
  }
}

WorkItem Experiment::TakeNext(Clock::time_point now) {
  CKPT_CHECK(Runnable());
  const Pending p = ready_.front();
  ready_.pop_front();
  Member& m = Edit(p.member);
  if (!p.eval && m.version == 0) {
    // Its first interval: the policy may propose from the results so far.
    if (auto proposed = policy_->Propose(Progress(m), history_)) m.hparams = std::move(*proposed);
  }
  WorkItem w;
  w.member = m.name;
  w.head_version = m.version;
  w.steps = p.eval ? 0 : config_.steps_per_interval;
  w.hparams = m.hparams;
  w.init_seed = MixSeed(config_.seed, kInitSeedSalt, static_cast<uint64_t>(m.state.index));
  w.eval_only = p.eval;
  w.interval_after = p.eval ? m.state.interval : m.state.interval + 1;
  w.state_after = m.state;
  w.state_after.interval = w.interval_after;
  w.state_after.failures = 0;
  w.state_after.status = w.interval_after >= config_.intervals ? records::MemberStatus::kDone
                                                               : records::MemberStatus::kIdle;
  if (!p.eval) m.state.status = records::MemberStatus::kRunning;
  if (first_dispatch_ == Clock::time_point{}) first_dispatch_ = now;
  ++in_flight_;
  return w;
}

void Experiment::OnCommitted(const WorkItem& item, int64_t version, int64_t step, double score,
                             int64_t samples, Clock::time_point now) {
  --in_flight_;
  const int i = Find(item.member);
  if (i < 0) return;
  Member* m = &Edit(i);
  if (!records::Finished(m->state.status)) m->state.status = records::MemberStatus::kIdle;
  m->state.interval = item.interval_after;
  m->state.score = score;
  m->state.failures = 0;
  m->version = version;
  m->step = step;
  history_[{item.interval_after, m->state.index}] =
      Observation{m->state.index, item.interval_after, item.hparams, score};
  samples_ += samples;
  ++intervals_this_run_;
  last_result_ = now;
  if (first_result_ == Clock::time_point{}) first_result_ = now;
  io_->KillPoint(base::kill_points::kSchedulerCommitted);
  if (m->state.status == records::MemberStatus::kFailed) {
    // It ended with its failed experiment; the commit wrote the interval's own record.
    (void)SaveRecord(*m);
    return;
  }
  if (phase_ != Phase::kTraining) {
    if (m->state.interval >= config_.intervals) m->state.status = records::MemberStatus::kDone;
    return;
  }
  AfterInterval(m, now);
}

void Experiment::AfterInterval(Member* m, Clock::time_point now) {
  const auto& c = config_;
  if (m->state.interval >= c.intervals) m->state.status = records::MemberStatus::kDone;
  if (c.target_metric && m->state.score >= *c.target_metric && !training_closed_) {
    training_closed_ = true;
    Logger().info("{}: {} reached the target {} (score {:.4f}); no new intervals", c.name, m->name,
                  *c.target_metric, m->state.score);
    LogEvent(records::EncodeEvent(
        records::TargetReachedEvent{m->name, m->state.score, *c.target_metric}));
  }
  if (c.max_wall_s > 0 && !training_closed_ &&
      std::chrono::duration<double>(now - start_).count() >= c.max_wall_s) {
    training_closed_ = true;
    Logger().info("{}: wall-time limit of {} s reached; no new intervals", c.name, c.max_wall_s);
    LogEvent(records::EncodeEvent(records::WallTimeReachedEvent{c.max_wall_s}));
  }
  if (!policy_->synchronous() && !training_closed_ &&
      m->state.status == records::MemberStatus::kIdle) {
    std::vector<MemberProgress> all;
    for (const auto& o : members_) all.push_back(Progress(o));
    if (ApplyDecisions(policy_->Decide(m->state.interval, {Progress(*m)}, all, history_)) &&
        m->state.status == records::MemberStatus::kIdle) {
      Enqueue(Find(m->name), false);
    }
  }
  MaybeAdvance();
}

void Experiment::Flush() {
  for (int i : dirty_) index_.Update(i, members_[static_cast<size_t>(i)]);
  dirty_.clear();
}

void Experiment::MaybeAdvance() {
  if (phase_ != Phase::kTraining) return;
  const auto& c = config_;
  if (!training_closed_) {
    if (policy_->synchronous()) {
      if (!AdvanceSync()) return;  // the generation waits for the store
      RunAheadOfBarrier();
    } else {
      Flush();
      for (int i : index_.Idle()) {
        const Member& m = members_[static_cast<size_t>(i)];
        if (m.state.interval < c.intervals && !deferred_.count(m.name)) Enqueue(i, false);
      }
      Flush();
      generation_ = index_.LowestActiveInterval(c.intervals);
    }
  }
  Flush();
  const bool open = index_.AnyBusy() || (!training_closed_ && index_.AnyIdleBelow(c.intervals));
  if (!open && in_flight_ == 0) StartFinalEval();
}

bool Experiment::AdvanceSync() {
  const int gen = SyncGeneration();
  // A member running ahead of this barrier neither holds it nor is past it.
  const bool busy = index_.BusyExcept(gen);
  // A member past the generation (only in a resumed run) means its barrier
  // was already applied: deciding it again would rank the laggards against
  // newer scores and exploit them a second time. Finished members count:
  // they are the usual case when a run is killed in its last generation.
  const bool ahead = index_.PastExcept(gen);
  // Once gen is decided, its idle members are queued even while others
  // run (those that ran ahead of it, when a decision was deferred).
  if ((busy && gen != generation_) || gen >= config_.intervals) return true;
  if (!busy && !ahead && gen > 0 && gen != generation_) DecideBarrier(gen);
  if (!deferred_.empty()) return false;
  generation_ = gen;
  // Members ahead of the generation (a resumed run) wait; those at it run.
  Flush();
  for (int i : index_.IdleAt(gen)) Enqueue(i, false);
  return true;
}

void Experiment::DecideBarrier(int gen) {
  std::vector<MemberProgress> all, at_gen;
  all.reserve(members_.size());
  for (const auto& o : members_) {
    all.push_back(BarrierProgress(o, gen));
    if (all.back().active && all.back().intervals_done == gen) at_gen.push_back(all.back());
  }
  // Decided once: a refused exploit is retried from deferred_, never
  // decided again (the policy would see the ones already applied).
  generation_ = gen;
  ApplyDecisions(policy_->Decide(gen, at_gen, all, history_));
  Flush();
  for (int i : index_.MarkedAt(gen)) Edit(i).state.ahead_of = -1;  // ranked at gen: done
}

int Experiment::SyncGeneration() {
  // Every barrier up to `decided` was decided: an unmarked member at interval
  // u was handed u after barrier u-1 (or ran ahead of it and was unmarked when
  // it was decided), and a mark of g was given once barrier g-1 was. A mark of
  // a barrier decided since is dropped: left in a record by a resumed run
  // (the record written after a commit carries the mark the interval was
  // given with), it would hold the generation at a barrier already decided.
  Flush();
  const int decided = index_.Decided();
  for (int i : index_.MarkedUpTo(decided)) Edit(i).state.ahead_of = -1;
  Flush();
  return index_.LowestBarrier(config_.intervals);
}

MemberProgress Experiment::BarrierProgress(const Member& m, int gen) const {
  if (m.state.ahead_of != gen) return Progress(m);
  // Whatever it did since (committed gen+1, failed there): at gen it had
  // this score and took part.
  return MemberProgress{m.name,    m.state.index, gen, m.state.last_exploit, m.state.ahead_score,
                        m.hparams, true};
}

void Experiment::RunAheadOfBarrier() {
  if (!options_.run_ahead || training_closed_ || !deferred_.empty() || phase_ != Phase::kTraining) {
    return;
  }
  const int g = generation_ + 1;  // the barrier not decided yet
  if (g <= 0 || g >= config_.intervals) return;
  // The members ranked at g: those that finished it (or run ahead of it) and
  // those still running towards it, whose scores are unknown (the index
  // keeps them; a new barrier is filed once).
  Flush();
  if (index_.barrier() != g) index_.SetBarrier(g, members_);
  const int f = index_.finished();
  const int running = index_.running();
  const auto classes = index_.WaitingClasses();
  // With nothing running the barrier is decided as soon as it may be.
  if (classes.empty() || running == 0) return;
  // The policies' margins depend on a member's place in the schedule, not on
  // its name or hyperparameters: asked once per last exploit (the waiting
  // members are all at g). `above` members rank before the member and
  // `below` after it, among those finished.
  std::vector<int> sure;
  for (const auto& [last_exploit, example] : classes) {
    const std::optional<RunAheadMargins> margins =
        policy_->RunAhead(g, Progress(members_[static_cast<size_t>(example)]), f + running);
    if (!margins || margins->above + margins->below >= f) continue;
    index_.AppendWaitingWithin(last_exploit, margins->above, margins->below, &sure);
  }
  std::sort(sure.begin(), sure.end());  // queued in population order
  for (int i : sure) {
    Member& m = Edit(i);
    // The mark is stored before the interval is given: its result may be
    // committed and the scheduler killed before the record after it is
    // written, and the record reconciled from that head must still say that
    // it ran ahead of g, not that g was decided (found by ckpt-chaos: a
    // barrier that made no exploits). Not stored, not given.
    m.state.ahead_of = g;
    m.state.ahead_score = m.state.score;
    if (!SaveRecord(m).ok()) {
      m.state.ahead_of = -1;
      m.state.ahead_score = std::nan("");
      continue;
    }
    Enqueue(i, false);
  }
}

bool Experiment::ApplyDecisions(const std::map<std::string, Decision>& decisions) {
  for (auto it = decisions.begin(); it != decisions.end(); ++it) {
    const auto& [name, d] = *it;
    const int i = Find(name);
    if (i < 0) continue;
    Member& m = Edit(i);
    if (d.kind == Decision::Kind::kExploit) {
      const int donor_index = Find(d.donor);
      if (donor_index < 0 || donor_index == i) continue;
      auto v = io_->Exploit(name, d.donor, d.hparams,
                            records::EncodeEvent(records::ExploitEvent{
                                name, d.donor, m.state.interval, d.why, d.hparams, 0}));
      if (v.status().IsResourceExhausted()) {
        NoteRefusal(v.status());
        deferred_.insert(it, decisions.end());
        Logger().warn("{}: exploit {} <- {} deferred until the store has space: {}", config_.name,
                      name, d.donor, v.status().ToString());
        return false;
      }
      if (!v.ok()) {
        Logger().warn("{}: exploit {} <- {} failed: {}", config_.name, name, d.donor,
                      v.status().ToString());
        continue;
      }
      const Member& donor = members_[donor_index];
      m.version = *v;
      m.step = donor.step;
      m.hparams = d.hparams;
      m.state.last_exploit = m.state.interval;
      ++exploits_;
      io_->KillPoint(base::kill_points::kSchedulerExploited);
      (void)SaveRecord(m);
    } else if (d.kind == Decision::Kind::kStop) {
      m.state.status = records::MemberStatus::kStopped;
      (void)SaveRecord(m);
      LogEvent(records::EncodeEvent(records::MemberStoppedEvent{name, d.why, std::nullopt}));
    }
  }
  return true;
}

void Experiment::RetryDeferred() {
  if (!WaitingForStore()) return;
  store_refusal_.clear();
  if (!WriteKept() || deferred_.empty()) return;
  const std::map<std::string, Decision> decisions = std::exchange(deferred_, {});
  if (phase_ != Phase::kTraining) return;
  if (!ApplyDecisions(decisions)) return;
  Logger().info("{}: {} deferred decision(s) applied; the store has space again", config_.name,
                decisions.size());
  MaybeAdvance();  // queues what they held back
}

void Experiment::OnEvaluated(const WorkItem& item, double test_score) {
  --in_flight_;
  const int i = Find(item.member);
  if (i < 0 || phase_ != Phase::kFinalEval) return;
  Edit(i).state.test_score = test_score;
  if (--evals_pending_ == 0) Finish();
}

void Experiment::OnFailed(const WorkItem& item, ipc::FailureCode code, const std::string& reason,
                          bool head_moved) {
  --in_flight_;
  const int i = Find(item.member);
  if (i < 0) return;
  Member* m = &Edit(i);
  if (!item.eval_only && !records::Finished(m->state.status)) {
    m->state.status = records::MemberStatus::kIdle;
  }
  if (phase_ == Phase::kDone) return;
  if (!item.eval_only && !head_moved && code == ipc::FailureCode::kBadState &&
      phase_ == Phase::kTraining && item.head_version > 0 && item.head_version == m->version &&
      FallBackFromCorruptHead(i, item, reason)) {
    return;
  }
  if (!head_moved) {
    ++m->state.failures;
    // Kept in its record, so that a restarted scheduler goes on counting
    // failures in a row instead of starting again from zero.
    (void)SaveRecord(*m);
  }
  LogEvent(records::EncodeEvent(records::FailedEvent{m->name, code, reason, m->state.failures}));
  Logger().warn("{}: member {} failed ({}): {}", config_.name, m->name, ipc::FailureCodeName(code),
                reason);
  if (item.eval_only) {
    // A member that cannot be evaluated keeps its trained state; it is
    // reported without a test accuracy.
    if (m->state.failures < options_.max_member_failures) {
      Enqueue(i, true);
    } else if (--evals_pending_ == 0) {
      Finish();
    }
    return;
  }
  if (m->state.failures >= options_.max_member_failures) {
    m->state.status = records::MemberStatus::kFailed;
    (void)SaveRecord(*m);
    LogEvent(records::EncodeEvent(records::MemberStoppedEvent{
        m->name, "failed " + std::to_string(m->state.failures) + " times; last: " + reason,
        m->version}));
    Logger().warn("{}: member {} stopped after {} failures; its last good version {} is kept",
                  config_.name, m->name, m->state.failures, m->version);
    MaybeAdvance();
  } else {
    Enqueue(i, false, /*front=*/true);
  }
}

bool Experiment::FallBackFromCorruptHead(int member, const WorkItem& item,
                                         const std::string& reason) {
  Member& m = Edit(member);
  auto good = io_->NewestGoodVersion(m.name, item.head_version);
  if (!good.ok()) {
    if (!good.status().IsNotFound()) {
      Logger().error("{}: member {} v{} is damaged in the store and cannot fall back: {}",
                     config_.name, m.name, item.head_version, good.status().ToString());
    }
    return false;
  }
  // Every interval trains steps_per_interval steps, so a version's step says
  // its interval. The store's bookkeeping of intervals (trained versions'
  // metrics) may miss it: an exploit's interval is counted from trained
  // versions before it, which retention may have deleted (found by
  // ckpt-chaos: a member fell back "to interval 0" and trained too far).
  int interval = good->interval;
  if (config_.steps_per_interval > 0 && good->step % config_.steps_per_interval == 0) {
    interval = static_cast<int>(good->step / config_.steps_per_interval);
  }
  // The state record goes first: a crash before the restore leaves the damaged
  // head, which the next dispatch finds again.
  m.state.interval = interval;
  m.state.ahead_of = -1;  // it is behind its barrier now
  m.state.last_exploit = std::min(m.state.last_exploit, interval);
  m.state.score = good->score;
  m.state.status = records::MemberStatus::kIdle;
  (void)SaveRecord(m);
  // The event goes in the restore's own write: a restored head without it
  // would read, in the event log, as intervals trained twice for no reason
  // (found by ckpt-chaos: a scheduler killed, or a full disk refusing the
  // event, between the restore and a separate append).
  auto v = io_->Restore(m.name, good->version,
                        records::EncodeEvent(records::CorruptStateEvent{
                            m.name, item.head_version, good->version, 0, interval, reason}));
  if (!v.ok()) {
    Logger().error("{}: member {}: restoring v{} after a damaged v{}: {}", config_.name, m.name,
                   good->version, item.head_version, v.status().ToString());
    return false;
  }
  m.version = *v;
  m.step = good->step;
  m.hparams = good->hparams;
  Logger().warn(
      "{}: member {} v{} is damaged in the store ({}); it falls back to v{} (interval "
      "{}) as v{} and retrains from there",
      config_.name, m.name, item.head_version, reason, good->version, interval, *v);
  MaybeAdvance();
  return true;
}

void Experiment::OnReturned(const WorkItem& item) {
  --in_flight_;
  const int i = Find(item.member);
  if (i < 0) return;
  Member& m = Edit(i);
  if (!item.eval_only && !records::Finished(m.state.status)) {
    m.state.status = records::MemberStatus::kIdle;
  }
  if (phase_ == Phase::kDone) return;
  Enqueue(i, item.eval_only, /*front=*/true);
}

void Experiment::OnConfigureRefused(const std::string& reason) {
  if (phase_ == Phase::kDone) return;
  Logger().error("{}: a worker refused the experiment: {}; the experiment has failed", config_.name,
                 reason);
  LogEvent(records::EncodeEvent(records::ConfigureRefusedEvent{reason}));
  End(records::ExperimentStatus::kFailed);
}

void Experiment::End(records::ExperimentStatus status) {
  for (const auto& p : ready_) {
    Member& m = Edit(p.member);
    if (m.state.status == records::MemberStatus::kQueued)
      m.state.status = records::MemberStatus::kIdle;
  }
  ready_.clear();
  // A failed experiment trains no member again (Resume refuses it): each
  // that had not finished ends failed, in its record too, rather than
  // reading as running for ever.
  if (status == records::ExperimentStatus::kFailed) {
    for (size_t i = 0; i < members_.size(); ++i) {
      if (records::Finished(members_[i].state.status)) continue;
      Member& m = Edit(static_cast<int>(i));
      m.state.status = records::MemberStatus::kFailed;
      (void)SaveRecord(m);
    }
  }
  phase_ = Phase::kDone;
  status_ = status;
  // Recorded after the records and events before it (the test scores are in
  // the records of a done experiment).
  end_unrecorded_ = true;
  (void)WriteKept();
}

Status Experiment::SaveRecord(const Member& m) {
  const int i = Find(m.name);
  Status s = io_->SaveState(m.name, m.state);
  if (s.IsResourceExhausted()) {
    unsaved_records_.insert(i);
    NoteRefusal(s);
  } else {
    unsaved_records_.erase(i);  // written, or refused for good (logged by io_)
  }
  return s;
}

void Experiment::LogEvent(std::string json) {
  if (unlogged_events_.empty()) {
    Status s = io_->AppendEvent(json);
    if (!s.IsResourceExhausted()) return;  // appended, or refused for good (logged by io_)
    NoteRefusal(s);
  }
  unlogged_events_.push_back(std::move(json));  // after those kept before it
}

void Experiment::NoteRefusal(const Status& s) {
  if (store_refusal_.empty()) store_refusal_ = s.ToString();
}

void Experiment::OnRecordRefused(const std::string& member, const Status& refusal) {
  const int i = Find(member);
  if (i < 0 || !refusal.IsResourceExhausted()) return;
  unsaved_records_.insert(i);
  NoteRefusal(refusal);
}

bool Experiment::WriteKept() {
  while (!unsaved_records_.empty()) {
    const Member& m = members_[*unsaved_records_.begin()];
    const Status s = io_->SaveState(m.name, m.state);
    if (s.IsResourceExhausted()) {
      NoteRefusal(s);
      return false;
    }
    unsaved_records_.erase(unsaved_records_.begin());
  }
  while (!unlogged_events_.empty()) {
    const Status s = io_->AppendEvent(unlogged_events_.front());
    if (s.IsResourceExhausted()) {
      NoteRefusal(s);
      return false;
    }
    unlogged_events_.pop_front();
  }
  if (end_unrecorded_) {
    const Status s = io_->SetStatus(status_);
    if (s.IsResourceExhausted()) {
      NoteRefusal(s);
      Logger().warn("{}: recording its end ({}) waits for the store to have space: {}", id(),
                    records::ExperimentStatusName(status_), s.ToString());
      return false;
    }
    end_unrecorded_ = false;
    if (!s.ok()) {
      Logger().error("{}: recording its end ({}): {}", id(), records::ExperimentStatusName(status_),
                     s.ToString());
    }
  }
  return true;
}

Status Experiment::Pause() {
  if (phase_ == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + id() + " has ended (" +
                                      records::ExperimentStatusName(status_) + ")");
  }
  CKPT_RETURN_IF_ERROR(io_->SetStatus(records::ExperimentStatus::kPaused));
  status_ = records::ExperimentStatus::kPaused;
  LogEvent(records::EncodeEvent(records::PausedEvent{}));
  return Status::OK();
}

Status Experiment::Resume() {
  if (phase_ == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + id() + " has ended (" +
                                      records::ExperimentStatusName(status_) + ")");
  }
  CKPT_RETURN_IF_ERROR(io_->SetStatus(records::ExperimentStatus::kRunning));
  status_ = records::ExperimentStatus::kRunning;
  LogEvent(records::EncodeEvent(records::ResumedEvent{}));
  return Status::OK();
}

Status Experiment::Stop() {
  if (phase_ == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + id() + " has ended (" +
                                      records::ExperimentStatusName(status_) + ")");
  }
  CKPT_RETURN_IF_ERROR(io_->SetStatus(records::ExperimentStatus::kStopped));
  LogEvent(records::EncodeEvent(records::StoppedEvent{}));
  End(records::ExperimentStatus::kStopped);
  return Status::OK();
}

Status Experiment::OnRestored(const std::string& member, int64_t version, const HParams& hparams,
                              int64_t step) {
  const int i = Find(member);
  if (i < 0) return Status::NotFound("member " + member + " of experiment " + id());
  // A task in flight was sent the old head: its commit is refused (the head
  // moved) and the member reruns from this version.
  Member& m = Edit(i);
  m.version = version;
  m.hparams = hparams;
  m.step = step;
  return Status::OK();
}

void Experiment::StartFinalEval() {
  phase_ = Phase::kFinalEval;
  std::vector<MemberProgress> all;
  for (const auto& o : members_) {
    if (o.version > 0) all.push_back(Progress(o));
  }
  int n = 0;
  for (const auto* p : RankByScore(all)) {
    if (n >= options_.final_eval_top) break;
    Enqueue(Find(p->member), true);
    ++n;
  }
  evals_pending_ = n;
  if (n == 0) Finish();
}

// The test accuracies are kept in the members' state records (written before
// the experiment is marked done), so a finished experiment reports them after
// a restart without reading its event log.
void Experiment::Finish() {
  records::FinalEvalEvent final_eval;
  final_eval.metric = config_.Metric();
  for (const auto& m : members_) {
    if (std::isnan(m.state.test_score)) continue;
    (void)SaveRecord(m);
    final_eval.results.push_back({m.name, m.state.score, m.state.test_score, m.version});
  }
  LogEvent(records::EncodeEvent(final_eval));
  End(records::ExperimentStatus::kDone);
}

ExperimentSummary Experiment::Summary(Clock::time_point now) const {
  ExperimentSummary s;
  s.id = id();
  s.status = status_;
  s.phase = phase_;
  s.population = config_.population;
  s.metric = config_.Metric();
  s.intervals = config_.intervals;
  s.generation = generation_;
  s.exploits = exploits_;
  s.train_samples = samples_;
  s.wall_s = std::chrono::duration<double>(now - start_).count();
  s.member_intervals = intervals_this_run_;
  if (first_dispatch_ != Clock::time_point{} && last_result_ > first_dispatch_) {
    s.training_s = std::chrono::duration<double>(last_result_ - first_dispatch_).count();
    s.first_result_s = std::chrono::duration<double>(first_result_ - first_dispatch_).count();
  }
  for (const auto& m : members_) {
    MemberSummary ms;
    ms.member = m.name;
    ms.intervals_done = m.state.interval;
    ms.status = records::StoredMemberStatus(m.state.status);
    ms.val_score = m.state.score;
    ms.test_score = m.state.test_score;
    ms.version = m.version;
    ms.step = m.step;
    ms.hparams = m.hparams;
    s.members.push_back(ms);
  }
  // Best first; members without a score (NaN) last.
  std::sort(s.members.begin(), s.members.end(), [](const MemberSummary& a, const MemberSummary& b) {
    const bool an = !format::IsEvaluated(a.val_score), bn = !format::IsEvaluated(b.val_score);
    if (an != bn) return bn;
    if (!an && a.val_score != b.val_score) return a.val_score > b.val_score;
    return a.member < b.member;
  });
  return s;
}

}  // namespace ckpt::scheduler
