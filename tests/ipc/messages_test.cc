// Message encodings: round trips, in-place state, and every way a decoder
// must refuse untrusted bytes.
#include "ckpt/ipc/messages.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/ipc/sha256.h"

namespace ckpt::ipc {
namespace {

template <typename M>
std::vector<uint8_t> EncodeToVector(const M& m) {
  std::vector<uint8_t> out(EncodedSize(m));
  EXPECT_TRUE(Encode(m, out.data(), out.size()).ok());
  return out;
}

std::vector<uint8_t> WithJson(const std::string& json, size_t pad_to = 0) {
  std::vector<uint8_t> out(4 + json.size());
  const auto n = static_cast<uint32_t>(json.size());
  std::memcpy(out.data(), &n, 4);
  std::memcpy(out.data() + 4, json.data(), json.size());
  if (pad_to > out.size()) out.resize(pad_to, 0);
  return out;
}

TEST(MessagesTest, HelloConfigureFailedStatsShutdownRoundTrip) {
  Hello h{"cuda:0", 80LL << 30, 4, true, "fused", 4242, "0.1.0"};
  auto hb = EncodeToVector(h);
  auto hd = DecodeHello(hb.data(), hb.size());
  ASSERT_TRUE(hd.ok()) << hd.status().ToString();
  EXPECT_EQ(hd->device, "cuda:0");
  EXPECT_EQ(hd->memory_bytes, 80LL << 30);
  EXPECT_EQ(hd->slots, 4);
  EXPECT_TRUE(hd->fusion);
  EXPECT_EQ(hd->mode, "fused");
  EXPECT_EQ(hd->pid, 4242);

  Configure c;
  c.experiment = "exp1";
  c.model_spec = R"([{"conv2d":[1,6,5]}])";
  c.model_sha256 = std::string(32, 'a') + std::string(32, '7');
  c.batch_size = 128;
  c.seed = ~uint64_t{0};
  c.optimizer = format::OptimizerKind::kAdamW;
  format::TensorDatasetOptions tensor;
  tensor.format = format::DatasetFormat::kNpz;
  tensor.path = "/data/set.npz";
  tensor.val_size = 500;
  tensor.classes = 12;
  tensor.mean = {0.25, 0.5};
  tensor.std = {1.5, 2};
  c.tensor_data = tensor;
  c.loss = format::LossKind::kMse;
  c.metric = format::MetricKind::kNegMse;
  c.augment.crop_padding = 4;
  c.augment.hflip = true;
  auto cb = EncodeToVector(c);
  auto cd = DecodeConfigure(cb.data(), cb.size());
  ASSERT_TRUE(cd.ok()) << cd.status().ToString();
  EXPECT_EQ(cd->model_spec, c.model_spec);
  EXPECT_EQ(cd->model_sha256, c.model_sha256);
  EXPECT_EQ(cd->optimizer, format::OptimizerKind::kAdamW);
  ASSERT_TRUE(cd->tensor_data.has_value());
  EXPECT_EQ(cd->tensor_data->format, format::DatasetFormat::kNpz);
  EXPECT_EQ(cd->tensor_data->path, "/data/set.npz");
  EXPECT_EQ(cd->dataset_path, "") << "the tensor file's path travels once";
  EXPECT_EQ(cd->tensor_data->val_size, 500);
  EXPECT_EQ(cd->tensor_data->classes, 12);
  EXPECT_EQ(cd->tensor_data->mean, tensor.mean);
  EXPECT_EQ(cd->tensor_data->std, tensor.std);
  EXPECT_EQ(cd->loss, format::LossKind::kMse);
  EXPECT_EQ(cd->metric, format::MetricKind::kNegMse);
  EXPECT_EQ(cd->augment.crop_padding, 4);
  EXPECT_TRUE(cd->augment.hflip);
  EXPECT_EQ(cd->batch_size, 128);
  EXPECT_EQ(cd->seed, ~uint64_t{0});

  Configure idx;
  idx.experiment = "exp2";
  idx.dataset = "mnist";
  idx.dataset_path = "/usr/share/datasets/mnist";
  auto ib = EncodeToVector(idx);
  auto id = DecodeConfigure(ib.data(), ib.size());
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_FALSE(id->tensor_data.has_value());
  EXPECT_EQ(id->dataset, "mnist");
  EXPECT_EQ(id->dataset_path, "/usr/share/datasets/mnist");
  EXPECT_FALSE(id->loss.has_value()) << "unset: the data's default";
  EXPECT_FALSE(id->metric.has_value());
  EXPECT_EQ(id->optimizer, format::OptimizerKind::kSgd);

  Failed f{17, "exp1", "m3", FailureCode::kNonFinite, "loss is NaN at step 40"};
  auto fb = EncodeToVector(f);
  auto fd = DecodeFailed(fb.data(), fb.size());
  ASSERT_TRUE(fd.ok());
  EXPECT_EQ(fd->task_id, 17u);
  EXPECT_EQ(fd->experiment, "exp1");
  EXPECT_EQ(fd->member, "m3");
  EXPECT_EQ(fd->code, FailureCode::kNonFinite);
  EXPECT_EQ(fd->reason, f.reason);

  Stats s{1234.5, 99, 8, 3, "plain", 1 << 20, 2 << 20};
  auto sb = EncodeToVector(s);
  auto sd = DecodeStats(sb.data(), sb.size());
  ASSERT_TRUE(sd.ok());
  EXPECT_DOUBLE_EQ(sd->samples_per_s, 1234.5);
  EXPECT_EQ(sd->slots_busy, 3);

  Shutdown d{"bye"};
  auto db = EncodeToVector(d);
  auto dd = DecodeShutdown(db.data(), db.size());
  ASSERT_TRUE(dd.ok());
  EXPECT_EQ(dd->reason, "bye");
}

// The model file's hash CONFIGURE carries: SHA-256's known answer, streamed
// or whole, and a value that is not 64 lowercase hex digits is refused.
TEST(MessagesTest, ConfigureCarriesTheModelFilesSha256) {
  const std::string abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
  EXPECT_EQ(Sha256Hex("abc"), abc);
  Sha256Hasher h;
  h.Update("a");
  h.Update("");
  h.Update("bc");
  EXPECT_EQ(h.FinalHex(), abc);
  EXPECT_TRUE(IsSha256Hex(abc));
  EXPECT_FALSE(IsSha256Hex(abc.substr(1)));
  Configure c;
  c.experiment = "e";
  c.model_sha256 = "ABC";
  auto bytes = EncodeToVector(c);
  auto d = DecodeConfigure(bytes.data(), bytes.size());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("model_sha256"), std::string::npos) << d.status().ToString();
  c.model_sha256 = "";
  bytes = EncodeToVector(c);
  d = DecodeConfigure(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->model_sha256, "");
}

TEST(MessagesTest, TrainAndResultCarryTheirStateAligned) {
  std::vector<uint8_t> state(1000);
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 13);
  Train t;
  t.task_id = 5;
  t.experiment = "exp";
  t.member = "m7";
  t.version = 12;
  t.steps = 500;
  t.hparams = {{"lr", 0.01}, {"momentum", 0.9}};
  t.state = {state.data(), state.size()};
  auto tb = EncodeToVector(t);
  auto td = DecodeTrain(tb.data(), tb.size());
  ASSERT_TRUE(td.ok()) << td.status().ToString();
  EXPECT_EQ(td->experiment, "exp");
  EXPECT_EQ(td->member, "m7");
  EXPECT_EQ(td->steps, 500);
  EXPECT_DOUBLE_EQ(td->hparams.at("lr"), 0.01);
  ASSERT_EQ(td->state.size, state.size());
  EXPECT_EQ((td->state.data - tb.data()) % 64, 0);
  EXPECT_EQ(std::memcmp(td->state.data, state.data(), state.size()), 0);

