// The only file that knows the events' JSON; nlohmann's exceptions never leave
// it (parsing without exceptions, every field checked for its type before it
// is read).
#include "ckpt/records/events.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <type_traits>

namespace ckpt::records {
namespace {

using json = nlohmann::json;

template <typename T>
struct Always {
  static constexpr bool kFalse = false;
};

// Reads the fields of one event object; the first wrong type is kept as the
// error, so a decoder reads every field and checks once at the end.
class Fields {
 public:
  Fields(const json& j, const std::string& what) : j_(j), what_(what) {}

  void Str(const char* key, std::string* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_string()) return Bad(key, "a string");
    *out = v->get<std::string>();
  }
  template <typename Int>
  void Integer(const char* key, Int* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_number_integer()) return Bad(key, "an integer");
    *out = static_cast<Int>(v->get<int64_t>());
  }
  void Double(const char* key, double* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (v->is_null()) {
      *out = std::nan("");
      return;
    }
    if (!v->is_number()) return Bad(key, "a number");
    *out = v->get<double>();
  }
  void Bool(const char* key, bool* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_boolean()) return Bad(key, "true or false");
    *out = v->get<bool>();
  }
  void Numbers(const char* key, std::map<std::string, double>* out) {
    const json* v = Find(key);
    if (v == nullptr) return;
    if (!v->is_object()) return Bad(key, "an object of numbers");
    for (auto it = v->begin(); it != v->end(); ++it) {
      if (!it->is_number()) return Bad(key, "an object of numbers");
      (*out)[it.key()] = it->get<double>();
    }
  }
  // A score of `split` ("val", "test") under its metric's name, setting
  // *metric; a record written before scores were named holds "<split>_acc"
  // (accuracy). Neither present: nothing changes.
  void Score(std::string_view split, format::MetricKind* metric, double* out) {
    for (format::MetricKind k : format::kMetricKinds) {
      const std::string key = format::SplitMetricName(split, k);
      if (Find(key.c_str()) != nullptr) {
        *metric = k;
        return Double(key.c_str(), out);
      }
    }
    const std::string legacy = std::string(split) + "_acc";
    if (Find(legacy.c_str()) != nullptr) {
      *metric = format::MetricKind::kAccuracy;
      Double(legacy.c_str(), out);
    }
  }
  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() ? nullptr : &*it;
  }
  void Bad(const std::string& key, const std::string& want) {
    if (status_.ok()) status_ = Status::Corruption(what_ + ": field '" + key + "' is not " + want);
  }
  const Status& status() const { return status_; }
  const std::string& what() const { return what_; }

 private:
  const json& j_;
  const std::string& what_;
  Status status_;
};

json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json ToJson(const TrainedEvent& e) {
  json j = {{"interval", e.interval},
            {format::SplitMetricName("val", e.metric), Number(e.val_score)},
            {"worker", e.worker}};
  if (!e.hparams.empty()) j["hparams"] = e.hparams;
  return j;
}
json ToJson(const ExploitEvent& e) {
  return {{"member", e.member},
          {"donor", e.donor},
          {"interval", e.interval},
          {"why", e.why},
          {"hparams", e.hparams}};
}
json ToJson(const RestoreEvent& e) {
  // "restored_version" and "version" are the store's names; its restore
  // sets both in the same object.
  json j = {{"member", e.member}, {"restored_version", e.from_version}, {"version", e.version}};
  if (!e.by.empty()) j["by"] = e.by;
  return j;
}
json ToJson(const FailedEvent& e) {
  return {{"member", e.member},
          {"code", ipc::FailureCodeName(e.code)},
          {"reason", e.reason},
          {"failures", e.failures}};
}
json ToJson(const MemberStoppedEvent& e) {
  json j = {{"member", e.member}, {"why", e.why}};
  if (e.kept_version) j["kept_version"] = *e.kept_version;
  return j;
}
json ToJson(const CorruptStateEvent& e) {
  // Logged by the store's restore, in its write: "reason", "version" and
  // "restored_version" are the store's ("reason" is "restore"), the damage
  // found is "damage".
  return {
      {"member", e.member},   {"bad_version", e.bad_version}, {"restored_version", e.restored_from},
      {"version", e.version}, {"interval", e.interval},       {"damage", e.reason}};
}
json ToJson(const TargetReachedEvent& e) {
  return {{"member", e.member}, {"score", Number(e.score)}, {"target", e.target}};
}
json ToJson(const WallTimeReachedEvent& e) { return {{"max_wall_s", e.max_wall_s}}; }
json ToJson(const ConfigureRefusedEvent& e) { return {{"reason", e.reason}}; }
json ToJson(const PausedEvent&) { return json::object(); }
json ToJson(const ResumedEvent&) { return json::object(); }
json ToJson(const StoppedEvent&) { return json::object(); }
json ToJson(const FinalEvalEvent& e) {
  json results = json::array();
  for (const auto& r : e.results) {
    results.push_back({{"member", r.member},
                       {format::SplitMetricName("val", e.metric), Number(r.val_score)},
                       {format::SplitMetricName("test", e.metric), Number(r.test_score)},
                       {"version", r.version}});
  }
  return {{"results", results}};
}
json ToJson(const StoreErrorEvent& e) { return {{"error", e.error}}; }
json ToJson(const WorkerLostEvent& e) {
  return {{"given_up", e.given_up},
          {"worker", e.worker},
          {"device", e.device},
          {"reason", e.reason},
          {"requeued", e.requeued}};
}
json ToJson(const ResumeFailedEvent& e) { return {{"error", e.error}}; }

