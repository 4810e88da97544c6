// Payload encodings of the scheduler <-> worker messages (messages.h): a JSON
// header (nlohmann::json, whose exceptions stay in this file) and, for TRAIN
// and RESULT, the state bytes at a 64-byte aligned offset.
#include "ckpt/ipc/messages.h"

#include <cmath>
#include <cstring>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "ckpt/base/json_depth.h"
#include "ckpt/ipc/sha256.h"

namespace ckpt::ipc {

using nlohmann::json;

const char* RecordTypeName(RecordType type) {
  switch (type) {
    case RecordType::kPadding:
      return "PADDING";
    case RecordType::kFragment:
      return "FRAGMENT";
    case RecordType::kHello:
      return "HELLO";
    case RecordType::kConfigure:
      return "CONFIGURE";
    case RecordType::kTrain:
      return "TRAIN";
    case RecordType::kResult:
      return "RESULT";
    case RecordType::kFailed:
      return "FAILED";
    case RecordType::kStats:
      return "STATS";
    case RecordType::kShutdown:
      return "SHUTDOWN";
  }
  return "UNKNOWN";
}

namespace {

constexpr size_t kLengthBytes = 4;
constexpr size_t kStateAlign = 64;
// Deepest nesting a decoder accepts; the messages themselves nest two deep.
constexpr int kMaxJsonDepth = 16;

size_t RoundUp64(size_t n) { return (n + kStateAlign - 1) & ~(kStateAlign - 1); }

// JSON has no NaN or infinity: they travel as null and come back as NaN.
json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string Dump(const json& j) {
  // Invalid UTF-8 in a string is replaced rather than thrown about.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json ToJson(const Hello& m) {
  return json{{"device", m.device},  {"memory_bytes", m.memory_bytes},
              {"slots", m.slots},    {"fusion", m.fusion},
              {"mode", m.mode},      {"pid", m.pid},
              {"version", m.version}};
}

// CONFIGURE on the wire: one "dataset_path" (the IDX directory or the tensor
// file) with "data_format" saying which, the tensor file's options beside it,
// every kind by its format name ("" for an unset loss or metric).
json ToJson(const Configure& m) {
  const format::TensorDatasetOptions tensor =
      m.tensor_data.value_or(format::TensorDatasetOptions{});
  return json{{"experiment", m.experiment},
              {"model_spec", m.model_spec},
              {"model_sha256", m.model_sha256},
              {"optimizer", format::OptimizerKindName(m.optimizer)},
              {"dataset", m.dataset},
              {"dataset_path", m.tensor_data ? tensor.path : m.dataset_path},
              {"data_format", format::DatasetFormatName(
                                  m.tensor_data ? tensor.format : format::DatasetFormat::kIdx)},
              {"val_size", tensor.val_size},
              {"classes", tensor.classes},
              {"data_mean", tensor.mean},
              {"data_std", tensor.std},
              {"loss", m.loss ? format::LossKindName(*m.loss) : ""},
              {"metric", m.metric ? format::MetricKindName(*m.metric) : ""},
              {"augment", format::AugmentationNames(m.augment)},
              {"batch_size", m.batch_size},
              {"eval_size", m.eval_size},
              {"seed", m.seed}};
}

json HParams(const std::map<std::string, double>& h) {
  json o = json::object();
  for (const auto& [k, v] : h) o[k] = Number(v);
  return o;
}

json ToJson(const Train& m) {
  return json{{"task_id", m.task_id},     {"experiment", m.experiment},
              {"member", m.member},       {"version", m.version},
              {"steps", m.steps},         {"eval_test", m.eval_test},
              {"init_seed", m.init_seed}, {"hparams", HParams(m.hparams)}};
}

json ToJson(const Result& m) {
  return json{{"task_id", m.task_id},
              {"experiment", m.experiment},
              {"member", m.member},
              {"step", m.step},
              {"train_loss", Number(m.train_loss)},
              {"val_score", Number(m.val_score)},
              {"test_score", Number(m.test_score)},
              {"samples", m.samples},
              {"compute_s", Number(m.compute_s)}};
}

json ToJson(const Failed& m) {
  return json{{"task_id", m.task_id},
              {"experiment", m.experiment},
              {"member", m.member},
              {"code", FailureCodeName(m.code)},
              {"reason", m.reason}};
}

json ToJson(const Stats& m) {
  return json{{"samples_per_s", Number(m.samples_per_s)},
              {"samples_total", m.samples_total},
              {"slots", m.slots},
              {"slots_busy", m.slots_busy},
              {"mode", m.mode},
              {"allocator_bytes", m.allocator_bytes},
              {"rss_bytes", m.rss_bytes}};
}

json ToJson(const Shutdown& m) { return json{{"reason", m.reason}}; }

// The JSON text and layout of one encoded message.
struct Plan {
  std::string text;
  size_t state_offset = 0;  // TRAIN/RESULT only
  size_t total = 0;
};

Plan PlanPlain(const json& j) {
  Plan p;
  p.text = Dump(j);
  p.total = kLengthBytes + p.text.size();
  return p;
}

// The state offset is in the JSON, whose length depends on the offset's
// digits: iterate to the fixed point (the offset only grows, so it converges).
Plan PlanWithState(json j, size_t state_bytes) {
  j["state_bytes"] = state_bytes;
  size_t offset = kStateAlign;
  Plan p;
  for (;;) {
    j["state_offset"] = offset;
    p.text = Dump(j);
    const size_t need = RoundUp64(kLengthBytes + p.text.size());
    if (need <= offset) break;
    offset = need;
  }
  p.state_offset = offset;
  p.total = offset + state_bytes;
  return p;
}

Status WriteJson(const Plan& plan, const char* type, uint8_t* dst, size_t size) {
  if (dst == nullptr || size != plan.total) {
    return Status::InvalidArgument(std::string(type) + ": buffer of " + std::to_string(size) +
                                   " bytes, the message needs " + std::to_string(plan.total));
  }
  if (plan.text.size() > kMaxMessageJsonBytes) {
    return Status::InvalidArgument(std::string(type) + ": JSON header of " +
                                   std::to_string(plan.text.size()) + " bytes exceeds the cap");
  }
  const auto j = static_cast<uint32_t>(plan.text.size());
  for (size_t i = 0; i < kLengthBytes; ++i) dst[i] = static_cast<uint8_t>(j >> (8 * i));
  std::memcpy(dst + kLengthBytes, plan.text.data(), plan.text.size());
  if (plan.state_offset != 0) {
    const size_t end = kLengthBytes + plan.text.size();
    std::memset(dst + end, 0, plan.state_offset - end);
  }
  return Status::OK();
}

template <typename M>
Status EncodePlain(const M& m, const char* type, uint8_t* dst, size_t size) {
  try {
    return WriteJson(PlanPlain(ToJson(m)), type, dst, size);
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string(type) + ": cannot encode: " + e.what());
  }
}

template <typename M>
StatusOr<size_t> EncodeStateful(const M& m, const char* type, uint8_t* dst, size_t size,
                                bool copy_state) {
  try {
    Plan plan = PlanWithState(ToJson(m), m.state.size);
    CKPT_RETURN_IF_ERROR(WriteJson(plan, type, dst, size));
    if (copy_state && m.state.size != 0) {
      if (m.state.data == nullptr) {
        return Status::InvalidArgument(std::string(type) + ": state of " +
                                       std::to_string(m.state.size) + " bytes has no data");
      }
      std::memcpy(dst + plan.state_offset, m.state.data, m.state.size);
    }
    return plan.state_offset;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string(type) + ": cannot encode: " + e.what());
  }
}

