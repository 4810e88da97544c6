#include "ckpt/records/config.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/scheduler/service.h"

namespace ckpt::scheduler {
namespace {

const char kGood[] = R"(name = "t1"
seed = 7
[model]
spec = "lenet5"
optimizer = "sgd"
[data]
batch_size = 32
eval_size = 500
[population]
size = 6
steps_per_interval = 20
intervals = 4
[search_space.lr]
type = "log_uniform"
min = 0.001
max = 0.1
[search_space.momentum]
type = "uniform"
min = 0.5
max = 0.99
[search_space.nesterov]
type = "choice"
values = [0, 1]
[policy]
kind = "pbt"
mode = "async"
quantile = 0.25
[[devices]]
device = "cpu"
slots = 2
count = 2
)";

void ExpectError(const std::string& text, const std::string& needle) {
  auto c = records::ParseExperimentConfig(text, "exp.toml");
  ASSERT_FALSE(c.ok()) << "accepted: " << text;
  EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
  EXPECT_NE(c.status().message().find(needle), std::string::npos)
      << "'" << c.status().message() << "' lacks '" << needle << "'";
}

std::string Replace(std::string s, const std::string& from, const std::string& to) {
  auto at = s.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return s.replace(at, from.size(), to);
}

TEST(ConfigTest, ParsesEveryField) {
  auto c = records::ParseExperimentConfig(kGood, "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "t1");
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->batch_size, 32);
  EXPECT_EQ(c->eval_size, 500);
  EXPECT_EQ(c->population, 6);
  EXPECT_EQ(c->steps_per_interval, 20);
  EXPECT_EQ(c->intervals, 4);
  ASSERT_EQ(c->search_space.size(), 3u);
  EXPECT_EQ(c->search_space["lr"].kind, records::SearchDim::Kind::kLogUniform);
  EXPECT_EQ(c->search_space["nesterov"].values.size(), 2u);
  EXPECT_EQ(c->policy.mode, records::PolicyMode::kAsync);
  EXPECT_DOUBLE_EQ(c->policy.quantile, 0.25);
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].count, 2);
  EXPECT_FALSE(c->devices[0].tf32);
  EXPECT_EQ(c->source, kGood);
}

