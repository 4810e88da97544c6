// Training on tensor datasets made by examples/make_dataset.py from data on
// this machine (nothing downloaded): Fashion-MNIST's IDX files converted to
// safetensors train bit for bit as the IDX files do; scikit-learn's bundled
// digits (classification, float32 images) and diabetes (regression, [N, F]
// features) learn; the loss and the model's outputs must fit the targets.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "ckpt/format/tensor_dataset.h"
#include "ckpt/model/model_spec.h"
#include "ckpt/model/trainer.h"
#include "model_test_util.h"

namespace ckpt::model {
namespace {

using testing::BaseOptions;
using testing::Decode;
using testing::MakeTrainer;
using testing::Task;

class TensorDataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::filesystem::path(std::filesystem::temp_directory_path() /
                                     ("ckpt_tensor_data_" + std::to_string(::getpid())));
    std::filesystem::create_directories(*dir_);
    const std::string script = std::string(CKPT_MAKE_DATASET) + " ";
    const std::string py = std::string(CKPT_PROJECT_PYTHON) + " ";
    for (const std::string& args : std::vector<std::string>{
             "fashion-mnist " + std::string(testing::kFashionDir) + " " + Path("fm.safetensors"),
             "digits " + Path("digits.npz"), "diabetes " + Path("diabetes.safetensors"),
             "cifar-synthetic --n 700 " + Path("cifar.safetensors")}) {
      const std::string cmd = py + script + args + " > /dev/null";
      ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
    }
  }
  static void TearDownTestSuite() {
    // Not std::filesystem::remove_all: PyPI's libtorch.so (torch 2.x) exports
    // its own copy of it, which the binary binds to and which crashes (a null
    // call inside libtorch.so); the other model tests use rm -rf for the same
    // reason.
    std::system(("rm -rf '" + dir_->string() + "'").c_str());
    delete dir_;
  }
  static std::string Path(const std::string& name) { return (*dir_ / name).string(); }

  static format::TensorDatasetOptions File(const std::string& name) {
    format::TensorDatasetOptions d;
    d.path = Path(name);
    d.format = name.find(".npz") != std::string::npos ? format::DatasetFormat::kNpz
                                                      : format::DatasetFormat::kSafetensors;
    return d;
  }

  static TrainerOptions Options(const std::string& file, const std::string& spec,
                                const std::string& optimizer) {
    TrainerOptions o = BaseOptions(spec, optimizer);
    o.data = nullptr;
    o.tensor_data = File(file);
    o.eval_size = 10000;
    return o;
  }

  static std::filesystem::path* dir_;
};
std::filesystem::path* TensorDataTest::dir_ = nullptr;

TEST_F(TensorDataTest, FashionMnistSafetensorsTrainsAsItsIdxFiles) {
  TrainerOptions idx = BaseOptions(testing::kLenet5Bn, "sgd");
  idx.eval_size = 500;
  TrainerOptions st = idx;
  st.data = nullptr;
  st.tensor_data = File("fm.safetensors");
  auto a = MakeTrainer(idx);
  auto b = MakeTrainer(st);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->dataset().scale, b->dataset().scale);
  EXPECT_EQ(a->dataset().shift, b->dataset().shift);
  const std::map<std::string, double> hp = {{"lr", 0.05}, {"momentum", 0.9}};
  MemberOutcome pa = a->TrainPlain(Task("m", nullptr, 3, 12, hp));
  MemberOutcome pb = b->TrainPlain(Task("m", nullptr, 3, 12, hp));
  ASSERT_TRUE(pa.ok() && pb.ok()) << pa.status.ToString() << pb.status.ToString();
  EXPECT_EQ(pa.EncodeState(), pb.EncodeState());
  EXPECT_EQ(pa.val_score, pb.val_score);
  std::vector<MemberTask> tasks = {Task("f0", nullptr, 4, 6, hp), Task("f1", nullptr, 5, 6, hp)};
  auto fa = a->TrainFused(tasks);
  auto fb = b->TrainFused(tasks);
  for (size_t k = 0; k < tasks.size(); ++k) {
    ASSERT_TRUE(fa[k].ok() && fb[k].ok());
    EXPECT_EQ(fa[k].EncodeState(), fb[k].EncodeState()) << k;
    EXPECT_EQ(fa[k].val_score, fb[k].val_score) << k;
  }
}

