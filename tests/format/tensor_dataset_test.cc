// TensorDataset: safetensors and .npz files written here byte by byte, the
// way Python's safetensors and np.savez lay them out, then damaged one way at
// a time; every error names the file and the tensor.
#include "ckpt/format/tensor_dataset.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ckpt/format/task.h"
#include "format/tensor_files.h"

namespace ckpt::format {
namespace {

using testing::Array;
using testing::Make;
using testing::Safetensors;

void Put16(std::string* s, uint32_t v) {
  s->push_back(static_cast<char>(v));
  s->push_back(static_cast<char>(v >> 8));
}
void Put32(std::string* s, uint32_t v) {
  Put16(s, v & 0xFFFF);
  Put16(s, v >> 16);
}

// np.savez's layout: a stored zip entry "<name>.npy" per array (CRCs are not
// checked by the reader and left 0 here).
std::string Npz(const std::vector<Array>& arrays, uint16_t method = 0) {
  std::string out, central;
  for (const Array& a : arrays) {
    const char* descr = a.dtype == "U8"    ? "|u1"
                        : a.dtype == "F32" ? "<f4"
                        : a.dtype == "F16" ? "<f2"
                        : a.dtype == "I64" ? "<i8"
                                           : "<f8";
    std::string shape = "(";
    for (int64_t d : a.shape) shape += std::to_string(d) + ", ";
    shape += ")";
    std::string dict =
        "{'descr': '" + std::string(descr) + "', 'fortran_order': False, 'shape': " + shape + ", }";
    while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
    dict += '\n';
    std::string npy = "\x93NUMPY";
    npy += '\x01';
    npy += '\x00';
    Put16(&npy, static_cast<uint32_t>(dict.size()));
    npy += dict + a.bytes;
    const std::string name = a.name + ".npy";
    const uint32_t local = static_cast<uint32_t>(out.size());
    Put32(&out, 0x04034b50);
    Put16(&out, 20);
    Put16(&out, 0);
    Put16(&out, method);
    Put32(&out, 0);
    Put32(&out, 0);
    Put32(&out, static_cast<uint32_t>(npy.size()));
    Put32(&out, static_cast<uint32_t>(npy.size()));
    Put16(&out, static_cast<uint32_t>(name.size()));
    Put16(&out, 0);
    out += name + npy;
    Put32(&central, 0x02014b50);
    Put16(&central, 20);
    Put16(&central, 20);
    Put16(&central, 0);
    Put16(&central, method);
    Put32(&central, 0);
    Put32(&central, 0);
    Put32(&central, static_cast<uint32_t>(npy.size()));
    Put32(&central, static_cast<uint32_t>(npy.size()));
    Put16(&central, static_cast<uint32_t>(name.size()));
    Put16(&central, 0);
    Put16(&central, 0);
    Put16(&central, 0);
    Put16(&central, 0);
    Put32(&central, 0);
    Put32(&central, local);
    central += name;
  }
  const uint32_t cd_offset = static_cast<uint32_t>(out.size());
  out += central;
  Put32(&out, 0x06054b50);
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put16(&out, static_cast<uint32_t>(arrays.size()));
  Put32(&out, static_cast<uint32_t>(central.size()));
  Put32(&out, cd_offset);
  Put16(&out, 0);
  return out;
}

// 12 images [N, 2, 2, 2] u8 whose channel 0 is 10 + label and channel 1 is
// 200; labels 0..2.
std::vector<Array> Images(int64_t n = 12) {
  std::vector<uint8_t> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    y.push_back(i % 3);
    for (int j = 0; j < 4; ++j) x.push_back(static_cast<uint8_t>(10 + i % 3));
    for (int j = 0; j < 4; ++j) x.push_back(200);
  }
  return {Make("train.x", "U8", {n, 2, 2, 2}, x), Make("train.y", "I64", {n}, y)};
}

class TensorDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("ckpt_tensor_dataset_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  TensorDatasetOptions Write(const std::string& name, const std::string& bytes) {
    TensorDatasetOptions o;
    o.path = (dir_ / name).string();
    o.format = name.size() > 4 && name.substr(name.size() - 4) == ".npz"
                   ? DatasetFormat::kNpz
                   : DatasetFormat::kSafetensors;
    std::ofstream(o.path, std::ios::binary) << bytes;
    return o;
  }