// intervals = 4, eta = 3, min_intervals = 1: s_max = 1, two brackets fit.
TEST(ConfigTest, HyperbandBracketsMustFitTheIntervals) {
  const std::string hb = Replace(kGood, "kind = \"pbt\"", "kind = \"hyperband\"");
  auto c = records::ParseExperimentConfig(hb + "", "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->policy.kind, records::PolicyKind::kHyperband);
  ExpectError(Replace(hb, "quantile = 0.25", "quantile = 0.25\nbrackets = 3"),
              "policy.brackets (exp.toml line 28): 3 brackets do not fit 4 intervals with eta = 3 "
              "and min_intervals = 1: at most 2");
  ExpectError(Replace(hb, "quantile = 0.25", "quantile = 0.25\nmin_intervals = 5"),
              "policy.min_intervals (exp.toml line 28): 5 is above the 4 intervals");
  ExpectError(Replace(Replace(hb, "size = 6", "size = 1"), "quantile = 0.25",
                      "quantile = 0.25\nbrackets = 2"),
              "policy.brackets (exp.toml line 28): 2 HyperBand brackets need at least 2 members");
  EXPECT_TRUE(records::ParseExperimentConfig(
                  Replace(hb, "quantile = 0.25", "quantile = 0.25\nbrackets = 2"), "exp.toml")
                  .ok());
}

TEST(ConfigTest, MedianStoppingServesRandomSearchAndHalvingOnly) {
  const std::string median =
      Replace(kGood, "quantile = 0.25", "median_stopping = true\nmedian_grace_intervals = 2");
  ExpectError(median,
              "policy.median_stopping (exp.toml line 27): applies to random search and "
              "successive_halving, not pbt");
  ExpectError(Replace(median, "kind = \"pbt\"", "kind = \"hyperband\""),
              "policy.median_stopping (exp.toml line 27)");
  for (const char* kind : {"random", "successive_halving"}) {
    auto c = records::ParseExperimentConfig(
        Replace(median, "kind = \"pbt\"", std::string("kind = \"") + kind + "\""), "exp.toml");
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_TRUE(c->policy.median_stopping);
    EXPECT_EQ(c->policy.median_grace_intervals, 2);
  }
  ExpectError(Replace(median, "median_grace_intervals = 2", "median_grace_intervals = 0"),
              "policy.median_grace_intervals (exp.toml line 28): must be in [1");
  ExpectError(Replace(median, "median_stopping = true", "median_stopping = 1"),
              "policy.median_stopping (exp.toml line 27): must be true or false");
}

TEST(ConfigTest, TpeResamplesPbtAndStartsAsyncMembers) {
  const std::string tpe = Replace(kGood, "quantile = 0.25", "resample = \"tpe\"");
  auto c = records::ParseExperimentConfig(tpe, "exp.toml");  // pbt, async
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->policy.resample, records::Resample::kTpe);
  EXPECT_TRUE(records::ParseExperimentConfig(Replace(tpe, "mode = \"async\"", "mode = \"sync\""),
                                             "exp.toml")
                  .ok());
  EXPECT_TRUE(records::ParseExperimentConfig(Replace(tpe, "kind = \"pbt\"", "kind = \"random\""),
                                             "exp.toml")
                  .ok());
  ExpectError(Replace(Replace(tpe, "kind = \"pbt\"", "kind = \"random\""), "mode = \"async\"",
                      "mode = \"sync\""),
              "policy.resample (exp.toml line 27): \"tpe\" proposes");
  ExpectError(Replace(tpe, "\"tpe\"", "\"bohb\""), "policy.resample (exp.toml line 27)");
}

