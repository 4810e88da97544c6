// Trainer: trains population members on one device, one at a time per calling
// thread ("plain") or K at once as one wide model ("fused"), from and to the
// checkpoint blob of ckpt/format/checkpoint.h.
//
// A Trainer holds what every member of an experiment shares: the device, the
// model spec, the optimizer kind, the batch size and the dataset, loaded once
// into device memory (uint8 images, normalized on the fly; a minibatch is an
// index gather on the device). A member's own state travels in its blob:
// model tensors, optimizer state, hyperparameters, step, data seed and cursor
// (names and layout: ckpt/model/model_spec.h).
//
// One interval of one member (a MemberTask):
//   1. its blob is parsed and validated against the spec (names, dtypes,
//      shapes, finiteness) and copied to the device; an empty blob means a
//      fresh member initialised from `init_seed` (deterministic);
//   2. `steps` optimizer steps on its own minibatches;
//   3. accuracy on the first `eval_size` validation samples (and, when asked,
//      the whole test split);
//   4. the new state is checked for finiteness and prepared for encoding: the
//      outcome can write the new blob straight into a caller's buffer.
//
// Fused training (TrainFused) gives the same parameters as training each member
// alone, up to float rounding: convolutions become one grouped convolution
// over K*C channels, linear layers one baddbmm, BatchNorm runs over K*C
// channels, the loss is the sum of the members' mean losses, and SGD/Adam/AdamW
// hold each member's hyperparameters as length-K tensors.
//
// Determinism: on the CPU with a fixed intra_op_threads, training S steps,
// saving, restoring and training S more gives bit-identical state to training
// 2S steps (dropout masks are drawn from a generator seeded by the member's
// data seed and step, not the global one). A TorchScript model's own random
// ops use LibTorch's global generator and are not reproducible.
//
// Threads: intra_op_threads applies to the thread that calls TrainPlain or
// TrainFused. LibTorch's CPU kernels (and oneDNN, OpenBLAS) run on OpenMP, whose
// thread count is a per-thread setting; each call sets it for the calling
// thread only (omp_set_num_threads after LibTorch's lazy per-thread
// initialisation), never the process-wide at::set_num_threads, so slot threads
// do not disturb each other. On a CUDA device each calling thread uses its own
// stream from LibTorch's pool for the whole call.
//
// Thread-safety: a Trainer is thread-safe: several slot threads may call
// TrainPlain / TrainFused at once. MemberOutcome is a value owned by the
// caller; it is not thread-safe.
#ifndef CKPT_MODEL_TRAINER_H_
#define CKPT_MODEL_TRAINER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/format/task.h"
#include "ckpt/ipc/failure_code.h"
#include "ckpt/ipc/fusion_mode.h"
#include "ckpt/model/dataset.h"