void Read(Fields& f, TrainedEvent* e) {
  f.Integer("interval", &e->interval);
  f.Score("val", &e->metric, &e->val_score);
  f.Integer("worker", &e->worker);
  f.Str("member", &e->member);
  f.Integer("version", &e->version);
  f.Numbers("hparams", &e->hparams);
}
void Read(Fields& f, ExploitEvent* e) {
  f.Str("member", &e->member);
  f.Str("donor", &e->donor);
  f.Integer("interval", &e->interval);
  f.Str("why", &e->why);
  f.Numbers("hparams", &e->hparams);
  f.Integer("version", &e->version);
}
void Read(Fields& f, RestoreEvent* e) {
  f.Str("member", &e->member);
  // Events logged before the store's restore took them (ckpt-tool's)
  // named the old version "from_version".
  f.Integer(f.Find("restored_version") != nullptr ? "restored_version" : "from_version",
            &e->from_version);
  f.Integer("version", &e->version);
  f.Str("by", &e->by);
}
void Read(Fields& f, FailedEvent* e) {
  f.Str("member", &e->member);
  std::string code;
  f.Str("code", &code);
  if (auto c = ipc::ParseFailureCode(code)) {
    e->code = *c;
  } else if (f.status().ok()) {
    f.Bad("code", "a failure code ('" + code.substr(0, 32) + "')");
  }
  f.Str("reason", &e->reason);
  f.Integer("failures", &e->failures);
}
void Read(Fields& f, MemberStoppedEvent* e) {
  f.Str("member", &e->member);
  f.Str("why", &e->why);
  if (f.Find("kept_version") != nullptr) {
    int64_t v = 0;
    f.Integer("kept_version", &v);
    e->kept_version = v;
  }
}
void Read(Fields& f, CorruptStateEvent* e) {
  f.Str("member", &e->member);
  f.Integer("bad_version", &e->bad_version);
  // Events logged before the store's restore took them: "restored_from".
  f.Integer(f.Find("restored_version") != nullptr ? "restored_version" : "restored_from",
            &e->restored_from);
  f.Integer("version", &e->version);
  f.Integer("interval", &e->interval);
  // Events logged before the restore carried them named the damage "reason".
  if (f.Find("damage") == nullptr) return f.Str("reason", &e->reason);
  f.Str("damage", &e->reason);
}
void Read(Fields& f, TargetReachedEvent* e) {
  f.Str("member", &e->member);
  f.Double("score", &e->score);
  f.Double("target", &e->target);
}
void Read(Fields& f, WallTimeReachedEvent* e) { f.Double("max_wall_s", &e->max_wall_s); }
void Read(Fields& f, ConfigureRefusedEvent* e) { f.Str("reason", &e->reason); }
void Read(Fields&, PausedEvent*) {}
void Read(Fields&, ResumedEvent*) {}
void Read(Fields&, StoppedEvent*) {}
void Read(Fields& f, FinalEvalEvent* e) {
  const json* results = f.Find("results");
  if (results == nullptr) return;
  if (!results->is_array()) return f.Bad("results", "an array");
  for (const json& r : *results) {
    if (!r.is_object()) return f.Bad("results", "an array of objects");
    Fields rf(r, f.what());
    FinalEvalEvent::Result out;
    rf.Str("member", &out.member);
    rf.Score("val", &e->metric, &out.val_score);
    rf.Score("test", &e->metric, &out.test_score);
    rf.Integer("version", &out.version);
    if (!rf.status().ok()) return f.Bad("results", "an array of results");
    e->results.push_back(std::move(out));
  }
}
void Read(Fields& f, StoreErrorEvent* e) { f.Str("error", &e->error); }
void Read(Fields& f, WorkerLostEvent* e) {
  f.Bool("given_up", &e->given_up);
  f.Integer("worker", &e->worker);
  f.Str("device", &e->device);
  f.Str("reason", &e->reason);
  f.Integer("requeued", &e->requeued);
}
void Read(Fields& f, ResumeFailedEvent* e) { f.Str("error", &e->error); }

