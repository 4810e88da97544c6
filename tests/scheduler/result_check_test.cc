// CheckResult (scheduler/src/result_check.h): each rule, at its edge and one
// past it, with the refusal naming the member, the worker, the field and both
// values. Pure: blobs built with format::CheckpointWriter, no store or worker.
#include "result_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "worker_handle.h"

namespace ckpt::scheduler {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

struct TensorSpec {
  std::string name;
  format::DType dtype;
  std::vector<int64_t> shape;
};

std::vector<TensorSpec> Lenetish() {
  return {{"fc.weight", format::DType::kF32, {4, 3}},
          {"fc.bias", format::DType::kF32, {4}},
          {"optim.fc.weight.momentum_buffer", format::DType::kF32, {4, 3}},
          {"optim.fc.bias.momentum_buffer", format::DType::kF32, {4}}};
}

// The fixture's data: batches of 32, one data seed.
constexpr int64_t kBatch = 32;
constexpr uint64_t kDataSeed = 77;

// A well-formed checkpoint of `tensors` (zeros) at `step`, with the metadata
// an honest worker writes there (SGD, lr 0.05 with the defaults beside it,
// the data cursor past `step` batches); `tweak` changes it.
std::string Blob(const std::vector<TensorSpec>& tensors, int64_t step,
                 const std::function<void(format::CheckpointMeta*)>& tweak = nullptr) {
  format::CheckpointMeta meta;
  meta.model_spec = "test";
  meta.optimizer = "sgd";
  meta.step = step;
  meta.hparams = {{"lr", 0.05}, {"momentum", 0.0}, {"nesterov", 0.0}, {"weight_decay", 0.0}};
  meta.data_seed = kDataSeed;
  meta.data_cursor = static_cast<uint64_t>(step * kBatch);
  if (tweak) tweak(&meta);
  format::CheckpointWriter writer;
  writer.SetMeta(meta);
  static const std::vector<uint8_t> zeros(1 << 16);
  for (const auto& t : tensors) {
    int64_t n = 1;
    for (int64_t d : t.shape) n *= d;
    const size_t bytes = static_cast<size_t>(n) * format::DTypeSize(t.dtype);
    EXPECT_TRUE(writer.AddTensor(t.name, t.dtype, t.shape, zeros.data(), bytes).ok());
  }
  return writer.Encode();
}

StateLayout LayoutOfBlob(const std::string& blob) {
  auto view = format::ParseCheckpoint(blob.data(), blob.size());
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  return LayoutOf(*view);
}

// A training task of 20 steps of 32 from step 100, and its honest answer.
class ResultCheckTest : public ::testing::Test {
 protected:
  void SetUp() override {
    sent_.experiment = "exp";
    sent_.member = "m3";
    sent_.worker = "worker 2 (r0@10.0.0.7:41234)";
    sent_.rules.metric = format::MetricKind::kAccuracy;
    sent_.rules.validates = true;
    sent_.rules.batch_size = kBatch;
    sent_.steps = 20;
    sent_.start_step = 100;
    sent_.hparams = {{"lr", 0.05}};
    sent_.start_cursor = 100 * kBatch;
    sent_.data_seed = kDataSeed;
    sent_.layout = std::make_shared<const StateLayout>(LayoutOfBlob(Blob(Lenetish(), 100)));
    SetState(Blob(Lenetish(), 120));
    result_.task_id = 7;
    result_.experiment = "exp";
    result_.member = "m3";
    result_.step = 120;
    result_.train_loss = 0.42;
    result_.val_score = 0.87;
    result_.samples = 640;
    result_.compute_s = 1.5;
  }

  void SetState(std::string blob) {
    state_ = std::move(blob);
    result_.state = ipc::ByteSpan{reinterpret_cast<const uint8_t*>(state_.data()), state_.size()};
  }

  // The refusal, checked to name the member and the worker.
  std::string Refusal() {
    Status s = CheckResult(sent_, result_);
    EXPECT_FALSE(s.ok());
    std::string m = s.ToString();
    EXPECT_NE(m.find("member exp/m3"), std::string::npos) << m;
    EXPECT_NE(m.find("worker 2 (r0@10.0.0.7:41234)"), std::string::npos) << m;
    return m;
  }

