#include "codec.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace ckpt::store::codec {
namespace {

using json = nlohmann::json;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Caller strings (states, statuses) may hold invalid UTF-8: replace, never throw.
std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json Number(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

json NumberMap(const std::map<std::string, double>& m) {
  json o = json::object();
  for (const auto& [k, v] : m) o[k] = Number(v);
  return o;
}

// The decoders below call nlohmann accessors that throw on a type mismatch;
// Decode() turns that into Corruption.
double JsonNumber(const json& j) {
  if (j.is_null()) return kNaN;
  return j.get<double>();
}

std::map<std::string, double> ToNumberMap(const json& j) {
  std::map<std::string, double> m;
  for (const auto& [k, v] : j.items()) m[k] = JsonNumber(v);
  return m;
}

template <typename T, typename Fn>
StatusOr<T> Decode(std::string_view what, std::string_view value, Fn fn) {
  json j = json::parse(value.begin(), value.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::Corruption(std::string(what) + ": stored value is not a JSON object");
  }
  try {
    return fn(j);
  } catch (const json::exception& e) {
    return Status::Corruption(std::string(what) + ": bad stored value: " + e.what());
  }
}

}  // namespace

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string EncodeExperiment(const ExperimentInfo& info) {
  json j = {{"config", info.config_json},
            {"status", info.status},
            {"created_unix_ms", info.created_unix_ms}};
  return Dump(j);
}

StatusOr<ExperimentInfo> DecodeExperiment(std::string_view id, std::string_view value) {
  return Decode<ExperimentInfo>("experiment " + std::string(id), value, [&](const json& j) {
    ExperimentInfo info;
    info.id = std::string(id);
    info.config_json = j.at("config").get<std::string>();
    info.status = j.at("status").get<std::string>();
    info.created_unix_ms = j.at("created_unix_ms").get<int64_t>();
    return info;
  });
}

std::string EncodeHead(const MemberHead& h) {
  json j = {{"version", h.version},
            {"state", h.state},
            {"last_score", Number(h.last_score)},
            {"hparams", NumberMap(h.hparams)},
            {"step", h.step},
            {"blob", h.blob ? json(h.blob->Hex()) : json(nullptr)},
            {"updated_unix_ms", h.updated_unix_ms}};
  return Dump(j);
}

StatusOr<MemberHead> DecodeHead(std::string_view member, std::string_view value) {
  return Decode<MemberHead>("member " + std::string(member), value, [&](const json& j) {
    MemberHead h;
    h.member = std::string(member);
    h.version = j.at("version").get<int64_t>();
    h.state = j.at("state").get<std::string>();
    h.last_score = JsonNumber(j.at("last_score"));
    h.hparams = ToNumberMap(j.at("hparams"));
    h.step = j.at("step").get<int64_t>();
    const json& b = j.at("blob");
    if (!b.is_null()) {
      BlobId id;
      if (!BlobId::FromHex(b.get<std::string>(), &id)) {
        throw json::other_error::create(501, "blob id is not 32 hex digits", &b);
      }
      h.blob = id;
    }
    h.updated_unix_ms = j.at("updated_unix_ms").get<int64_t>();
    return h;
  });
}

std::string EncodeManifest(const Manifest& m) {
  json parent = nullptr;
  if (m.parent) parent = {{"member", m.parent->member}, {"version", m.parent->version}};
  json j = {{"version", m.version},
            {"blob", m.blob.Hex()},
            {"bytes", m.bytes},
            {"step", m.step},
            {"metrics", NumberMap(m.metrics)},
            {"hparams", NumberMap(m.hparams)},
            {"parent", parent},
            {"reason", m.reason},
            {"unix_ms", m.unix_ms},
            {"pinned", m.pinned},
            {"holds_blob", m.holds_blob}};
  return Dump(j);
}

StatusOr<Manifest> DecodeManifest(std::string_view member, std::string_view value) {
  return Decode<Manifest>("manifest of member " + std::string(member), value, [&](const json& j) {
    Manifest m;
    m.member = std::string(member);
    m.version = j.at("version").get<int64_t>();
    const json& b = j.at("blob");
    if (!BlobId::FromHex(b.get<std::string>(), &m.blob)) {
      throw json::other_error::create(501, "blob id is not 32 hex digits", &b);
    }
    m.bytes = j.at("bytes").get<uint64_t>();
    m.step = j.at("step").get<int64_t>();
    m.metrics = ToNumberMap(j.at("metrics"));
    m.hparams = ToNumberMap(j.at("hparams"));
    const json& p = j.at("parent");
    if (!p.is_null()) {
      m.parent = VersionRef{p.at("member").get<std::string>(), p.at("version").get<int64_t>()};
    }
    m.reason = j.at("reason").get<std::string>();
    m.unix_ms = j.at("unix_ms").get<int64_t>();
    m.pinned = j.at("pinned").get<bool>();
    m.holds_blob = j.at("holds_blob").get<bool>();
    return m;
  });
}

Status ValidateJson(std::string_view what, std::string_view text) {
  if (!json::accept(text.begin(), text.end())) {
    return Status::InvalidArgument(std::string(what) + " is not valid JSON");
  }
  return Status::OK();
}

StatusOr<std::string> BuildEvent(std::string_view text, std::string_view default_type,
                                 std::string_view exp,
                                 const std::map<std::string, std::string>& string_fields,
                                 const std::map<std::string, int64_t>& int_fields) {
  json j = json::object();
  if (!text.empty()) {
    j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::InvalidArgument("event is not a JSON object: " +
                                     std::string(text.substr(0, 200)));
    }
  }
  if (!j.contains("type")) j["type"] = std::string(default_type);
  for (const auto& [k, v] : string_fields) j[k] = v;
  for (const auto& [k, v] : int_fields) j[k] = v;
  j["exp"] = std::string(exp);
  j["unix_ms"] = NowUnixMs();
  return Dump(j);
}

}  // namespace ckpt::store::codec
