#include "ckpt/format/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <random>

#include "ckpt/format/checksum.h"

namespace ckpt::format {
namespace {

using json = nlohmann::json;

std::vector<uint8_t> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

constexpr char kSumField[] = "\"ckpt.header_xxh3\":\"";

// A blob with a hand-written JSON header, padded so the data area is aligned,
// its header checksum filled in where the header has the field.
std::string RawBlob(const std::string& header_json, const std::string& data) {
  size_t padded = (8 + header_json.size() + 63) / 64 * 64;
  std::string out(padded, ' ');
  uint64_t n = padded - 8;
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  std::memcpy(out.data() + 8, header_json.data(), header_json.size());
  size_t at = out.find(kSumField);
  if (at != std::string::npos) {
    std::string sum = HexU64(Xxh3_64(out.data(), out.size()));
    out.replace(at + std::strlen(kSumField), 16, sum);
  }
  return out + data;
}

// A field that makes a hand-written header's checksum check pass, so that
// later checks are reached.
const std::string kSumEntry = std::string(kSumField) + "0000000000000000\"";

json MetaWithSums(const std::map<std::string, std::string>& tensors_data) {
  json sums = json::object();
  for (const auto& [name, bytes] : tensors_data)
    sums[name] = HexU64(Xxh3_64(bytes.data(), bytes.size()));
  return {{"ckpt.format_version", "1"},
          {"ckpt.checksums", sums.dump()},
          {"ckpt.header_xxh3", "0000000000000000"}};
}

TEST(CheckpointTest, RoundTripIsBitExactForEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI64,
                          DType::kI32, DType::kI16, DType::kI8,  DType::kU8,   DType::kBool};
  struct Case {
    std::vector<int64_t> shape;
  };
  const std::vector<std::vector<int64_t>> shapes = {{}, {0}, {3, 0, 2}, {7}, {2, 3, 5}};
  std::vector<std::vector<uint8_t>> storage;
  CheckpointWriter w;
  CheckpointMeta meta;
  meta.model_spec = "lenet5";
  meta.optimizer = "sgd";
  meta.hparams = {{"lr", 0.0125}, {"momentum", 0.9}, {"weight_decay", 1e-4}};
  meta.step = 12345;
  meta.data_seed = 0xfeedfacecafebeefULL;
  meta.data_cursor = 777;
  meta.extra["user.note"] = "kept verbatim";
  w.SetMeta(meta);
  int i = 0;
  for (DType d : dtypes) {
    for (const auto& shape : shapes) {
      int64_t numel = 1;
      for (auto s : shape) numel *= s;
      storage.push_back(RandomBytes(numel * DTypeSize(d), i));
      const std::string name = "t" + std::to_string(i++) + "." + std::string(DTypeName(d));
      ASSERT_TRUE(w.AddTensor(name, d, shape, storage.back().data(), storage.back().size()).ok());
    }
  }
  std::string blob = w.Encode();
  ASSERT_EQ(blob.size(), w.EncodedSize());

