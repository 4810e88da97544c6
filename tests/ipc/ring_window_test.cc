// The send ring's window (ring.h: a producer keeps its records at the start
// of the data area, so a large ring costs only what its records need) and
// the gather send (Channel::SendParts: a payload in pieces, read once).
//
// RingWindowTest drives the real RingWriter and RingReader over ordinary
// memory, every byte past the window a sentinel that must survive;
// ChannelWindowTest measures the shared memory a real segment holds
// (st_blocks of /dev/shm/NAME) after thousands of records.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/channel.h"
#include "ipc_test_util.h"
#include "layout.h"
#include "payload_checksum.h"
#include "ring.h"

namespace ckpt::ipc {
namespace {

using internal::RingReader;
using internal::RingWriter;
using std::chrono::milliseconds;

constexpr uint8_t kSentinel = 0xC5;

class RingWindowTest : public ::testing::Test {
 protected:
  static constexpr uint64_t kRing = 64 << 10;

  RingWindowTest()
      : data_(kRing, kSentinel),
        writer_(&header_, data_.data(), kRing, "test ring", /*min_window=*/4096),
        reader_(&header_, data_.data(), kRing, uint64_t{1} << 30, "test ring") {}

  // Writes record i of `size` bytes and reads it back at once.
  void RoundTrip(uint64_t i, size_t size) {
    internal::RecordSpec spec{RecordType::kTrain, 0, size, RecordType::kTrain, size, 0};
    uint8_t* p = nullptr;
    std::string error;
    ASSERT_EQ(writer_.TryReserve(spec, &p, &error), RingWriter::Result::kReserved) << error;
    testing::FillPayload(1, i, p, size);
    writer_.Commit();
    RingReader::Message m;
    ASSERT_EQ(reader_.Next(&m, &error), RingReader::Result::kMessage) << error;
    ASSERT_EQ(m.size, size);
    std::vector<uint8_t> want(size);
    testing::FillPayload(1, i, want.data(), size);
    ASSERT_EQ(std::memcmp(m.payload, want.data(), size), 0) << "record " << i;
    reader_.Release();
  }

  // The first byte at or past `from` that is no longer the sentinel, or -1.
  int64_t FirstWrittenFrom(uint64_t from) const {
    for (uint64_t i = from; i < kRing; ++i) {
      if (data_[i] != kSentinel) return static_cast<int64_t>(i);
    }
    return -1;
  }