  Result r;
  r.task_id = 5;
  r.experiment = "exp";
  r.member = "m7";
  r.step = 500;
  r.train_loss = std::nan("");
  r.val_score = 0.875;
  r.state = {state.data(), state.size()};
  auto rb = EncodeToVector(r);
  auto rd = DecodeResult(rb.data(), rb.size());
  ASSERT_TRUE(rd.ok()) << rd.status().ToString();
  EXPECT_EQ(rd->experiment, "exp");
  EXPECT_EQ(rd->member, "m7");
  EXPECT_TRUE(std::isnan(rd->train_loss));  // non-finite travels as null
  EXPECT_DOUBLE_EQ(rd->val_score, 0.875);
  EXPECT_TRUE(std::isnan(rd->test_score));  // not evaluated: null
  EXPECT_EQ(std::memcmp(rd->state.data, state.data(), state.size()), 0);
}

TEST(MessagesTest, EmptyStateRoundTrips) {
  Train t;
  t.member = "m";
  auto tb = EncodeToVector(t);
  auto td = DecodeTrain(tb.data(), tb.size());
  ASSERT_TRUE(td.ok()) << td.status().ToString();
  EXPECT_EQ(td->state.size, 0u);
}

TEST(MessagesTest, HeaderOnlyEncodingLeavesTheStateToTheCaller) {
  std::vector<uint8_t> state(4096, 0x5c);
  Result r;
  r.member = "exp/1";
  r.state = {nullptr, state.size()};
  std::vector<uint8_t> buf(EncodedSize(r));
  auto offset = EncodeHeaderOnly(r, buf.data(), buf.size());
  ASSERT_TRUE(offset.ok()) << offset.status().ToString();
  EXPECT_EQ(*offset % 64, 0u);
  EXPECT_EQ(*offset + state.size(), buf.size());
  std::memcpy(buf.data() + *offset, state.data(), state.size());
  auto rd = DecodeResult(buf.data(), buf.size());
  ASSERT_TRUE(rd.ok()) << rd.status().ToString();
  EXPECT_EQ(rd->state.data, buf.data() + *offset);
  // Plain Encode refuses a state without bytes.
  EXPECT_TRUE(Encode(r, buf.data(), buf.size()).IsInvalidArgument());
}