  // Opens and expects a failure whose message names the file and `needle`.
  void ExpectError(const TensorDatasetOptions& o, const std::string& needle, bool corruption) {
    auto d = TensorDataset::Open(o);
    ASSERT_FALSE(d.ok()) << needle;
    EXPECT_EQ(d.status().IsCorruption(), corruption) << d.status().ToString();
    EXPECT_NE(d.status().message().find(o.path), std::string::npos) << d.status().ToString();
    EXPECT_NE(d.status().message().find(needle), std::string::npos) << d.status().ToString();
    EXPECT_EQ(d.status().message().find('\n'), std::string::npos);
  }

  std::filesystem::path dir_;
};

TEST_F(TensorDatasetTest, ReadsSplitsStatisticsAndClasses) {
  for (const char* name : {"d.safetensors", "d.npz"}) {
    auto arrays = Images(12);
    std::string bytes =
        std::string(name).find("npz") != std::string::npos ? Npz(arrays) : Safetensors(arrays);
    TensorDatasetOptions o = Write(name, bytes);
    o.val_size = 3;
    auto d = TensorDataset::Open(o);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    const TensorDataset& ds = **d;
    EXPECT_EQ(ds.x_dtype(), DType::kU8);
    EXPECT_EQ(ds.sample_shape(), (std::vector<int64_t>{2, 2, 2}));
    EXPECT_EQ(ds.target(), TargetKind::kClasses);
    EXPECT_EQ(ds.num_classes(), 3);
    EXPECT_EQ(ds.train().count, 9);
    EXPECT_EQ(ds.validation().count, 3);
    EXPECT_EQ(ds.test().count, 0);
    // The validation split is the last 3 train rows, in place.
    EXPECT_EQ(static_cast<const uint8_t*>(ds.validation().x),
              static_cast<const uint8_t*>(ds.train().x) + 9 * 8);
    // Channel 0 holds 10, 11, 12 equally often; channel 1 is constant 200.
    EXPECT_DOUBLE_EQ(ds.mean()[0], 11.0 / 255.0);
    EXPECT_NEAR(ds.stddev()[0], std::sqrt(2.0 / 3.0) / 255.0, 1e-12);
    EXPECT_DOUBLE_EQ(ds.mean()[1], 200.0 / 255.0);
    EXPECT_NEAR(11.0 * ds.scale()[0] + ds.shift()[0], 0.0, 1e-9);
  }
}

TEST_F(TensorDatasetTest, RegressionTargetsAndFeatures) {
  std::vector<float> x, y;
  for (int i = 0; i < 10; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(1.0f);
    y.push_back(0.5f * static_cast<float>(i));
    y.push_back(-1.0f);
  }
  auto o = Write(
      "r.safetensors",
      Safetensors({Make("train.x", "F32", {8, 2}, std::vector<float>(x.begin(), x.begin() + 16)),
                   Make("train.y", "F32", {8, 2}, std::vector<float>(y.begin(), y.begin() + 16)),
                   Make("val.x", "F32", {2, 2}, std::vector<float>(x.begin() + 16, x.end())),
                   Make("val.y", "F32", {2, 2}, std::vector<float>(y.begin() + 16, y.end()))}));
  auto d = TensorDataset::Open(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->target(), TargetKind::kValues);
  EXPECT_EQ((*d)->target_width(), 2);
  EXPECT_EQ((*d)->num_outputs(), 2);
  EXPECT_EQ((*d)->sample_shape(), (std::vector<int64_t>{2}));
  EXPECT_DOUBLE_EQ((*d)->mean()[0], 3.5);  // features 0..7 of the train split
  EXPECT_DOUBLE_EQ((*d)->scale()[0], 1.0 / (*d)->stddev()[0]);
  EXPECT_EQ(DefaultLoss((*d)->target()), LossKind::kMse);
  EXPECT_EQ(DefaultMetric((*d)->target()), MetricKind::kNegMse);
}