namespace ckpt::model {

struct TrainerOptions {
  // "cpu", "cuda" (= "cuda:0") or "cuda:N". Default: "cpu".
  std::string device = "cpu";
  // A model spec (ckpt/model/model_spec.h). Default: "lenet5".
  std::string model_spec = "lenet5";
  // SHA-256 (hex) a TorchScript model's file must have (CONFIGURE's
  // model_sha256): Create refuses a file whose bytes hash otherwise with
  // InvalidArgument naming the file and both hashes. "" = not checked.
  // Default: "".
  std::string model_sha256;
  // Default: SGD.
  format::OptimizerKind optimizer = format::OptimizerKind::kSgd;
  // Training minibatch per member. Default: 64.
  int32_t batch_size = 64;
  // Validation samples evaluated after each interval (the first eval_size of
  // the split, capped at its size); 0 skips validation (val_score not evaluated). Default: 10000.
  int32_t eval_size = 10000;
  // Samples per forward pass while evaluating (divided by K when fused). A
  // LeNet-5 chunk of 256 keeps its activations (~5 MB) in cache and off
  // fresh pages; 1000 evaluated 1.6x slower on the CPU. Default: 256.
  int32_t eval_batch_size = 256;
  // Dataset name and directory ("" = DefaultDatasetDir(dataset)). Default: Fashion-MNIST.
  std::string dataset = "fashion-mnist";
  std::string dataset_path;
  // A tensor dataset (safetensors or .npz, ckpt/format/tensor_dataset.h) read
  // instead of dataset/dataset_path when set. Default: none.
  std::optional<format::TensorDatasetOptions> tensor_data;
  // Training loss and validation metric; by default those of the data's
  // targets (ckpt/format/task.h). InvalidArgument at Create when one does not
  // fit the targets. Default: none.
  std::optional<format::LossKind> loss;
  std::optional<format::MetricKind> metric;
  // Augmentation of training batches (image data only), drawn on the device
  // from the member's data seed and step, so a resumed member sees the same
  // crops and flips. Default: none.
  format::Augmentation augment;
  // A dataset already loaded; when set, the fields above are not read. Default: none.
  std::shared_ptr<const DatasetSplits> data;
  // OpenMP threads of each calling thread (see "Threads" above). Default: 1.
  int32_t intra_op_threads = 1;
  // On a GPU: whether float32 convolutions (cuDNN) and matrix products
  // (cuBLAS) may run in TF32 (a 10-bit mantissa; PyTorch 2 allows it for
  // cuDNN by default). Off, a GPU computes in float32 as the CPU does: TF32's
  // rounding parts a GPU run from the CPU's, and flips the sign of Adam's
  // first step (+-lr whatever the gradient's size) where a gradient is near
  // zero. LibTorch's setting is process-wide: Create sets it, so every
  // Trainer of a process should ask the same (ckpt-worker passes its --tf32
  // to all). Ignored on the CPU. Default: false.
  bool allow_tf32 = false;
  // Experiment seed, mixed into each fresh member's data seed. Default: 0.
  uint64_t seed = 0;
  // When set and it becomes true, training stops before the next step and the
  // unfinished members fail with ipc::FailureCode::kAborted. Must outlive
  // the Trainer. Default: none.
  const std::atomic<bool>* cancel = nullptr;
  // For benchmarks of the pipeline alone: an interval of 0 steps still
  // changes one weight (the first floating-point tensor's first element, by
  // 1e-6), so its state's bytes differ from the last as a trained state's do
  // and the store writes it rather than deduplicating it. Default: false.
  bool touch_null_intervals = false;
};

namespace internal {
class EncodedState;
class UploadedState;
struct OutcomeAccess;
}  // namespace internal

// One member's interval.
struct MemberTask {
  // For messages ("exp/member7"). Default: "".
  std::string member;
  // The member's checkpoint blob; size 0 means initialise from init_seed.
  // REQUIRES: the bytes stay valid and unchanged until the call returns.
  const uint8_t* state = nullptr;
  size_t state_size = 0;
  // Seed of a fresh member's parameters and data order (ignored when state is given).
  uint64_t init_seed = 0;
  // Hyperparameters, applied over the blob's (ckpt/model/hparams.h).
  std::map<std::string, double> hparams;
  // Optimizer steps this interval; 0 returns the (initialised) state as is.
  int64_t steps = 0;
  // Also evaluate on the whole test split.
  bool eval_test = false;
  // The state parsed and already on the device (Trainer::Upload of this
  // task), read instead of `state`; a failure Upload found is this task's.
  // Single use: training updates its tensors in place. Default: none.
  std::shared_ptr<const internal::UploadedState> uploaded;
};

// The result of one member's interval: metrics and the new state, or why not.
class MemberOutcome {
 public:
  MemberOutcome();
  MemberOutcome(const MemberOutcome&);
  MemberOutcome(MemberOutcome&&) noexcept;
  MemberOutcome& operator=(const MemberOutcome&);
  MemberOutcome& operator=(MemberOutcome&&) noexcept;
  ~MemberOutcome();

  bool ok() const { return status.ok(); }

