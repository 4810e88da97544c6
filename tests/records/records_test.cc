#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/ipc/failure_code.h"
#include "ckpt/records/config.h"
#include "ckpt/records/events.h"
#include "ckpt/records/member_record.h"
#include "ckpt/records/status.h"

namespace ckpt::records {
namespace {

using json = nlohmann::json;

// One value of every event type, each field set to something other than its
// default so that a field the codec drops shows up.
std::vector<Event> OneOfEach() {
  FinalEvalEvent final_eval;
  final_eval.results = {{"m1", 0.81, 0.8, 7}, {"m0", -1.0, 0.49, 3}};
  final_eval.metric = format::MetricKind::kR2;
  return {
      TrainedEvent{3, -0.75, 1, "", 0, format::MetricKind::kNegMse, {{"lr", 0.01}}},
      ExploitEvent{"m2", "m0", 4, "bottom 20%", {{"lr", 0.02}, {"momentum", 0.9}}, 0},
      RestoreEvent{"m1", 5, 9, "ckpt-tool"},
      FailedEvent{"m3", ipc::FailureCode::kOutOfMemory, "CUDA out of memory", 2},
      MemberStoppedEvent{"m4", "failed 3 times; last: nan", 12},
      MemberStoppedEvent{"m5", "rung 2", std::nullopt},
      CorruptStateEvent{"m6", 8, 6, 9, 3, "tensor fc3.weight: checksum mismatch"},
      TargetReachedEvent{"m7", 0.93, 0.92},
      WallTimeReachedEvent{3600},
      ConfigureRefusedEvent{"unknown layer 'conv3d'"},
      PausedEvent{},
      ResumedEvent{},
      StoppedEvent{},
      final_eval,
      StoreErrorEvent{"background error: IO error: No space left on device"},
      WorkerLostEvent{true, 2, "cuda:1", "exit code 9", 3},
      ResumeFailedEvent{"InvalidArgument: population.size (e line 7): must be at least 1"},
  };
}

TEST(EventCodecTest, EveryEventTypeRoundTrips) {
  const std::vector<Event> all = OneOfEach();
  std::set<std::string> types;
  for (const Event& e : all) {
    const std::string text = EncodeEvent(e);
    types.insert(EventTypeName(e));
    EXPECT_EQ(json::parse(text)["type"], EventTypeName(e)) << text;
    auto back = DecodeEvent(text, "event");
    ASSERT_TRUE(back.ok()) << text << ": " << back.status().ToString();
    EXPECT_EQ(back->index(), e.index()) << text;
    // Encoding what was decoded gives the same bytes: no field was lost.
    EXPECT_EQ(EncodeEvent(*back), text);
  }
  // Every alternative of Event was covered.
  EXPECT_EQ(types.size(), std::variant_size_v<Event>);
}

TEST(EventCodecTest, FieldsReadBackAsWritten) {
  auto failed =
      DecodeEvent(EncodeEvent(FailedEvent{"m3", ipc::FailureCode::kNonFinite, "nan", 2}), "e");
  ASSERT_TRUE(failed.ok());
  const auto& f = std::get<FailedEvent>(*failed);
  EXPECT_EQ(f.member, "m3");
  EXPECT_EQ(f.code, ipc::FailureCode::kNonFinite);
  EXPECT_EQ(f.reason, "nan");
  EXPECT_EQ(f.failures, 2);

  auto exploit =
      DecodeEvent(EncodeEvent(ExploitEvent{"m2", "m0", 4, "why", {{"lr", 0.5}}, 0}), "e");
  ASSERT_TRUE(exploit.ok());
  EXPECT_EQ(std::get<ExploitEvent>(*exploit).hparams.at("lr"), 0.5);
  EXPECT_EQ(std::get<ExploitEvent>(*exploit).donor, "m0");
}

// Events as earlier schedulers and the store wrote them, byte for byte.
TEST(EventCodecTest, OldStoresStillDecode) {
  // The store adds exp, unix_ms, member, reason, blob, version and step.
  auto trained = DecodeEvent(
      R"({"type":"trained","interval":2,"val_score":0.5,"worker":0,"exp":"e","unix_ms":1,)"
      R"("member":"m1","reason":"trained","blob":"ab","version":3,"step":40})",
      "e");
  ASSERT_TRUE(trained.ok()) << trained.status().ToString();
  EXPECT_EQ(std::get<TrainedEvent>(*trained).member, "m1");
  EXPECT_EQ(std::get<TrainedEvent>(*trained).version, 3);
  EXPECT_EQ(std::get<TrainedEvent>(*trained).interval, 2);

  // Hyphenated worker codes, and a refused commit's Status code name.
  for (const auto& [code, want] : std::vector<std::pair<std::string, ipc::FailureCode>>{
           {"non-finite", ipc::FailureCode::kNonFinite},
           {"out-of-memory", ipc::FailureCode::kOutOfMemory},
           {"bad-state", ipc::FailureCode::kBadState},
           {"bad-request", ipc::FailureCode::kBadRequest},
           {"internal", ipc::FailureCode::kInternal},
           {"Aborted", ipc::FailureCode::kCommitError},
           {"IOError", ipc::FailureCode::kCommitError}}) {
    auto e = DecodeEvent(
        R"({"type":"failed","member":"m0","code":")" + code + R"(","reason":"r","failures":1})",
        "e");
    ASSERT_TRUE(e.ok()) << code << ": " << e.status().ToString();
    EXPECT_EQ(std::get<FailedEvent>(*e).code, want) << code;
  }

  // The store's own restore event (restored_version), and ckpt-tool's.
  auto store_restore =
      DecodeEvent(R"({"type":"restore","member":"m1","reason":"restore","blob":"ab","version":9,)"
                  R"("restored_version":5,"exp":"e","unix_ms":1})",
                  "e");
  ASSERT_TRUE(store_restore.ok());
  EXPECT_EQ(std::get<RestoreEvent>(*store_restore).from_version, 5);
  EXPECT_EQ(std::get<RestoreEvent>(*store_restore).version, 9);
  auto tool_restore = DecodeEvent(
      R"({"type":"restore","member":"m1","restored_version":5,"version":9,"by":"ckpt-tool"})", "e");
  ASSERT_TRUE(tool_restore.ok());
  EXPECT_EQ(std::get<RestoreEvent>(*tool_restore).by, "ckpt-tool");
  EXPECT_EQ(std::get<RestoreEvent>(*tool_restore).from_version, 5);
  // ckpt-tool's, before the store's restore took its event: "from_version".
  auto old_tool_restore = DecodeEvent(
      R"({"type":"restore","member":"m1","from_version":5,"version":9,"by":"ckpt-tool"})", "e");
  ASSERT_TRUE(old_tool_restore.ok());
  EXPECT_EQ(std::get<RestoreEvent>(*old_tool_restore).from_version, 5);

  // A fall-back from a damaged head, as the store's restore logs it (its
  // "reason" is the store's), and as events before that named the damage.
  auto corrupt = DecodeEvent(
      R"({"type":"corrupt_state","member":"m6","bad_version":8,"interval":3,)"
      R"("damage":"tensor fc3.weight: checksum mismatch","reason":"restore","blob":"ab",)"
      R"("version":9,"restored_version":6,"exp":"e","unix_ms":1})",
      "e");
  ASSERT_TRUE(corrupt.ok()) << corrupt.status().ToString();
  EXPECT_EQ(std::get<CorruptStateEvent>(*corrupt).restored_from, 6);
  EXPECT_EQ(std::get<CorruptStateEvent>(*corrupt).reason, "tensor fc3.weight: checksum mismatch");
  EXPECT_EQ(std::get<CorruptStateEvent>(*corrupt).version, 9);
  auto old_corrupt = DecodeEvent(
      R"({"type":"corrupt_state","member":"m6","bad_version":8,"restored_from":6,"version":9,)"
      R"("interval":3,"reason":"tensor fc3.weight: checksum mismatch"})",
      "e");
  ASSERT_TRUE(old_corrupt.ok()) << old_corrupt.status().ToString();
  EXPECT_EQ(std::get<CorruptStateEvent>(*old_corrupt).reason,
            "tensor fc3.weight: checksum mismatch");
  EXPECT_EQ(std::get<CorruptStateEvent>(*old_corrupt).restored_from, 6);

  // A member stopped by the policy has no kept_version; null scores read as NaN.
  auto stopped = DecodeEvent(R"({"type":"member_stopped","member":"m2","why":"rung 1"})", "e");
  ASSERT_TRUE(stopped.ok());
  EXPECT_FALSE(std::get<MemberStoppedEvent>(*stopped).kept_version.has_value());
  auto final_eval = DecodeEvent(
      R"({"type":"final_eval","results":[{"member":"m0","val_r2":null,"test_r2":0.5,"version":2}]})",
      "e");
  ASSERT_TRUE(final_eval.ok());
  ASSERT_EQ(std::get<FinalEvalEvent>(*final_eval).results.size(), 1u);
  EXPECT_TRUE(std::isnan(std::get<FinalEvalEvent>(*final_eval).results[0].val_score));
  EXPECT_EQ(std::get<FinalEvalEvent>(*final_eval).results[0].test_score, 0.5);
  EXPECT_EQ(std::get<FinalEvalEvent>(*final_eval).metric, format::MetricKind::kR2);
}

// A score is written under its metric's name; stores written before that
// hold "val_acc" / "test_acc", which read as accuracy.
TEST(EventCodecTest, ScoresCarryTheirMetricsNameAndOldEventsStillRead) {
  const std::string trained =
      EncodeEvent(TrainedEvent{2, -0.25, 0, "", 0, format::MetricKind::kNegMse});
  EXPECT_NE(trained.find(R"("val_neg_mse":-0.25)"), std::string::npos) << trained;
  EXPECT_EQ(trained.find("val_acc"), std::string::npos) << trained;

  auto old = DecodeEvent(R"({"type":"trained","interval":4,"val_acc":0.91,"worker":2})", "e");
  ASSERT_TRUE(old.ok()) << old.status().ToString();
  EXPECT_EQ(std::get<TrainedEvent>(*old).val_score, 0.91);
  EXPECT_EQ(std::get<TrainedEvent>(*old).metric, format::MetricKind::kAccuracy);
  auto old_final = DecodeEvent(
      R"({"type":"final_eval","results":[{"member":"m0","val_acc":0.9,"test_acc":0.88,"version":2}]})",
      "e");
  ASSERT_TRUE(old_final.ok());
  EXPECT_EQ(std::get<FinalEvalEvent>(*old_final).results.at(0).test_score, 0.88);
  EXPECT_EQ(std::get<FinalEvalEvent>(*old_final).metric, format::MetricKind::kAccuracy);

  auto wrong_type = DecodeEvent(R"({"type":"trained","interval":4,"val_r2":"high"})", "e 9");
  EXPECT_TRUE(wrong_type.status().IsCorruption());
  EXPECT_NE(wrong_type.status().message().find("val_r2"), std::string::npos);
}

TEST(EventCodecTest, BadEventsAreErrorsNamingTheEvent) {
  auto not_json = DecodeEvent("{", "experiment e event 4");
  EXPECT_TRUE(not_json.status().IsCorruption());
  EXPECT_NE(not_json.status().message().find("experiment e event 4"), std::string::npos);

  auto wrong_type = DecodeEvent(R"({"type":"failed","member":7})", "event 5");
  EXPECT_TRUE(wrong_type.status().IsCorruption());
  EXPECT_NE(wrong_type.status().message().find("'member'"), std::string::npos)
      << wrong_type.status().ToString();

  auto bad_code = DecodeEvent(R"({"type":"failed","member":"m","code":"tired"})", "event 6");
  EXPECT_TRUE(bad_code.status().IsCorruption());
  EXPECT_NE(bad_code.status().message().find("tired"), std::string::npos);

  // The store's own events (an import, a note) are not the scheduler's.
  auto note = DecodeEvent(R"({"type":"note","text":"hi"})", "event 7");
  EXPECT_TRUE(note.status().IsNotFound()) << note.status().ToString();
  EXPECT_TRUE(DecodeEvent(R"({"member":"m"})", "event 8").status().IsCorruption());
}

TEST(FailureCodeTest, EveryCodeRoundTripsThroughItsName) {
  std::set<std::string> names;
  for (int i = 0; i < ipc::kFailureCodeCount; ++i) {
    const auto code = static_cast<ipc::FailureCode>(i);
    const std::string name = ipc::FailureCodeName(code);
    names.insert(name);
    EXPECT_EQ(ipc::ParseFailureCode(name), code) << name;
    EXPECT_EQ(ipc::FailureCodeFromWorker(name), code) << name;
    // One spelling: snake_case, never a hyphen.
    EXPECT_EQ(name.find('-'), std::string::npos) << name;
  }
  EXPECT_EQ(names.size(), static_cast<size_t>(ipc::kFailureCodeCount));
  EXPECT_EQ(ipc::ParseFailureCode("tired"), std::nullopt);
  // A newer worker's code this version does not know counts as internal.
  EXPECT_EQ(ipc::FailureCodeFromWorker("gpu-on-fire"), ipc::FailureCode::kInternal);
}

TEST(StatusTest, EveryStatusRoundTripsThroughItsName) {
  for (int i = 0; i < kMemberStatusCount; ++i) {
    const auto s = static_cast<MemberStatus>(i);
    auto back = ParseMemberStatus(MemberStatusName(s));
    ASSERT_TRUE(back.ok()) << MemberStatusName(s);
    EXPECT_EQ(*back, s);
  }
  for (ExperimentStatus s :
       {ExperimentStatus::kRunning, ExperimentStatus::kPaused, ExperimentStatus::kDone,
        ExperimentStatus::kStopped, ExperimentStatus::kFailed}) {
    auto back = ParseExperimentStatus(ExperimentStatusName(s));
    ASSERT_TRUE(back.ok()) << ExperimentStatusName(s);
    EXPECT_EQ(*back, s);
  }
  EXPECT_EQ(*ParseExperimentStatus("created"), ExperimentStatus::kRunning);
  EXPECT_TRUE(ParseExperimentStatus("resting").status().IsInvalidArgument());
  EXPECT_TRUE(ParseMemberStatus("resting").status().IsInvalidArgument());
  EXPECT_EQ(StoredMemberStatus(MemberStatus::kQueued), MemberStatus::kRunning);
  EXPECT_EQ(StoredMemberStatus(MemberStatus::kStopped), MemberStatus::kStopped);
}

TEST(MemberRecordTest, RoundTripsAndKeepsTheStoredStatus) {
  MemberRecord r;
  r.index = 4;
  r.interval = 3;
  r.last_exploit = 2;
  r.score = -0.25;
  r.status = MemberStatus::kStopped;
  r.failures = 1;
  auto back = DecodeMemberRecord(EncodeMemberRecord(r), "e", "m4");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, r);
  // Idle, queued and running are one stored value, read back as idle.
  r.status = MemberStatus::kQueued;
  EXPECT_EQ(json::parse(EncodeMemberRecord(r))["status"], "running");
  EXPECT_EQ(DecodeMemberRecord(EncodeMemberRecord(r), "e", "m4")->status, MemberStatus::kIdle);
}

TEST(ConfigErrorTest, ErrorsNameTheKeyAndItsLine) {
  const std::string base =
      "name = \"e\"\n"            // line 1
      "[population]\n"            // line 2
      "size = 4\n"                // line 3
      "[search_space.lr]\n"       // line 4
      "type = \"log_uniform\"\n"  // line 5
      "min = 0.001\n"             // line 6
      "max = 0.1\n";              // line 7
  struct Case {
    std::string extra;
    std::string key;
    std::string line;
  };
  for (const Case& c :
       std::vector<Case>{{"[policy]\nquantile = 0.9\n", "policy.quantile", "line 9"},
                         {"[policy]\nkind = \"grid\"\n", "policy.kind", "line 9"},
                         {"[[devices]]\nslots = 0\n", "devices[0].slots", "line 9"},
                         {"[supervision]\ngrace = 3\n", "supervision.grace", "line 9"},
                         {"[model]\noptimizer = 3\n", "model.optimizer", "line 9"}}) {
    auto parsed = ParseExperimentConfig(base + c.extra, "exp.toml");
    ASSERT_FALSE(parsed.ok()) << c.extra;
    EXPECT_TRUE(parsed.status().IsInvalidArgument());
    const std::string& m = parsed.status().message();
    EXPECT_NE(m.find(c.key), std::string::npos) << m;
    EXPECT_NE(m.find("exp.toml " + c.line), std::string::npos) << m;
  }
  // A syntax error names the file and line too.
  auto syntax = ParseExperimentConfig(base + "[policy\n", "exp.toml");
  ASSERT_FALSE(syntax.ok());
  EXPECT_NE(syntax.status().message().find("exp.toml line 8"), std::string::npos)
      << syntax.status().message();
}

}  // namespace
}  // namespace ckpt::records
