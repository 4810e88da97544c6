// ScanRingImage: the receiver's code over a ring in ordinary memory, fed by
// the real RingWriter.
#include "ckpt/ipc/ring_image.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "layout.h"
#include "payload_checksum.h"
#include "ring.h"

namespace ckpt::ipc {
namespace {

constexpr uint64_t kRing = 4096;

class RingImageTest : public ::testing::Test {
 protected:
  RingImageTest() : data_(kRing, 0), writer_(&header_, data_.data(), kRing, "test ring") {}

  void Put(RecordType type, const std::string& body) {
    internal::RecordSpec spec{type, 0, body.size(), type, body.size(), 0};
    uint8_t* p = nullptr;
    std::string error;
    ASSERT_EQ(writer_.TryReserve(spec, &p, &error), internal::RingWriter::Result::kReserved);
    std::memcpy(p, body.data(), body.size());
    writer_.Commit();
  }
  void PutFragmented(RecordType type, const std::string& body, size_t chunk) {
    for (size_t off = 0; off < body.size(); off += chunk) {
      const size_t n = std::min(chunk, body.size() - off);
      uint16_t flags =
          (off == 0 ? layout::kFlagFirst : 0) | (off + n == body.size() ? layout::kFlagLast : 0);
      internal::RecordSpec spec{RecordType::kFragment, flags, n, type, body.size(), off};
      uint8_t* p = nullptr;
      std::string error;
      ASSERT_EQ(writer_.TryReserve(spec, &p, &error), internal::RingWriter::Result::kReserved);
      std::memcpy(p, body.data() + off, n);
      writer_.Commit();
    }
  }
  RingImageScan Scan(std::vector<std::string>* bodies = nullptr) {
    RingImageOptions o;
    o.head = header_.head.raw;
    o.tail = header_.tail.raw;
    return ScanRingImage(data_.data(), kRing, o, [&](RecordType, const uint8_t* p, size_t n) {
      if (bodies) bodies->emplace_back(reinterpret_cast<const char*>(p), n);
    });
  }

  layout::RingHeader header_{};
  std::vector<uint8_t> data_;
  internal::RingWriter writer_;
};

TEST_F(RingImageTest, WrittenRecordsReadBack) {
  Put(RecordType::kHello, "one");
  Put(RecordType::kStats, "");
  PutFragmented(RecordType::kTrain, std::string(1500, 'z'), 700);
  std::vector<std::string> bodies;
  RingImageScan scan = Scan(&bodies);
  EXPECT_EQ(scan.messages, 3u);
  EXPECT_EQ(scan.bad_records, 0u);
  EXPECT_FALSE(scan.broken);
  ASSERT_EQ(bodies.size(), 3u);
  EXPECT_EQ(bodies[0], "one");
  EXPECT_EQ(bodies[1], "");
  EXPECT_EQ(bodies[2], std::string(1500, 'z'));
}

TEST_F(RingImageTest, AFlippedPayloadByteIsOneBadRecord) {
  Put(RecordType::kHello, "one");
  Put(RecordType::kHello, "two");
  data_[64 + 1] ^= 1;
  std::vector<std::string> bodies;
  RingImageScan scan = Scan(&bodies);
  EXPECT_EQ(scan.bad_records, 1u);
  ASSERT_EQ(bodies.size(), 1u);
  EXPECT_EQ(bodies[0], "two");
}

TEST_F(RingImageTest, RepairedChecksumsExposeTheFieldChecks) {
  Put(RecordType::kHello, "one");
  layout::RecordHeader h;
  std::memcpy(&h, data_.data(), sizeof(h));
  h.sequence = 9;  // wrong, but the checksums will be resealed
  std::memcpy(data_.data(), &h, sizeof(h));
  RingImageOptions o;
  o.head = header_.head.raw;
  o.first_sequence = 1;
  o.repair_checksums = true;
  RingImageScan scan = ScanRingImage(data_.data(), kRing, o);
  EXPECT_EQ(scan.bad_records, 1u);
  EXPECT_EQ(scan.messages, 0u);
}

TEST_F(RingImageTest, ImpossiblePositionsAreBroken) {
  Put(RecordType::kHello, "one");
  RingImageOptions o;
  o.head = 3 * kRing;
  EXPECT_TRUE(ScanRingImage(data_.data(), kRing, o).broken);
  o.head = 64 + 1;
  EXPECT_TRUE(ScanRingImage(data_.data(), kRing, o).broken);
  EXPECT_TRUE(ScanRingImage(data_.data(), 1000, RingImageOptions()).broken);
}

TEST_F(RingImageTest, WrapGoesThroughAPaddingRecord) {
  // Fill and consume most of the ring, then write across the end.
  for (int i = 0; i < 5; ++i) Put(RecordType::kHello, std::string(600, 'a'));
  header_.tail.raw = header_.head.raw;  // consumed
  Put(RecordType::kResult, std::string(1800, 'b'));
  std::vector<std::string> bodies;
  RingImageScan scan = Scan(&bodies);
  EXPECT_EQ(scan.bad_records, 0u);
  ASSERT_EQ(bodies.size(), 1u);
  EXPECT_EQ(bodies[0], std::string(1800, 'b'));
}

TEST(PayloadChecksumTest, EqualsXxh3OfEveryLength) {
  std::vector<uint8_t> bytes(70000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  for (size_t n = 0; n < 2100; ++n) {
    ASSERT_EQ(internal::PayloadXxh3(bytes.data() + 1, n), Xxh3_64(bytes.data() + 1, n)) << n;
  }
  for (size_t n : {size_t{4096}, size_t{65535}, size_t{69999}}) {
    ASSERT_EQ(internal::PayloadXxh3(bytes.data(), n), Xxh3_64(bytes.data(), n)) << n;
  }
}

}  // namespace
}  // namespace ckpt::ipc