TEST_F(TensorDatasetTest, GivenNormalizationAndClasses) {
  auto o = Write("g.safetensors", Safetensors(Images(12)));
  o.val_size = 2;
  o.classes = 5;
  o.mean = {0.5, 0.25};
  o.std = {0.5, 2.0};
  auto d = TensorDataset::Open(o);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)->num_classes(), 5);
  EXPECT_DOUBLE_EQ((*d)->scale()[1], 1.0 / (255.0 * 2.0));
  EXPECT_DOUBLE_EQ((*d)->shift()[0], -1.0);
  o.mean = {0.5};
  ExpectError(o, "one per channel", false);
}

TEST_F(TensorDatasetTest, BadFilesNameFileTensorAndValue) {
  const std::string good = Safetensors(Images(12));
  // Truncated: the data area is shorter than the header says.
  auto o = Write("trunc.safetensors", good.substr(0, good.size() - 5));
  o.val_size = 2;
  ExpectError(o, "train.y", true);
  // A header length beyond the file.
  std::string big = good;
  big[5] = 1;
  o = Write("hdr.safetensors", big);
  ExpectError(o, "beyond the file", true);
  // Wrong dtype.
  auto arrays = Images(12);
  arrays[1].dtype = "F64";
  o = Write("dtype.safetensors", Safetensors(arrays));
  o.val_size = 2;
  ExpectError(o, "train.y: F64 [12]", true);
  // Mismatched N.
  arrays = Images(12);
  arrays[1] = Make("train.y", "I64", {11}, std::vector<int64_t>(11, 1));
  o = Write("n.safetensors", Safetensors(arrays));
  o.val_size = 2;
  ExpectError(o, "train.y: 11 rows, but train.x has 12", true);
  // A label out of range (classes given), and a negative one.
  arrays = Images(12);
  o = Write("label.safetensors", Safetensors(arrays));
  o.val_size = 2;
  o.classes = 2;
  ExpectError(o, "train.y: label 2 at row 2 is outside [0, 2)", true);
  std::vector<int64_t> y(12, 0);
  y[7] = -3;
  y[1] = 1;
  arrays[1] = Make("train.y", "I64", {12}, y);
  o = Write("neg.safetensors", Safetensors(arrays));
  o.val_size = 2;
  ExpectError(o, "train.y: label -3 at row 7", true);
  // A NaN in the features of a val split.
  std::vector<float> fx(8, 1.0f), fy(4, 0.0f);
  std::vector<float> vx = {1, 2, std::numeric_limits<float>::quiet_NaN(), 4};
  o = Write("nan.safetensors",
            Safetensors({Make("train.x", "F32", {4, 2}, fx), Make("train.y", "F32", {4}, fy),
                         Make("val.x", "F32", {2, 2}, vx),
                         Make("val.y", "F32", {2}, std::vector<float>(2, 0.0f))}));
  ExpectError(o, "val.x: NaN at row 1", true);
  // A val split whose shape differs from train's.
  arrays = Images(12);
  arrays.push_back(Make("val.x", "U8", {1, 2, 2, 3}, std::vector<uint8_t>(12, 0)));
  arrays.push_back(Make("val.y", "I64", {1}, std::vector<int64_t>{0}));
  o = Write("shape.safetensors", Safetensors(arrays));
  ExpectError(o, "val.x: shape [1, 2, 2, 3] does not match train.x's [12, 2, 2, 2]", true);
  // An unknown tensor, and a missing y.
  arrays = Images(12);
  arrays.push_back(Make("valid.x", "U8", {1}, std::vector<uint8_t>{0}));
  o = Write("typo.safetensors", Safetensors(arrays));
  ExpectError(o, "valid.x: unknown tensor", true);
  arrays = Images(12);
  arrays.pop_back();
  o = Write("noy.safetensors", Safetensors(arrays));
  ExpectError(o, "train.y: missing", true);
  // val_size: required without a val split, refused with one.
  o = Write("noval.safetensors", Safetensors(Images(12)));
  ExpectError(o, "val_size", false);
}