  SentTask sent_;
  ipc::Result result_;
  std::string state_;
};

#define EXPECT_HAS(text, part) EXPECT_NE((text).find(part), std::string::npos) << (text)

TEST_F(ResultCheckTest, AnHonestResultPassesAndGivesItsLayout) {
  StateLayout got;
  Status s = CheckResult(sent_, result_, &got);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(got, *sent_.layout);
  EXPECT_EQ(got.tensors.size(), 4u);
}

// The parse the check made is handed out for the store's commit: of the
// result's own bytes, every checksum verified.
TEST_F(ResultCheckTest, AnHonestResultGivesTheVerifiedParseOfItsState) {
  std::optional<format::CheckpointView> view;
  Status s = CheckResult(sent_, result_, nullptr, &view);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_TRUE(view.has_value());
  EXPECT_EQ(static_cast<const void*>(view->bytes()), result_.state.data);
  EXPECT_EQ(view->total_bytes(), result_.state.size);
  EXPECT_TRUE(view->fully_verified());
  EXPECT_EQ(view->meta().step, result_.step);
  // An evaluation reads no state and gives none.
  std::optional<format::CheckpointView> none;
  sent_.eval_only = true;
  sent_.steps = 0;
  result_.samples = 0;
  result_.step = sent_.start_step;
  s = CheckResult(sent_, result_, nullptr, &none);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(none.has_value());
}

TEST_F(ResultCheckTest, AccuracyMustLieInZeroToOne) {
  // NaN: not evaluated (null on the wire), allowed; it ranks last.
  for (double ok : {0.0, 1.0, 0.5, kNaN}) {
    result_.val_score = ok;
    EXPECT_TRUE(CheckResult(sent_, result_).ok()) << ok;
  }
  result_.val_score = 1e308;
  std::string m = Refusal();
  EXPECT_HAS(m, "val_accuracy 1e+308 outside [0, 1]");
  EXPECT_EQ(CheckResult(sent_, result_).code(), StatusCode::kInvalidArgument);
  // -1 was once the "not evaluated" marker; it is no accuracy.
  for (double bad : {std::nextafter(1.0, 2.0), -1e-9, -0.5, -1.0, kInf, -kInf}) {
    result_.val_score = bad;
    EXPECT_FALSE(CheckResult(sent_, result_).ok()) << bad;
  }
  result_.val_score = -1;
  EXPECT_HAS(Refusal(), "val_accuracy -1 outside [0, 1]");
}

TEST_F(ResultCheckTest, NegMseMustBeFiniteAndAtMostZero) {
  sent_.rules.metric = format::MetricKind::kNegMse;
  for (double ok : {0.0, -1.0, -0.25, -1e6, kNaN}) {
    result_.val_score = ok;
    EXPECT_TRUE(CheckResult(sent_, result_).ok()) << ok;
  }
  result_.val_score = 0.5;
  EXPECT_HAS(Refusal(), "val_neg_mse 0.5 outside (-inf, 0] and finite");
  for (double bad : {1e-300, -kInf, kInf}) {
    result_.val_score = bad;
    EXPECT_FALSE(CheckResult(sent_, result_).ok()) << bad;
  }
}

TEST_F(ResultCheckTest, R2MustBeFiniteAndAtMostOne) {
  sent_.rules.metric = format::MetricKind::kR2;
  for (double ok : {1.0, 0.0, 0.93, -3.5, -1.0, kNaN}) {
    result_.val_score = ok;
    EXPECT_TRUE(CheckResult(sent_, result_).ok()) << ok;
  }
  result_.val_score = 1.5;
  EXPECT_HAS(Refusal(), "val_r2 1.5 outside (-inf, 1] and finite");
  for (double bad : {std::nextafter(1.0, 2.0), -kInf, kInf}) {
    result_.val_score = bad;
    EXPECT_FALSE(CheckResult(sent_, result_).ok()) << bad;
  }
}

TEST_F(ResultCheckTest, WithoutValidationTheScoreMustBeTheWorkersNotEvaluated) {
  sent_.rules.validates = false;
  result_.val_score = kNaN;
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
  result_.val_score = 1.0;
  EXPECT_HAS(Refusal(), "val_accuracy 1, expected none (the experiment does not validate");
  result_.val_score = -1;  // the old marker is a score like any other
  EXPECT_HAS(Refusal(), "val_accuracy -1, expected none");
}

TEST_F(ResultCheckTest, StepMustBeTheSentStatesPlusTheSteps) {
  result_.step = 121;
  std::string m = Refusal();
  EXPECT_HAS(m, "step 121, expected 120 (step 100 + 20 steps)");
  result_.step = std::numeric_limits<int64_t>::max();
  EXPECT_FALSE(CheckResult(sent_, result_).ok());
  // An initialised member starts at 0 (its data cursor too).
  sent_.start_step = 0;
  sent_.start_cursor = 0;
  result_.step = 20;
  SetState(Blob(Lenetish(), 20));
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
  // A start step that no step count can follow is refused, not overflowed.
  sent_.start_step = std::numeric_limits<int64_t>::max() - 5;
  EXPECT_HAS(Refusal(), "cannot answer 20 steps");
}

TEST_F(ResultCheckTest, SamplesMustBeStepsTimesBatchSize) {
  result_.samples = std::numeric_limits<int64_t>::max();
  EXPECT_HAS(Refusal(), "samples 9223372036854775807, expected 640 (20 steps x batch size 32)");
  result_.samples = -640;
  EXPECT_HAS(Refusal(), "samples -640, expected 640");
  result_.samples = 639;
  EXPECT_FALSE(CheckResult(sent_, result_).ok());
  // A product past int64 is refused, not wrapped.
  sent_.rules.batch_size = std::numeric_limits<int64_t>::max() / 2;
  result_.samples = 0;
  EXPECT_HAS(Refusal(), "samples 0 cannot answer 20 steps");
}

TEST_F(ResultCheckTest, TrainLossMustBeFiniteAndNonNegative) {
  result_.train_loss = 0;
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
  result_.train_loss = kNaN;
  EXPECT_HAS(Refusal(), "train_loss nan, expected a finite value >= 0");
  result_.train_loss = kInf;
  EXPECT_HAS(Refusal(), "train_loss inf");
  result_.train_loss = -0.1;
  EXPECT_HAS(Refusal(), "train_loss -0.1");
}

TEST_F(ResultCheckTest, ComputeSecondsMustBeFiniteAndNonNegative) {
  result_.compute_s = -1;
  EXPECT_HAS(Refusal(), "compute_s -1, expected a finite value >= 0");
  result_.compute_s = kInf;
  EXPECT_FALSE(CheckResult(sent_, result_).ok());
}

TEST_F(ResultCheckTest, MemberMustBeTheOneSent) {
  result_.member = "m4";
  EXPECT_HAS(Refusal(), "member \"exp/m4\", expected \"exp/m3\"");
  result_.member = "m3";
  result_.experiment = "other";
  EXPECT_HAS(Refusal(), "member \"other/m3\", expected \"exp/m3\"");
}

TEST_F(ResultCheckTest, StateMustBeACheckpoint) {
  SetState("");
  EXPECT_HAS(Refusal(), "state of 0 bytes, expected a checkpoint");
  std::string blob = Blob(Lenetish(), 120);
  blob[blob.size() - 1] ^= 1;  // a tensor byte: its checksum no longer matches
  SetState(blob);
  EXPECT_EQ(CheckResult(sent_, result_).code(), StatusCode::kCorruption);
  EXPECT_HAS(Refusal(), "state: ");
  SetState("not a checkpoint at all");
  EXPECT_EQ(CheckResult(sent_, result_).code(), StatusCode::kCorruption);
}

TEST_F(ResultCheckTest, StateStepMustBeTheResultsStep) {
  SetState(Blob(Lenetish(), 119));
  EXPECT_HAS(Refusal(), "state ckpt.step 119, expected 120 (the result's step)");
}

// The metadata the next worker resumes from must be what the task implies.
TEST_F(ResultCheckTest, StateMetadataMustBeWhatTheTaskImplies) {
  SetState(Blob(Lenetish(), 120, [](format::CheckpointMeta* m) { m->hparams["lr"] = 0.5; }));
  EXPECT_HAS(Refusal(), "state ckpt.hparams lr 0.5, expected 0.05 (the TRAIN's)");
  SetState(Blob(Lenetish(), 120, [](format::CheckpointMeta* m) { m->hparams.erase("lr"); }));
  EXPECT_HAS(Refusal(), "state ckpt.hparams has no lr, expected 0.05");
  SetState(Blob(Lenetish(), 120, [](format::CheckpointMeta* m) { m->data_cursor = 0; }));
  EXPECT_HAS(Refusal(), "state ckpt.data_cursor 0, expected 3840 (the sent state's 3200 + 640");
  SetState(Blob(Lenetish(), 120, [](format::CheckpointMeta* m) { m->data_seed = 78; }));
  EXPECT_HAS(Refusal(), "state ckpt.data_seed 78, expected 77 (the sent state's)");
  SetState(Blob(Lenetish(), 120, [](format::CheckpointMeta* m) { m->optimizer = "adam"; }));
  EXPECT_HAS(Refusal(), "state ckpt.optimizer \"adam\", expected \"sgd\"");
  // An initialised member: its seed is the worker's to draw; its cursor
  // starts at 0.
  sent_.data_seed.reset();
  sent_.start_cursor = 0;
  sent_.start_step = 0;
  result_.step = 20;
  SetState(Blob(Lenetish(), 20, [](format::CheckpointMeta* m) { m->data_seed = 12345; }));
  Status s = CheckResult(sent_, result_);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

TEST_F(ResultCheckTest, StateLayoutMustBeTheSentStates) {
  auto tensors = Lenetish();
  tensors[0].shape = {4, 4};
  SetState(Blob(tensors, 120));
  EXPECT_HAS(Refusal(), "state tensor fc.weight shape [4, 4], expected [4, 3]");

  tensors = Lenetish();
  tensors[1].dtype = format::DType::kF64;
  SetState(Blob(tensors, 120));
  EXPECT_HAS(Refusal(), "state tensor fc.bias dtype F64, expected F32");

  tensors = Lenetish();
  tensors.pop_back();
  SetState(Blob(tensors, 120));
  EXPECT_HAS(Refusal(), "state tensor optim.fc.bias.momentum_buffer missing, expected F32 [4]");

  tensors = Lenetish();
  tensors.push_back({"extra", format::DType::kU8, {8}});
  SetState(Blob(tensors, 120));
  EXPECT_HAS(Refusal(), "state tensor extra (U8 [8]) unexpected");

  // Order aside: the same tensors written in another order pass.
  tensors = Lenetish();
  std::swap(tensors[0], tensors[3]);
  SetState(Blob(tensors, 120));
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
}

TEST_F(ResultCheckTest, WithoutAKnownLayoutAnyWellFormedStatePassesAndIsReturned) {
  sent_.layout = nullptr;
  auto tensors = Lenetish();
  tensors[0].shape = {9, 9};
  SetState(Blob(tensors, 120));
  StateLayout got;
  EXPECT_TRUE(CheckResult(sent_, result_, &got).ok());
  EXPECT_EQ(got.tensors.at("fc.weight").shape, (std::vector<int64_t>{9, 9}));
  // ... and the comparison a caller then makes with a reference names both.
  Status s = CompareLayouts("member exp/m3, worker 2", LayoutOfBlob(Blob(Lenetish(), 0)), got);
  EXPECT_HAS(s.ToString(), "state tensor fc.weight shape [9, 9], expected [4, 3]");
}

TEST_F(ResultCheckTest, AnEvaluationTrainsNothingAndItsStateIsNotRead) {
  sent_.eval_only = true;
  sent_.steps = 0;
  result_.step = 100;
  result_.samples = 0;
  result_.train_loss = 0;
  result_.test_score = 0.9;
  SetState("");
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
  result_.test_score = kNaN;  // no test split
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
  result_.test_score = 2;
  EXPECT_HAS(Refusal(), "test_accuracy 2 outside [0, 1]");
  result_.test_score = 0.9;
  result_.step = 120;
  EXPECT_HAS(Refusal(), "step 120, expected 100 (step 100 + 0 steps)");
  result_.step = 100;
  result_.samples = 640;
  EXPECT_HAS(Refusal(), "samples 640, expected 0");
  // Its steps are 0 whatever the task says.
  result_.samples = 0;
  sent_.steps = 20;
  EXPECT_TRUE(CheckResult(sent_, result_).ok());
}

TEST(StateLayoutsTest, TheFirstLayoutSeenStaysTheExperiments) {
  StateLayouts layouts;
  EXPECT_EQ(layouts.Find("e"), nullptr);
  const StateLayout first = LayoutOfBlob(Blob(Lenetish(), 0));
  auto tensors = Lenetish();
  tensors.pop_back();
  const StateLayout other = LayoutOfBlob(Blob(tensors, 0));
  EXPECT_EQ(*layouts.Establish("e", first), first);
  EXPECT_EQ(*layouts.Establish("e", other), first);
  EXPECT_EQ(*layouts.Find("e"), first);
  EXPECT_EQ(*layouts.Establish("f", other), other);
  EXPECT_EQ(layouts.Find("g"), nullptr);
}

// What a member's last commit said of its state, recalled when that very
// blob is sent on (so its header is not parsed again), and only then.
TEST(StateLayoutsTest, ACommittedHeaderIsRecalledForItsOwnBlobOnly) {
  StateLayouts layouts;
  const std::string a = Blob(Lenetish(), 20), b = Blob(Lenetish(), 40);
  const BlobId id_a = BlobId::Of(a.data(), a.size()), id_b = BlobId::Of(b.data(), b.size());
  auto layout = std::make_shared<const StateLayout>(LayoutOfBlob(a));
  EXPECT_FALSE(layouts.Committed("e", "m1", id_a).has_value());
  layouts.RememberCommitted("e", "m1", {id_a, 20, layout});
  auto got = layouts.Committed("e", "m1", id_a);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->blob, id_a);
  EXPECT_EQ(got->step, 20);
  EXPECT_EQ(got->layout, layout);
  // Another blob as the head (an exploit's donor state, an import), another
  // member, another experiment: not known.
  EXPECT_FALSE(layouts.Committed("e", "m1", id_b).has_value());
  EXPECT_FALSE(layouts.Committed("e", "m2", id_a).has_value());
  EXPECT_FALSE(layouts.Committed("f", "m1", id_a).has_value());
  // The member's next commit replaces it.
  layouts.RememberCommitted("e", "m1", {id_b, 40, layout});
  EXPECT_FALSE(layouts.Committed("e", "m1", id_a).has_value());
  ASSERT_TRUE(layouts.Committed("e", "m1", id_b).has_value());
  EXPECT_EQ(layouts.Committed("e", "m1", id_b)->step, 40);
}

TEST(ResultRulesTest, FromTheConfiguration) {
  records::ExperimentConfig c;
  c.batch_size = 128;
  c.eval_size = 0;
  c.target = format::TargetKind::kValues;
  ResultRules r = ResultRulesFor(c);
  EXPECT_EQ(r.metric, format::MetricKind::kNegMse);  // the data's default
  EXPECT_FALSE(r.validates);
  EXPECT_EQ(r.batch_size, 128);
  c.metric = format::MetricKind::kAccuracy;
  c.eval_size = 2000;
  r = ResultRulesFor(c);
  EXPECT_EQ(r.metric, format::MetricKind::kAccuracy);
  EXPECT_TRUE(r.validates);
}

}  // namespace
}  // namespace ckpt::scheduler
