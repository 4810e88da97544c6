// What `ckpt-tool export` writes of an experiment's data (dataset_stats.h):
// for a tensor file, the per-channel values the workers normalize with
// (TensorDataset's), the input's dtype and shape, and what the model
// outputs; errors name the file and the tensor.
#include "dataset_stats.h"

#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/format/tensor_dataset.h"
#include "format/tensor_files.h"
#include "peak_rss.h"

namespace ckpt::tool {
namespace {

using testing::Make;

class DatasetStatsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        std::filesystem::temp_directory_path() / ("ckpt-dataset-stats-" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // An experiment config whose [data] is the safetensors file `name`, the
  // last 2 train rows held out for validation.
  records::ExperimentConfig Config(const std::string& name, const std::string& bytes) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path, std::ios::binary) << bytes;
    records::ExperimentConfig c;
    c.data_format = format::DatasetFormat::kSafetensors;
    c.dataset_path = path;
    c.tensor_file.val_size = 2;
    return c;
  }

  std::filesystem::path dir_;
};

// 8 float images [8, 3, 2, 2]: channel c of image i is c * 10 + i on every
// pixel, so over the train split (images 0..5) each channel's mean is
// c * 10 + 2.5 and its std that of 0..5.
std::vector<float> ThreeChannels() {
  std::vector<float> x;
  for (int i = 0; i < 8; ++i) {
    for (int c = 0; c < 3; ++c) {
      for (int p = 0; p < 4; ++p) x.push_back(static_cast<float>(c * 10 + i));
    }
  }
  return x;
}

TEST_F(DatasetStatsTest, ATensorFileGivesThePerChannelValuesTheWorkersUse) {
  const std::vector<int64_t> y = {0, 1, 2, 3, 4, 0, 1, 2};
  const auto config =
      Config("rgb.safetensors", testing::Safetensors({
                                    Make("train.x", "F32", {8, 3, 2, 2}, ThreeChannels()),
                                    Make("train.y", "I64", {8}, y),
                                }));
  auto n = ComputeInputNormalization(config);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  const double std05 = std::sqrt(35.0 / 12);  // population std of 0..5
  ASSERT_EQ(n->mean.size(), 3u);
  ASSERT_EQ(n->std.size(), 3u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_NEAR(n->mean[c], c * 10 + 2.5, 1e-9) << c;
    EXPECT_NEAR(n->std[c], std05, 1e-9) << c;
    // Floats are fed x * (1 / std) - mean / std.
    EXPECT_NEAR(n->scale[c], 1 / std05, 1e-9) << c;
    EXPECT_NEAR(n->shift[c], -(c * 10 + 2.5) / std05, 1e-9) << c;
  }
  // Exactly the workers' values: the same reader computes them.
  auto data = format::TensorDataset::Open(config.TensorData());
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(n->scale, (*data)->scale());
  EXPECT_EQ(n->shift, (*data)->shift());
  EXPECT_EQ(n->input_dtype, "float32");
  EXPECT_EQ(n->input_shape, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(n->target, "classes");
  EXPECT_EQ(n->num_classes, 5);
  EXPECT_EQ(n->num_outputs, 5);
}

// ckpt-tool reads a stored experiment's file without its file checks
// (FileChecks::kSkip): the tensor file's path is still the one [data] names.
// When the parser kept the path twice and filled the second copy only while
// checking files, export found no file here and wrote no normalization.
TEST_F(DatasetStatsTest, AStoredConfigurationReadWithoutFileChecksFindsItsTensorFile) {
  const std::vector<int64_t> y = {0, 1, 2, 3, 4, 0, 1, 2};
  const auto written =
      Config("stored.safetensors", testing::Safetensors({
                                       Make("train.x", "F32", {8, 3, 2, 2}, ThreeChannels()),
                                       Make("train.y", "I64", {8}, y),
                                   }));
  const std::string toml = "name = \"st\"\n[data]\nformat = \"safetensors\"\npath = \"" +
                           written.dataset_path +
                           "\"\nval_size = 2\n[population]\nsize = 2\n"
                           "[search_space.lr]\ntype = \"log_uniform\"\nmin = 0.001\nmax = 0.1\n";
  auto stored = records::ParseExperimentConfig(toml, "experiment st", records::FileChecks::kSkip);
  ASSERT_TRUE(stored.ok()) << stored.status().ToString();
  auto n = ComputeInputNormalization(*stored);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->input_shape, (std::vector<int64_t>{3, 2, 2}));
  EXPECT_EQ(n->num_classes, 5);
}

TEST_F(DatasetStatsTest, RegressionTargetsGiveTheirWidthAndNoClasses) {
  // [6, 2] features; the train split is the first 4 rows.
  const std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<float> y = {0.5F, 1, 1.5F, 2, 2.5F, 3, 3.5F, 4, 4.5F, 5, 5.5F, 6};
  const auto config = Config(
      "reg.safetensors",
      testing::Safetensors({Make("train.x", "F32", {6, 2}, x), Make("train.y", "F32", {6, 2}, y)}));
  auto n = ComputeInputNormalization(config);
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(n->target, "values");
  EXPECT_EQ(n->num_classes, 0);
  EXPECT_EQ(n->num_outputs, 2);
  EXPECT_EQ(n->input_shape, (std::vector<int64_t>{2}));
  ASSERT_EQ(n->mean.size(), 2u);
  EXPECT_DOUBLE_EQ(n->mean[0], 4);  // 1, 3, 5, 7
  EXPECT_DOUBLE_EQ(n->mean[1], 5);  // 2, 4, 6, 8
}