// kGood searches nesterov as a choice (line 22: its type).
TEST(ConfigTest, Pb2ExploresContinuousHyperparametersOnly) {
  const std::string pb2 = Replace(kGood, "kind = \"pbt\"", "kind = \"pb2\"");
  ExpectError(pb2,
              "search_space.nesterov.type (exp.toml line 22): is a choice: policy.kind = "
              "\"pb2\" explores continuous hyperparameters only");
  const std::string continuous =
      Replace(pb2, "[search_space.nesterov]\ntype = \"choice\"\nvalues = [0, 1]\n", "");
  auto c = records::ParseExperimentConfig(continuous, "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->policy.kind, records::PolicyKind::kPb2);
  ExpectError(Replace(continuous, "quantile = 0.25", "resample = \"tpe\""),
              "policy.resample (exp.toml line 24): does not apply to pb2");
  ExpectError(Replace(continuous, "quantile = 0.25", "gp_lengthscale = 0.2"),
              "policy.gp_lengthscale (exp.toml line 24): unknown key");
}

// TF32 is off unless a device entry asks for it; anything but a boolean is
// refused, naming the key.
TEST(ConfigTest, Tf32IsAskedForPerDevice) {
  auto on = records::ParseExperimentConfig(Replace(kGood, "slots = 2", "slots = 2\ntf32 = true"),
                                           "exp.toml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->devices[0].tf32);
  ExpectError(Replace(kGood, "slots = 2", "slots = 2\ntf32 = 1"), "devices[0].tf32");
}

TEST(ConfigTest, UnknownKeyNamesKeyAndLine) {
  ExpectError(Replace(kGood, "size = 6", "size = 6\nsizes = 7"),
              "population.sizes (exp.toml line 11): unknown key");
  ExpectError(Replace(kGood, "seed = 7", "sed = 7"), "sed (exp.toml line 2): unknown key");
  ExpectError(Replace(kGood, "slots = 2", "slot = 2"), "devices[0].slot");
}

TEST(ConfigTest, WrongTypeNamesKeyAndLine) {
  ExpectError(Replace(kGood, "size = 6", "size = \"six\""),
              "population.size (exp.toml line 10): must be an integer");
  ExpectError(Replace(kGood, "min = 0.001", "min = \"small\""),
              "search_space.lr.min (exp.toml line 15)");
  ExpectError(Replace(kGood, "[model]", "model = 3\n[modelx]"), "model");
}

TEST(ConfigTest, BadValuesAreRefused) {
  ExpectError(Replace(kGood, "size = 6", "size = 0"),
              "population.size (exp.toml line 10): must be in [1");
  ExpectError(Replace(kGood, "optimizer = \"sgd\"", "optimizer = \"lbfgs\""), "model.optimizer");
  ExpectError(Replace(kGood, "kind = \"pbt\"", "kind = \"bohb\""),
              "policy.kind (exp.toml line 25)");
  ExpectError(Replace(kGood, "quantile = 0.25", "quantile = 0.25\nbracket = 2"),
              "policy.bracket (exp.toml line 28): unknown key");
  ExpectError(Replace(kGood, "max = 0.1", "max = 0.0001"), "search_space.lr.max");
  ExpectError(Replace(kGood, "device = \"cpu\"", "device = \"tpu\""), "devices[0].device");
  ExpectError(Replace(kGood, "name = \"t1\"", "name = \"a b\""), "name");
  ExpectError("name = \"x\"\n[population]\nsize = [", "exp.toml line 3");
}

// The service's blob_log key (store::StoreOptions::blob_log): on unless the
// file turns it off, handed to the scheduler, and a change needs a restart.
TEST(ConfigTest, ServiceBlobLogIsOnByDefaultAndTheFileTurnsItOff) {
  auto on = ParseServiceConfig("store = \"/s\"\n", "svc.toml");
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_TRUE(on->blob_log);
  EXPECT_TRUE(SchedulerOptionsFor(*on).blob_log);
  auto off = ParseServiceConfig("store = \"/s\"\nblob_log = false\n", "svc.toml");
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_FALSE(off->blob_log);
  EXPECT_FALSE(SchedulerOptionsFor(*off).blob_log);
  EXPECT_EQ(records::SettingsNeedingRestart(*on, *off), "blob_log");
  auto bad = ParseServiceConfig("store = \"/s\"\nblob_log = \"no\"\n", "svc.toml");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("blob_log (svc.toml line 2): must be true or false"),
            std::string::npos)
      << bad.status().ToString();
}

TEST(ConfigTest, RemoteWorkerBoundsAreReadWithTheirDefaultsAndRanges) {
  auto plain = records::ParseExperimentConfig(kGood, "exp.toml");
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  EXPECT_EQ(plain->workers.remote_memory_bytes, uint64_t{2048} << 20);
  EXPECT_EQ(plain->workers.max_remote_slots, 64);
  EXPECT_EQ(plain->workers.task_timeout_factor, 10);
  EXPECT_EQ(plain->workers.task_timeout_floor, std::chrono::milliseconds(60000));
  const std::string table =
      std::string(kGood) +
      "[workers]\nlisten = \"127.0.0.1:0\"\nsecret_file = \"s\"\nremote_memory_mib = 512\n"
      "max_remote_slots = 8\ntask_timeout_factor = 4\ntask_timeout_floor_s = 2.5\n";
  auto c = records::ParseExperimentConfig(table, "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->workers.remote_memory_bytes, uint64_t{512} << 20);
  EXPECT_EQ(c->workers.max_remote_slots, 8);
  EXPECT_EQ(c->workers.task_timeout_factor, 4);
  EXPECT_EQ(c->workers.task_timeout_floor, std::chrono::milliseconds(2500));
  ExpectError(Replace(table, "remote_memory_mib = 512", "remote_memory_mib = 8"),
              "workers.remote_memory_mib (exp.toml line 35): must be in [16");
  ExpectError(Replace(table, "max_remote_slots = 8", "max_remote_slots = 257"),
              "workers.max_remote_slots");
  ExpectError(Replace(table, "task_timeout_factor = 4", "task_timeout_factor = 0.5"),
              "workers.task_timeout_factor");
  ExpectError(Replace(table, "task_timeout_floor_s = 2.5", "task_timeout_floor_s = 0"),
              "workers.task_timeout_floor_s");
}

TEST(ConfigTest, EmptySearchSpaceIsRefused) {
  std::string text = kGood;
  text = text.substr(0, text.find("[search_space.lr]")) + text.substr(text.find("[policy]"));
  ExpectError(text, "search_space");
  ExpectError(Replace(kGood, "values = [0, 1]", "values = []"), "search_space.nesterov.values");
}

TEST(ConfigTest, MissingDatasetIsRefusedBeforeAnythingStarts) {
  ExpectError(Replace(kGood, "batch_size = 32", "batch_size = 32\npath = \"/nonexistent/fmnist\""),
              "data.path");
}

TEST(ConfigTest, LoadNamesAMissingFile) {
  auto c = records::LoadExperimentConfig("/nonexistent/exp.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsNotFound());
  EXPECT_NE(c.status().message().find("/nonexistent/exp.toml"), std::string::npos);
}

// docs/LIMITS.md: each limit of an experiment file, at its value and one past.
TEST(ConfigLimitsTest, PopulationAtAndPastTheLimit) {
  auto c = records::ParseExperimentConfig(Replace(kGood, "size = 6", "size = 10000"), "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->population, records::kMaxPopulation);
  ExpectError(Replace(kGood, "size = 6", "size = 10001"),
              "population.size (exp.toml line 10): must be in [1, 10000], not 10001");
}

TEST(ConfigLimitsTest, ModelSpecAtAndPastTheLimit) {
  // A JSON layer list of exactly 64 KiB (padded with spaces, which JSON allows).
  std::string spec = "[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": 10}]";
  spec += std::string(records::kMaxModelSpecBytes - spec.size(), ' ');
  auto c = records::ParseExperimentConfig(
      Replace(kGood, "spec = \"lenet5\"", "spec = '" + spec + "'"), "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_spec.size(), records::kMaxModelSpecBytes);
  ExpectError(Replace(kGood, "spec = \"lenet5\"", "spec = '" + spec + " '"),
              "model.spec (exp.toml line 4): is 65537 bytes; the limit is 65536");
}

TEST(ConfigLimitsTest, NameAtAndPastTheLimit) {
  const std::string at(records::kMaxExperimentNameBytes, 'n');
  auto c = records::ParseExperimentConfig(Replace(kGood, "name = \"t1\"", "name = \"" + at + "\""),
                                          "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectError(Replace(kGood, "name = \"t1\"", "name = \"" + at + "n\""),
              "name (exp.toml line 1): is 129 bytes; the limit is 128");
}

// A file of exactly `bytes` bytes: kGood padded with a comment.
std::string TomlOfSize(size_t bytes) {
  std::string text = kGood;
  text += "#";
  text += std::string(bytes - text.size() - 1, 'x');
  text += "\n";
  EXPECT_EQ(text.size(), bytes);
  return text;
}

TEST(ConfigLimitsTest, TomlSizeAtAndPastTheLimit) {
  const size_t limit = size_t{1} << 20;
  auto c = records::ParseExperimentConfig(TomlOfSize(limit), "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectError(TomlOfSize(limit + 1),
              "exp.toml: 1048577 bytes of TOML, above the limit of 1048576 bytes (1 MiB)");
  // The service file has the same limit.
  std::string service = "store = \"s\"\n#";
  service += std::string(limit - service.size() - 1, 'x') + "\n";
  ASSERT_EQ(service.size(), limit);
  auto s = ParseServiceConfig(service, "svc.toml");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  service.insert(0, " ");
  s = ParseServiceConfig(service, "svc.toml");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("svc.toml: 1048577 bytes of TOML, above the limit"),
            std::string::npos)
      << s.status().ToString();
}

TEST(ConfigLimitsTest, LoadReadsNoMoreThanTheLimit) {
  // /dev/zero never ends: the loader stops one byte past the limit.
  auto c = records::LoadExperimentConfig("/dev/zero");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsInvalidArgument()) << c.status().ToString();
  EXPECT_NE(c.status().message().find("/dev/zero: 1048577 bytes of TOML"), std::string::npos)
      << c.status().ToString();
  auto s = LoadServiceConfig("/dev/zero");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/dev/zero: 1048577 bytes of TOML"), std::string::npos)
      << s.status().ToString();
}