  // OK, or the failure: InvalidArgument (bad-request), Corruption (bad-state),
  // Aborted (non-finite, aborted), ResourceExhausted (out-of-memory),
  // Internal. The message names the member and, where there is one, the
  // tensor and the step.
  Status status;
  // Why, when !ok(): the FAILED record's code (ipc::FailureCodeName);
  // meaningless when ok().
  ipc::FailureCode fail_code = ipc::FailureCode::kInternal;
  std::string member;
  int64_t step = 0;       // the member's step after this interval
  double train_loss = 0;  // mean training loss over this interval's steps (0 when steps = 0)
  // The experiment's metric (TrainerOptions::metric: accuracy, negative MSE
  // or R^2) on validation and test; format::kNotEvaluated (NaN) when the
  // split was not evaluated.
  double val_score = format::kNotEvaluated;
  double test_score = format::kNotEvaluated;
  int64_t samples = 0;   // training samples this interval (steps * batch_size)
  double compute_s = 0;  // training and evaluation; for fused members, the group's time / K
  double eval_s = 0;     // the evaluation part of compute_s
  double pack_s = 0;     // entry: parse + validate the blob, copy to the device, pack
  double unpack_s = 0;   // exit: unpack, copy to the host, finiteness check, checksums
  ipc::FusionMode mode = ipc::FusionMode::kPlain;  // kPlain or kFused

  // The new state's metadata (step, data seed and cursor, hparams).
  // REQUIRES: ok().
  const format::CheckpointMeta& state_meta() const;
  // Size of the encoded new state; 0 when !ok().
  size_t state_size() const;
  // Writes the new blob into [dst, dst + size). InvalidArgument when
  // size != state_size(), FailedPrecondition when !ok().
  Status EncodeStateTo(void* dst, size_t size) const;
  // The new blob as a string ("" when !ok()).
  std::string EncodeState() const;

 private:
  friend struct internal::OutcomeAccess;
  std::shared_ptr<internal::EncodedState> state_;
};

// What ChooseMode measures.
struct ModeProbe {
  // Slot threads training at once, as the worker would run them. Default: 1.
  int32_t slots = 1;
  // K of a fused group. Default: 8.
  int32_t fusion_width = 8;
  // Wall time measured per mode (after one warm-up step). Default: 2.
  double seconds = 2.0;
};

struct ModeChoice {
  // kPlain or kFused: whichever trains more samples/s.
  ipc::FusionMode mode = ipc::FusionMode::kPlain;
  double plain_samples_s = 0;  // all slots busy, one member per slot
  double fused_samples_s = 0;  // all slots busy, one K-group per slot; 0 when not supported
};

struct DeviceMemory {
  int64_t total_bytes = 0;      // device memory (CPU: physical RAM)
  int64_t allocated_bytes = 0;  // held by LibTorch's CUDA allocator; 0 on the CPU
};

// Host <-> device traffic of a Trainer since Create, all calls together. On
// a CPU device nothing is copied or waited for; the counts are those a GPU
// run would make (the same code path counts them), so that a CPU test can
// check how often training would wait for the device.
struct DeviceTraffic {
  int64_t to_device_copies = 0;  // host -> device copies (queued, non-blocking)
  int64_t to_device_bytes = 0;
  int64_t to_host_copies = 0;  // device -> host copies
  int64_t to_host_bytes = 0;
  int64_t waits = 0;  // waits of the host for the device (stream synchronizations)
  // Host copies into a page-locked staging buffer ahead of a device copy:
  // the source was not pinned (PinHostMemory). Always 0 on the CPU.
  int64_t staged_copies = 0;
};

// How many Trainers of this process hold [base, ...) pinned
// (Trainer::PinHostMemory); 0 when none.
int PinnedHostMemoryReferences(const void* base);

// Total memory of `device` ("cpu", "cuda", "cuda:N"): the GPU's (asking CUDA,
// which creates the process's context on it) or, on the CPU, physical RAM;
// 0 when it cannot be told (a GPU this build or process cannot use, a
// malformed name).
int64_t DeviceTotalMemoryBytes(const std::string& device);

class Trainer {
 public:
  // Loads the dataset (unless options.data is set) onto the device, parses the
  // model spec (loading a TorchScript file) and checks that it fits the data.
  // Returns InvalidArgument for bad options (unknown device or optimizer,
  // batch_size < 1, a spec that does not parse or does not map the input shape
  // to num_classes logits), Unavailable for a CUDA device without CUDA, the
  // dataset errors of LoadDataset, NotFound / InvalidArgument for a TorchScript
  // file that cannot be loaded.
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainerOptions& options);

