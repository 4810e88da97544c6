#include "control_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

#include "ckpt/base/json_depth.h"
#include "ckpt/scheduler/summary_text.h"

namespace ckpt::scheduler::protocol {
namespace {

using json = nlohmann::json;

// Non-finite numbers have no JSON form; the protocol sends -1 for "none".
double Finite(double v) { return std::isfinite(v) ? v : -1.0; }

// A score of the experiment's metric: null when not evaluated (any value,
// -1 included, is a possible neg_mse or r2).
json Score(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
double ScoreFrom(const json& j, const char* key) {
  const json& v = j.at(key);
  return v.is_null() ? format::kNotEvaluated : v.get<double>();
}

// A field of a reply that is not what the protocol says.
struct BadField : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The integer field `key` of `j`, refused (BadField) unless it is a JSON
// integer that T holds: nlohmann's get<T>() converts a float or a wider
// integer with a bare cast, which is undefined for 7e40 (found by
// tests/fuzz/control_request_fuzz.cc).
template <typename T>
T Integer(const json& j, const char* key) {
  const json& v = j.at(key);
  const std::string where = std::string("field '") + key + "'";
  if (!v.is_number_integer()) throw BadField(where + " is not an integer");
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      throw BadField(where + " is out of range");
    }
    return static_cast<T>(u);
  }
  const int64_t i = v.get<int64_t>();
  if (i < static_cast<int64_t>(std::numeric_limits<T>::min()) ||
      i > static_cast<int64_t>(std::numeric_limits<T>::max())) {
    throw BadField(where + " is out of range");
  }
  return static_cast<T>(i);
}

const char* TypeName(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "an array";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number with a fraction";
    default:
      return "a binary value";
  }
}

enum class FieldType { kString, kVersion };

struct FieldSpec {
  const char* name;
  FieldType type;
  bool required;
};

struct VerbSpec {
  std::vector<FieldSpec> fields;
  bool mutates;  // logged with the peer's uid
};

const std::map<std::string, VerbSpec>& Verbs() {
  static const auto* verbs = new std::map<std::string, VerbSpec>{
      {"submit",
       {{{"toml", FieldType::kString, true}, {"origin", FieldType::kString, false}}, true}},
      {"list", {{}, false}},
      {"status", {{{"experiment", FieldType::kString, false}}, false}},
      {"pause", {{{"experiment", FieldType::kString, true}}, true}},
      {"resume", {{{"experiment", FieldType::kString, true}}, true}},
      {"stop", {{{"experiment", FieldType::kString, true}}, true}},
      {"restore",
       {{{"experiment", FieldType::kString, true},
         {"member", FieldType::kString, true},
         {"version", FieldType::kVersion, true}},
        true}},
      {"pin",
       {{{"experiment", FieldType::kString, true},
         {"member", FieldType::kString, true},
         {"version", FieldType::kVersion, true}},
        true}},
      {"unpin",
       {{{"experiment", FieldType::kString, true},
         {"member", FieldType::kString, true},
         {"version", FieldType::kVersion, true}},
        true}},
      {"shutdown", {{{"why", FieldType::kString, false}}, true}},
  };
  return *verbs;
}