// The bytes before the state: everything WriteJson writes.
template <typename M>
StatusOr<std::vector<uint8_t>> EncodePrefix(const M& m, const char* type) {
  try {
    Plan plan = PlanWithState(ToJson(m), m.state.size);
    plan.total = plan.state_offset;
    std::vector<uint8_t> out(plan.total);
    CKPT_RETURN_IF_ERROR(WriteJson(plan, type, out.data(), out.size()));
    return out;
  } catch (const std::exception& e) {
    return Status::InvalidArgument(std::string(type) + ": cannot encode: " + e.what());
  }
}

template <typename M>
size_t SizePlain(const M& m) {
  try {
    return PlanPlain(ToJson(m)).total;
  } catch (const std::exception&) {
    return 0;
  }
}

template <typename M>
size_t SizeStateful(const M& m) {
  try {
    return PlanWithState(ToJson(m), m.state.size).total;
  } catch (const std::exception&) {
    return 0;
  }
}

// ---------------------------------------------------------------- decoding

// Reads typed fields of one message's JSON object; the first failure sticks.
class Fields {
 public:
  Fields(const json& obj, const char* type) : obj_(obj), type_(type) {}

  const Status& status() const { return status_; }

  void Str(const char* key, std::string* out, bool required = false) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_string()) return Fail(key, "expected a string");
    *out = v->get<std::string>();
  }
  void Bool(const char* key, bool* out, bool required = false) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Fail(key, "expected true or false");
    *out = v->get<bool>();
  }
  void I64(const char* key, int64_t* out, bool required = false) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (v->is_number_unsigned()) {
      const auto u = v->get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return Fail(key, "out of range");
      }
      *out = static_cast<int64_t>(u);
    } else if (v->is_number_integer()) {
      *out = v->get<int64_t>();
    } else {
      Fail(key, "expected an integer");
    }
  }
  void I32(const char* key, int32_t* out, bool required = false) {
    int64_t wide = *out;
    I64(key, &wide, required);
    if (!status_.ok()) return;
    if (wide < std::numeric_limits<int32_t>::min() || wide > std::numeric_limits<int32_t>::max()) {
      return Fail(key, "out of range");
    }
    *out = static_cast<int32_t>(wide);
  }
  void U64(const char* key, uint64_t* out, bool required = false) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (!v->is_number_unsigned()) return Fail(key, "expected a non-negative integer");
    *out = v->get<uint64_t>();
  }
  void F64(const char* key, double* out, bool required = false) {
    const json* v = Find(key, required);
    if (v == nullptr) return;
    if (v->is_null()) {
      *out = std::numeric_limits<double>::quiet_NaN();
    } else if (v->is_number()) {
      *out = v->get<double>();
    } else {
      Fail(key, "expected a number");
    }
  }
  void Strings(const char* key, std::vector<std::string>* out) {
    const json* v = Find(key, false);
    if (v == nullptr) return;
    if (!v->is_array()) return Fail(key, "expected an array of strings");
    out->clear();
    for (const auto& x : *v) {
      if (!x.is_string()) return Fail(key, "expected an array of strings");
      out->push_back(x.get<std::string>());
    }
  }
  // A string naming a kind, read with `parse` (a format::Parse* function);
  // its error, naming the value, is the field's.
  template <typename T, typename Parse>
  void Named(const char* key, Parse parse, T* out) {
    std::string name;
    Str(key, &name);
    if (!status_.ok() || obj_.find(key) == obj_.end()) return;
    StatusOr<T> v = parse(name);
    if (!v.ok()) return Fail(key, v.status().message());
    *out = *v;
  }
  // As Named; "" (or no key) leaves `out` unset.
  template <typename T, typename Parse>
  void OptionalNamed(const char* key, Parse parse, std::optional<T>* out) {
    std::string name;
    Str(key, &name);
    if (!status_.ok() || name.empty()) return;
    StatusOr<T> v = parse(name);
    if (!v.ok()) return Fail(key, v.status().message());
    *out = *v;
  }
  void Numbers(const char* key, std::vector<double>* out) {
    const json* v = Find(key, false);
    if (v == nullptr) return;
    if (!v->is_array()) return Fail(key, "expected an array of numbers");
    out->clear();
    for (const auto& x : *v) {
      if (!x.is_number()) return Fail(key, "expected an array of numbers");
      out->push_back(x.get<double>());
    }
  }
  void Map(const char* key, std::map<std::string, double>* out) {
    const json* v = Find(key, false);
    if (v == nullptr) return;
    if (!v->is_object()) return Fail(key, "expected an object of numbers");
    for (const auto& [k, x] : v->items()) {
      if (x.is_null()) {
        (*out)[k] = std::numeric_limits<double>::quiet_NaN();
      } else if (x.is_number()) {
        (*out)[k] = x.get<double>();
      } else {
        return Fail(key, "value of '" + k + "' is not a number");
      }
    }
  }

 private:
  const json* Find(const char* key, bool required) {
    if (!status_.ok()) return nullptr;
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) Fail(key, "missing");
      return nullptr;
    }
    return &*it;
  }
  void Fail(const char* key, const std::string& why) {
    if (status_.ok()) {
      status_ = Status::Corruption(std::string(type_) + " message: field '" + key + "': " + why);
    }
  }

  const json& obj_;
  const char* type_;
  Status status_;
};