TEST(MessagesTest, StatePrefixAndStateAreTheEncodedMessage) {
  std::vector<uint8_t> state(5000);
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 13);
  Train t;
  t.task_id = 9;
  t.member = "exp/3";
  t.hparams = {{"lr", 0.01}};
  t.state = {state.data(), state.size()};
  auto prefix = EncodeStatePrefix(t);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  std::vector<uint8_t> joined = *prefix;
  joined.insert(joined.end(), state.begin(), state.end());
  EXPECT_EQ(joined, EncodeToVector(t));
  Result r;
  r.member = "exp/3";
  r.state = {nullptr, state.size()};  // only its size is read
  auto rp = EncodeStatePrefix(r);
  ASSERT_TRUE(rp.ok()) << rp.status().ToString();
  EXPECT_EQ(rp->size() + state.size(), EncodedSize(r));
}

TEST(MessagesTest, StateOffsetStaysConsistentAcrossDigitBoundaries) {
  // JSON lengths around multiples of 64 change the offset's digit count.
  for (size_t len = 0; len < 300; ++len) {
    Train t;
    t.member = std::string(len, 'm');
    std::vector<uint8_t> state(len % 7);
    t.state = {state.data(), state.size()};
    auto tb = EncodeToVector(t);
    auto td = DecodeTrain(tb.data(), tb.size());
    ASSERT_TRUE(td.ok()) << len << ": " << td.status().ToString();
  }
}

TEST(MessagesTest, WrongBufferSizeIsInvalidArgument) {
  Hello h;
  std::vector<uint8_t> buf(EncodedSize(h) + 1);
  EXPECT_TRUE(Encode(h, buf.data(), buf.size()).IsInvalidArgument());
}

