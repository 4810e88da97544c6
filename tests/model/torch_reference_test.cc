// Cross-checks against Python PyTorch (/usr/bin/python3 with torch 1.13): the
// same state trained the same steps by torch.optim gives the same tensors, and
// a TorchScript LeNet-5 saved from Python trains like the built-in spec.
// Skipped where that interpreter has no torch.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/model/trainer.h"
#include "model_test_util.h"

namespace ckpt::model {
namespace {

using testing::BaseOptions;
using testing::Decode;
using testing::MakeTrainer;
using testing::OwnedBlob;
using testing::RelativeDiff;
using testing::Task;

// The Python whose torch has this build's LibTorch kernels: Debian's
// python3-torch for Debian's LibTorch, the venv's torch for -DCKPT_TORCH=pip
// (1.13 and 2.11 kernels differ by ~1e-6, more than these tests allow).
#ifndef CKPT_MODEL_TORCH_PYTHON
#define CKPT_MODEL_TORCH_PYTHON "/usr/bin/python3"
#endif
constexpr const char* kPython = CKPT_MODEL_TORCH_PYTHON;

bool PythonHasTorch() {
  static const bool has =
      access(kPython, X_OK) == 0 &&
      std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return has;
}

std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

// How much farther from PyTorch ckpt's one-channel convolution may train
// than PyTorch's own two kernels are from each other.
constexpr double kSpreadFactor = 10;

class TorchReferenceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!PythonHasTorch()) GTEST_SKIP() << kPython << " has no torch";
    char tmpl[] = "/tmp/ckpt_torchref_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // ckpt's trainings here run their convolutions through LibTorch, the
    // kernels the Python side runs, so that they stay bit-close; ckpt's own
    // kernels (conv1's one-channel and conv2's batch-lane ones) are held to
    // PyTorch by the *WithinTorchsOwnSpread tests.
    setenv("CKPT_CONV_KERNELS", "off", 1);
  }
  void TearDown() override {
    unsetenv("CKPT_CONV_KERNELS");
    if (!dir_.empty()) std::system(("rm -rf " + dir_).c_str());
  }

  std::string Write(const std::string& name, const std::string& bytes) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << bytes;
    return path;
  }

  // Trains `steps` from a fresh member here and in Python; expects agreement.
  // With spread_factor > 0, the convolutions run through ckpt's own kernels
  // (conv1's and, where it applies, conv2's: sums in other orders) and every
  // tensor must be within 1e-6, or spread_factor times the distance between
  // the results of PyTorch's own two convolution kernels (oneDNN's and
  // im2col's, for every convolution) where that is larger.
  void CrossCheck(const std::string& spec, const std::string& optimizer,
                  const std::map<std::string, double>& hp, int64_t warmup, int64_t steps,
                  double spread_factor = 0) {
    if (spread_factor > 0) unsetenv("CKPT_CONV_KERNELS");
    auto trainer = MakeTrainer(BaseOptions(spec, optimizer));
    ASSERT_NE(trainer, nullptr);
    MemberOutcome init = trainer->TrainPlain(Task("ref", nullptr, 21, warmup, hp));
    ASSERT_TRUE(init.ok()) << init.status.ToString();
    std::string init_blob = init.EncodeState();
    MemberOutcome result = trainer->TrainPlain(Task("ref", &init_blob, 0, steps, hp));
    ASSERT_TRUE(result.ok()) << result.status.ToString();
    nlohmann::json hp_json = hp;
    std::string cmd =
        std::string(kPython) + " " + CKPT_MODEL_TORCH_REFERENCE + " train --init " +
        Write("init", init_blob) + " --result " + Write("result", result.EncodeState()) +
        " --spec " + Quote(spec) + " --optimizer " + optimizer + " --hparams " +
        Quote(hp_json.dump()) + " --batch 32 --steps " + std::to_string(steps) +
        " --tolerance 1e-6" +
        (spread_factor > 0 ? " --spread-factor " + std::to_string(spread_factor) : std::string());
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }

  std::string dir_;
};

constexpr const char* kBnNoDropout = R"([
  {"type": "conv2d", "out": 6, "kernel": 5, "padding": 2},
  {"type": "batchnorm2d"},
  {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "conv2d", "out": 16, "kernel": 5},
  {"type": "batchnorm2d", "momentum": 0.2},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "out": 120},
  {"type": "relu"},
  {"type": "linear", "out": 10}
])";

// Overlapping windows (kernel 3, stride 2: a value can be the maximum of two
// windows, its gradients add up), a pool not preceded by a relu, and one that
// is (the trainer pools before the relu there).
constexpr const char* kOverlappingPools = R"([
  {"type": "conv2d", "out": 6, "kernel": 5, "padding": 2},
  {"type": "tanh"},
  {"type": "maxpool2d", "kernel": 3, "stride": 2},
  {"type": "conv2d", "out": 8, "kernel": 4},
  {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "out": 10}
])";

TEST_F(TorchReferenceTest, OverlappingMaxPoolsMatchTorch) {
  CrossCheck(kOverlappingPools, "sgd", {{"lr", 0.05}, {"momentum", 0.9}}, 2, 5);
}