// Parses the length-prefixed JSON object at the payload's start.
// `json_end` receives the offset just past the JSON text.
Status ParseHeader(const uint8_t* p, size_t n, const char* type, json* out, size_t* json_end) {
  if (p == nullptr && n != 0) return Status::Corruption(std::string(type) + " message: no bytes");
  if (n < kLengthBytes) {
    return Status::Corruption(std::string(type) + " message: " + std::to_string(n) +
                              " bytes, shorter than its length prefix");
  }
  uint32_t len = 0;
  for (size_t i = 0; i < kLengthBytes; ++i) len |= static_cast<uint32_t>(p[i]) << (8 * i);
  if (len > kMaxMessageJsonBytes || len > n - kLengthBytes) {
    return Status::Corruption(std::string(type) + " message: JSON length " + std::to_string(len) +
                              " exceeds the payload or the cap");
  }
  std::string_view text(reinterpret_cast<const char*>(p + kLengthBytes), len);
  if (base::JsonDepth(text, kMaxJsonDepth) > kMaxJsonDepth) {
    return Status::Corruption(std::string(type) + " message: JSON nested too deep");
  }
  try {
    *out = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  } catch (const std::exception& e) {
    return Status::Corruption(std::string(type) + " message: bad JSON: " + e.what());
  }
  if (out->is_discarded()) return Status::Corruption(std::string(type) + " message: bad JSON");
  if (!out->is_object()) {
    return Status::Corruption(std::string(type) + " message: JSON header is not an object");
  }
  *json_end = kLengthBytes + len;
  return Status::OK();
}