TEST(MessagesTest, InvalidUtf8IsReplacedNotThrown) {
  Failed f;
  f.member = "m";
  f.code = FailureCode::kInternal;
  f.reason = "bad \xff\xfe bytes";
  auto fb = EncodeToVector(f);
  auto fd = DecodeFailed(fb.data(), fb.size());
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  EXPECT_NE(fd->reason.find("bad"), std::string::npos);
}

// A payload with `key` set to `value` in the JSON of `m` (encoded), re-encoded
// with the message layout: how a peer of another version (or a liar) writes.
template <typename M>
std::vector<uint8_t> WithField(const M& m, const std::string& key, const nlohmann::json& value) {
  std::vector<uint8_t> buf = EncodeToVector(m);
  uint32_t len = 0;
  std::memcpy(&len, buf.data(), 4);
  nlohmann::json j = nlohmann::json::parse(buf.begin() + 4, buf.begin() + 4 + len);
  j[key] = value;
  const std::string text = j.dump();
  std::vector<uint8_t> out(4 + text.size());
  const auto n = static_cast<uint32_t>(text.size());
  std::memcpy(out.data(), &n, 4);
  std::memcpy(out.data() + 4, text.data(), text.size());
  return out;
}

TEST(MessagesTest, ConfigureKindsAreTypedAndAnUnknownNameIsCorruptionNamingTheField) {
  Configure c;
  c.experiment = "e";
  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"data_format", "parquet"},
                                                        {"loss", "hinge"},
                                                        {"metric", "f1"},
                                                        {"optimizer", "lion"}}) {
    auto bytes = WithField(c, key, value);
    auto d = DecodeConfigure(bytes.data(), bytes.size());
    ASSERT_FALSE(d.ok()) << key;
    EXPECT_TRUE(d.status().IsCorruption()) << d.status().ToString();
    EXPECT_NE(d.status().message().find("field '" + key + "'"), std::string::npos)
        << d.status().ToString();
    EXPECT_NE(d.status().message().find(value), std::string::npos) << d.status().ToString();
  }
  auto bytes = WithField(c, "augment", nlohmann::json::array({"rotate:90"}));
  auto d = DecodeConfigure(bytes.data(), bytes.size());
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("field 'augment'"), std::string::npos)
      << d.status().ToString();
}

TEST(MessagesTest, ANewerWorkersUnknownFailureCodeReadsAsInternal) {
  Failed f;
  f.task_id = 3;
  f.member = "m0";
  auto bytes = WithField(f, "code", "gpu_on_fire");
  auto d = DecodeFailed(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->code, FailureCode::kInternal);
  bytes = WithField(f, "code", "out-of-memory");  // an older worker's spelling
  d = DecodeFailed(bytes.data(), bytes.size());
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->code, FailureCode::kOutOfMemory);
}

