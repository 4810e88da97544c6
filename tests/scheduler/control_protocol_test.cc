// The control API's request parser (scheduler/src/control_protocol.h), the
// code every request line goes through before the scheduler sees it; its
// limits (docs/LIMITS.md) at their value and one past. The line-length limit
// (max_request_bytes) is the server's, tested in control_test.cc.
#include "control_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "ckpt/records/status.h"
#include "ckpt/scheduler/summary.h"

namespace ckpt::scheduler::protocol {
namespace {

Status Parse(const std::string& line, Request* out = nullptr) {
  Request r;
  return ParseRequest(line, out != nullptr ? out : &r);
}

void ExpectRefused(const std::string& line, const std::string& needle) {
  Status s = Parse(line);
  ASSERT_FALSE(s.ok()) << line;
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos)
      << "'" << s.message() << "' lacks '" << needle << "'";
}

TEST(ControlProtocolTest, AcceptsEachVerbWithItsFields) {
  Request r;
  ASSERT_TRUE(
      Parse(R"({"verb":"restore","experiment":"e","member":"m1","version":3,"id":9})", &r).ok());
  EXPECT_EQ(r.verb, "restore");
  EXPECT_TRUE(r.mutates);
  EXPECT_EQ(r.id, 9);
  EXPECT_EQ(r.body.at("version"), 3);
  ASSERT_TRUE(Parse(R"({"verb":"list"})", &r).ok());
  EXPECT_FALSE(r.mutates);
  EXPECT_TRUE(r.id.is_null());
}

TEST(ControlProtocolTest, RefusalsNameTheProblemAndKeepTheId) {
  ExpectRefused("", "empty request line");
  ExpectRefused(std::string("{\"verb\":\"list\"}\0x", 17), "NUL byte at offset 15");
  ExpectRefused("{\"verb\":", "malformed JSON");
  ExpectRefused("[1]", "a request must be a JSON object, not an array");
  ExpectRefused("{}", "field 'verb' is required");
  ExpectRefused(R"({"verb":"fly"})", "unknown verb 'fly'");
  ExpectRefused(R"({"verb":"pause"})", "verb 'pause': field 'experiment' is required");
  ExpectRefused(R"({"verb":"pause","experiment":""})", "must not be empty");
  ExpectRefused(R"({"verb":"list","x":1})", "verb 'list': unknown field 'x' (it takes none)");
  ExpectRefused(R"({"verb":"list","id":[1]})", "field 'id' must be a string, number");
  Request r;
  EXPECT_FALSE(Parse(R"({"verb":"fly","id":"abc"})", &r).ok());
  EXPECT_EQ(r.id, "abc");
}

TEST(ControlProtocolTest, NestingAtAndPastTheLimit) {
  auto nested = [](int depth) {
    // The request object is level 1, the value of "x" levels 2..depth. An
    // unknown field is refused after parsing, so the message tells which
    // check refused: the depth check names the limit, the field check not.
    std::string v;
    for (int i = 1; i < depth; ++i) v += "[";
    for (int i = 1; i < depth; ++i) v += "]";
    return "{\"verb\":\"list\",\"x\":" + (v.empty() ? std::string("0") : v) + "}";
  };
  ASSERT_EQ(kMaxRequestDepth, 32);
  // 32 levels: parsed, then refused for the unknown field (not for depth).
  ExpectRefused(nested(32), "unknown field 'x'");
  ExpectRefused(nested(33), "JSON nested deeper than 32 levels");
  // Brackets inside strings do not count.
  EXPECT_TRUE(Parse(R"({"verb":"submit","toml":")" + std::string(100, '[') + "\"}").ok());
}

TEST(ControlProtocolTest, VersionAtAndPastItsBounds) {
  const std::string head = R"({"verb":"pin","experiment":"e","member":"m","version":)";
  EXPECT_TRUE(Parse(head + "1}").ok());
  ExpectRefused(head + "0}", "must be at least 1, not 0");
  EXPECT_TRUE(Parse(head + "9223372036854775807}").ok());
  ExpectRefused(head + "9223372036854775808}", "must be a positive integer");
  ExpectRefused(head + "1.5}", "must be a positive integer, not a number with a fraction");
}

// Statuses travel by their records names and come back as the same enums; a
// name the records do not know is refused naming the field (and the member).
TEST(ControlProtocolTest, SummaryStatusesRoundTripAndUnknownNamesAreRefused) {
  ExperimentSummary s;
  s.id = "e";
  s.status = records::ExperimentStatus::kPaused;
  s.population = 2;
  s.intervals = 3;
  MemberSummary a, b;
  a.member = "m000";
  a.status = records::MemberStatus::kStopped;
  b.member = "m001";
  b.status = records::MemberStatus::kRunning;
  s.members = {a, b};
  const nlohmann::json j = SummaryToJson(s, /*with_members=*/true);
  EXPECT_EQ(j["status"], "paused");
  EXPECT_EQ(j["members"][0]["status"], "stopped");
  auto back = SummaryFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->status, records::ExperimentStatus::kPaused);
  ASSERT_EQ(back->members.size(), 2u);
  EXPECT_EQ(back->members[0].status, records::MemberStatus::kStopped);
  EXPECT_EQ(back->members[1].status, records::MemberStatus::kRunning);

  nlohmann::json bad = j;
  bad["status"] = "sleeping";
  auto r = SummaryFromJson(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("field 'status'"), std::string::npos)
      << r.status().ToString();
  EXPECT_NE(r.status().message().find("sleeping"), std::string::npos) << r.status().ToString();
  bad = j;
  bad["members"][1]["status"] = "dancing";
  r = SummaryFromJson(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("member m001: field 'status'"), std::string::npos)
      << r.status().ToString();
}