std::string VerbList() {
  std::string out;
  for (const auto& [name, spec] : Verbs()) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// Checks `request` against its verb's fields: required ones present, every
// one of its type, no unknown ones.
StatusOr<const VerbSpec*> Validate(const json& request, std::string* verb) {
  if (!request.is_object()) {
    return Status::InvalidArgument(std::string("a request must be a JSON object, not ") +
                                   TypeName(request));
  }
  auto v = request.find("verb");
  if (v == request.end()) {
    return Status::InvalidArgument("field 'verb' is required (one of " + VerbList() + ")");
  }
  if (!v->is_string()) {
    return Status::InvalidArgument(std::string("field 'verb' must be a string, not ") +
                                   TypeName(*v));
  }
  *verb = v->get<std::string>();
  auto it = Verbs().find(*verb);
  if (it == Verbs().end()) {
    return Status::InvalidArgument("unknown verb '" + *verb + "' (known: " + VerbList() + ")");
  }
  const VerbSpec& spec = it->second;
  for (const auto& [key, value] : request.items()) {
    if (key == "verb") continue;
    if (key == "id") {
      if (value.is_structured()) {
        return Status::InvalidArgument("field 'id' must be a string, number, boolean or null");
      }
      continue;
    }
    bool known = false;
    for (const auto& f : spec.fields) known = known || key == f.name;
    if (!known) {
      std::string fields;
      for (const auto& f : spec.fields) fields += std::string(fields.empty() ? "" : ", ") + f.name;
      return Status::InvalidArgument("verb '" + *verb + "': unknown field '" + key + "' (" +
                                     (fields.empty() ? "it takes none" : "it takes " + fields) +
                                     ")");
    }
  }
  for (const auto& f : spec.fields) {
    auto field = request.find(f.name);
    const std::string where = "verb '" + *verb + "': field '" + f.name + "'";
    const char* want = f.type == FieldType::kString ? "a string" : "a positive integer";
    if (field == request.end()) {
      if (f.required) return Status::InvalidArgument(where + " is required (" + want + ")");
      continue;
    }
    if (f.type == FieldType::kString) {
      if (!field->is_string()) {
        return Status::InvalidArgument(where + " must be a string, not " + TypeName(*field));
      }
      if (f.required && field->get_ref<const std::string&>().empty()) {
        return Status::InvalidArgument(where + " must not be empty");
      }
    } else {
      const bool fits =
          field->is_number_integer() &&
          (field->is_number_unsigned() ? field->get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                       : true);
      if (!fits) {
        return Status::InvalidArgument(where + " must be a positive integer, not " +
                                       TypeName(*field));
      }
      if (field->get<int64_t>() < 1) {
        return Status::InvalidArgument(where + " must be at least 1, not " +
                                       std::to_string(field->get<int64_t>()));
      }
    }
  }
  return &spec;
}

}  // namespace

json SummaryToJson(const ExperimentSummary& s, bool with_members) {
  json j = {
      {"id", s.id},
      {"status", records::ExperimentStatusName(s.status)},
      {"phase", records::ExperimentPhaseName(s.phase)},
      {"population", s.population},
      {"intervals", s.intervals},
      {"generation", s.generation},
      {"exploits", s.exploits},
      {"member_intervals", s.member_intervals},
      {"train_samples", s.train_samples},
      {"metric", format::MetricKindName(s.metric)},
      {"best_val_score", s.members.empty() ? json(nullptr) : Score(s.members.front().val_score)},
      {"progress", ProgressLine(s)}};
  if (!with_members) return j;
  j["wall_s"] = Finite(s.wall_s);
  j["training_s"] = Finite(s.training_s);
  j["first_result_s"] = Finite(s.first_result_s);
  j["store"] = s.store_path;
  json members = json::array();
  for (const auto& m : s.members) {
    json hp = json::object();
    for (const auto& [k, v] : m.hparams) hp[k] = Finite(v);
    members.push_back({{"member", m.member},
                       {"status", records::MemberStatusName(m.status)},
                       {"intervals_done", m.intervals_done},
                       {"val_score", Score(m.val_score)},
                       {"test_score", Score(m.test_score)},
                       {"version", m.version},
                       {"step", m.step},
                       {"hparams", hp}});
  }
  j["members"] = std::move(members);
  return j;
}