  layout::RingHeader header_{};
  std::vector<uint8_t> data_;
  RingWriter writer_;
  RingReader reader_;
};

TEST_F(RingWindowTest, RecordsStayInsideTheWindowAcrossManyWraps) {
  // Records of 512 bytes with their header: four take 2 KiB, so the 4 KiB
  // window holds them, and eight would end exactly at the window's end,
  // where the padding's header must not go.
  for (uint64_t i = 0; i < 200; ++i) RoundTrip(i, 448);
  EXPECT_EQ(writer_.window(), 4096u);
  EXPECT_GT(header_.head.raw, 20 * kRing) << "the records wrapped many times";
  EXPECT_EQ(FirstWrittenFrom(4096), -1) << "a byte past the window was written";
}

TEST_F(RingWindowTest, TheWindowGrowsForALargerRecordAndNeverShrinks) {
  for (uint64_t i = 0; i < 20; ++i) RoundTrip(i, 500);
  // 3,000 bytes: four records need 12,544 bytes, so 16 KiB.
  for (uint64_t i = 20; i < 120; ++i) RoundTrip(i, 3000);
  EXPECT_EQ(writer_.window(), 16u << 10);
  for (uint64_t i = 120; i < 200; ++i) RoundTrip(i, 100);
  EXPECT_EQ(writer_.window(), 16u << 10);
  EXPECT_EQ(FirstWrittenFrom(16 << 10), -1);
  EXPECT_NE(FirstWrittenFrom(4096), -1) << "the grown window was used";
}

TEST_F(RingWindowTest, ARecordOfHalfTheRingTakesTheWholeRing) {
  RoundTrip(0, 100);
  RoundTrip(1, writer_.max_payload());
  EXPECT_EQ(writer_.window(), kRing);
  RoundTrip(2, writer_.max_payload());
  RoundTrip(3, 100);
}

TEST_F(RingWindowTest, AFullWindowIsFullEvenThoughTheRingIsNot) {
  // Nothing is read: at most four 500-byte records fit the 4 KiB window
  // (less the padding header's room at its end); the ring's other 60 KiB
  // are not offered.
  int reserved = 0;
  for (;;) {
    internal::RecordSpec spec{RecordType::kTrain, 0, 500, RecordType::kTrain, 500, 0};
    uint8_t* p = nullptr;
    std::string error;
    if (writer_.TryReserve(spec, &p, &error) != RingWriter::Result::kReserved) break;
    std::memset(p, 1, 500);
    writer_.Commit();
    ASSERT_LT(++reserved, 100);
  }
  EXPECT_GE(reserved, 4);
  EXPECT_LE(reserved, 7);
  EXPECT_FALSE(writer_.HasRoom(500));
  // Reading one record makes room for the next, at the window's start.
  RingReader::Message m;
  std::string error;
  ASSERT_EQ(reader_.Next(&m, &error), RingReader::Result::kMessage) << error;
  reader_.Release();
  EXPECT_TRUE(writer_.HasRoom(500));
  internal::RecordSpec spec{RecordType::kTrain, 0, 500, RecordType::kTrain, 500, 0};
  uint8_t* p = nullptr;
  ASSERT_EQ(writer_.TryReserve(spec, &p, &error), RingWriter::Result::kReserved) << error;
  writer_.Commit();
  // In flight: the records not read, and not the padding of the wrap.
  EXPECT_EQ(writer_.used(), static_cast<uint64_t>(reserved) * 576);
  EXPECT_EQ(FirstWrittenFrom(4096), -1);
}

TEST_F(RingWindowTest, AWriterWithoutAWindowUsesTheWholeRing) {
  layout::RingHeader header{};
  std::vector<uint8_t> data(kRing, kSentinel);
  RingWriter writer(&header, data.data(), kRing, "whole ring");
  RingReader reader(&header, data.data(), kRing, uint64_t{1} << 30, "whole ring");
  for (int i = 0; i < 200; ++i) {
    internal::RecordSpec spec{RecordType::kTrain, 0, 500, RecordType::kTrain, 500, 0};
    uint8_t* p = nullptr;
    std::string error;
    ASSERT_EQ(writer.TryReserve(spec, &p, &error), RingWriter::Result::kReserved);
    std::memset(p, 2, 500);
    writer.Commit();
    RingReader::Message m;
    ASSERT_EQ(reader.Next(&m, &error), RingReader::Result::kMessage) << error;
    reader.Release();
  }
  EXPECT_EQ(writer.window(), kRing);
  EXPECT_NE(data[kRing - 600], kSentinel) << "the last part of the ring was written";
}

TEST(GatherAndXxh3Test, EveryRangeOfThePartsEqualsACopyOfTheirConcatenation) {
  std::mt19937_64 rng(11);
  for (int round = 0; round < 200; ++round) {
    const int n = 1 + static_cast<int>(rng() % 5);
    std::vector<std::vector<uint8_t>> bufs(n);
    std::vector<PayloadPart> parts;
    std::vector<uint8_t> whole;
    for (auto& b : bufs) {
      // Empty parts, small ones and ones across the 16 KiB copy chunk.
      const size_t sizes[] = {0, 1, 63, 200, 16384, 40000};
      b.resize(sizes[rng() % 6] + rng() % 3);
      for (auto& x : b) x = static_cast<uint8_t>(rng());
      parts.push_back({b.empty() ? nullptr : b.data(), b.size()});
      whole.insert(whole.end(), b.begin(), b.end());
    }
    const uint64_t offset = whole.empty() ? 0 : rng() % (whole.size() + 1);
    const size_t size = static_cast<size_t>(rng() % (whole.size() - offset + 1));
    std::vector<uint8_t> dst(size + 8, 0xAA);
    const uint64_t h =
        internal::GatherAndXxh3(dst.data(), parts.data(), parts.size(), offset, size);
    SCOPED_TRACE("round " + std::to_string(round));
    ASSERT_TRUE(std::equal(whole.begin() + offset, whole.begin() + offset + size, dst.begin()));
    EXPECT_EQ(h, Xxh3_64(whole.data() + offset, size));
    for (size_t i = size; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0xAA) << "written past the end";
  }
}

class ChannelWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "ckpt-ipc-wtest-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    options_.ring_bytes = size_t{32} << 20;
    options_.heartbeat_interval = milliseconds(10);
  }
  void TearDown() override {
    owner_.reset();
    worker_.reset();
    EXPECT_TRUE(Channel::Remove(name_).ok());
  }

