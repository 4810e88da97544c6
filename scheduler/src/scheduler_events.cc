// SchedulerImpl: the workers' events, routed to their experiments, and
// dispatch (scheduler_impl.h).
#include <algorithm>
#include <string>
#include <vector>

#include "ckpt/records/events.h"
#include "log.h"
#include "scheduler_impl.h"
#include "trace.h"

namespace ckpt::scheduler {

void SchedulerImpl::Dispatch() {
  if (stopping_ || !pool_) return;
  for (const auto& [id, entry] : entries_) {
    if (store_health_.waiting_for_space()) break;
    if (entry.experiment->WaitingForStore()) {
      store_health_.WaitForSpace(id + ": " + entry.experiment->store_refusal());
    }
  }
  if (store_health_.waiting_for_space()) return;
  dispatcher_.Dispatch(pool_.get(), InOrder(), Clock::now());
}

void SchedulerImpl::NoteStateSize(Entry& entry, uint64_t bytes) {
  if (bytes <= entry.state_bytes) return;
  entry.state_bytes = bytes;
  uint64_t total = 0;
  for (const auto& [id, x] : entries_) {
    if (!x.experiment->ended()) {
      total += x.state_bytes * static_cast<uint64_t>(x.experiment->config().population);
    }
  }
  store_health_.SizeForHeadStates(total);
}

void SchedulerImpl::OnTaskEvent(size_t worker, WorkerEvent ev) {
  if (ev.kind == WorkerEvent::Kind::kConfigureRefused) {
    if (Experiment* e = Find(ev.exp)) {
      e->OnConfigureRefused("worker " + std::to_string(worker) + ": " + ev.reason);
    }
  } else if (Experiment* e = Find(ev.task.exp)) {
    const WorkItem& item = ev.task;
    switch (ev.kind) {
      case WorkerEvent::Kind::kCommitted:
        if (metrics_) {
          metrics_->IntervalCommitted(
              e->id(), ev.device, SecondsSince(ev.task.dispatched),
              static_cast<uint64_t>(std::max<int64_t>(0, ev.result.samples)));
        }
        NoteStateSize(entries_[e->id()], ev.result.state.size);
        e->OnCommitted(item, ev.version, ev.result.step, ev.result.val_score, ev.result.samples,
                       Clock::now());
        if (!ev.record_status.ok()) e->OnRecordRefused(item.member, ev.record_status);
        break;
      case WorkerEvent::Kind::kEvaluated:
        e->OnEvaluated(item, ev.result.test_score);
        break;
      case WorkerEvent::Kind::kFailed:
        if (metrics_) metrics_->MemberFailed(e->id(), ev.code);
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/false);
        break;
      case WorkerEvent::Kind::kBadResult:
        // The worker's fault, not the member's: counted, rerun, not charged.
        if (metrics_) metrics_->MemberFailed(e->id(), ipc::FailureCode::kBadResult);
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/true);
        break;
      case WorkerEvent::Kind::kCommitError: {
        if (ev.commit_status == StatusCode::kResourceExhausted) {
          // A full disk is no fault of the member: the interval reruns from
          // its committed head once the store has space again.
          if (metrics_) metrics_->MemberFailed(e->id(), ipc::FailureCode::kStoreFull);
          e->OnReturned(item);
          store_health_.WaitForSpace(ev.reason);
          break;
        }
        const bool moved = ev.commit_status == StatusCode::kAborted;
        if (!moved && store_health_.BrokenForGood()) {
          // The store's fault, not the member's: the interval reruns from
          // its committed head once ckpt is restarted on a reopened store.
          e->OnReturned(item);
          break;
        }
        if (metrics_ && !moved) {
          metrics_->MemberFailed(e->id(), ipc::FailureCode::kCommitError);
        }
        e->OnFailed(item, ev.code, ev.reason, /*head_moved=*/moved);
        break;
      }
      default:
        break;
    }
  }
  AfterChange();
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnStoreWritable() {
  for (auto& [id, entry] : entries_) entry.experiment->RetryDeferred();
  AfterChange();
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnWorkerLost(size_t worker, const std::string& device,
                                 const std::string& reason, std::vector<Task> unfinished,
                                 bool given_up) {
  for (const Task& t : unfinished) {
    Experiment* e = Find(t.exp);
    if (e == nullptr) continue;
    if (metrics_ && !t.eval_only && !e->ended()) {
      metrics_->MemberFailed(e->id(), ipc::FailureCode::kWorkerLost);
    }
    e->OnReturned(t);
  }
  const std::string event = records::EncodeEvent(
      records::WorkerLostEvent{given_up && !stopping_, static_cast<int64_t>(worker), device, reason,
                               static_cast<int64_t>(unfinished.size())});
  // Each experiment's log, through its own store adapter (which logs a
  // refusal); a lost worker's record is no reason to stop.
  for (const auto& id : order_) (void)entries_[id].io->AppendEvent(event);
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnStoreBroken(const Status& s) {
  if (run_status_.ok()) {
    run_status_ = Status(s.code(),
                         "the store refuses every write, so ckpt stopped; start it "
                         "again to reopen the store (what it committed is kept): " +
                             s.message());
  }
  BeginStop("the store refuses every write");
}

void SchedulerImpl::OnAllGivenUp(const std::string& last_reason) {
  run_status_ = Status::Unavailable("every worker was given up on; last: " + last_reason);
  BeginStop("no workers left");
}

void SchedulerImpl::AfterChange() {
  bool any_ended = false;
  for (auto& [id, entry] : entries_) {
    if (entry.experiment->ended() && !entry.announced_end) {
      entry.announced_end = true;
      any_ended = true;
      trace::Ended(id, records::ExperimentStatusName(entry.experiment->status()));
    }
  }
  if (!any_ended) return;
  PrintProgress(true);
  if (AllEnded() && !options_.serve) BeginStop("all experiments ended");
}

}  // namespace ckpt::scheduler