json WorkerToJson(const WorkerStatus& w) {
  // null where NVML gives no figure (no GPU, a remote worker, no NVML).
  auto optional = [](const auto& v) { return v ? json(*v) : json(nullptr); };
  return {{"index", w.index},
          {"device", w.device},
          {"host", w.host},
          {"pid", w.pid},
          {"ready", w.ready},
          {"mode", w.mode ? ipc::FusionModeName(*w.mode) : ""},
          {"capacity", w.capacity},
          {"busy", w.busy},
          {"restarts", w.restarts},
          {"given_up", w.given_up},
          {"samples_per_s", Finite(w.samples_per_s)},
          {"rss_bytes", w.rss_bytes},
          {"device_memory_bytes", w.device_memory_bytes},
          {"gpu_utilization", w.gpu_utilization ? json(Finite(*w.gpu_utilization)) : json(nullptr)},
          {"gpu_memory_used_bytes", optional(w.gpu_memory_used_bytes)},
          {"gpu_memory_total_bytes", optional(w.gpu_memory_total_bytes)}};
}

StatusOr<ExperimentSummary> SummaryFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("experiment summary is not a JSON object");
  try {
    ExperimentSummary s;
    s.id = j.at("id").get<std::string>();
    auto status = records::ParseExperimentStatus(j.at("status").get<std::string>());
    if (!status.ok()) throw BadField("field 'status': " + status.status().message());
    s.status = *status;
    if (j.contains("phase")) {
      auto phase = records::ParseExperimentPhase(j.at("phase").get<std::string>());
      if (!phase.ok()) throw BadField("field 'phase': " + phase.status().message());
      s.phase = *phase;
    }
    if (j.contains("metric")) {
      auto metric = format::ParseMetricKind(j.at("metric").get<std::string>());
      if (!metric.ok()) throw BadField("field 'metric': " + metric.status().message());
      s.metric = *metric;
    }
    s.population = Integer<int>(j, "population");
    s.intervals = Integer<int>(j, "intervals");
    s.generation = Integer<int>(j, "generation");
    s.exploits = Integer<int64_t>(j, "exploits");
    s.member_intervals = Integer<int64_t>(j, "member_intervals");
    s.train_samples = Integer<int64_t>(j, "train_samples");
    s.wall_s = j.value("wall_s", 0.0);
    s.training_s = j.value("training_s", 0.0);
    s.first_result_s = j.value("first_result_s", 0.0);
    s.store_path = j.value("store", "");
    for (const auto& m : j.value("members", json::array())) {
      MemberSummary ms;
      ms.member = m.at("member").get<std::string>();
      auto member_status = records::ParseMemberStatus(m.at("status").get<std::string>());
      if (!member_status.ok()) {
        throw BadField("member " + ms.member +
                       ": field 'status': " + member_status.status().message());
      }
      ms.status = *member_status;
      ms.intervals_done = Integer<int>(m, "intervals_done");
      ms.val_score = ScoreFrom(m, "val_score");
      ms.test_score = ScoreFrom(m, "test_score");
      ms.version = Integer<int64_t>(m, "version");
      ms.step = Integer<int64_t>(m, "step");
      ms.hparams = m.at("hparams").get<std::map<std::string, double>>();
      s.members.push_back(std::move(ms));
    }
    return s;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("experiment summary: ") + e.what());
  } catch (const BadField& e) {
    return Status::InvalidArgument(std::string("experiment summary: ") + e.what());
  }
}