  auto view = ParseCheckpoint(blob.data(), blob.size());
  ASSERT_TRUE(view.ok()) << view.status().ToString();
  EXPECT_EQ(view->header_bytes() % kDataAlignment, 0u);
  EXPECT_EQ(view->meta().model_spec, "lenet5");
  EXPECT_EQ(view->meta().optimizer, "sgd");
  EXPECT_EQ(view->meta().hparams, meta.hparams);
  EXPECT_EQ(view->meta().step, 12345);
  EXPECT_EQ(view->meta().data_seed, meta.data_seed);
  EXPECT_EQ(view->meta().data_cursor, 777u);
  EXPECT_EQ(view->meta().extra.at("user.note"), "kept verbatim");
  ASSERT_EQ(view->tensors().size(), storage.size());
  i = 0;
  for (DType d : dtypes) {
    for (const auto& shape : shapes) {
      const std::string name = "t" + std::to_string(i) + "." + std::string(DTypeName(d));
      const TensorView* t = view->Find(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->dtype, d);
      EXPECT_EQ(t->shape, shape);
      ASSERT_EQ(t->nbytes, storage[i].size());
      // (memcmp of an empty, possibly null range is undefined: UBSan.)
      if (t->nbytes > 0) {
        EXPECT_EQ(0, std::memcmp(t->data, storage[i].data(), t->nbytes)) << name;
      }
      // Zero-copy: the view points into the blob.
      EXPECT_GE(reinterpret_cast<const char*>(t->data), blob.data());
      EXPECT_LE(reinterpret_cast<const char*>(t->data) + t->nbytes, blob.data() + blob.size());
      ++i;
    }
  }
  // Tensors come back in data (insertion) order.
  EXPECT_EQ(view->tensors().front().name, "t0.F64");
}

TEST(CheckpointTest, EncodeToWritesInPlaceAndChecksSize) {
  std::vector<float> x = {1, 2, 3};
  CheckpointWriter w;
  ASSERT_TRUE(w.AddTensor("fc.weight", DType::kF32, {3}, x.data(), 12).ok());
  std::vector<uint8_t> buf(w.EncodedSize());
  EXPECT_TRUE(w.EncodeTo(buf.data(), buf.size() - 1).IsInvalidArgument());
  ASSERT_TRUE(w.EncodeTo(buf.data(), buf.size()).ok());
  EXPECT_EQ(std::string(buf.begin(), buf.end()), w.Encode());
}

TEST(CheckpointTest, WriterRejectsBadTensors) {
  float x[4] = {};
  CheckpointWriter w;
  EXPECT_TRUE(w.AddTensor("", DType::kF32, {1}, x, 4).IsInvalidArgument());
  EXPECT_TRUE(w.AddTensor("__metadata__", DType::kF32, {1}, x, 4).IsInvalidArgument());
  EXPECT_TRUE(w.AddTensor("a", DType::kF32, {2}, x, 4).IsInvalidArgument());
  EXPECT_TRUE(w.AddTensor("a", DType::kF32, {-1}, x, 4).IsInvalidArgument());
  ASSERT_TRUE(w.AddTensor("a", DType::kF32, {1}, x, 4).ok());
  Status dup = w.AddTensor("a", DType::kF32, {1}, x, 4);
  EXPECT_TRUE(dup.IsInvalidArgument());
  EXPECT_NE(dup.message().find("a"), std::string::npos);
}

void ExpectCorruption(const std::string& blob, const std::string& needle,
                      const ReadOptions& options = ReadOptions()) {
  auto r = ParseCheckpoint(blob.data(), blob.size(), options);
  ASSERT_FALSE(r.ok()) << "accepted a blob that should fail with '" << needle << "'";
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().ToString();
}

std::string TensorJson(const std::string& dtype, json shape, uint64_t b, uint64_t e) {
  return json{{"dtype", dtype}, {"shape", shape}, {"data_offsets", {b, e}}}.dump();
}

TEST(CheckpointTest, EveryCorruptionCaseIsDetectedAndNamed) {
  const std::string a(16, 'a'), b(8, 'b');
  json meta = MetaWithSums({{"w", a}, {"v", b}});
  auto header = [&](const std::string& w_entry, const std::string& v_entry) {
    return "{\"__metadata__\":" + meta.dump() + ",\"w\":" + w_entry + ",\"v\":" + v_entry + "}";
  };
  // Sanity: the well-formed version parses.
  std::string good =
      RawBlob(header(TensorJson("F32", {4}, 0, 16), TensorJson("U8", {8}, 16, 24)), a + b);
  ASSERT_TRUE(ParseCheckpoint(good.data(), good.size()).ok());

  // Header length beyond the blob.
  std::string longer = good;
  longer[5] = 1;
  ExpectCorruption(longer, "beyond the blob");
  ExpectCorruption(std::string(5, '\0'), "shorter than 8");
  // Header length above the configured cap.
  ReadOptions small;
  small.max_header_bytes = 32;
  ExpectCorruption(good, "above the cap", small);
  // Malformed JSON.
  ExpectCorruption(RawBlob("{\"m\":{" + kSumEntry + "}, \"w\": [1, 2", ""), "not valid JSON");
  ExpectCorruption(RawBlob("[{" + kSumEntry + "}]", ""), "not a JSON object");
  // Header checksum missing, or not matching the header.
  ExpectCorruption(RawBlob("{}", ""), "no single ckpt.header_xxh3");
  std::string edited = good;
  edited[edited.find("\"F32\"") + 1] = 'I';
  ExpectCorruption(edited, "header checksum mismatch");
  // Unknown dtype.
  ExpectCorruption(
      RawBlob(header(TensorJson("F33", {4}, 0, 16), TensorJson("U8", {8}, 16, 24)), a + b),
      "tensor w: unknown dtype");
  // Shape product overflow.
  ExpectCorruption(RawBlob(header(TensorJson("F32", {4611686018427387904ULL, 4}, 0, 16),
                                  TensorJson("U8", {8}, 16, 24)),
                           a + b),
                   "tensor w");
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {-4}, 0, 16), TensorJson("U8", {8}, 16, 24)), a + b),
      "tensor w: shape");
  // Byte count that does not match dtype x shape.
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {3}, 0, 16), TensorJson("U8", {8}, 16, 24)), a + b),
      "tensor w: 16 bytes do not match");
  // Offsets out of bounds.
  ExpectCorruption(RawBlob(header(TensorJson("F32", {4}, 0, 16), TensorJson("U8", {8}, 16, 24)), a),
                   "tensor v: data_offsets [16, 24] out of bounds");
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {4}, 16, 0), TensorJson("U8", {8}, 16, 24)), a + b),
      "tensor w: data_offsets");
  // Overlapping.
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {4}, 0, 16), TensorJson("U8", {8}, 8, 16)), a + b),
      "overlaps");
  // Hole.
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {4}, 0, 16), TensorJson("U8", {8}, 20, 28)), a + "xxxx" + b),
      "tensor v: leaves a hole");
  // Trailing bytes.
  ExpectCorruption(
      RawBlob(header(TensorJson("F32", {4}, 0, 16), TensorJson("U8", {8}, 16, 24)), a + b + "z"),
      "trailing bytes");
  // Checksum mismatch.
  std::string flipped = good;
  flipped[flipped.size() - 1] ^= 1;
  ExpectCorruption(flipped, "tensor v: checksum mismatch");
  // Missing checksum.
  json no_sums = {{"ckpt.format_version", "1"}, {"ckpt.header_xxh3", "0000000000000000"}};
  ExpectCorruption(RawBlob("{\"__metadata__\":" + no_sums.dump() +
                               ",\"w\":" + TensorJson("F32", {4}, 0, 16) + "}",
                           a),
                   "tensor w: no checksum");
  // Data area not aligned.
  std::string unaligned = good;
  unaligned[0] = static_cast<char>(unaligned[0] - 1);
  ExpectCorruption(unaligned, "aligned");
}