TEST_F(DatasetStatsTest, ABadFileIsNamedWithItsTensor) {
  const std::vector<int64_t> y = {0, 1, 2};  // 3 labels for 8 images
  const auto config =
      Config("short.safetensors",
             testing::Safetensors({Make("train.x", "F32", {8, 3, 2, 2}, ThreeChannels()),
                                   Make("train.y", "I64", {3}, y)}));
  auto n = ComputeInputNormalization(config);
  ASSERT_FALSE(n.ok());
  EXPECT_NE(n.status().message().find("short.safetensors"), std::string::npos)
      << n.status().ToString();
  EXPECT_NE(n.status().message().find("train.y"), std::string::npos) << n.status().ToString();
}

TEST_F(DatasetStatsTest, AMissingIdxFileIsNamed) {
  records::ExperimentConfig c;
  c.dataset_path = dir_.string();
  auto n = ComputeInputNormalization(c);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsNotFound()) << n.status().ToString();
  EXPECT_NE(n.status().message().find("train-images-idx3-ubyte"), std::string::npos)
      << n.status().ToString();
}

using ckpt::tool::test_support::PeakRssBytes;

// A gzipped file: an IDX header of `dims` (none when empty), then `zeros`
// zero bytes (however many the dimensions say), streamed through zlib
// without holding them.
void WriteGzIdx(const std::string& path, const std::vector<uint32_t>& dims, size_t zeros) {
  gzFile f = gzopen(path.c_str(), "wb1");
  ASSERT_NE(f, nullptr);
  std::string header;
  if (!dims.empty()) header = {0, 0, 0x08, static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift : {24, 16, 8, 0}) header.push_back(static_cast<char>((d >> shift) & 0xff));
  }
  ASSERT_EQ(gzwrite(f, header.data(), static_cast<unsigned>(header.size())),
            static_cast<int>(header.size()));
  const std::string block(1 << 20, '\0');
  for (size_t left = zeros; left > 0;) {
    const size_t n = std::min(left, block.size());
    ASSERT_EQ(gzwrite(f, block.data(), static_cast<unsigned>(n)), static_cast<int>(n));
    left -= n;
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

// The normalization of `dir`'s IDX files under `cap`, with how much the
// process's peak resident set grew meanwhile.
StatusOr<InputNormalization> NormalizeMeasured(const std::filesystem::path& dir, size_t cap,
                                               int64_t* grown) {
  records::ExperimentConfig c;
  c.dataset_path = dir.string();
  const int64_t before = PeakRssBytes();
  auto n = ComputeInputNormalization(c, cap);
  *grown = PeakRssBytes() - before;
  return n;
}

constexpr size_t kTestCap = size_t{4} << 20;

// A gzip bomb with no IDX header to bound it: refused once the stream passes
// the cap, and memory never holds what the stream expands to (64 times the
// cap; `ckpt-tool export` used to read it whole).
TEST_F(DatasetStatsTest, AGzipBombIsRefusedAtTheCapWhileStreaming) {
  WriteGzIdx((dir_ / "train-images-idx3-ubyte.gz").string(), {}, 64 * kTestCap);
  int64_t grown = 0;
  auto n = NormalizeMeasured(dir_, kTestCap, &grown);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsInvalidArgument()) << n.status().ToString();
  EXPECT_NE(n.status().message().find((dir_ / "train-images-idx3-ubyte.gz").string() +
                                      ": holds more than 4194304 bytes, the cap of an IDX file"),
            std::string::npos)
      << n.status().ToString();
  EXPECT_LT(grown, static_cast<int64_t>(4 * kTestCap)) << "the bomb expands to " << 64 * kTestCap;
}

// A gzip bomb behind an IDX header that claims less than the cap: refused
// once the stream passes the claim, memory bounded as above.
TEST_F(DatasetStatsTest, AGzipBombPastItsHeadersClaimIsRefusedWhileStreaming) {
  WriteGzIdx((dir_ / "train-images-idx3-ubyte.gz").string(), {10001, 20, 20}, 64 * kTestCap);
  int64_t grown = 0;
  auto n = NormalizeMeasured(dir_, kTestCap, &grown);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsCorruption()) << n.status().ToString();
  EXPECT_NE(n.status().message().find("train-images-idx3-ubyte.gz: holds more than the " +
                                      std::to_string(10001 * 20 * 20 + 16) +
                                      " bytes its IDX header claims"),
            std::string::npos)
      << n.status().ToString();
  EXPECT_LT(grown, static_cast<int64_t>(4 * kTestCap)) << "the bomb expands to " << 64 * kTestCap;
}

// A 40-byte file whose header claims 2^40 bytes: refused by what it claims,
// under the real cap, before anything is allocated for it.
TEST_F(DatasetStatsTest, AnIdxHeaderClaimingPastTheCapIsRefused) {
  WriteGzIdx((dir_ / "train-images-idx3-ubyte.gz").string(), {1u << 20, 1u << 10, 1u << 10}, 0);
  records::ExperimentConfig c;
  c.dataset_path = dir_.string();
  auto n = ComputeInputNormalization(c);
  ASSERT_FALSE(n.ok());
  EXPECT_TRUE(n.status().IsInvalidArgument()) << n.status().ToString();
  EXPECT_NE(n.status().message().find("train-images-idx3-ubyte.gz: its IDX dimensions claim " +
                                      std::to_string((uint64_t{1} << 40) + 16) +
                                      " bytes, more than " + std::to_string(kMaxIdxFileBytes) +
                                      " bytes, the cap of an IDX file"),
            std::string::npos)
      << n.status().ToString();
}

}  // namespace
}  // namespace ckpt::tool