// A file that is not a tensor file at all (a secret a user names to read it
// through the service): the error names the file and the problem, never its
// bytes, not even the first 8 read as a header length.
TEST_F(TensorDatasetTest, ErrorsOnAFileOfAnotherKindEchoNoneOfItsBytes) {
  const std::string secret = "Q7ZX9KW3M2VJ8L4HT6YB5NR1PD0GFC2XQ9WZ3KM7JV4LH8TY6BN5RP1DG0FC2X\n";
  uint64_t le = 0;
  for (int i = 7; i >= 0; --i)
    le = (le << 8) | static_cast<uint8_t>(secret[static_cast<size_t>(i)]);
  for (const char* name : {"secret.safetensors", "secret.npz"}) {
    auto o = Write(name, secret);
    auto d = TensorDataset::Open(o);
    ASSERT_FALSE(d.ok()) << name;
    const std::string m = d.status().message();
    EXPECT_NE(m.find(o.path), std::string::npos) << m;
    EXPECT_EQ(m.find(std::to_string(le)), std::string::npos) << m;
    for (size_t at = 0; at + 4 <= secret.size(); ++at) {
      ASSERT_EQ(m.find(secret.substr(at, 4)), std::string::npos) << m;
    }
  }
}

// Opened as a model file is: a symbolic link (to a good file) is refused.
TEST_F(TensorDatasetTest, ASymbolicLinkIsRefused) {
  auto o = Write("real.safetensors", Safetensors(Images(12)));
  o.val_size = 2;
  ASSERT_TRUE(TensorDataset::Open(o).ok());
  const std::string link = (dir_ / "link.safetensors").string();
  ASSERT_EQ(symlink(o.path.c_str(), link.c_str()), 0);
  o.path = link;
  ExpectError(o, "is a symbolic link", false);
}

TEST_F(TensorDatasetTest, BadNpz) {
  auto o = Write("c.npz", Npz(Images(12), /*method=*/8));
  o.val_size = 2;
  ExpectError(o, "np.savez_compressed", true);
  auto arrays = Images(12);
  arrays[0].dtype = "F64";
  arrays[0].bytes = std::string(12 * 8 * 8, '\0');
  o = Write("f64.npz", Npz(arrays));
  o.val_size = 2;
  ExpectError(o, "train.x: dtype '<f8'", true);
  std::string cut = Npz(Images(12));
  o = Write("cut.npz", cut.substr(0, cut.size() / 2));
  ExpectError(o, "zip", true);
  o = Write("missing.npz", "");
  std::filesystem::remove(o.path);
  auto d = TensorDataset::Open(o);
  EXPECT_TRUE(d.status().IsNotFound()) << d.status().ToString();
}

TEST(TaskTest, NamesRoundTrip) {
  for (LossKind k : {LossKind::kCrossEntropy, LossKind::kMse}) {
    EXPECT_EQ(*ParseLossKind(LossKindName(k)), k);
  }
  for (MetricKind k : {MetricKind::kAccuracy, MetricKind::kNegMse}) {
    EXPECT_EQ(*ParseMetricKind(MetricKindName(k)), k);
  }
  EXPECT_FALSE(ParseLossKind("l1").ok());
  EXPECT_EQ(*ParseDatasetFormat("npz"), DatasetFormat::kNpz);
  EXPECT_FALSE(ParseDatasetFormat("csv").ok());
}

}  // namespace
}  // namespace ckpt::format
