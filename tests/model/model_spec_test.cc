// Model specs, hyperparameters, IDX datasets and data order: the torch-free
// parts of ckpt::model.
#include "ckpt/model/model_spec.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "ckpt/model/dataset.h"
#include "ckpt/model/hparams.h"
#include "model_test_util.h"

namespace ckpt::model {
namespace {

std::vector<std::string> Names(const std::vector<TensorSpec>& t) {
  std::vector<std::string> out;
  for (const auto& s : t) out.push_back(s.name);
  return out;
}

TEST(ModelSpecTest, Lenet5HasPyTorchStateDictLayout) {
  auto spec = ModelSpec::Parse("lenet5");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->num_outputs(), 10);
  auto tensors = spec->ModelTensors();
  EXPECT_EQ(Names(tensors),
            (std::vector<std::string>{"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias",
                                      "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias",
                                      "fc3.weight", "fc3.bias"}));
  EXPECT_EQ(tensors[0].shape, (std::vector<int64_t>{6, 1, 5, 5}));
  EXPECT_EQ(tensors[2].shape, (std::vector<int64_t>{16, 6, 5, 5}));
  EXPECT_EQ(tensors[4].shape, (std::vector<int64_t>{120, 400}));
  EXPECT_EQ(tensors[9].shape, (std::vector<int64_t>{10}));
  int64_t params = 0;
  for (const auto& t : tensors) params += t.numel();
  EXPECT_EQ(params, 61706);  // LeNet-5 with padding 2 on 28x28 inputs
}

// LeNet-5 on 28x28 by hand: conv1 6x28x28 outputs of 1x5x5 = 117,600
// multiply-adds; conv2 16x10x10 of 6x5x5 = 240,000; fc 400x120 + 120x84 +
// 84x10 = 58,920. A training step adds the weight gradients and every input
// gradient but conv1's.
TEST(ModelSpecTest, FlopsPerSampleCountConvAndLinearMultiplyAdds) {
  auto spec = ModelSpec::Parse("lenet5");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const int64_t forward_macs = 117600 + 240000 + 48000 + 10080 + 840;
  EXPECT_EQ(spec->ForwardFlopsPerSample(), 2 * forward_macs);
  EXPECT_EQ(spec->TrainingFlopsPerSample(), 2 * (3 * forward_macs - 117600));
  auto script = ModelSpec::Parse("torchscript:/nonexistent.pt");
  ASSERT_TRUE(script.ok()) << script.status().ToString();
  EXPECT_EQ(script->TrainingFlopsPerSample(), 0);
}

TEST(ModelSpecTest, BatchNormHasBuffersAndInferredSizes) {
  auto spec = ModelSpec::Parse(testing::kLenet5Bn);
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  auto tensors = spec->ModelTensors();
  auto names = Names(tensors);
  EXPECT_NE(std::find(names.begin(), names.end(), "bn1.running_mean"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "bn2.num_batches_tracked"), names.end());
  for (const auto& t : tensors) {
    if (t.name == "bn2.num_batches_tracked") {
      EXPECT_EQ(t.dtype, format::DType::kI64);
      EXPECT_TRUE(t.shape.empty());
      EXPECT_FALSE(t.trainable);
    }
    if (t.name == "fc1.weight") {
      EXPECT_EQ(t.shape, (std::vector<int64_t>{120, 400}));
    }
    if (t.name == "bn1.weight") {
      EXPECT_TRUE(t.trainable);
    }
  }
  EXPECT_TRUE(spec->has_dropout());
}

TEST(ModelSpecTest, StateLayoutNamesOptimizerSlots) {
  auto spec = ModelSpec::Parse("lenet5");
  ASSERT_TRUE(spec.ok());
  auto sgd = StateLayout(spec->ModelTensors(), OptimizerKind::kSgd);
  EXPECT_EQ(sgd.size(), 20u);
  EXPECT_EQ(sgd[10].name, "optim.conv1.weight.momentum_buffer");
  EXPECT_EQ(sgd[10].shape, (std::vector<int64_t>{6, 1, 5, 5}));
  auto adam = StateLayout(spec->ModelTensors(), OptimizerKind::kAdam);
  EXPECT_EQ(adam.size(), 40u);
  EXPECT_EQ(adam[10].name, "optim.conv1.weight.exp_avg");
  EXPECT_EQ(adam[11].name, "optim.conv1.weight.exp_avg_sq");
  EXPECT_EQ(adam[12].name, "optim.conv1.weight.step");
  EXPECT_TRUE(adam[12].shape.empty());
}

TEST(ModelSpecTest, ObjectFormWithInputAndNames) {
  auto spec = ModelSpec::Parse(
      R"({"input": [3, 8, 8], "layers": [{"type": "conv2d", "out": 4, "kernel": 3, "name": "stem"},
          {"type": "flatten"}, {"type": "linear", "out": 5, "bias": false, "name": "head"}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(Names(spec->ModelTensors()),
            (std::vector<std::string>{"stem.weight", "stem.bias", "head.weight"}));
  EXPECT_EQ(spec->ModelTensors()[2].shape, (std::vector<int64_t>{5, 144}));
}

// A conv1x1 shortcut named as the user's PyTorch block names it
// ("shortcut_names"), so ckpt_client.convert keeps a torchvision-style
// "downsample.0" / ".1" on the fused path; an identity shortcut has nothing
// to name.
TEST(ModelSpecTest, Conv1x1ShortcutTakesTheModulesNames) {
  const std::string body =
      R"([{"type": "conv2d", "out": 8, "kernel": 3, "stride": 2, "padding": 1, "bias": false,
           "name": "b.conv1"}, {"type": "batchnorm2d", "name": "b.bn1"}])";
  auto spec =
      ModelSpec::Parse(R"({"input": [4, 8, 8], "layers": [{"type": "residual", "layers": )" + body +
                       R"(, "shortcut": "conv1x1", "shortcut_names": ["b.downsample.0",
                               "b.downsample.1"]}, {"type": "globalavgpool"},
                               {"type": "linear", "out": 3, "name": "fc"}]})");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  const std::vector<std::string> names = Names(spec->ModelTensors());
  for (const char* want : {"b.downsample.0.weight", "b.downsample.1.weight",
                           "b.downsample.1.running_mean", "b.downsample.1.num_batches_tracked"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
  }
  for (const std::string& n : names) EXPECT_EQ(n.find(".shortcut."), std::string::npos) << n;

  auto identity = ModelSpec::Parse(
      R"({"input": [4, 8, 8], "layers": [{"type": "residual", "layers": [{"type": "relu"}],
          "shortcut": "identity", "shortcut_names": ["a", "b"]}]})");
  ASSERT_FALSE(identity.ok());
  EXPECT_NE(identity.status().message().find("identity shortcut takes no"), std::string::npos)
      << identity.status().ToString();
  auto malformed = ModelSpec::Parse(R"({"input": [4, 8, 8], "layers": [{"type": "residual",
      "layers": )" + body + R"(, "shortcut": "conv1x1", "shortcut_names": ["only one"]}]})");
  ASSERT_FALSE(malformed.ok());
  EXPECT_NE(malformed.status().message().find("shortcut_names"), std::string::npos)
      << malformed.status().ToString();
}

