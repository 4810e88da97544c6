// CheckResult: whether a worker's RESULT answers the task it was sent, before
// anything of it is committed (private to ckpt::scheduler). A worker is not
// trusted: a remote one is anyone holding the secret, a local one may be
// broken. Pure logic: no thread, clock, I/O or logging of its own.
//
// The rules (each refusal names the member, the worker, the field, the value
// sent and the value expected):
//   member      the experiment and member the TRAIN named.
//   val_score   the experiment's metric (format::MetricKind), finite: accuracy
//               in [0, 1], neg_mse in (-inf, 0], r2 in (-inf, 1]; or none
//               (null, format::kNotEvaluated), the worker's "not evaluated",
//               which is also the only value allowed when the experiment does
//               not validate (eval_size = 0). None gains a worker nothing: it
//               ranks last.
//   test_score  evaluations only: the same range, or none (no test split).
//               Ignored for training results (nothing reads it).
//   step        the sent state's step + the task's steps: the worker resumes
//               from the step in the state it is given (ckpt.step), 0 for an
//               initialised member. An evaluation trains no step.
//   samples     steps x batch_size (0 for an evaluation): every training step
//               takes one full batch (trainer.cc).
//   train_loss  finite and >= 0 (the mean of cross-entropy or squared-error
//               losses; 0 when no step ran). A non-finite loss never comes as
//               a RESULT: the worker sends FAILED non_finite, which is the
//               member's failure and is left alone here.
//   compute_s   finite and >= 0.
//   state       training results only (an evaluation commits nothing and its
//               state is not read): the blob parses as a checkpoint with every
//               checksum verified (ParseCheckpoint, the store's own validation,
//               so that a bad blob is the worker's fault here rather than a
//               commit error charged to the member); its ckpt.step equals
//               `step` (the store keeps `step`, the next worker resumes from
//               ckpt.step); and its layout, the set of tensor names with each
//               one's dtype and shape (order aside: a reader finds tensors by
//               name), equals the expected one below.
//   metadata    training results only: the state's optimizer is the
//               experiment's; each hyperparameter the TRAIN sent is in the
//               state with the value sent (the worker adds the optimizer's
//               defaults for the ones not sent); the data cursor is the sent
//               state's cursor (0 for an initialised member) + samples; the
//               data seed is the sent state's (an initialised member's is
//               drawn by the worker and not checked). The next worker resumes
//               from these, so a lie in them would be trusted later.
//
// The expected layout: the layout of the state the worker was sent (the head
// blob the sender read from the store). For an initialised member (no state
// sent), the experiment's reference layout: every member of an experiment has
// one architecture and one optimizer, whose slots do not depend on
// hyperparameters (format::OptimizerSlots), so every state of the experiment
// has one layout. The reference is the first layout the scheduler saw for the
// experiment, of a state it sent or of a result it accepted
// (StateLayouts, worker_handle.h). When none is known yet, the first result
// establishes it: a hostile worker answering the very first interval of a new
// experiment can choose it (the honest workers then refuse its states as
// bad_state); closing that needs the layout of the model spec, which only the
// worker (LibTorch) can compute.
//
// Thread-safety: values and pure functions.
#ifndef CKPT_SCHEDULER_RESULT_CHECK_H_
#define CKPT_SCHEDULER_RESULT_CHECK_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/task.h"
#include "ckpt/ipc/messages.h"
#include "ckpt/records/config.h"

namespace ckpt::scheduler {

// A member state's tensors as the check compares them: name -> dtype, shape.
struct StateLayout {
  struct Tensor {
    format::DType dtype = format::DType::kF32;
    std::vector<int64_t> shape;
    bool operator==(const Tensor& o) const { return dtype == o.dtype && shape == o.shape; }
  };
  std::map<std::string, Tensor> tensors;
  bool operator==(const StateLayout& o) const { return tensors == o.tensors; }
};

// The layout of a parsed checkpoint.
StateLayout LayoutOf(const format::CheckpointView& view);

// What every result of one experiment must show, from its configuration.
struct ResultRules {
  // The validation metric ([task] metric, else the data's default).
  format::MetricKind metric = format::MetricKind::kAccuracy;
  // eval_size > 0: results carry a measured score; else none (kNotEvaluated).
  bool validates = true;
  // Samples per training step ([data] batch_size).
  int64_t batch_size = 64;
  // The experiment's optimizer ([model] optimizer).
  format::OptimizerKind optimizer = format::OptimizerKind::kSgd;
};

// The rules of an experiment's results. REQUIRES: `config` parsed with file
// checks (its `target` read from the data), as the scheduler parses it.
ResultRules ResultRulesFor(const records::ExperimentConfig& config);

// What a worker was sent, as the check needs it.
struct SentTask {
  std::string experiment;  // as the TRAIN named them
  std::string member;
  std::string worker;  // who answers, for messages: "worker 3 (r0@10.0.0.7:41234)"
  ResultRules rules;
  int64_t steps = 0;  // 0 for an evaluation
  bool eval_only = false;
  // The step of the state sent (its ckpt.step); 0 when the member was
  // initialised (no state sent).
  int64_t start_step = 0;
  // The hyperparameters the TRAIN carried.
  std::map<std::string, double> hparams;
  // The sent state's data cursor (0 when none was sent) and data seed (none
  // when no state was sent, or its header is not known).
  uint64_t start_cursor = 0;
  std::optional<uint64_t> data_seed;
  // The layout the result's state must have (see the file comment); null
  // when none is known yet (then any well-formed layout passes, and the
  // caller may record the result's as the reference).
  std::shared_ptr<const StateLayout> layout;
};

// OK when `result` (its state bytes included, read in place) answers `sent`
// by every rule of the file comment; then, for a training result, sets
// `*result_layout` (when not null) to its state's layout and `*state_view`
// (when not null) to the verified parse of its state, which the store's
// commit takes instead of parsing the bytes again (store::CommitRequest::
// verified; it points into the result's bytes). Otherwise
// InvalidArgument for a value out of its rule, or Corruption for a state that
// does not parse, the message naming member, worker, field and both values:
//   "member e/m3, worker 2 (cpu): val_accuracy 1e+308 outside [0, 1]".
// Never throws.
Status CheckResult(const SentTask& sent, const ipc::Result& result,
                   StateLayout* result_layout = nullptr,
                   std::optional<format::CheckpointView>* state_view = nullptr);

// The refusal of a result whose state's layout is not `want`: the first
// tensor that differs (missing, unexpected, other dtype or shape), both ways.
// OK when they are equal. `who`: "member e/m3, worker 2 (cpu)".
Status CompareLayouts(std::string_view who, const StateLayout& want, const StateLayout& got);

}  // namespace ckpt::scheduler

#endif  // CKPT_SCHEDULER_RESULT_CHECK_H_
