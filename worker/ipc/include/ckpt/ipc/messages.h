// The messages exchanged between the scheduler and a worker, and their payload
// encodings.
//
// Payload layout of every message:
//
//   offset 0   u32 LE  J = length of the JSON header
//   offset 4   J       JSON object (the message's fields below)
//   ...        pad     zero bytes up to the next multiple of 64 (from payload start)
//   offset S   ...     state bytes (a checkpoint blob, ckpt/format/checkpoint.h),
//                      present for TRAIN and RESULT only; S is stored in the JSON
//                      as "state_offset" and the length as "state_bytes"
//
// A message without state (HELLO, CONFIGURE, FAILED, STATS, SHUTDOWN) ends
// right after its JSON. JSON keys are the struct fields' names below; numbers
// that are not finite travel as null and decode as NaN.
//
// A decoder treats the payload as untrusted: bounded lengths (JSON at most
// kMaxMessageJsonBytes, nested at most 16 deep), JSON fields of the right types
// and ranges, the state exactly filling the payload from a 64-aligned offset
// past the JSON, zero padding; any failure is Corruption naming the message
// type and field. Unknown keys are ignored (a newer sender may add fields);
// missing keys keep the struct's defaults, except the required ones: HELLO
// device; CONFIGURE experiment; TRAIN task_id, experiment, member, steps;
// RESULT task_id, member; FAILED task_id, code. Decoded state spans point into the
// payload.
//
// Thread-safety: pure functions.
#ifndef CKPT_IPC_MESSAGES_H_
#define CKPT_IPC_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/format/task.h"
#include "ckpt/format/tensor_dataset.h"
#include "ckpt/ipc/failure_code.h"