TEST(ModelSpecTest, RejectsBadSpecsNamingTheLayer) {
  struct Case {
    const char* text;
    const char* fragment;
  };
  const Case cases[] = {
      {"resnet50", "neither a known name"},
      {"[]", "non-empty"},
      {R"([{"type": "conv3d"}])", "layer 0: unknown layer type"},
      {R"([{"type": "conv2d", "out": 6}])", "layer 0 (conv2d): missing field \"kernel\""},
      {R"([{"type": "conv2d", "in": 3, "out": 6, "kernel": 5}])", "in = 3 but the input has 1"},
      {R"([{"type": "linear", "out": 10}])", "add a flatten"},
      {R"([{"type": "flatten"}, {"type": "maxpool2d", "kernel": 2}])", "follows the flatten"},
      {R"([{"type": "conv2d", "out": 6, "kernel": 50}])", "does not fit"},
      {R"([{"type": "flatten"}, {"type": "linear", "out": 10, "in": 7}])", "in = 7"},
      {R"([{"type": "relu", "alpha": 1}])", "unknown field \"alpha\""},
      {R"([{"type": "conv2d", "out": "6", "kernel": 5}])", "must be an integer"},
      {R"([{"type": "flatten"}, {"type": "dropout", "p": 1.5}, {"type": "linear", "out": 2}])",
       "out of range"},
      {R"([{"type": "conv2d", "out": 2, "kernel": 3}])", "must be flat"},
      {R"([{"type": "flatten"}, {"type": "linear", "out": 4, "name": "a"},
           {"type": "linear", "out": 2, "name": "a"}])",
       "duplicate layer name"},
  };
  for (const auto& c : cases) {
    auto spec = ModelSpec::Parse(c.text);
    ASSERT_FALSE(spec.ok()) << c.text;
    EXPECT_TRUE(spec.status().IsInvalidArgument()) << spec.status().ToString();
    EXPECT_NE(spec.status().message().find(c.fragment), std::string::npos)
        << c.text << " -> " << spec.status().ToString();
  }
}

