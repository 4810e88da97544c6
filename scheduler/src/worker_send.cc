// WorkerHandle's sender thread: an experiment's CONFIGURE before its first
// TRAIN to this worker, then each task's TRAIN with the member's head state
// read from the store straight into the request ring (worker_handle.h).
#include <chrono>
#include <string>

#include "ckpt/format/checkpoint.h"
#include "log.h"
#include "trace.h"
#include "worker_handle.h"

namespace ckpt::scheduler {

using std::chrono::milliseconds;

void WorkerHandle::SendLoopBody() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_.load() || !queue_.empty(); });
      if (stopping_.load()) return;
      task = queue_.front();
      queue_.pop_front();
      // An initialisation's RESULT carries a state like the experiment's
      // others; a training one's is set below from the state sent.
      if (spec_.layouts) task.expected_state_bytes = spec_.layouts->StateBytes(task.exp);
      in_flight_[task.id] = task;
    }
    Status s = SendTask(task);
    Logger().trace("worker {}: sent TRAIN task {} {}/{}: {}", spec_.index, task.id, task.exp,
                   task.member, s.ToString());
    if (!s.ok()) {
      if (stopping_.load()) return;
      ReportLost("sending " + task.member + ": " + s.ToString());
      return;
    }
  }
}

Status WorkerHandle::SendTask(const Task& task) {
  if (configured_.count(task.exp) == 0) {
    CKPT_ASSIGN_OR_RETURN(std::shared_ptr<const ipc::Configure> c,
                          spec_.configures->Find(task.exp));
    std::vector<uint8_t> buf(ipc::EncodedSize(*c));
    CKPT_RETURN_IF_ERROR(ipc::Encode(*c, buf.data(), buf.size()));
    while (true) {
      Status s = channel_->Send(ipc::RecordType::kConfigure, buf.data(), buf.size(),
                                ipc::DeadlineIn(milliseconds(500)));
      if (s.ok()) break;
      if (!s.IsResourceExhausted() || stopping_.load()) return s;
    }
    configured_.insert(task.exp);
  }
  ipc::Train t;
  t.task_id = task.id;
  t.experiment = task.exp;
  t.member = task.member;
  t.version = task.head_version;
  t.steps = task.steps;
  t.eval_test = task.eval_only;
  t.init_seed = task.init_seed;
  t.hparams = task.hparams;
  store::PinnedBlob blob;
  if (task.head_version > 0) {
    // The worker verifies every tensor checksum; the store's read skips it.
    // Only this task changes the member's head until it is reported back.
    const auto t0 = std::chrono::steady_clock::now();
    auto b = store_->ReadHeadBlob(task.exp, task.member, /*verify=*/false);
    if (!b.ok()) return b.status().WithPrefix("member " + task.member);
    blob = std::move(*b);
    if (spec_.metrics) {
      spec_.metrics->StoreOperation(metrics::StoreOp::kReadHeadBlob, SecondsSince(t0), blob.size());
    }
    t.state.size = blob.size();
    if (spec_.layouts) spec_.layouts->NoteStateBytes(task.exp, blob.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_flight_.find(task.id);
      if (it != in_flight_.end()) it->second.expected_state_bytes = blob.size();
    }
    // What the result is checked against: the header alone (the worker
    // verifies the tensors), as the member's last commit of this very blob
    // recorded it, else parsed here. A state that does not parse is sent as
    // before: the worker refuses it as bad_state, which the experiment handles.
    std::optional<StateLayouts::Header> header;
    if (spec_.layouts) header = spec_.layouts->Committed(task.exp, task.member, blob.id());
    if (!header) {
      format::ReadOptions header_only;
      header_only.verify_checksums = false;
      auto view = format::ParseCheckpoint(blob.data(), blob.size(), header_only);
      if (view.ok()) {
        header = StateLayouts::Header{blob.id(), view->meta().step,
                                      std::make_shared<const StateLayout>(LayoutOf(*view)),
                                      view->meta().data_seed, view->meta().data_cursor};
        if (spec_.layouts && !spec_.layouts->Find(task.exp)) {
          (void)spec_.layouts->Establish(task.exp, *header->layout);
        }
      }
    }
    if (header) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = in_flight_.find(task.id);
      if (it != in_flight_.end()) {
        it->second.sent_step = header->step;
        it->second.sent_layout = std::move(header->layout);
        it->second.sent_data_seed = header->data_seed;
        it->second.sent_data_cursor = header->data_cursor;
      }
    }
  }
  // The encoded header and the store's pinned blob go as two parts, each
  // byte copied once into the ring (no staging, however large the state).
  CKPT_ASSIGN_OR_RETURN(std::vector<uint8_t> prefix, ipc::EncodeStatePrefix(t));
  const ipc::PayloadPart parts[2] = {{prefix.data(), prefix.size()}, {blob.data(), blob.size()}};
  const auto send_start = std::chrono::steady_clock::now();
  uint64_t sent = 0;
  while (true) {
    Status s = channel_->SendParts(ipc::RecordType::kTrain, parts, 2,
                                   ipc::DeadlineIn(milliseconds(500)), &sent);
    if (s.ok()) {
      if (spec_.metrics) {
        spec_.metrics->RingSendObserved(spec_.name, spec_.device.device, SecondsSince(send_start));
      }
      return s;
    }
    if (!s.IsResourceExhausted() || stopping_.load()) return s;
  }
}

}  // namespace ckpt::scheduler