TEST_F(TensorDataTest, DigitsLearn) {
  // Float32 [N, 1, 8, 8] images from an .npz; 10 classes, chance is 0.1.
  auto t = MakeTrainer(Options("digits.npz", R"([
    {"type": "conv2d", "out": 16, "kernel": 3, "padding": 1}, {"type": "relu"},
    {"type": "maxpool2d", "kernel": 2}, {"type": "flatten"},
    {"type": "linear", "out": 10}])",
                               "sgd"));
  ASSERT_TRUE(t);
  EXPECT_EQ(t->dataset().x_dtype, format::DType::kF32);
  EXPECT_EQ(t->dataset().num_classes, 10);
  MemberOutcome o = t->TrainPlain(Task("d", nullptr, 1, 300, {{"lr", 0.05}, {"momentum", 0.9}}));
  ASSERT_TRUE(o.ok()) << o.status.ToString();
  EXPECT_GT(o.val_score, 0.85);
}

TEST_F(TensorDataTest, DiabetesRegressionBeatsTheMean) {
  // The MSE of predicting the train split's mean on the validation split.
  auto file = format::TensorDataset::Open(File("diabetes.safetensors"));
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  const auto& d = **file;
  double mean = 0, baseline = 0;
  for (int64_t i = 0; i < d.train().count; ++i) mean += static_cast<const float*>(d.train().y)[i];
  mean /= static_cast<double>(d.train().count);
  for (int64_t i = 0; i < d.validation().count; ++i) {
    const double e = static_cast<const float*>(d.validation().y)[i] - mean;
    baseline += e * e;
  }
  baseline /= static_cast<double>(d.validation().count);

  const std::string spec = R"([{"type": "linear", "out": 16}, {"type": "tanh"},
                               {"type": "linear", "out": 1}])";
  auto t = MakeTrainer(Options("diabetes.safetensors", spec, "adam"));
  ASSERT_TRUE(t);
  const std::map<std::string, double> hp = {{"lr", 0.01}};
  MemberOutcome o = t->TrainPlain(Task("r", nullptr, 1, 300, hp));
  ASSERT_TRUE(o.ok()) << o.status.ToString();
  // val_score holds the metric, neg_mse.
  EXPECT_LT(-o.val_score, 0.8 * baseline) << "mean predictor's MSE " << baseline;

  // r2 on the same training: 1 - MSE / the variance of the validation
  // targets (about their own mean); the metric changes nothing trained.
  TrainerOptions r2_options = Options("diabetes.safetensors", spec, "adam");
  r2_options.metric = format::MetricKind::kR2;
  auto r2_trainer = MakeTrainer(r2_options);
  ASSERT_TRUE(r2_trainer);
  MemberOutcome r2 = r2_trainer->TrainPlain(Task("r", nullptr, 1, 300, hp));
  ASSERT_TRUE(r2.ok()) << r2.status.ToString();
  EXPECT_EQ(r2.EncodeState(), o.EncodeState());
  double val_mean = 0, val_var = 0;
  const auto* vy = static_cast<const float*>(d.validation().y);
  for (int64_t i = 0; i < d.validation().count; ++i) val_mean += vy[i];
  val_mean /= static_cast<double>(d.validation().count);
  for (int64_t i = 0; i < d.validation().count; ++i) {
    val_var += (vy[i] - val_mean) * (vy[i] - val_mean);
  }
  val_var /= static_cast<double>(d.validation().count);
  EXPECT_NEAR(r2.val_score, 1 + o.val_score / val_var, 1e-9);
  EXPECT_GT(r2.val_score, 0) << "r2 at most 0 is no better than the mean";

  // Fused regression on [N, F] features gives the plain parameters.
  std::vector<MemberTask> tasks = {Task("r0", nullptr, 1, 30, hp), Task("r1", nullptr, 2, 30, hp)};
  auto fused = t->TrainFused(tasks);
  for (size_t k = 0; k < tasks.size(); ++k) {
    MemberOutcome plain = t->TrainPlain(tasks[k]);
    ASSERT_TRUE(fused[k].ok() && plain.ok());
    EXPECT_EQ(fused[k].mode, ipc::FusionMode::kFused);
    auto a = Decode(fused[k].EncodeState());
    auto b = Decode(plain.EncodeState());
    for (auto& tensor : a.tensors) {
      if (tensor.dtype != format::DType::kF32) continue;
      EXPECT_LE(testing::RelativeL2(tensor, *b.Find(tensor.name)), 1e-4) << tensor.name;
    }
    EXPECT_NEAR(fused[k].val_score, plain.val_score, 1e-4 * std::fabs(plain.val_score));
  }
}