// A worker's mode: none before its first CONFIGURE (""), else a fusion mode
// by its records name; another name is refused naming the field.
TEST(ControlProtocolTest, WorkerModeRoundTripsAndUnknownModesAreRefused) {
  WorkerStatus w;
  w.device = "cpu";
  nlohmann::json j = WorkerToJson(w);
  EXPECT_EQ(j["mode"], "");
  auto back = WorkerFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_FALSE(back->mode.has_value());
  w.mode = ipc::FusionMode::kFused;
  j = WorkerToJson(w);
  EXPECT_EQ(j["mode"], "fused");
  back = WorkerFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->mode, ipc::FusionMode::kFused);
  j["mode"] = "turbo";
  back = WorkerFromJson(j);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'mode'"), std::string::npos)
      << back.status().ToString();
  EXPECT_NE(back.status().message().find("turbo"), std::string::npos) << back.status().ToString();
}

// Memory and GPU figures: zero and null when absent (a CPU worker, no NVML,
// or a scheduler from before them), round-tripped when present.
TEST(ControlProtocolTest, WorkerMemoryAndGpuFiguresRoundTripAndMayBeAbsent) {
  WorkerStatus w;
  w.device = "cuda:1";
  nlohmann::json j = WorkerToJson(w);
  EXPECT_EQ(j["rss_bytes"], 0);
  EXPECT_TRUE(j["gpu_utilization"].is_null());
  EXPECT_TRUE(j["gpu_memory_total_bytes"].is_null());
  w.rss_bytes = int64_t{3} << 30;
  w.device_memory_bytes = int64_t{5} << 30;
  w.gpu_utilization = 0.875;
  w.gpu_memory_used_bytes = int64_t{20} << 30;
  w.gpu_memory_total_bytes = int64_t{141} << 30;
  auto back = WorkerFromJson(WorkerToJson(w));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rss_bytes, w.rss_bytes);
  EXPECT_EQ(back->device_memory_bytes, w.device_memory_bytes);
  EXPECT_EQ(back->gpu_utilization, 0.875);
  EXPECT_EQ(back->gpu_memory_used_bytes, w.gpu_memory_used_bytes);
  EXPECT_EQ(back->gpu_memory_total_bytes, w.gpu_memory_total_bytes);
  // An older scheduler's reply, without the fields.
  j = WorkerToJson(w);
  for (const char* key : {"rss_bytes", "device_memory_bytes", "gpu_utilization",
                          "gpu_memory_used_bytes", "gpu_memory_total_bytes"}) {
    j.erase(key);
  }
  back = WorkerFromJson(j);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->rss_bytes, 0);
  EXPECT_FALSE(back->gpu_utilization.has_value());
  EXPECT_FALSE(back->gpu_memory_total_bytes.has_value());
  j = WorkerToJson(w);
  j["gpu_memory_used_bytes"] = 1.5;
  back = WorkerFromJson(j);
  ASSERT_FALSE(back.ok());
  EXPECT_NE(back.status().message().find("field 'gpu_memory_used_bytes'"), std::string::npos)
      << back.status().ToString();
}

// corpus/control_request/ubsan_summary_float_to_int64 (UBSan in the fuzzer):
// a reply's integer field holding 7e40 was cast to int64_t (undefined); every
// integer field of a reply must now be a JSON integer that fits.
TEST(ControlProtocolTest, ReplyIntegersMustBeIntegersThatFit) {
  nlohmann::json summary = {
      {"id", "e"},       {"status", "running"}, {"population", 2},       {"intervals", 3},
      {"generation", 1}, {"exploits", 0},       {"member_intervals", 4}, {"train_samples", 100}};
  ASSERT_TRUE(SummaryFromJson(summary).ok());
  for (const auto& [key, bad] :
       std::vector<std::pair<std::string, nlohmann::json>>{{"train_samples", 7e40},
                                                           {"train_samples", 1.5},
                                                           {"population", int64_t{1} << 40},
                                                           {"exploits", UINT64_MAX}}) {
    nlohmann::json j = summary;
    j[key] = bad;
    auto s = SummaryFromJson(j);
    ASSERT_FALSE(s.ok()) << key << " = " << bad.dump();
    EXPECT_TRUE(s.status().IsInvalidArgument()) << s.status().ToString();
    EXPECT_NE(s.status().message().find("field '" + key + "'"), std::string::npos)
        << s.status().ToString();
  }
  nlohmann::json worker = {{"index", 0},        {"device", "cpu"}, {"pid", 1e300},
                           {"ready", true},     {"mode", "plain"}, {"capacity", 2},
                           {"busy", 0},         {"restarts", 0},   {"given_up", false},
                           {"samples_per_s", 1}};
  auto w = WorkerFromJson(worker);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("field 'pid' is not an integer"), std::string::npos)
      << w.status().ToString();
}

}  // namespace
}  // namespace ckpt::scheduler::protocol
