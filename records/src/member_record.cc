// The only file that knows the member-state record's JSON; nlohmann's
// exceptions never leave it (parsing without exceptions, every field checked
// for its type before it is read).
#include "ckpt/records/member_record.h"

#include <limits>
#include <nlohmann/json.hpp>

namespace ckpt::records {
namespace {

using json = nlohmann::json;

bool SameDouble(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

json NumberOrNull(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

}  // namespace

bool operator==(const MemberRecord& a, const MemberRecord& b) {
  return a.index == b.index && a.interval == b.interval && a.last_exploit == b.last_exploit &&
         SameDouble(a.score, b.score) &&
         StoredMemberStatus(a.status) == StoredMemberStatus(b.status) && a.failures == b.failures &&
         SameDouble(a.test_score, b.test_score) && a.ahead_of == b.ahead_of &&
         (!a.ahead() || SameDouble(a.ahead_score, b.ahead_score));
}

std::string EncodeMemberRecord(const MemberRecord& s) {
  json j = {
      {"v", kMemberRecordVersion},      {"index", s.index},
      {"interval", s.interval},         {"last_exploit", s.last_exploit},
      {"score", NumberOrNull(s.score)}, {"status", MemberStatusName(StoredMemberStatus(s.status))},
      {"failures", s.failures},         {"test_score", NumberOrNull(s.test_score)}};
  if (s.ahead()) j["ahead"] = {{"of", s.ahead_of}, {"score", NumberOrNull(s.ahead_score)}};
  return j.dump();
}

StatusOr<MemberRecord> DecodeMemberRecord(std::string_view bytes, const std::string& exp,
                                          const std::string& member) {
  MemberRecord s;
  if (bytes.empty() || bytes == "created") return s;
  auto bad = [&](const std::string& what) {
    return Status::Corruption("experiment " + exp + " member " + member + ": state record " + what);
  };
  const json j = json::parse(bytes.begin(), bytes.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("is not JSON");
  if (!j.is_object()) return bad("is not a JSON object");
  int version = 1;
  if (auto it = j.find("v"); it != j.end()) {
    if (!it->is_number_integer()) return bad("field 'v' is not an integer");
    version = it->get<int>();
    if (version < 2 || version > kMemberRecordVersion) {
      return bad("has version " + std::to_string(version) + "; this scheduler reads 1 to " +
                 std::to_string(kMemberRecordVersion));
    }
  }
  auto read_int = [&](const char* key, int lo, int* out) -> Status {
    auto it = j.find(key);
    if (it == j.end()) return Status::OK();
    if (!it->is_number_integer()) return bad(std::string("field '") + key + "' is not an integer");
    const int64_t v = it->get<int64_t>();
    if (v < lo || v > std::numeric_limits<int>::max()) {
      return bad(std::string("field '") + key + "' is out of range: " + std::to_string(v));
    }
    *out = static_cast<int>(v);
    return Status::OK();
  };
  auto read_score = [&](const char* key, double* out) -> Status {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return Status::OK();
    if (!it->is_number()) return bad(std::string("field '") + key + "' is not a number or null");
    *out = it->get<double>();
    // Version 1 wrote "none" as -1.
    if (version == 1 && *out < 0) *out = std::nan("");
    return Status::OK();
  };
  CKPT_RETURN_IF_ERROR(read_int("index", version == 1 ? 0 : -1, &s.index));
  if (version == 1) s.index = -1;
  CKPT_RETURN_IF_ERROR(read_int("interval", 0, &s.interval));
  CKPT_RETURN_IF_ERROR(read_int("last_exploit", 0, &s.last_exploit));
  CKPT_RETURN_IF_ERROR(read_int("failures", 0, &s.failures));
  CKPT_RETURN_IF_ERROR(read_score("score", &s.score));
  // Versions 1 and 2 named the test score for the one metric they knew.
  CKPT_RETURN_IF_ERROR(read_score(version >= 3 ? "test_score" : "test_acc", &s.test_score));
  if (s.last_exploit > s.interval) {
    return bad("has last_exploit " + std::to_string(s.last_exploit) + " after interval " +
               std::to_string(s.interval));
  }
  if (auto it = j.find("ahead"); it != j.end()) {
    auto of = it->is_object() ? it->find("of") : it->end();
    auto score = it->is_object() ? it->find("score") : it->end();
    if (!it->is_object() || of == it->end() || !of->is_number_integer() || score == it->end() ||
        !(score->is_number() || score->is_null())) {
      return bad("field 'ahead' is not {\"of\": integer, \"score\": number or null}");
    }
    const int64_t g = of->get<int64_t>();
    if (g < 0 || g > s.interval || s.interval > g + 1) {
      return bad("is ahead of generation " + std::to_string(g) + " at interval " +
                 std::to_string(s.interval));
    }
    s.ahead_of = static_cast<int>(g);
    if (score->is_number()) s.ahead_score = score->get<double>();
  }
  if (auto it = j.find("status"); it != j.end()) {
    if (!it->is_string()) return bad("field 'status' is not a string");
    const std::string& st = it->get_ref<const std::string&>();
    auto parsed = ParseMemberStatus(st);
    // Stored: "running" (the event loop's idle, queued or running), "done",
    // "stopped", "failed".
    if (!parsed.ok() || StoredMemberStatus(*parsed) != *parsed) {
      return bad("has unknown status '" + st.substr(0, 32) + "'");
    }
    s.status = *parsed == MemberStatus::kRunning ? MemberStatus::kIdle : *parsed;
  }
  return s;
}

}  // namespace ckpt::records
