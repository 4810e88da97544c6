// WorkerHandle's receiver side of a RESULT: the checks that it answers its
// task (result_check.h), its commit to the store with the member's state
// record that follows, and the refusal of one that does not answer
// (worker_handle.h).
#include <chrono>
#include <string>

#include "ckpt/format/checkpoint.h"
#include "experiment_store.h"
#include "log.h"
#include "trace.h"
#include "worker_handle.h"

namespace ckpt::scheduler {
namespace {

// The score twice: as the store ranks versions by it, and under the metric's
// own name ("val_accuracy") for whoever reads the checkpoint.
std::map<std::string, double> CommitMetrics(const Task& task, const ipc::Result& r) {
  return {{store::kScoreMetric, r.val_score},
          {format::SplitMetricName("val", task.rules.metric), r.val_score},
          {"train_loss", r.train_loss},
          {"interval", task.interval_after},
          {"samples", static_cast<double>(r.samples)},
          {"compute_s", r.compute_s}};
}

// The commit's "trained" event: the score under the experiment's metric's
// name ("val_neg_mse"), and the hyperparameters trained with (the policies'
// history, LoadHistory).
std::string TrainedEventJson(const Task& task, double val_score, int worker) {
  records::TrainedEvent trained{task.interval_after, val_score, worker, "", 0};
  trained.hparams = task.hparams;
  trained.metric = task.rules.metric;
  return records::EncodeEvent(trained);
}

}  // namespace

void WorkerHandle::HandleResult(const ipc::Received& rec) {
  auto r = ipc::DecodeResult(rec.payload, rec.size);
  if (!r.ok()) {
    channel_->Release();
    ReportLost("bad RESULT record: " + r.status().ToString());
    return;
  }
  WorkerEvent e;
  Logger().trace("worker {}: got RESULT task {}", spec_.index, r->task_id);
  trace::Result(static_cast<int>(spec_.index), r->task_id);
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = in_flight_.find(r->task_id);
    if (it == in_flight_.end()) {
      channel_->Release();
      return;
    }
    e.task = it->second;
    in_flight_.erase(it);
  }
  e.result = *r;
  e.result.state = ipc::ByteSpan{nullptr, r->state.size};  // the ring's bytes are released
  // Checked while the state is still in the ring; the check's parse of it is
  // the store's validation too.
  std::optional<format::CheckpointView> view;
  std::shared_ptr<const StateLayout> layout;
  Status answers = CheckAgainstTask(e.task, *r, &view, &layout);
  if (!answers.ok()) {
    channel_->Release();
    RefuseResult(std::move(e), answers);
    return;
  }
  if (e.task.eval_only) {
    channel_->Release();
    e.kind = WorkerEvent::Kind::kEvaluated;
    on_event_(std::move(e));
    return;
  }
  store::CommitRequest c;
  c.exp = e.task.exp;
  c.member = e.task.member;
  c.expected_head_version = e.task.head_version;
  c.blob = r->state.data;
  c.blob_size = r->state.size;
  c.step = r->step;
  c.metrics = CommitMetrics(e.task, *r);
  c.hparams = e.task.hparams;
  c.event_json = TrainedEventJson(e.task, r->val_score, spec_.index);
  c.verified = view ? &*view : nullptr;
  BlobId committed;
  c.committed_blob = &committed;
  const auto t0 = std::chrono::steady_clock::now();
  auto version = store_->CommitResult(c);
  const uint64_t data_seed = view ? view->meta().data_seed : 0;
  const uint64_t data_cursor = view ? view->meta().data_cursor : 0;
  view.reset();  // it points into the ring's bytes
  channel_->Release();
  if (spec_.metrics && version.ok()) {
    spec_.metrics->StoreOperation(metrics::StoreOp::kCommitResult, SecondsSince(t0), c.blob_size);
  }
  if (!version.ok()) {
    e.kind = WorkerEvent::Kind::kCommitError;
    e.code = ipc::FailureCode::kCommitError;
    e.commit_status = version.status().code();
    e.reason = version.status().ToString();
    on_event_(std::move(e));
    return;
  }
  if (spec_.layouts) spec_.layouts->NoteStateBytes(c.exp, c.blob_size);
  if (spec_.layouts && layout) {
    spec_.layouts->RememberCommitted(
        c.exp, c.member, {committed, r->step, std::move(layout), data_seed, data_cursor});
  }
  if (trace::Enabled()) {
    trace::Committed(c.exp, c.member, *version, e.task.interval_after, committed.Hex());
  }
  // The head's state record follows the commit; a crash between the two is
  // reconciled from the head manifest at start-up.
  records::MemberRecord state = e.task.state_after;
  state.score = r->val_score;
  const Status saved = WriteMemberRecord(store_, e.task.exp, e.task.member, state, spec_.metrics);
  if (!saved.ok()) {
    Logger().error(
        "{}/{}: writing the state record after v{}: {} (reconciled from the head at "
        "the next start, or written again once the store has space)",
        e.task.exp, e.task.member, *version, saved.ToString());
  }
  e.kind = WorkerEvent::Kind::kCommitted;
  e.version = *version;
  e.record_status = saved;
  on_event_(std::move(e));
}

Status WorkerHandle::CheckAgainstTask(const Task& task, const ipc::Result& r,
                                      std::optional<format::CheckpointView>* view,
                                      std::shared_ptr<const StateLayout>* layout) const {
  SentTask sent;
  sent.experiment = task.exp;
  sent.member = task.member;
  sent.worker = Name();
  sent.rules = task.rules;
  sent.steps = task.steps;
  sent.eval_only = task.eval_only;
  sent.start_step = task.sent_step;
  sent.layout = task.sent_layout;
  sent.hparams = task.hparams;
  sent.start_cursor = task.sent_data_cursor;
  sent.data_seed = task.sent_data_seed;
  if (!sent.layout && spec_.layouts) sent.layout = spec_.layouts->Find(task.exp);
  StateLayout got;
  CKPT_RETURN_IF_ERROR(CheckResult(sent, r, &got, view));
  if (task.eval_only) return Status::OK();
  if (sent.layout) {
    *layout = sent.layout;  // CheckResult found them equal
    return Status::OK();
  }
  if (!spec_.layouts) {
    *layout = std::make_shared<const StateLayout>(std::move(got));
    return Status::OK();
  }
  // The experiment's first state seen: it becomes the reference, unless
  // another handle's result got there first.
  std::shared_ptr<const StateLayout> ref = spec_.layouts->Establish(task.exp, got);
  CKPT_RETURN_IF_ERROR(
      CompareLayouts("member " + task.exp + "/" + task.member + ", " + sent.worker, *ref, got));
  *layout = std::move(ref);
  return Status::OK();
}

void WorkerHandle::RefuseResult(WorkerEvent e, const Status& why) {
  Logger().warn(
      "{} sent a RESULT for task {} that does not answer it; nothing committed, the interval "
      "reruns from the committed head: {}",
      Name(), e.task.id, why.ToString());
  trace::BadResult(spec_.index, e.task.id, e.task.exp + "/" + e.task.member);
  e.kind = WorkerEvent::Kind::kBadResult;
  e.code = ipc::FailureCode::kBadResult;
  e.reason = why.ToString();
  on_event_(std::move(e));
}

}  // namespace ckpt::scheduler