TEST_F(TensorDataTest, LossMetricAndOutputsMustFitTheTargets) {
  TrainerOptions o = Options(
      "digits.npz", "[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]", "sgd");
  o.loss = format::LossKind::kMse;
  auto t = Trainer::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("loss mse"), std::string::npos) << t.status().ToString();
  o.loss.reset();
  o.metric = format::MetricKind::kNegMse;
  EXPECT_TRUE(Trainer::Create(o).status().IsInvalidArgument());
  o.metric.reset();
  o.model_spec = "[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 7}]";
  t = Trainer::Create(o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("7 outputs"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("10 classes"), std::string::npos) << t.status().ToString();
  // A bad file fails Create naming the file.
  o.tensor_data->path = Path("absent.safetensors");
  EXPECT_TRUE(Trainer::Create(o).status().IsNotFound());
}

TEST_F(TensorDataTest, AugmentedTrainingResumesExactlyAndFusesAsSeparate) {
  const std::string spec =
      R"([{"type": "conv2d", "out": 8, "kernel": 3, "stride": 2, "bias": false},
    {"type": "batchnorm2d"}, {"type": "relu"}, {"type": "globalavgpool"},
    {"type": "linear", "out": 10}])";
  TrainerOptions o = Options("cifar.safetensors", spec, "sgd");
  o.augment.crop_padding = 4;
  o.augment.hflip = true;
  auto t = MakeTrainer(o);
  TrainerOptions plain_options = o;
  plain_options.augment = format::Augmentation();
  auto unaugmented = MakeTrainer(plain_options);
  ASSERT_TRUE(t && unaugmented);
  const std::map<std::string, double> hp = {{"lr", 0.05}, {"momentum", 0.9}};
  MemberOutcome whole = t->TrainPlain(Task("a", nullptr, 2, 6, hp));
  MemberOutcome half = t->TrainPlain(Task("a", nullptr, 2, 3, hp));
  ASSERT_TRUE(whole.ok() && half.ok());
  const std::string state = half.EncodeState();
  MemberOutcome resumed = t->TrainPlain(Task("a", &state, 0, 3, hp));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed.EncodeState(), whole.EncodeState());
  // The crops and flips change what is trained on.
  EXPECT_NE(unaugmented->TrainPlain(Task("a", nullptr, 2, 6, hp)).EncodeState(),
            whole.EncodeState());

  std::vector<MemberTask> tasks = {Task("f0", nullptr, 3, 4, hp), Task("f1", nullptr, 4, 4, hp)};
  auto fused = t->TrainFused(tasks);
  for (size_t k = 0; k < tasks.size(); ++k) {
    MemberOutcome plain = t->TrainPlain(tasks[k]);
    ASSERT_TRUE(fused[k].ok() && plain.ok()) << fused[k].status.ToString();
    auto a = Decode(fused[k].EncodeState());
    auto b = Decode(plain.EncodeState());
    for (auto& tensor : a.tensors) {
      if (tensor.dtype != format::DType::kF32) continue;
      EXPECT_LE(testing::RelativeL2(tensor, *b.Find(tensor.name)), 1e-4) << tensor.name;
    }
  }

  // Features cannot be cropped.
  TrainerOptions features =
      Options("diabetes.safetensors", "[{\"type\": \"linear\", \"out\": 1}]", "sgd");
  features.augment.hflip = true;
  EXPECT_TRUE(Trainer::Create(features).status().IsInvalidArgument());
}