TEST(ModelSpecTest, TorchScriptSpecCarriesPath) {
  auto spec = ModelSpec::Parse("torchscript:/tmp/m.pt");
  ASSERT_TRUE(spec.ok());
  EXPECT_TRUE(spec->is_torchscript());
  EXPECT_EQ(spec->torchscript_path(), "/tmp/m.pt");
  EXPECT_FALSE(ModelSpec::Parse("torchscript:").ok());
}

TEST(HparamsTest, DefaultsThenCheckpointThenRequest) {
  auto h = ResolveHyperparameters(OptimizerKind::kSgd, {{"lr", 0.1}, {"momentum", 0.9}},
                                  {{"lr", 0.2}, {"nesterov", 1}});
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->lr, 0.2);
  EXPECT_EQ(h->momentum, 0.9);
  EXPECT_TRUE(h->nesterov);
  auto adamw = ResolveHyperparameters(OptimizerKind::kAdamW, {}, {});
  ASSERT_TRUE(adamw.ok());
  EXPECT_EQ(adamw->lr, 0.001);
  EXPECT_EQ(adamw->weight_decay, 0.01);
  EXPECT_EQ(HyperparameterMap(OptimizerKind::kAdam, *adamw).count("beta2"), 1u);
}

TEST(HparamsTest, RejectsUnknownAndOutOfRangeValues) {
  const std::map<std::string, double> bad[] = {
      {{"learning_rate", 0.1}}, {{"lr", -1}},        {{"beta1", 0.5}}, {{"nesterov", 1}},
      {{"momentum", -0.5}},     {{"nesterov", 0.5}}, {{"lr", NAN}},
  };
  for (const auto& m : bad) {
    auto h = ResolveHyperparameters(OptimizerKind::kSgd, {}, m);
    EXPECT_FALSE(h.ok()) << m.begin()->first;
    EXPECT_TRUE(h.status().IsInvalidArgument());
  }
  EXPECT_FALSE(ResolveHyperparameters(OptimizerKind::kAdam, {}, {{"beta2", 1.0}}).ok());
  EXPECT_FALSE(ResolveHyperparameters(OptimizerKind::kAdam, {}, {{"momentum", 0.9}}).ok());
  EXPECT_FALSE(ParseOptimizerKind("rmsprop").ok());
}

class IdxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/ckpt_idx_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  void WritePlain(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  void WriteGz(const std::string& name, const std::string& bytes) {
    gzFile f = gzopen((dir_ + "/" + name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())),
              static_cast<int>(bytes.size()));
    gzclose(f);
  }
  // An IDX header of u8 elements alone.
  static std::string IdxHeader(const std::vector<uint32_t>& dims) {
    std::string s = {0, 0, 0x08, static_cast<char>(dims.size())};
    for (uint32_t d : dims) {
      for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((d >> (8 * i)) & 0xff));
    }
    return s;
  }
  static std::string Idx(std::vector<uint32_t> dims, uint8_t fill, uint8_t type = 0x08) {
    std::string s = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
    size_t n = 1;
    for (uint32_t d : dims) {
      for (int i = 3; i >= 0; --i) s.push_back(static_cast<char>((d >> (8 * i)) & 0xff));
      n *= d;
    }
    for (size_t i = 0; i < n; ++i) s.push_back(static_cast<char>((fill + i) % 7));
    return s;
  }

  std::string dir_;
};

TEST_F(IdxTest, ReadsPlainAndGzip) {
  WritePlain("a", Idx({2, 3}, 1));
  WriteGz("b.gz", Idx({2, 3}, 1));
  auto a = ReadIdxFile(dir_ + "/a");
  auto b = ReadIdxFile(dir_ + "/b.gz");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(a->dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a->data, b->data);
  EXPECT_EQ(a->data.size(), 6u);
}