  void Connect() {
    auto o = Channel::Create(name_, options_);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    owner_ = std::move(*o);
    auto w = Channel::Open(name_, options_);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    worker_ = std::move(*w);
  }

  // Sends `count` records of `size` bytes each way, one at a time, each
  // checked by its receiver.
  void Exchange(int count, size_t size) {
    std::vector<uint8_t> out(size), scratch;
    for (int i = 0; i < count; ++i) {
      testing::FillPayload(3, i, out.data(), size);
      for (auto [from, to] :
           {std::pair{owner_.get(), worker_.get()}, std::pair{worker_.get(), owner_.get()}}) {
        ASSERT_TRUE(
            from->Send(RecordType::kResult, out.data(), size, DeadlineIn(milliseconds(5000))).ok());
        auto got = to->Receive(DeadlineIn(milliseconds(5000)));
        ASSERT_TRUE(got.ok()) << got.status().ToString();
        ASSERT_EQ(got->size, size);
        ASSERT_EQ(std::memcmp(got->payload, out.data(), size), 0) << "record " << i;
        to->Release();
      }
    }
  }

  // Bytes of memory the segment holds (its pages ever written).
  int64_t Allocated() const {
    struct stat st {};
    if (::stat(("/dev/shm/" + name_).c_str(), &st) != 0) return -1;
    return static_cast<int64_t>(st.st_blocks) * 512;
  }

  std::string name_;
  ChannelOptions options_;
  std::unique_ptr<Channel> owner_;
  std::unique_ptr<Channel> worker_;
};

TEST_F(ChannelWindowTest, ARingCostsTheMemoryItsRecordsNeedNotItsSize) {
  Connect();
  // 0.5 MB records, 400 of them each way: 200 MB through each 32 MiB ring.
  Exchange(400, 500000);
  // Four records of 0.5 MB fit 2 MiB: two windows, the control pages.
  EXPECT_EQ(owner_->Stats().send_window_bytes, size_t{2} << 20);
  EXPECT_EQ(worker_->Stats().send_window_bytes, size_t{2} << 20);
  EXPECT_LE(Allocated(), (int64_t{4} << 20) + (64 << 10));
  // 5 MB records widen the windows to 32 MiB, four of them being 20 MB.
  Exchange(20, 5000000);
  EXPECT_EQ(owner_->Stats().send_window_bytes, size_t{32} << 20);
}

TEST_F(ChannelWindowTest, WithoutAWindowTheRingsCostTheirSize) {
  options_.min_window_bytes = 0;
  Connect();
  Exchange(400, 500000);
  EXPECT_EQ(owner_->Stats().send_window_bytes, size_t{32} << 20);
  EXPECT_GE(Allocated(), int64_t{60} << 20);
}