TEST(ResidualSpecTest, Resnet20LayoutAndErrors) {
  auto spec = ModelSpec::Parse("resnet20", {3, 32, 32});
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  int64_t params = 0;
  std::set<std::string> names;
  for (const TensorSpec& t : spec->ModelTensors()) {
    if (t.trainable) params += t.numel();
    names.insert(t.name);
  }
  // He et al. 2016 count 0.27 M; the two conv1x1 shortcuts (with BatchNorm) add ~2.8 k.
  EXPECT_GT(params, 268000);
  EXPECT_LT(params, 276000);
  EXPECT_EQ(spec->num_outputs(), 10);
  EXPECT_EQ(names.count("res1.conv1.weight"), 1u);
  EXPECT_EQ(names.count("res4.shortcut.conv1.weight"), 1u);
  EXPECT_EQ(names.count("res4.shortcut.bn1.running_var"), 1u);
  EXPECT_EQ(names.count("res2.shortcut.conv1.weight"), 0u);  // identity

  auto bad = ModelSpec::Parse(
      R"([{"type": "residual", "layers": [{"type": "conv2d", "out": 4, "kernel": 3}]},
          {"type": "flatten"}, {"type": "linear", "out": 2}])",
      {1, 8, 8});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("identity shortcut"), std::string::npos)
      << bad.status().ToString();
  bad = ModelSpec::Parse(
      R"([{"type": "residual", "shortcut": "conv1x1", "layers": [{"type": "linear", "out": 4}]},
          {"type": "linear", "out": 2}])",
      {6});
  EXPECT_FALSE(bad.ok());
  // A residual over features with an identity shortcut is fine.
  EXPECT_TRUE(ModelSpec::Parse(R"([{"type": "residual", "layers": [{"type": "linear", "out": 6},
                                    {"type": "tanh"}]}, {"type": "linear", "out": 2}])",
                               {6})
                  .ok());
}

TEST_F(TensorDataTest, Resnet20OnCifarShapedDataLearnsFusesAndResumes) {
  TrainerOptions o = Options("cifar.safetensors", "resnet20", "sgd");
  o.batch_size = 16;
  auto t = MakeTrainer(o);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->dataset().sample_shape, (std::vector<int64_t>{3, 32, 32}));
  const std::map<std::string, double> hp = {{"lr", 0.05}, {"momentum", 0.9}};
  // Learns: ten classes, chance 0.1.
  MemberOutcome learned = t->TrainPlain(Task("l", nullptr, 1, 80, hp));
  ASSERT_TRUE(learned.ok()) << learned.status.ToString();
  EXPECT_GT(learned.val_score, 0.3);

  // Resume equals uninterrupted, bit for bit.
  MemberOutcome whole = t->TrainPlain(Task("r", nullptr, 2, 4, hp));
  MemberOutcome half = t->TrainPlain(Task("r", nullptr, 2, 2, hp));
  ASSERT_TRUE(whole.ok() && half.ok());
  const std::string state = half.EncodeState();
  MemberOutcome resumed = t->TrainPlain(Task("r", &state, 0, 2, hp));
  ASSERT_TRUE(resumed.ok());
  EXPECT_EQ(resumed.EncodeState(), whole.EncodeState());

  // Fused equals separate, up to the rounding of grouped kernels: one step
  // (BatchNorm over batches of 16 then amplifies rounding step by step; a
  // wrong layout would differ at once, by the size of the update).
  std::vector<MemberTask> tasks = {Task("f0", nullptr, 3, 1, hp), Task("f1", nullptr, 4, 1, hp)};
  auto fused = t->TrainFused(tasks);
  for (size_t k = 0; k < tasks.size(); ++k) {
    MemberOutcome plain = t->TrainPlain(tasks[k]);
    ASSERT_TRUE(fused[k].ok() && plain.ok()) << fused[k].status.ToString();
    EXPECT_EQ(fused[k].mode, ipc::FusionMode::kFused);
    auto a = Decode(fused[k].EncodeState());
    auto b = Decode(plain.EncodeState());
    for (auto& tensor : a.tensors) {
      if (tensor.dtype != format::DType::kF32 || tensor.name.rfind("optim.", 0) == 0) continue;
      EXPECT_LE(testing::RelativeL2(tensor, *b.Find(tensor.name)), 1e-4) << tensor.name;
    }
  }
}

}  // namespace
}  // namespace ckpt::model