TEST(CheckpointTest, NewerFormatVersionIsRefusedClearly) {
  json meta = {{"ckpt.format_version", "2"},
               {"ckpt.checksums", "{}"},
               {"ckpt.header_xxh3", "0000000000000000"}};
  std::string blob = RawBlob("{\"__metadata__\":" + meta.dump() + "}", "");
  auto r = ParseCheckpoint(blob.data(), blob.size());
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(r.status().IsInvalidArgument());
  EXPECT_NE(r.status().message().find("version 2"), std::string::npos);
}

TEST(CheckpointTest, AnySingleByteFlipIsDetected) {
  std::vector<float> w(1000), m(1000);
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = 0.001f * static_cast<float>(i);
    m[i] = -0.5f * static_cast<float>(i);
  }
  CheckpointWriter writer;
  writer.mutable_meta().hparams["lr"] = 0.1;
  ASSERT_TRUE(writer.AddTensor("fc1.weight", DType::kF32, {10, 100}, w.data(), 4000).ok());
  ASSERT_TRUE(
      writer.AddTensor("optim.fc1.weight.momentum_buffer", DType::kF32, {10, 100}, m.data(), 4000)
          .ok());
  const std::string blob = writer.Encode();
  std::mt19937 rng(7);
  int detected = 0, tried = 0;
  for (size_t pos = 0; pos < blob.size(); pos += 1 + rng() % 37) {
    std::string bad = blob;
    bad[pos] = static_cast<char>(bad[pos] ^ (1 << (rng() % 8)));
    ++tried;
    auto r = ParseCheckpoint(bad.data(), bad.size());
    EXPECT_FALSE(r.ok()) << "undetected flip at byte " << pos;
    if (!r.ok()) {
      EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
      ++detected;
    }
  }
  EXPECT_GT(tried, 100);
  EXPECT_EQ(detected, tried);
}

}  // namespace
}  // namespace ckpt::format