TEST(ConfigLimitsTest, TorchScriptSpecNamingAFifoIsRefusedWithoutReadingIt) {
  // Opening a FIFO for reading blocks until a writer comes: a submitted
  // experiment naming one would hang the scheduler's event loop.
  const char* tmp = std::getenv("TMPDIR");
  const std::string fifo = std::string(tmp != nullptr ? tmp : "/tmp") + "/ckpt_config_test_fifo_" +
                           std::to_string(getpid());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  ExpectError(Replace(kGood, "spec = \"lenet5\"", "spec = \"torchscript:" + fifo + "\""),
              "is not a regular file");
  unlink(fifo.c_str());
}

// A tensor dataset written with the checkpoint writer (its metadata is
// ignored by the dataset reader): 20 U8 images of `sample` ([1, 2, 2] unless
// said), labels 0..classes-1, or F32 targets.
std::string WriteTensorData(const std::string& name, bool regression,
                            const std::vector<int64_t>& sample = {1, 2, 2}, int classes = 4) {
  std::vector<uint8_t> x(20 * static_cast<size_t>(sample[0] * sample[1] * sample[2]));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<uint8_t>(i);
  std::vector<int64_t> labels(20);
  std::vector<float> targets(20);
  for (int i = 0; i < 20; ++i) {
    labels[i] = i % classes;
    targets[i] = 0.5f * static_cast<float>(i);
  }
  format::CheckpointWriter w;
  EXPECT_TRUE(w.AddTensor("train.x", format::DType::kU8, {20, sample[0], sample[1], sample[2]},
                          x.data(), x.size())
                  .ok());
  if (regression) {
    EXPECT_TRUE(w.AddTensor("train.y", format::DType::kF32, {20}, targets.data(), 80).ok());
  } else {
    EXPECT_TRUE(w.AddTensor("train.y", format::DType::kI64, {20}, labels.data(), 160).ok());
  }
  const std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path, std::ios::binary) << w.Encode();
  return path;
}