template <typename T>
constexpr const char* TypeName() {
  if constexpr (std::is_same_v<T, TrainedEvent>)
    return "trained";
  else if constexpr (std::is_same_v<T, ExploitEvent>)
    return "exploit";
  else if constexpr (std::is_same_v<T, RestoreEvent>)
    return "restore";
  else if constexpr (std::is_same_v<T, FailedEvent>)
    return "failed";
  else if constexpr (std::is_same_v<T, MemberStoppedEvent>)
    return "member_stopped";
  else if constexpr (std::is_same_v<T, CorruptStateEvent>)
    return "corrupt_state";
  else if constexpr (std::is_same_v<T, TargetReachedEvent>)
    return "target_reached";
  else if constexpr (std::is_same_v<T, WallTimeReachedEvent>)
    return "wall_time_reached";
  else if constexpr (std::is_same_v<T, ConfigureRefusedEvent>)
    return "configure_refused";
  else if constexpr (std::is_same_v<T, PausedEvent>)
    return "paused";
  else if constexpr (std::is_same_v<T, ResumedEvent>)
    return "resumed";
  else if constexpr (std::is_same_v<T, StoppedEvent>)
    return "stopped";
  else if constexpr (std::is_same_v<T, FinalEvalEvent>)
    return "final_eval";
  else if constexpr (std::is_same_v<T, StoreErrorEvent>)
    return "store_error";
  else if constexpr (std::is_same_v<T, WorkerLostEvent>)
    return "worker_lost";
  else if constexpr (std::is_same_v<T, ResumeFailedEvent>)
    return "resume_failed";
  else
    static_assert(Always<T>::kFalse, "an Event alternative without a type name");
}

// Decodes alternative I of Event when its name is `type`, else the next one.
template <size_t I = 0>
StatusOr<Event> DecodeAs(const std::string& type, const json& j, const std::string& what) {
  if constexpr (I == std::variant_size_v<Event>) {
    return Status::NotFound(what + ": type '" + type.substr(0, 32) +
                            "' is not an event the scheduler writes");
  } else {
    using T = std::variant_alternative_t<I, Event>;
    if (type != TypeName<T>()) return DecodeAs<I + 1>(type, j, what);
    T e;
    Fields f(j, what);
    Read(f, &e);
    if (!f.status().ok()) return f.status();
    return Event(std::move(e));
  }
}

}  // namespace

const char* EventTypeName(const Event& event) {
  return std::visit([](const auto& e) { return TypeName<std::decay_t<decltype(e)>>(); }, event);
}

std::string EncodeEvent(const Event& event) {
  json j = std::visit([](const auto& e) { return ToJson(e); }, event);
  j["type"] = EventTypeName(event);
  return j.dump();
}

StatusOr<Event> DecodeEvent(std::string_view text, const std::string& what) {
  const json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::Corruption(what + " is not a JSON object");
  auto type = j.find("type");
  if (type == j.end() || !type->is_string()) {
    return Status::Corruption(what + ": no string field 'type'");
  }
  return DecodeAs(type->get<std::string>(), j, what);
}

}  // namespace ckpt::records