// 2x2 pools of stride 2 without a relu before them: one on an odd map (25
// wide: the last row and column are in no window, the gradient's scatter
// path) and one on a map the windows tile (10 wide: the gradient written once,
// and on AVX-512 CPUs sixteen windows at a time).
constexpr const char* kTwoByTwoPools = R"([
  {"type": "conv2d", "out": 4, "kernel": 4},
  {"type": "tanh"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "conv2d", "out": 6, "kernel": 3},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "relu"},
  {"type": "flatten"},
  {"type": "linear", "out": 10}
])";

TEST_F(TorchReferenceTest, TwoByTwoMaxPoolsOnOddAndTiledMapsMatchTorch) {
  CrossCheck(kTwoByTwoPools, "sgd", {{"lr", 0.05}, {"momentum", 0.9}}, 2, 5);
}

TEST_F(TorchReferenceTest, SgdNesterovWeightDecayMatchesTorchOptim) {
  CrossCheck("lenet5", "sgd",
             {{"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 5e-4}, {"nesterov", 1}}, 0, 6);
}

TEST_F(TorchReferenceTest, SgdFromTrainedStateMatchesTorchOptim) {
  CrossCheck("lenet5", "sgd", {{"lr", 0.03}, {"momentum", 0.8}}, 7, 5);
}

TEST_F(TorchReferenceTest, AdamWithBatchNormMatchesTorchOptim) {
  CrossCheck(kBnNoDropout, "adam", {{"lr", 0.002}, {"weight_decay", 1e-4}}, 3, 6);
}

TEST_F(TorchReferenceTest, AdamWMatchesTorchOptim) {
  CrossCheck("lenet5", "adamw", {{"lr", 0.003}, {"weight_decay", 0.05}, {"beta1", 0.85}}, 2, 5);
}

TEST_F(TorchReferenceTest, CkptsConvKernelsTrainLikeTorchWithinTorchsOwnSpread) {
  CrossCheck("lenet5", "sgd", {{"lr", 0.05}, {"momentum", 0.9}, {"weight_decay", 5e-4}}, 0, 6,
             kSpreadFactor);
}

// With BatchNorm after conv1, conv1's bias gradient is rounding noise (its
// true value is 0): its Adam second moment is as far apart in PyTorch's own
// two kernels.
TEST_F(TorchReferenceTest, CkptsConvKernelsWithBatchNormAndAdamWithinTorchsOwnSpread) {
  CrossCheck(kBnNoDropout, "adam", {{"lr", 0.002}, {"weight_decay", 1e-4}}, 3, 6, kSpreadFactor);
}

TEST_F(TorchReferenceTest, TorchScriptLenet5TrainsLikeTheBuiltInSpec) {
  const std::string path = dir_ + "/lenet5.pt";
  std::string cmd = std::string(kPython) + " " + CKPT_MODEL_TORCH_REFERENCE +
                    " script --spec lenet5 --out " + path;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto spec_trainer = MakeTrainer(BaseOptions("lenet5", "sgd"));
  auto o = BaseOptions("torchscript:" + path, "sgd");
  o.eval_size = 1000;
  auto script_trainer = MakeTrainer(o);
  ASSERT_NE(spec_trainer, nullptr);
  ASSERT_NE(script_trainer, nullptr);
  EXPECT_FALSE(script_trainer->SupportsFusion());

  // Fresh TorchScript members are initialised from the seed, not the file.
  MemberOutcome fresh = script_trainer->TrainPlain(Task("ts", nullptr, 3, 0));
  ASSERT_TRUE(fresh.ok()) << fresh.status.ToString();
  OwnedBlob fresh_blob = Decode(fresh.EncodeState());
  EXPECT_EQ(fresh_blob.tensors.size(), 20u);
  ASSERT_NE(fresh_blob.Find("conv1.weight"), nullptr);
  ASSERT_NE(fresh_blob.Find("optim.fc3.bias.momentum_buffer"), nullptr);

  std::map<std::string, double> hp = {{"lr", 0.05}, {"momentum", 0.9}};
  MemberOutcome init = spec_trainer->TrainPlain(Task("m", nullptr, 8, 0, hp));
  ASSERT_TRUE(init.ok());
  std::string init_blob = init.EncodeState();
  MemberOutcome a = spec_trainer->TrainPlain(Task("m", &init_blob, 0, 8, hp));
  MemberOutcome b = script_trainer->TrainPlain(Task("m", &init_blob, 0, 8, hp));
  ASSERT_TRUE(a.ok()) << a.status.ToString();
  ASSERT_TRUE(b.ok()) << b.status.ToString();
  EXPECT_GE(b.val_score, 0.0);
  OwnedBlob x = Decode(a.EncodeState()), y = Decode(b.EncodeState());
  ASSERT_EQ(x.tensors.size(), y.tensors.size());
  for (auto& t : x.tensors) {
    ASSERT_NE(y.Find(t.name), nullptr) << t.name;
    EXPECT_LE(RelativeDiff(t, *y.Find(t.name)), 1e-6) << t.name;
  }
  // A TorchScript state refused by the spec layout is a clear error too.
  std::string bad = "not a blob";
  MemberOutcome c = script_trainer->TrainPlain(Task("m", &bad, 0, 1));
  EXPECT_EQ(c.fail_code, ipc::FailureCode::kBadState);
}

}  // namespace
}  // namespace ckpt::model
