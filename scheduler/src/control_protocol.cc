#include "control_protocol.h"

#include <cmath>

namespace ckpt::scheduler::protocol {
namespace {

using json = nlohmann::json;

// Non-finite numbers have no JSON form; the protocol sends -1 for "none".
double Finite(double v) { return std::isfinite(v) ? v : -1.0; }

}  // namespace

json SummaryToJson(const ExperimentSummary& s, bool with_members) {
  json j = {{"id", s.id},
            {"status", s.status},
            {"population", s.population},
            {"intervals", s.intervals},
            {"generation", s.generation},
            {"exploits", s.exploits},
            {"member_intervals", s.member_intervals},
            {"train_samples", s.train_samples},
            {"best_val_acc", s.members.empty() ? -1.0 : Finite(s.members.front().val_acc)}};
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
                       {"status", m.status},
                       {"intervals_done", m.intervals_done},
                       {"val_acc", Finite(m.val_acc)},
                       {"test_acc", Finite(m.test_acc)},
                       {"version", m.version},
                       {"step", m.step},
                       {"hparams", hp}});
  }
  j["members"] = std::move(members);
  return j;
}

json WorkerToJson(const WorkerStatus& w) {
  return {{"index", w.index},       {"device", w.device},
          {"pid", w.pid},           {"ready", w.ready},
          {"mode", w.mode},         {"capacity", w.capacity},
          {"busy", w.busy},         {"restarts", w.restarts},
          {"given_up", w.given_up}, {"samples_per_s", Finite(w.samples_per_s)}};
}

StatusOr<ExperimentSummary> SummaryFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("experiment summary is not a JSON object");
  try {
    ExperimentSummary s;
    s.id = j.at("id").get<std::string>();
    s.status = j.at("status").get<std::string>();
    s.population = j.at("population").get<int>();
    s.intervals = j.at("intervals").get<int>();
    s.generation = j.at("generation").get<int>();
    s.exploits = j.at("exploits").get<int64_t>();
    s.member_intervals = j.at("member_intervals").get<int64_t>();
    s.train_samples = j.at("train_samples").get<int64_t>();
    s.wall_s = j.value("wall_s", 0.0);
    s.training_s = j.value("training_s", 0.0);
    s.first_result_s = j.value("first_result_s", 0.0);
    s.store_path = j.value("store", "");
    for (const auto& m : j.value("members", json::array())) {
      MemberSummary ms;
      ms.member = m.at("member").get<std::string>();
      ms.status = m.at("status").get<std::string>();
      ms.intervals_done = m.at("intervals_done").get<int>();
      ms.val_acc = m.at("val_acc").get<double>();
      ms.test_acc = m.at("test_acc").get<double>();
      ms.version = m.at("version").get<int64_t>();
      ms.step = m.at("step").get<int64_t>();
      ms.hparams = m.at("hparams").get<std::map<std::string, double>>();
      s.members.push_back(std::move(ms));
    }
    return s;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("experiment summary: ") + e.what());
  }
}

StatusOr<WorkerStatus> WorkerFromJson(const json& j) {
  if (!j.is_object()) return Status::InvalidArgument("device status is not a JSON object");
  try {
    WorkerStatus w;
    w.index = j.at("index").get<int>();
    w.device = j.at("device").get<std::string>();
    w.pid = j.at("pid").get<int64_t>();
    w.ready = j.at("ready").get<bool>();
    w.mode = j.at("mode").get<std::string>();
    w.capacity = j.at("capacity").get<int>();
    w.busy = j.at("busy").get<int>();
    w.restarts = j.at("restarts").get<int>();
    w.given_up = j.at("given_up").get<bool>();
    w.samples_per_s = j.at("samples_per_s").get<double>();
    return w;
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("device status: ") + e.what());
  }
}

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

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace ckpt::scheduler::protocol