  virtual ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains one member by the calling thread. Never throws; a failure is in
  // the outcome (fail_code): bad-request for bad hyperparameters, bad-state for
  // a blob that does not parse or does not fit the spec, non-finite for a
  // non-finite input state, loss (naming the step) or output state (naming the
  // tensor), out-of-memory, aborted, internal.
  virtual MemberOutcome TrainPlain(const MemberTask& task) = 0;

  // Trains `tasks` as fused groups of the members whose steps are equal (each
  // group one wide model), by the calling thread. Returns one outcome per
  // task, in order. A member whose blob or hyperparameters are rejected fails
  // alone; the others train. A member that becomes non-finite fails alone
  // (members do not mix in a fused model). Falls back to TrainPlain per member
  // when !SupportsFusion().
  virtual std::vector<MemberOutcome> TrainFused(const std::vector<MemberTask>& tasks) = 0;

  // False for a TorchScript model.
  virtual bool SupportsFusion() const = 0;

  // Measures plain and fused training briefly with throw-away members and
  // returns the faster mode for this device. Takes about 2 * probe.seconds.
  // REQUIRES: no other call is training on this Trainer (it would skew the timing).
  virtual StatusOr<ModeChoice> ChooseMode(const ModeProbe& probe) = 0;

  // Registers [base, base + bytes) of host memory the caller owns (the
  // worker's shared-memory segment) as page-locked with CUDA
  // (cudaHostRegister), so that copies between it and the device run as DMA,
  // asynchronously on the calling slot's stream, without a staging copy.
  // Registration is the process's: the Trainers that pin the same range share
  // one registration (PinnedHostMemoryReferences counts them), made by the
  // first on a GPU and undone when the last is destroyed; on the CPU the
  // range is only counted. Returns InvalidArgument for an empty range, one
  // that overlaps a range this Trainer pinned, or one that overlaps another
  // range pinned in the process without being the same; Unavailable when
  // CUDA refuses (the message says why; training still works, with pageable
  // copies).
  // REQUIRES: the memory stays mapped until the Trainer is destroyed.
  // Not verified on a GPU yet (no GPU was available when it was written).
  virtual Status PinHostMemory(const void* base, size_t bytes) = 0;

  // Parses and checks `task`'s state (and hyperparameters) and copies its
  // tensors to the device straight from the state's bytes, then waits for
  // the copies: the bytes may be released as soon as it returns (the worker
  // releases its ring record). On a GPU a copy is a DMA from the bytes
  // themselves when they lie in a range pinned with PinHostMemory, else from
  // one page-locked staging copy (DeviceTraffic::staged_copies); on the CPU
  // the tensors are copied out of the bytes as TrainPlain would. Set the
  // result as the task's `uploaded`: TrainPlain / TrainFused then train it
  // without reading `state`, and report a failure found here (bad-request,
  // bad-state, non-finite, out-of-memory, internal) as their own. Never
  // throws; never null. Not run on a GPU yet.
  virtual std::shared_ptr<const internal::UploadedState> Upload(const MemberTask& task) = 0;

  virtual DeviceMemory GetDeviceMemory() const = 0;
  // Training of an interval copies a constant number of times per chunk of
  // steps (tensor loads, the interval's random draws, results) and waits for
  // the device only at its end, never per step. Thread-safe.
  virtual DeviceTraffic GetDeviceTraffic() const = 0;
  // The canonical device ("cpu", "cuda:0").
  virtual const std::string& device() const = 0;
  virtual const TrainerOptions& options() const = 0;
  virtual const DatasetSplits& dataset() const = 0;
  // Encoded size of a member's state (model + optimizer), for sizing buffers;
  // the exact size varies by a few bytes with the metadata.
  virtual size_t ApproxStateBytes() const = 0;

 protected:
  Trainer() = default;
};

}  // namespace ckpt::model

#endif  // CKPT_MODEL_TRAINER_H_