Status CheckPlainEnd(size_t json_end, size_t n, const char* type) {
  if (json_end != n) {
    return Status::Corruption(std::string(type) + " message: " + std::to_string(n - json_end) +
                              " bytes after the JSON header");
  }
  return Status::OK();
}

Status ReadState(const json& j, const uint8_t* p, size_t n, size_t json_end, const char* type,
                 ByteSpan* state) {
  Fields f(j, type);
  uint64_t offset = 0, bytes = 0;
  f.U64("state_offset", &offset, true);
  f.U64("state_bytes", &bytes, true);
  CKPT_RETURN_IF_ERROR(f.status());
  if (offset % kStateAlign != 0 || offset < json_end || offset > n || bytes != n - offset) {
    return Status::Corruption(std::string(type) + " message: state at " + std::to_string(offset) +
                              " of " + std::to_string(bytes) + " bytes does not fit the " +
                              std::to_string(n) + "-byte payload");
  }
  for (size_t i = json_end; i < offset; ++i) {
    if (p[i] != 0) {
      return Status::Corruption(std::string(type) + " message: non-zero padding before the state");
    }
  }
  state->data = p + offset;
  state->size = bytes;
  return Status::OK();
}

template <typename Fill>
auto Decode(const uint8_t* p, size_t n, const char* type, Fill fill)
    -> decltype(fill(std::declval<const json&>(), size_t{0})) {
  try {
    json j;
    size_t json_end = 0;
    CKPT_RETURN_IF_ERROR(ParseHeader(p, n, type, &j, &json_end));
    return fill(j, json_end);
  } catch (const std::exception& e) {
    return Status::Corruption(std::string(type) + " message: " + e.what());
  }
}

}  // namespace

size_t EncodedSize(const Hello& m) { return SizePlain(m); }
size_t EncodedSize(const Configure& m) { return SizePlain(m); }
size_t EncodedSize(const Train& m) { return SizeStateful(m); }
size_t EncodedSize(const Result& m) { return SizeStateful(m); }
size_t EncodedSize(const Failed& m) { return SizePlain(m); }
size_t EncodedSize(const Stats& m) { return SizePlain(m); }
size_t EncodedSize(const Shutdown& m) { return SizePlain(m); }