// The last rows can go to their own array (the validation split), read there
// straight from the file, plain or gzipped; short files are still refused.
TEST_F(IdxTest, ReadsTheLastRowsIntoTheirOwnArray) {
  const std::string whole = Idx({5, 3}, 2);
  WritePlain("a", whole);
  WriteGz("b.gz", whole);
  for (const char* name : {"a", "b.gz"}) {
    SCOPED_TRACE(name);
    auto x = ReadIdxFile(dir_ + "/" + name, 2);
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    EXPECT_EQ(x->dims, (std::vector<int64_t>{5, 3}));
    const std::string body = whole.substr(4 + 2 * 4);
    EXPECT_EQ(std::string(x->data.begin(), x->data.end()), body.substr(0, 9));
    EXPECT_EQ(std::string(x->tail.begin(), x->tail.end()), body.substr(9));
    auto all = ReadIdxFile(dir_ + "/" + name, 7);  // more rows than the file has
    ASSERT_TRUE(all.ok()) << all.status().ToString();
    EXPECT_TRUE(all->data.empty());
    EXPECT_EQ(std::string(all->tail.begin(), all->tail.end()), body);
  }
  WritePlain("short", whole.substr(0, whole.size() - 1));
  WritePlain("long", whole + "x");
  EXPECT_TRUE(ReadIdxFile(dir_ + "/short", 2).status().IsCorruption());
  EXPECT_TRUE(ReadIdxFile(dir_ + "/long", 2).status().IsCorruption());
}

TEST_F(IdxTest, RejectsMalformedFiles) {
  WritePlain("magic", std::string("\x01\x00\x08\x01\x00\x00\x00\x01\x05", 9));
  WritePlain("type", Idx({2}, 0, 0x0D));
  WritePlain("short", Idx({4, 4}, 0).substr(0, 20));
  WritePlain("rank", std::string("\x00\x00\x08\x00", 4));
  WritePlain("notgz.gz", "this is not gzip at all");
  EXPECT_TRUE(ReadIdxFile(dir_ + "/magic").status().IsCorruption());
  EXPECT_TRUE(ReadIdxFile(dir_ + "/type").status().IsCorruption());
  EXPECT_TRUE(ReadIdxFile(dir_ + "/short").status().IsCorruption());
  EXPECT_TRUE(ReadIdxFile(dir_ + "/rank").status().IsCorruption());
  EXPECT_FALSE(ReadIdxFile(dir_ + "/notgz.gz").ok());
  EXPECT_TRUE(ReadIdxFile(dir_ + "/absent").status().IsNotFound());
  EXPECT_TRUE(LoadDataset("fashion-mnist", dir_).status().IsNotFound());
  EXPECT_TRUE(LoadDataset("cifar", "").status().IsInvalidArgument());
}

