#include "ckpt/scheduler/config.h"

#include <gtest/gtest.h>

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
  auto c = ParseExperimentConfig(text, "exp.toml");
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
  auto c = ParseExperimentConfig(kGood, "exp.toml");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->name, "t1");
  EXPECT_EQ(c->seed, 7u);
  EXPECT_EQ(c->batch_size, 32);
  EXPECT_EQ(c->eval_size, 500);
  EXPECT_EQ(c->population, 6);
  EXPECT_EQ(c->steps_per_interval, 20);
  EXPECT_EQ(c->intervals, 4);
  ASSERT_EQ(c->search_space.size(), 3u);
  EXPECT_EQ(c->search_space["lr"].kind, SearchDim::Kind::kLogUniform);
  EXPECT_EQ(c->search_space["nesterov"].values.size(), 2u);
  EXPECT_EQ(c->policy.mode, PolicyMode::kAsync);
  EXPECT_DOUBLE_EQ(c->policy.quantile, 0.25);
  ASSERT_EQ(c->devices.size(), 1u);
  EXPECT_EQ(c->devices[0].count, 2);
  EXPECT_EQ(c->source, kGood);
}

TEST(ConfigTest, UnknownKeyNamesKeyAndLine) {
  ExpectError(Replace(kGood, "size = 6", "size = 6\nsizes = 7"), "population.sizes (exp.toml line 11): unknown key");
  ExpectError(Replace(kGood, "seed = 7", "sed = 7"), "sed (exp.toml line 2): unknown key");
  ExpectError(Replace(kGood, "slots = 2", "slot = 2"), "devices[0].slot");
}

TEST(ConfigTest, WrongTypeNamesKeyAndLine) {
  ExpectError(Replace(kGood, "size = 6", "size = \"six\""), "population.size (exp.toml line 10): must be an integer");
  ExpectError(Replace(kGood, "min = 0.001", "min = \"small\""), "search_space.lr.min (exp.toml line 15)");
  ExpectError(Replace(kGood, "[model]", "model = 3\n[modelx]"), "model");
}

TEST(ConfigTest, BadValuesAreRefused) {
  ExpectError(Replace(kGood, "size = 6", "size = 0"), "population.size (exp.toml line 10): must be in [1");
  ExpectError(Replace(kGood, "optimizer = \"sgd\"", "optimizer = \"lbfgs\""), "model.optimizer");
  ExpectError(Replace(kGood, "kind = \"pbt\"", "kind = \"hyperband\""), "policy.kind");
  ExpectError(Replace(kGood, "max = 0.1", "max = 0.0001"), "search_space.lr.max");
  ExpectError(Replace(kGood, "device = \"cpu\"", "device = \"tpu\""), "devices[0].device");
  ExpectError(Replace(kGood, "name = \"t1\"", "name = \"a b\""), "name");
  ExpectError("name = \"x\"\n[population]\nsize = [", "exp.toml line 3");
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
  auto c = LoadExperimentConfig("/nonexistent/exp.toml");
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().IsNotFound());
  EXPECT_NE(c.status().message().find("/nonexistent/exp.toml"), std::string::npos);
}

}  // namespace
}  // namespace ckpt::scheduler