Status Encode(const Hello& m, uint8_t* dst, size_t size) {
  return EncodePlain(m, "HELLO", dst, size);
}
Status Encode(const Configure& m, uint8_t* dst, size_t size) {
  return EncodePlain(m, "CONFIGURE", dst, size);
}
Status Encode(const Train& m, uint8_t* dst, size_t size) {
  auto r = EncodeStateful(m, "TRAIN", dst, size, true);
  return r.ok() ? Status::OK() : r.status();
}
Status Encode(const Result& m, uint8_t* dst, size_t size) {
  auto r = EncodeStateful(m, "RESULT", dst, size, true);
  return r.ok() ? Status::OK() : r.status();
}
Status Encode(const Failed& m, uint8_t* dst, size_t size) {
  return EncodePlain(m, "FAILED", dst, size);
}
Status Encode(const Stats& m, uint8_t* dst, size_t size) {
  return EncodePlain(m, "STATS", dst, size);
}
Status Encode(const Shutdown& m, uint8_t* dst, size_t size) {
  return EncodePlain(m, "SHUTDOWN", dst, size);
}

StatusOr<size_t> EncodeHeaderOnly(const Train& m, uint8_t* dst, size_t size) {
  return EncodeStateful(m, "TRAIN", dst, size, false);
}
StatusOr<size_t> EncodeHeaderOnly(const Result& m, uint8_t* dst, size_t size) {
  return EncodeStateful(m, "RESULT", dst, size, false);
}

StatusOr<std::vector<uint8_t>> EncodeStatePrefix(const Train& m) {
  return EncodePrefix(m, "TRAIN");
}
StatusOr<std::vector<uint8_t>> EncodeStatePrefix(const Result& m) {
  return EncodePrefix(m, "RESULT");
}

StatusOr<Hello> DecodeHello(const uint8_t* p, size_t n) {
  return Decode(p, n, "HELLO", [&](const json& j, size_t end) -> StatusOr<Hello> {
    CKPT_RETURN_IF_ERROR(CheckPlainEnd(end, n, "HELLO"));
    Hello m;
    Fields f(j, "HELLO");
    f.Str("device", &m.device, true);
    f.I64("memory_bytes", &m.memory_bytes);
    f.I32("slots", &m.slots);
    f.Bool("fusion", &m.fusion);
    f.Str("mode", &m.mode);
    f.I64("pid", &m.pid);
    f.Str("version", &m.version);
    CKPT_RETURN_IF_ERROR(f.status());
    return m;
  });
}

StatusOr<Configure> DecodeConfigure(const uint8_t* p, size_t n) {
  return Decode(p, n, "CONFIGURE", [&](const json& j, size_t end) -> StatusOr<Configure> {
    CKPT_RETURN_IF_ERROR(CheckPlainEnd(end, n, "CONFIGURE"));
    Configure m;
    Fields f(j, "CONFIGURE");
    f.Str("experiment", &m.experiment, true);
    f.Str("model_spec", &m.model_spec);
    f.Str("model_sha256", &m.model_sha256);
    f.Named("optimizer", format::ParseOptimizerKind, &m.optimizer);
    f.Str("dataset", &m.dataset);
    f.Str("dataset_path", &m.dataset_path);
    format::DatasetFormat data_format = format::DatasetFormat::kIdx;
    f.Named("data_format", format::ParseDatasetFormat, &data_format);
    format::TensorDatasetOptions tensor;
    f.I64("val_size", &tensor.val_size);
    f.I64("classes", &tensor.classes);
    f.Numbers("data_mean", &tensor.mean);
    f.Numbers("data_std", &tensor.std);
    f.OptionalNamed("loss", format::ParseLossKind, &m.loss);
    f.OptionalNamed("metric", format::ParseMetricKind, &m.metric);
    std::vector<std::string> augment;
    f.Strings("augment", &augment);
    f.I32("batch_size", &m.batch_size);
    f.I32("eval_size", &m.eval_size);
    f.U64("seed", &m.seed);
    CKPT_RETURN_IF_ERROR(f.status());
    if (!m.model_sha256.empty() && !IsSha256Hex(m.model_sha256)) {
      return Status::Corruption(
          "CONFIGURE message: field 'model_sha256' is not 64 lowercase hex digits");
    }
    auto augmentation = format::ParseAugmentation(augment);
    if (!augmentation.ok()) {
      return Status::Corruption("CONFIGURE message: field 'augment': " +
                                augmentation.status().message());
    }
    m.augment = *augmentation;
    if (data_format != format::DatasetFormat::kIdx) {
      tensor.format = data_format;
      tensor.path = std::move(m.dataset_path);
      m.dataset_path.clear();
      m.tensor_data = std::move(tensor);
    }
    return m;
  });
}