StatusOr<WorkerStatus> WorkerFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("device status is not a JSON object");
  try {
    WorkerStatus w;
    w.index = Integer<int>(j, "index");
    w.device = j.at("device").get<std::string>();
    w.host = j.value("host", "");
    w.pid = Integer<int64_t>(j, "pid");
    w.ready = j.at("ready").get<bool>();
    if (const std::string mode = j.at("mode").get<std::string>(); !mode.empty()) {
      auto parsed = ipc::ParseFusionMode(mode);
      if (!parsed.ok()) throw BadField("field 'mode': " + parsed.status().message());
      w.mode = *parsed;
    }
    w.capacity = Integer<int>(j, "capacity");
    w.busy = Integer<int>(j, "busy");
    w.restarts = Integer<int>(j, "restarts");
    w.given_up = j.at("given_up").get<bool>();
    w.samples_per_s = j.at("samples_per_s").get<double>();
    // Absent from a scheduler before these fields: zero and none.
    if (j.contains("rss_bytes")) w.rss_bytes = Integer<int64_t>(j, "rss_bytes");
    if (j.contains("device_memory_bytes")) {
      w.device_memory_bytes = Integer<int64_t>(j, "device_memory_bytes");
    }
    if (j.contains("gpu_utilization") && !j["gpu_utilization"].is_null()) {
      w.gpu_utilization = j["gpu_utilization"].get<double>();
    }
    for (auto [key, field] : {std::pair{"gpu_memory_used_bytes", &w.gpu_memory_used_bytes},
                              std::pair{"gpu_memory_total_bytes", &w.gpu_memory_total_bytes}}) {
      if (j.contains(key) && !j[key].is_null()) *field = Integer<int64_t>(j, key);
    }
    return w;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("device status: ") + e.what());
  } catch (const BadField& e) {
    return Status::InvalidArgument(std::string("device status: ") + e.what());
  }
}

json ServiceToJson(const ServiceInfo& s) {
  return {{"version", s.version},           {"host", s.host},   {"pid", s.pid},
          {"uptime_s", Finite(s.uptime_s)}, {"store", s.store}, {"socket", s.socket}};
}

StatusOr<ServiceInfo> ServiceFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("service status is not a JSON object");
  try {
    ServiceInfo s;
    s.version = j.at("version").get<std::string>();
    s.host = j.at("host").get<std::string>();
    s.pid = Integer<int64_t>(j, "pid");
    s.uptime_s = j.at("uptime_s").get<double>();
    s.store = j.at("store").get<std::string>();
    s.socket = j.at("socket").get<std::string>();
    return s;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("service status: ") + e.what());
  } catch (const BadField& e) {
    return Status::InvalidArgument(std::string("service status: ") + e.what());
  }
}

const char* CkptVersion() { return CKPT_VERSION; }

json ErrorReply(const Status& status) {
  return {{"ok", false},
          {"code", std::string(StatusCodeName(status.code()))},
          {"error", status.message()}};
}

Status StatusFromReply(const json& reply) {
  std::string message = "reply without an error message";
  std::string code;
  if (reply.is_object()) {
    auto e = reply.find("error");
    if (e != reply.end() && e->is_string()) message = e->get<std::string>();
    auto c = reply.find("code");
    if (c != reply.end() && c->is_string()) code = c->get<std::string>();
  }
  for (int i = 1; i <= static_cast<int>(StatusCode::kFailedPrecondition); ++i) {
    const auto sc = static_cast<StatusCode>(i);
    if (StatusCodeName(sc) == code) return Status(sc, message);
  }
  return Status::Internal(code.empty() ? message : code + ": " + message);
}

Status ParseRequest(std::string_view line, Request* out) {
  *out = Request();
  if (line.find_first_not_of(" \t") == std::string_view::npos) {
    return Status::InvalidArgument("empty request line (expected a JSON object)");
  }
  if (const size_t nul = line.find('\0'); nul != std::string_view::npos) {
    // The JSON parser would stop at it and ignore the rest of the line.
    return Status::InvalidArgument("malformed request: NUL byte at offset " + std::to_string(nul));
  }
  if (base::JsonDepth(line, kMaxRequestDepth) > kMaxRequestDepth) {
    return Status::InvalidArgument("malformed request: JSON nested deeper than " +
                                   std::to_string(kMaxRequestDepth) + " levels");
  }
  json request;
  try {
    request = json::parse(line);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("malformed JSON: ") + e.what());
  }
  if (request.is_object()) {
    auto it = request.find("id");
    if (it != request.end() && !it->is_structured()) out->id = *it;
  }
  std::string verb;
  auto spec = Validate(request, &verb);
  if (!spec.ok()) return spec.status();
  out->verb = std::move(verb);
  out->mutates = (*spec)->mutates;
  out->body = std::move(request);
  return Status::OK();
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace ckpt::scheduler::protocol