TEST(MessagesTest, UntrustedBytesAreRefusedWithCorruption) {
  const std::vector<std::vector<uint8_t>> bad = {
      {},
      {1, 2},
      {0xff, 0xff, 0xff, 0x7f, '{', '}'},                       // length beyond the payload
      WithJson("{"),                                            // truncated
      WithJson("[1,2]"),                                        // not an object
      WithJson(R"({"device":5})"),                              // wrong type
      WithJson(R"({"device":"cpu"} trailing)"),                 // not JSON
      WithJson(std::string(100, '[') + std::string(100, ']')),  // too deep
  };
  for (const auto& b : bad) {
    auto r = DecodeHello(b.data(), b.size());
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  }
  auto plain = WithJson(R"({"device":"cpu"})");
  ASSERT_TRUE(DecodeHello(plain.data(), plain.size()).ok());
  plain.push_back(0);  // bytes after the JSON of a message without state
  EXPECT_TRUE(DecodeHello(plain.data(), plain.size()).status().IsCorruption());

  auto missing = WithJson(R"({"member":"m"})");
  EXPECT_TRUE(DecodeTrain(missing.data(), missing.size()).status().IsCorruption());
  auto neg = WithJson(
      R"({"task_id":-1,"experiment":"e","member":"m","steps":1,"state_offset":128,"state_bytes":0})",
      128);
  EXPECT_TRUE(DecodeTrain(neg.data(), neg.size()).status().IsCorruption());
  auto big = WithJson(R"({"experiment":"e","batch_size":4294967296})");
  EXPECT_TRUE(DecodeConfigure(big.data(), big.size()).status().IsCorruption());

  const std::string train =
      R"({"task_id":1,"experiment":"e","member":"m","steps":1,"state_offset":128,"state_bytes":)";
  auto ok = WithJson(train + "8}", 136);
  ASSERT_TRUE(DecodeTrain(ok.data(), ok.size()).ok());
  auto past_end = WithJson(train + "9}", 136);
  EXPECT_TRUE(DecodeTrain(past_end.data(), past_end.size()).status().IsCorruption());
  auto huge = WithJson(train + "18446744073709551615}", 136);
  EXPECT_TRUE(DecodeTrain(huge.data(), huge.size()).status().IsCorruption());
  auto dirty = ok;
  dirty[127] = 1;  // non-zero padding before the state
  EXPECT_TRUE(DecodeTrain(dirty.data(), dirty.size()).status().IsCorruption());
  auto unaligned =
      WithJson(R"({"task_id":1,"member":"m","steps":1,"state_offset":129,"state_bytes":7})", 136);
  EXPECT_TRUE(DecodeTrain(unaligned.data(), unaligned.size()).status().IsCorruption());
  auto overlapping =
      WithJson(R"({"task_id":1,"member":"m","steps":1,"state_offset":0,"state_bytes":136})", 136);
  EXPECT_TRUE(DecodeTrain(overlapping.data(), overlapping.size()).status().IsCorruption());
  auto hp = WithJson(
      R"({"task_id":1,"member":"m","steps":1,"hparams":{"lr":"x"},"state_offset":128,"state_bytes":0})",
      128);
  EXPECT_TRUE(DecodeTrain(hp.data(), hp.size()).status().IsCorruption());
}

// docs/LIMITS.md: a message's JSON header of exactly kMaxMessageJsonBytes
// encodes and decodes; one byte more is refused on both sides.
TEST(MessagesTest, JsonHeaderAtAndPastTheCap) {
  auto json_bytes = [](const std::vector<uint8_t>& m) {
    uint32_t n = 0;
    std::memcpy(&n, m.data(), 4);
    return static_cast<size_t>(n);
  };
  const size_t base = json_bytes(EncodeToVector(Shutdown{}));
  Shutdown at;
  at.reason = std::string(kMaxMessageJsonBytes - base, 'r');
  std::vector<uint8_t> encoded = EncodeToVector(at);
  ASSERT_EQ(json_bytes(encoded), kMaxMessageJsonBytes);
  auto decoded = DecodeShutdown(encoded.data(), encoded.size());
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->reason.size(), at.reason.size());

  Shutdown past = at;
  past.reason += "r";
  std::vector<uint8_t> out(EncodedSize(past));
  Status s = Encode(past, out.data(), out.size());
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("JSON header of 1048577 bytes exceeds the cap"), std::string::npos)
      << s.ToString();
  const std::string text = "{\"reason\":\"" + past.reason + "\"}";
  ASSERT_GT(text.size(), kMaxMessageJsonBytes);
  std::vector<uint8_t> raw = WithJson(text);
  auto refused = DecodeShutdown(raw.data(), raw.size());
  ASSERT_FALSE(refused.ok());
  EXPECT_TRUE(refused.status().IsCorruption()) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find("exceeds the payload or the cap"), std::string::npos)
      << refused.status().ToString();
}

TEST(MessagesTest, RecordTypeNames) {
  EXPECT_STREQ(RecordTypeName(RecordType::kTrain), "TRAIN");
  EXPECT_STREQ(RecordTypeName(static_cast<RecordType>(77)), "UNKNOWN");
}

}  // namespace
}  // namespace ckpt::ipc