// kGood with a layer list of `outputs` outputs, for [1, 2, 2] data.
std::string WithLinearModel(const std::string& text, int outputs) {
  return Replace(text, "spec = \"lenet5\"",
                 "spec = '[{\"type\": \"flatten\"}, {\"type\": \"linear\", \"out\": " +
                     std::to_string(outputs) + "}]'");
}

TEST(ConfigTest, TensorDataAndTask) {
  const std::string file = WriteTensorData("cfg_data.safetensors", false);
  const std::string data =
      "[data]\nformat = \"safetensors\"\npath = \"" + file +
      "\"\nval_size = 4\nclasses = 5\naugment = [\"random_crop:2\", \"hflip\"]\n";
  std::string text = Replace(WithLinearModel(kGood, 5), "[data]\n", data);
  auto c = records::ParseExperimentConfig(text + "[task]\nloss = \"cross_entropy\"\n", "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->data_format, format::DatasetFormat::kSafetensors);
  EXPECT_EQ(c->tensor_file.val_size, 4);
  EXPECT_EQ(c->tensor_file.classes, 5);
  EXPECT_EQ(c->augment.crop_padding, 2);
  EXPECT_TRUE(c->augment.hflip);
  EXPECT_EQ(c->loss, format::LossKind::kCrossEntropy);
  EXPECT_FALSE(c->metric.has_value());

  ExpectError(text + "[task]\nloss = \"mse\"\n", "task.loss (exp.toml line");
  ExpectError(text + "[task]\nmetric = \"r3\"\n", "task.metric");
  ExpectError(Replace(text, "\"hflip\"", "\"vflip\""), "data.augment");
  ExpectError(Replace(text, "classes = 5", "classes = 3"),
              file + ": train.y: label 3 at row 3 is outside [0, 3)");
  ExpectError(Replace(text, "val_size = 4\n", ""), "val_size");
  ExpectError(Replace(kGood, "[data]\n", "[data]\nval_size = 4\n"), "data.val_size");
  ExpectError(Replace(kGood, "[data]\n", "[data]\nformat = \"npz\"\n"), "data.format");
  ExpectError(Replace(kGood, "[data]\n", "[data]\nformat = \"csv\"\n"), "data.format");

  const std::string reg = WriteTensorData("cfg_reg.safetensors", true);
  text = Replace(WithLinearModel(kGood, 1), "[data]\n",
                 "[data]\nformat = \"safetensors\"\npath = \"" + reg + "\"\nval_size = 4\n");
  c = records::ParseExperimentConfig(text + "[task]\nmetric = \"neg_mse\"\n", "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->target, format::TargetKind::kValues);
  ExpectError(text + "[task]\nmetric = \"accuracy\"\n", "float targets");

  // A target of the experiment's metric: negative for neg_mse, refused when
  // no value of the metric can reach it; unset means none.
  EXPECT_FALSE(c->target_metric.has_value());
  const std::string targeted =
      Replace(text, "[population]\n", "[population]\ntarget_metric = -0.05\n");
  c = records::ParseExperimentConfig(targeted + "[task]\nmetric = \"neg_mse\"\n", "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->target_metric, -0.05);
  ExpectError(Replace(text, "[population]\n", "[population]\ntarget_metric = 0.5\n") +
                  "[task]\nmetric = \"neg_mse\"\n",
              "population.target_metric (exp.toml line");
  ExpectError(Replace(text, "[population]\n", "[population]\ntarget_metric = 0.5\n") +
                  "[task]\nmetric = \"neg_mse\"\n",
              "0.5 is outside (-inf, 0] and finite, the range of neg_mse");
  c = records::ParseExperimentConfig(
      Replace(text, "[population]\n", "[population]\ntarget_metric = 0.5\n") +
          "[task]\nmetric = \"r2\"\n",
      "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ExpectError(Replace(kGood, "[population]\n", "[population]\ntarget_metric = -0.5\n"),
              "-0.5 is outside [0, 1], the range of accuracy");
}

// [search_space.dropout] (and [hparams] dropout) is a probability: [0, 1)
// over every value the search can reach (perturbation clamps to min..max).
TEST(ConfigTest, DropoutIsSearchedAsAProbability) {
  const std::string space = "[search_space.dropout]\ntype = \"uniform\"\nmin = 0.1\nmax = 0.6\n";
  auto c = records::ParseExperimentConfig(kGood + space, "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->search_space.at("dropout").max, 0.6);
  ExpectError(kGood + Replace(space, "max = 0.6", "max = 1.0"),
              "search_space.dropout.min/max (exp.toml");
  ExpectError(kGood + Replace(space, "max = 0.6", "max = 1.0"),
              "1 is no dropout probability: it must be in [0, 1)");
  ExpectError(
      std::string(kGood) + "[search_space.dropout]\ntype = \"choice\"\nvalues = [0.2, -0.1]\n",
      "-0.1 is no dropout probability");
  ExpectError(std::string(kGood) + "[hparams]\ndropout = 1.5\n", "hparams.dropout");
  EXPECT_TRUE(
      records::ParseExperimentConfig(std::string(kGood) + "[hparams]\ndropout = 0.3\n", "exp.toml")
          .ok());
}

// The shipped example for your own data parses as written, the tensor file
// aside (a small one here, holding out 4 of its 20 rows instead of 5,000).
TEST(ConfigTest, TheCifarExampleParses) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/examples/cifar10-resnet20-pbt.toml");
  ASSERT_TRUE(in.good());
  std::stringstream text;
  text << in.rdbuf();
  const std::string file = WriteTensorData("cfg_cifar.safetensors", false, {3, 32, 32}, 10);
  std::string toml = Replace(text.str(), "\"cifar10.safetensors\"", "\"" + file + "\"");
  toml = Replace(toml, "val_size = 5000", "val_size = 4");
  auto c = records::ParseExperimentConfig(toml, "cifar10-resnet20-pbt.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->model_spec, "resnet20");
  EXPECT_EQ(c->data_format, format::DatasetFormat::kSafetensors);
  EXPECT_EQ(c->augment.crop_padding, 4);
  EXPECT_TRUE(c->augment.hflip);
  EXPECT_EQ(c->metric, format::MetricKind::kAccuracy);
}

// A stored configuration is read elsewhere (ckpt-tool, perhaps on another
// host) without the files it names; everything else is still checked.
TEST(ConfigTest, FileChecksCanBeSkippedByAReader) {
  const std::string text =
      Replace(kGood, "[data]\n",
              "[data]\nformat = \"safetensors\"\npath = \"/nonexistent/d.safetensors\"\n"
              "val_size = 4\n");
  ExpectError(text, "/nonexistent/d.safetensors");
  auto c = records::ParseExperimentConfig(text, "exp.toml", records::FileChecks::kSkip);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->dataset_path, "/nonexistent/d.safetensors");
  EXPECT_EQ(c->tensor_file.val_size, 4);
  const std::string torchscript =
      Replace(kGood, "spec = \"lenet5\"", "spec = \"torchscript:/nonexistent/m.pt\"");
  EXPECT_TRUE(
      records::ParseExperimentConfig(torchscript, "exp.toml", records::FileChecks::kSkip).ok());
  EXPECT_FALSE(records::ParseExperimentConfig(Replace(text, "val_size = 4", "val_size = -1"),
                                              "exp.toml", records::FileChecks::kSkip)
                   .ok());
}

// A layer list whose output size is not the data's classes (or targets per
// sample) is refused when parsing, naming model.spec and its line, as the
// worker refused it at CONFIGURE (after the store and the experiment were
// created); a layer list that does not fit the data's shape is refused too.
// Read without the file checks (a stored experiment), nothing is judged.
TEST(ConfigTest, AModelWhoseOutputsDisagreeWithTheDataIsRefused) {
  const std::string file = WriteTensorData("cfg_outputs.safetensors", false);
  const std::string data =
      "[data]\nformat = \"safetensors\"\npath = \"" + file + "\"\nval_size = 4\n";
  EXPECT_TRUE(
      records::ParseExperimentConfig(Replace(WithLinearModel(kGood, 4), "[data]\n", data), "e.toml")
          .ok());
  const std::string three = Replace(WithLinearModel(kGood, 3), "[data]\n", data);
  ExpectError(three, "model.spec (exp.toml line 4): the model's last layer has 3 outputs, but " +
                         file + " has 4 classes");
  EXPECT_TRUE(records::ParseExperimentConfig(three, "exp.toml", records::FileChecks::kSkip).ok());
  // [data] classes widens the classes past the labels.
  ExpectError(Replace(Replace(WithLinearModel(kGood, 4), "[data]\n", data), "val_size = 4\n",
                      "val_size = 4\nclasses = 6\n"),
              "has 4 outputs, but " + file + " has 6 classes");
  // Regression targets: one per sample.
  const std::string reg = WriteTensorData("cfg_outputs_reg.safetensors", true);
  const std::string reg_data =
      "[data]\nformat = \"safetensors\"\npath = \"" + reg + "\"\nval_size = 4\n";
  ExpectError(
      Replace(WithLinearModel(kGood, 2), "[data]\n", reg_data) + "[task]\nmetric = \"neg_mse\"\n",
      "has 2 outputs, but " + reg + " has 1 targets per sample");
  // The built-in models against data they do not fit: lenet5's 28x28
  // convolutions on [1, 2, 2] images.
  ExpectError(Replace(kGood, "[data]\n", data), "model.spec (exp.toml line 4): model spec layer");
  // Fashion-MNIST's IDX files: [1, 28, 28], 10 classes.
  ExpectError(WithLinearModel(kGood, 9),
              "has 9 outputs, but /usr/share/datasets/fashion-mnist has 10 classes");
  EXPECT_TRUE(records::ParseExperimentConfig(WithLinearModel(kGood, 10), "exp.toml").ok());
  std::string no_model = Replace(kGood, "[model]\nspec = \"lenet5\"\noptimizer = \"sgd\"\n", "");
  ExpectError(Replace(no_model, "[data]\n", data), "model.spec (exp.toml): the default, lenet5: ");
}

// An IDX file of u8: its header of `dims`, then `bytes`.
void WriteIdx(const std::string& path, const std::vector<uint32_t>& dims,
              const std::vector<uint8_t>& bytes) {
  std::string out = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  out.append(bytes.begin(), bytes.end());
  std::ofstream(path, std::ios::binary) << out;
}

// An IDX directory other than Fashion-MNIST's (as EMNIST's are): the model is
// checked against what its files hold, the train images' [H, W] and 1 + the
// largest label of the train and t10k labels, as the worker reads them.
TEST(ConfigTest, AModelIsCheckedAgainstWhatAnIdxDirectoryHolds) {
  const std::string dir = ::testing::TempDir() + "/cfg_idx_" + std::to_string(getpid());
  ASSERT_EQ(mkdir(dir.c_str(), 0700), 0);
  WriteIdx(dir + "/train-images-idx3-ubyte", {3, 2, 2}, std::vector<uint8_t>(12, 1));
  WriteIdx(dir + "/train-labels-idx1-ubyte", {3}, {0, 1, 4});
  WriteIdx(dir + "/t10k-labels-idx1-ubyte", {2}, {6, 2});
  const std::string data = "[data]\npath = \"" + dir + "\"\n";
  EXPECT_TRUE(
      records::ParseExperimentConfig(Replace(WithLinearModel(kGood, 7), "[data]\n", data), "e.toml")
          .ok());
  ExpectError(Replace(WithLinearModel(kGood, 10), "[data]\n", data),
              "model.spec (exp.toml line 4): the model's last layer has 10 outputs, but " + dir +
                  " has 7 classes");
  // lenet5's 28x28 convolutions on 2x2 images.
  ExpectError(Replace(kGood, "[data]\n", data), "model.spec (exp.toml line 4): model spec layer");
  // A label file the parser cannot read is left to the worker, which names it.
  WriteIdx(dir + "/t10k-labels-idx1-ubyte", {5}, {6, 2});
  EXPECT_TRUE(records::ParseExperimentConfig(Replace(WithLinearModel(kGood, 10), "[data]\n", data),
                                             "e.toml")
                  .ok());
  for (const char* f :
       {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-labels-idx1-ubyte"}) {
    unlink((dir + "/" + f).c_str());
  }
  rmdir(dir.c_str());
}

// dataset = "mnist" without a path reads MNIST's directory, not the default
// Fashion-MNIST one.
TEST(ConfigTest, MnistWithoutAPathIsMnistsDirectory) {
  auto c =
      records::ParseExperimentConfig(Replace(kGood, "[data]\n", "[data]\ndataset = \"mnist\"\n"),
                                     "exp.toml", records::FileChecks::kSkip);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->dataset_path, "/usr/share/datasets/mnist");
}

}  // namespace
}  // namespace ckpt::scheduler