namespace ckpt::ipc {

enum class RecordType : uint16_t {
  kPadding = 0,   // ring-internal: fills the end before a wrap; never delivered
  kFragment = 1,  // ring-internal: part of a large record; never delivered as such
  kHello = 2,
  kConfigure = 3,
  kTrain = 4,
  kResult = 5,
  kFailed = 6,
  kStats = 7,
  kShutdown = 8,
};
const char* RecordTypeName(RecordType type);

// Bytes that live elsewhere (in the ring, or a store value).
struct ByteSpan {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// worker -> scheduler, once after Open.
struct Hello {
  std::string device;        // "cpu", "cuda:0"
  int64_t memory_bytes = 0;  // device memory (CPU: physical RAM)
  int32_t slots = 1;         // concurrent members it trains
  bool fusion = false;       // supports fused training
  std::string mode;          // "plain" | "fused" (after CONFIGURE), "" before
  int64_t pid = 0;
  std::string version;
};

// scheduler -> worker: the experiment's fixed settings. Sent before any TRAIN.
// Typed as the experiment file's parser made them (records::ExperimentConfig)
// and as the trainer takes them (model::TrainerOptions): only this codec
// spells them as text on the wire (the names of ckpt/format/task.h,
// tensor_dataset.h and optimizer.h), and a name the worker's build does not
// know is Corruption naming the field.
struct Configure {
  std::string experiment;
  std::string model_spec = "lenet5";  // name or JSON list of layers, or "torchscript:PATH"
  // SHA-256 (64 lowercase hex digits, ckpt/ipc/sha256.h) of the TorchScript
  // file as the scheduler read it at submission: a worker refuses a file of
  // that path whose bytes hash otherwise, naming both. "" = not checked (a
  // model that is no file).
  std::string model_sha256;
  format::OptimizerKind optimizer = format::OptimizerKind::kSgd;
  // IDX data: the data set's name and its directory ("" = the default one).
  std::string dataset = "fashion-mnist";
  std::string dataset_path;
  // A tensor file (safetensors or npz) read instead of the IDX data; its
  // path, format and options travel here once. Default: none (IDX).
  std::optional<format::TensorDatasetOptions> tensor_data;
  // The training loss and validation metric; unset = the data's default.
  std::optional<format::LossKind> loss;
  std::optional<format::MetricKind> metric;
  format::Augmentation augment;
  int32_t batch_size = 64;
  int32_t eval_size = 10000;  // validation samples per evaluation
  uint64_t seed = 0;
};

// scheduler -> worker: train one member for `steps` steps from `state`.
// An empty state means: initialise the member from `init_seed`.
struct Train {
  uint64_t task_id = 0;    // echoed in RESULT/FAILED
  std::string experiment;  // which CONFIGURE applies
  std::string member;      // the member's name within the experiment
  int64_t version = 0;     // head version the state came from
  int64_t steps = 0;
  bool eval_test = false;  // also evaluate on the test split
  uint64_t init_seed = 0;
  std::map<std::string, double> hparams;  // authoritative (the blob's may be stale)
  ByteSpan state;
};

// worker -> scheduler.
struct Result {
  uint64_t task_id = 0;
  std::string experiment;  // the TRAIN's, echoed
  std::string member;
  int64_t step = 0;  // training step after this interval
  double train_loss = 0;
  // The experiment's metric on validation / test; NaN (null on the wire,
  // format::kNotEvaluated) when the split was not evaluated.
  double val_score = format::kNotEvaluated;
  double test_score = format::kNotEvaluated;
  int64_t samples = 0;  // training samples this interval
  double compute_s = 0;
  ByteSpan state;
};

// worker -> scheduler: the member could not be trained, or (task id 0,
// kConfigureRefused, no member) the experiment could not be set up.
struct Failed {
  uint64_t task_id = 0;
  std::string experiment;
  std::string member;
  // On the wire FailureCodeName's spelling; decoded with
  // FailureCodeFromWorker, so a newer worker's unknown code reads kInternal.
  FailureCode code = FailureCode::kInternal;
  std::string reason;  // human-readable, names the tensor/step
};

// worker -> scheduler, about every second.
struct Stats {
  double samples_per_s = 0;
  uint64_t samples_total = 0;
  int32_t slots = 0;
  int32_t slots_busy = 0;
  std::string mode;             // "plain" | "fused"
  int64_t allocator_bytes = 0;  // device allocator memory in use
  int64_t rss_bytes = 0;
};

struct Shutdown {
  std::string reason;
};

// Encoded payload sizes, and encoders writing into [dst, dst + size).
// EncodeX returns InvalidArgument when size != EncodedSizeX (0 only when out of
// memory), or for a TRAIN/RESULT whose state has a size but no data.
size_t EncodedSize(const Hello& m);
size_t EncodedSize(const Configure& m);
size_t EncodedSize(const Train& m);
size_t EncodedSize(const Result& m);
size_t EncodedSize(const Failed& m);
size_t EncodedSize(const Stats& m);
size_t EncodedSize(const Shutdown& m);
Status Encode(const Hello& m, uint8_t* dst, size_t size);
Status Encode(const Configure& m, uint8_t* dst, size_t size);
Status Encode(const Train& m, uint8_t* dst, size_t size);
Status Encode(const Result& m, uint8_t* dst, size_t size);
Status Encode(const Failed& m, uint8_t* dst, size_t size);
Status Encode(const Stats& m, uint8_t* dst, size_t size);
Status Encode(const Shutdown& m, uint8_t* dst, size_t size);

// For a TRAIN/RESULT written in place: encodes the message with
// state.data == nullptr and state.size = the state's length, and returns the
// offset at which the caller writes the state bytes. REQUIRES: size == EncodedSize(m).
StatusOr<size_t> EncodeHeaderOnly(const Train& m, uint8_t* dst, size_t size);
StatusOr<size_t> EncodeHeaderOnly(const Result& m, uint8_t* dst, size_t size);
// For a TRAIN/RESULT sent in two parts (Channel::SendParts): the bytes before
// the state, which EncodeHeaderOnly would write; the state follows them as is.
// Its size plus state.size is EncodedSize(m); state.data is not read.
StatusOr<std::vector<uint8_t>> EncodeStatePrefix(const Train& m);
StatusOr<std::vector<uint8_t>> EncodeStatePrefix(const Result& m);

StatusOr<Hello> DecodeHello(const uint8_t* p, size_t n);
StatusOr<Configure> DecodeConfigure(const uint8_t* p, size_t n);
StatusOr<Train> DecodeTrain(const uint8_t* p, size_t n);
StatusOr<Result> DecodeResult(const uint8_t* p, size_t n);
StatusOr<Failed> DecodeFailed(const uint8_t* p, size_t n);
StatusOr<Stats> DecodeStats(const uint8_t* p, size_t n);
StatusOr<Shutdown> DecodeShutdown(const uint8_t* p, size_t n);

// Payload-size cap a decoder accepts for the JSON header. 1 MiB.
inline constexpr size_t kMaxMessageJsonBytes = size_t{1} << 20;

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_MESSAGES_H_