// The process's peak resident set (VmHWM), after `reset` starts it anew from
// the current resident set (/proc/self/clear_refs, "5").
int64_t PeakRssBytes(bool reset) {
  if (reset) std::ofstream("/proc/self/clear_refs") << "5";
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

// A header claims what the file does not hold: memory follows the bytes the
// file (or its gzip stream) yields, never the header's claim. The old reader
// zero-filled the whole claim first (1 GiB here, for a 20-byte file).
TEST_F(IdxTest, MemoryFollowsTheFileNotWhatItsHeaderClaims) {
  // 16,383 x 65,536 bytes: just under the 1 GiB limit.
  const std::string header = IdxHeader({16383, 65536});
  WritePlain("claims.idx", header + std::string(12, '\1'));
  WriteGz("claims.idx.gz", header + std::string(12, '\1'));
  for (const char* name : {"claims.idx", "claims.idx.gz"}) {
    SCOPED_TRACE(name);
    const int64_t before = PeakRssBytes(/*reset=*/true);
    ASSERT_GT(before, 0) << "no VmHWM in /proc/self/status";
    auto x = ReadIdxFile(dir_ + "/" + name, 100);
    const int64_t grown = PeakRssBytes(/*reset=*/false) - before;
    ASSERT_FALSE(x.ok());
    EXPECT_TRUE(x.status().IsCorruption()) << x.status().ToString();
    EXPECT_NE(x.status().message().find("IDX holds 12 elements, dimensions say 1073676288"),
              std::string::npos)
        << x.status().ToString();
    EXPECT_LT(grown, int64_t{256} << 20)
        << "peak resident set grew by " << (grown >> 20) << " MiB for a 20-byte file";
  }
  // Past the limit, refused from the header alone.
  WritePlain("huge.idx", IdxHeader({16385, 65536}));
  auto huge = ReadIdxFile(dir_ + "/huge.idx");
  EXPECT_NE(huge.status().message().find("IDX dimensions too large"), std::string::npos)
      << huge.status().ToString();
}

TEST_F(IdxTest, SplitsAndNormalizes) {
  WriteGz("train-images-idx3-ubyte.gz", Idx({10010, 2, 2}, 3));
  WriteGz("train-labels-idx1-ubyte.gz", Idx({10010}, 0));
  WritePlain("t10k-images-idx3-ubyte", Idx({5, 2, 2}, 1));
  WritePlain("t10k-labels-idx1-ubyte", Idx({5}, 0));
  auto ds = LoadDataset("tiny", dir_);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ((*ds)->train.count, 10);
  EXPECT_EQ((*ds)->validation.count, kValidationSize);
  // Validation is the train file's last rows, in order, after the train rows.
  auto whole = ReadIdxFile(dir_ + "/train-images-idx3-ubyte.gz");
  ASSERT_TRUE(whole.ok());
  const auto* train_x = static_cast<const uint8_t*>((*ds)->train.x);
  const auto* val_x = static_cast<const uint8_t*>((*ds)->validation.x);
  std::vector<uint8_t> joined(train_x, train_x + 10 * 4);
  joined.insert(joined.end(), val_x, val_x + kValidationSize * 4);
  EXPECT_EQ(joined, whole->data);
  EXPECT_EQ((*ds)->test.count, 5);
  EXPECT_EQ((*ds)->num_classes, 7);
  EXPECT_EQ((*ds)->sample_shape, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ((*ds)->x_dtype, format::DType::kU8);
  // Normalized train pixels have mean 0: mean * 255 * scale + shift == 0.
  EXPECT_NEAR((*ds)->mean[0] * 255.0 * (*ds)->scale[0] + (*ds)->shift[0], 0.0, 1e-9);

  WritePlain("t10k-labels-idx1-ubyte", Idx({4}, 0));
  EXPECT_TRUE(LoadDataset("tiny", dir_).status().IsCorruption());
}

TEST(DatasetTest, FashionMnistSplits) {
  auto ds = testing::FashionMnist();
  ASSERT_NE(ds, nullptr);
  EXPECT_EQ(ds->train.count, 50000);
  EXPECT_EQ(ds->validation.count, 10000);
  EXPECT_EQ(ds->test.count, 10000);
  EXPECT_EQ(ds->num_classes, 10);
  EXPECT_EQ(ds->sample_shape, (std::vector<int64_t>{1, 28, 28}));
  EXPECT_NEAR(ds->mean[0], 0.286, 0.002);
  EXPECT_NEAR(ds->stddev[0], 0.353, 0.002);
}

TEST(DataOrderTest, PermutationIsDeterministicAndComplete) {
  auto a = EpochPermutation(42, 3, 1000);
  auto b = EpochPermutation(42, 3, 1000);
  auto c = EpochPermutation(42, 4, 1000);
  auto d = EpochPermutation(43, 3, 1000);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a, d);
  std::set<int32_t> all(a.begin(), a.end());
  EXPECT_EQ(all.size(), 1000u);
  EXPECT_EQ(*all.begin(), 0);
  EXPECT_EQ(*all.rbegin(), 999);
}

TEST(DataOrderTest, BatchesStraddleEpochsAndResumeFromCursor) {
  const int64_t n = 10;
  std::vector<int64_t> out, again;
  std::vector<int32_t> cache;
  int64_t cached = -1;
  BatchIndices(5, 8, 4, n, &out, &cache, &cached);
  auto e0 = EpochPermutation(5, 0, n);
  auto e1 = EpochPermutation(5, 1, n);
  EXPECT_EQ(out, (std::vector<int64_t>{e0[8], e0[9], e1[0], e1[1]}));
  std::vector<int32_t> fresh_cache;
  int64_t fresh = -1;
  BatchIndices(5, 8, 4, n, &again, &fresh_cache, &fresh);
  EXPECT_EQ(out, again);
  EXPECT_NE(MemberDataSeed(1, 2), MemberDataSeed(1, 3));
  EXPECT_NE(MemberDataSeed(1, 2), MemberDataSeed(2, 2));
}

}  // namespace
}  // namespace ckpt::model