StatusOr<Train> DecodeTrain(const uint8_t* p, size_t n) {
  return Decode(p, n, "TRAIN", [&](const json& j, size_t end) -> StatusOr<Train> {
    Train m;
    Fields f(j, "TRAIN");
    f.U64("task_id", &m.task_id, true);
    f.Str("experiment", &m.experiment, true);
    f.Str("member", &m.member, true);
    f.I64("version", &m.version);
    f.I64("steps", &m.steps, true);
    f.Bool("eval_test", &m.eval_test);
    f.U64("init_seed", &m.init_seed);
    f.Map("hparams", &m.hparams);
    CKPT_RETURN_IF_ERROR(f.status());
    CKPT_RETURN_IF_ERROR(ReadState(j, p, n, end, "TRAIN", &m.state));
    return m;
  });
}

StatusOr<Result> DecodeResult(const uint8_t* p, size_t n) {
  return Decode(p, n, "RESULT", [&](const json& j, size_t end) -> StatusOr<Result> {
    Result m;
    Fields f(j, "RESULT");
    f.U64("task_id", &m.task_id, true);
    f.Str("experiment", &m.experiment);
    f.Str("member", &m.member, true);
    f.I64("step", &m.step);
    f.F64("train_loss", &m.train_loss);
    f.F64("val_score", &m.val_score);
    f.F64("test_score", &m.test_score);
    f.I64("samples", &m.samples);
    f.F64("compute_s", &m.compute_s);
    CKPT_RETURN_IF_ERROR(f.status());
    CKPT_RETURN_IF_ERROR(ReadState(j, p, n, end, "RESULT", &m.state));
    return m;
  });
}

StatusOr<Failed> DecodeFailed(const uint8_t* p, size_t n) {
  return Decode(p, n, "FAILED", [&](const json& j, size_t end) -> StatusOr<Failed> {
    CKPT_RETURN_IF_ERROR(CheckPlainEnd(end, n, "FAILED"));
    Failed m;
    Fields f(j, "FAILED");
    f.U64("task_id", &m.task_id, true);
    f.Str("experiment", &m.experiment);
    f.Str("member", &m.member);
    std::string code;
    f.Str("code", &code, true);
    f.Str("reason", &m.reason);
    CKPT_RETURN_IF_ERROR(f.status());
    m.code = FailureCodeFromWorker(code);
    return m;
  });
}

StatusOr<Stats> DecodeStats(const uint8_t* p, size_t n) {
  return Decode(p, n, "STATS", [&](const json& j, size_t end) -> StatusOr<Stats> {
    CKPT_RETURN_IF_ERROR(CheckPlainEnd(end, n, "STATS"));
    Stats m;
    Fields f(j, "STATS");
    f.F64("samples_per_s", &m.samples_per_s);
    f.U64("samples_total", &m.samples_total);
    f.I32("slots", &m.slots);
    f.I32("slots_busy", &m.slots_busy);
    f.Str("mode", &m.mode);
    f.I64("allocator_bytes", &m.allocator_bytes);
    f.I64("rss_bytes", &m.rss_bytes);
    CKPT_RETURN_IF_ERROR(f.status());
    return m;
  });
}

StatusOr<Shutdown> DecodeShutdown(const uint8_t* p, size_t n) {
  return Decode(p, n, "SHUTDOWN", [&](const json& j, size_t end) -> StatusOr<Shutdown> {
    CKPT_RETURN_IF_ERROR(CheckPlainEnd(end, n, "SHUTDOWN"));
    Shutdown m;
    Fields f(j, "SHUTDOWN");
    f.Str("reason", &m.reason);
    CKPT_RETURN_IF_ERROR(f.status());
    return m;
  });
}

}  // namespace ckpt::ipc