TEST_F(ChannelWindowTest, PartsArriveAsOnePayloadInOneRecordOrInFragments) {
  options_.ring_bytes = 64 << 10;
  Connect();
  std::vector<uint8_t> a(100), b(70000), c(3);
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<uint8_t>(i * 7);
  std::memset(a.data(), 'a', a.size());
  std::memset(c.data(), 'c', c.size());
  std::vector<uint8_t> whole(a);
  whole.insert(whole.end(), b.begin(), b.end());
  whole.insert(whole.end(), c.begin(), c.end());
  // Small: one record. Large (three parts, one empty, 70 KB > 32 KiB): fragments.
  const PayloadPart small[2] = {{a.data(), a.size()}, {c.data(), c.size()}};
  const PayloadPart large[4] = {
      {a.data(), a.size()}, {nullptr, 0}, {b.data(), b.size()}, {c.data(), c.size()}};
  std::thread sender([&] {
    uint64_t sent = 0;
    EXPECT_TRUE(
        owner_->SendParts(RecordType::kTrain, small, 2, DeadlineIn(milliseconds(5000)), &sent)
            .ok());
    EXPECT_EQ(sent, 103u);
    sent = 0;
    EXPECT_TRUE(
        owner_->SendParts(RecordType::kTrain, large, 4, DeadlineIn(milliseconds(5000)), &sent)
            .ok());
    EXPECT_EQ(sent, whole.size());
  });
  auto first = worker_->Receive(DeadlineIn(milliseconds(5000)));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size, 103u);
  EXPECT_EQ(std::memcmp(first->payload, a.data(), 100), 0);
  EXPECT_EQ(std::memcmp(first->payload + 100, "ccc", 3), 0);
  auto second = worker_->Receive(DeadlineIn(milliseconds(5000)));
  sender.join();
  ASSERT_TRUE(second.ok()) << second.status().ToString();
  ASSERT_EQ(second->size, whole.size());
  EXPECT_EQ(std::memcmp(second->payload, whole.data(), whole.size()), 0);
  EXPECT_EQ(worker_->Stats().bad_records, 0u);
  EXPECT_EQ(owner_->Stats().records_sent, 2u);
}

TEST_F(ChannelWindowTest, PartsResumeWhereTheDeadlineStoppedThem) {
  options_.ring_bytes = 64 << 10;
  Connect();
  std::vector<uint8_t> head(64, 'h'), body(size_t{3} * (64 << 10));
  testing::FillPayload(4, 4, body.data(), body.size());
  const PayloadPart parts[2] = {{head.data(), head.size()}, {body.data(), body.size()}};
  // Nobody reads yet: the ring fills part way through the fragments.
  uint64_t sent = 0;
  Status first =
      owner_->SendParts(RecordType::kTrain, parts, 2, DeadlineIn(milliseconds(50)), &sent);
  ASSERT_TRUE(first.IsResourceExhausted()) << first.ToString();
  ASSERT_GT(sent, 0u);
  ASSERT_LT(sent, head.size() + body.size());
  Status second;
  std::thread resume([&] {
    second =
        owner_->SendParts(RecordType::kTrain, parts, 2, DeadlineIn(milliseconds(10000)), &sent);
  });
  auto got = worker_->Receive(DeadlineIn(milliseconds(10000)));
  resume.join();
  ASSERT_TRUE(second.ok()) << second.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size, head.size() + body.size());
  EXPECT_EQ(std::memcmp(got->payload, head.data(), head.size()), 0);
  EXPECT_EQ(std::memcmp(got->payload + head.size(), body.data(), body.size()), 0);
  EXPECT_EQ(worker_->Stats().dropped_messages, 0u);
}

TEST_F(ChannelWindowTest, BadPartsAreRefusedByName) {
  options_.ring_bytes = 64 << 10;
  Connect();
  const PayloadPart null_part[2] = {{"x", 1}, {nullptr, 5}};
  uint64_t sent = 0;
  Status s =
      owner_->SendParts(RecordType::kTrain, null_part, 2, DeadlineIn(milliseconds(100)), &sent);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_NE(s.message().find("null payload part 1 of 5 bytes"), std::string::npos) << s.message();
  const PayloadPart one[1] = {{"abc", 3}};
  sent = 2;
  s = owner_->SendParts(RecordType::kTrain, one, 1, DeadlineIn(milliseconds(100)), &sent);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  sent = 0;
  s = owner_->SendParts(RecordType::kFragment, one, 1, DeadlineIn(milliseconds(100)), &sent);
  EXPECT_TRUE(s.IsInvalidArgument()) << s.ToString();
  EXPECT_EQ(owner_->Stats().records_sent, 0u);
}

}  // namespace
}  // namespace ckpt::ipc
