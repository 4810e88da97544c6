// One process, both sides: the channel's contracts (deadlines, close,
// reservations, refusals), and a round trip of every size class.
#include "ckpt/ipc/channel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ipc_test_util.h"
#include "layout.h"

namespace ckpt::ipc {
namespace {

using std::chrono::milliseconds;
using testing::CheckRecord;
using testing::SendRecord;

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "ckpt-ipc-ctest-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
    options_.ring_bytes = 64 << 10;
    options_.heartbeat_interval = milliseconds(10);
  }
  void TearDown() override { EXPECT_TRUE(Channel::Remove(name_).ok()); }

  void Connect() {
    auto o = Channel::Create(name_, options_);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    owner_ = std::move(*o);
    auto w = Channel::Open(name_, options_);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    worker_ = std::move(*w);
  }

  // Writes a segment by hand: `edit` changes the control block first.
  template <typename Edit>
  void WriteRawSegment(uint64_t bytes, Edit edit) {
    int fd = ::shm_open(("/" + name_).c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(bytes)), 0);
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    ::close(fd);
    ASSERT_NE(p, MAP_FAILED);
    edit(static_cast<uint8_t*>(p));
    ::munmap(p, bytes);
  }

  std::string name_;
  ChannelOptions options_;
  std::unique_ptr<Channel> owner_;
  std::unique_ptr<Channel> worker_;
};

TEST_F(ChannelTest, EverySizeClassRoundTripsBothWays) {
  Connect();
  const uint64_t ring = owner_->Stats().ring_bytes;
  ASSERT_EQ(ring, 64u << 10);
  constexpr uint64_t kCount = 400;
  auto pump = [&](Channel* from, Channel* to, uint64_t seed, std::string* error) {
    std::thread sender([&] {
      std::vector<uint8_t> scratch;
      for (uint64_t i = 0; i < kCount; ++i) {
        Status s = SendRecord(from, seed, i, ring, &scratch, DeadlineIn(milliseconds(20000)));
        if (!s.ok()) {
          *error = s.ToString();
          return;
        }
      }
    });
    std::vector<uint8_t> scratch;
    for (uint64_t i = 0; i < kCount && error->empty(); ++i) {
      auto r = to->Receive(DeadlineIn(milliseconds(20000)));
      if (!r.ok()) {
        *error = r.status().ToString();
        break;
      }
      *error = CheckRecord(seed, i, ring, r->type, r->payload, r->size, &scratch);
      to->Release();
    }
    sender.join();
  };
  std::string down_error, up_error;
  std::thread up([&] { pump(worker_.get(), owner_.get(), 8, &up_error); });
  pump(owner_.get(), worker_.get(), 7, &down_error);
  up.join();
  EXPECT_EQ(down_error, "");
  EXPECT_EQ(up_error, "");
  EXPECT_EQ(owner_->Stats().records_sent, kCount);
  EXPECT_EQ(worker_->Stats().records_received, kCount);
  EXPECT_EQ(owner_->Stats().bad_records + worker_->Stats().bad_records, 0u);
}

TEST_F(ChannelTest, ReservationIsInvisibleUntilCommitted) {
  Connect();
  auto r = owner_->Reserve(RecordType::kTrain, 1000, DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::memset(r->data, 0x11, r->size);
  auto none = worker_->Receive(DeadlineIn(milliseconds(20)));
  EXPECT_TRUE(none.status().IsResourceExhausted()) << none.status().ToString();
  ASSERT_TRUE(owner_->Commit(*r, DeadlineIn(milliseconds(1000))).ok());
  auto got = worker_->Receive(DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->type, RecordType::kTrain);
  ASSERT_EQ(got->size, 1000u);
  EXPECT_EQ(got->payload[0], 0x11);
  EXPECT_EQ(got->payload[999], 0x11);
}

TEST_F(ChannelTest, AbandonedReservationIsNeverDelivered) {
  Connect();
  for (size_t size : {size_t{100}, size_t{200000}}) {  // in place, staged
    auto r = owner_->Reserve(RecordType::kTrain, size, DeadlineIn(milliseconds(1000)));
    ASSERT_TRUE(r.ok());
    owner_->Abandon();
    EXPECT_TRUE(owner_->Commit(*r, DeadlineIn(milliseconds(1000))).IsInvalidArgument());
  }
  // A pending reservation is abandoned by the next Send as well.
  auto r = owner_->Reserve(RecordType::kTrain, 100, DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(r.ok());
  ASSERT_TRUE(owner_->Send(RecordType::kStats, "after", 5, DeadlineIn(milliseconds(1000))).ok());
  auto got = worker_->Receive(DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->type, RecordType::kStats);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got->payload), got->size), "after");
  EXPECT_TRUE(worker_->Receive(DeadlineIn(milliseconds(10))).status().IsResourceExhausted());
  EXPECT_EQ(worker_->Stats().bad_records, 0u);
}

TEST_F(ChannelTest, StagedReservationArrivesWhole) {
  Connect();
  const size_t size = 5 * (64 << 10) + 123;  // five rings' worth: fragments
  std::thread sender([&] {
    auto r = owner_->Reserve(RecordType::kResult, size, DeadlineIn(milliseconds(10000)));
    ASSERT_TRUE(r.ok());
    testing::FillPayload(5, 5, r->data, r->size);
    ASSERT_TRUE(owner_->Commit(*r, DeadlineIn(milliseconds(10000))).ok());
  });
  auto got = worker_->Receive(DeadlineIn(milliseconds(10000)));
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->type, RecordType::kResult);
  std::vector<uint8_t> want(size);
  testing::FillPayload(5, 5, want.data(), size);
  ASSERT_EQ(got->size, size);
  EXPECT_EQ(std::memcmp(got->payload, want.data(), size), 0);
}

TEST_F(ChannelTest, StagedCommitResumesAfterItsDeadline) {
  Connect();
  const size_t size = 3 * (64 << 10);
  auto r = owner_->Reserve(RecordType::kTrain, size, DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(r.ok());
  testing::FillPayload(9, 9, r->data, r->size);
  // Nobody reads yet: the ring fills part way through the fragments.
  Status first = owner_->Commit(*r, DeadlineIn(milliseconds(50)));
  ASSERT_TRUE(first.IsResourceExhausted()) << first.ToString();
  Status second;
  std::thread resume([&] { second = owner_->Commit(*r, DeadlineIn(milliseconds(10000))); });
  auto got = worker_->Receive(DeadlineIn(milliseconds(10000)));
  resume.join();
  ASSERT_TRUE(second.ok()) << second.ToString();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  std::vector<uint8_t> want(size);
  testing::FillPayload(9, 9, want.data(), size);
  ASSERT_EQ(got->size, size);
  EXPECT_EQ(std::memcmp(got->payload, want.data(), size), 0);
  EXPECT_EQ(worker_->Stats().dropped_messages, 0u);
  EXPECT_EQ(owner_->Stats().records_sent, 1u);
}

TEST_F(ChannelTest, AbandonedFragmentsAreDroppedByTheReceiver) {
  Connect();
  std::vector<uint8_t> big(3 * (64 << 10), 1);
  Status s = owner_->Send(RecordType::kTrain, big.data(), big.size(), DeadlineIn(milliseconds(50)));
  ASSERT_TRUE(s.IsResourceExhausted()) << s.ToString();
  std::thread sender([&] {
    ASSERT_TRUE(owner_->Send(RecordType::kStats, "next", 4, DeadlineIn(milliseconds(10000))).ok());
  });
  auto got = worker_->Receive(DeadlineIn(milliseconds(10000)));
  sender.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->type, RecordType::kStats);
  EXPECT_EQ(worker_->Stats().dropped_messages, 1u);
  EXPECT_EQ(worker_->Stats().bad_records, 0u);
}

TEST_F(ChannelTest, ReceiveWithNothingToReadStopsAtTheDeadline) {
  Connect();
  const auto start = Clock::now();
  auto r = worker_->Receive(start + milliseconds(150));
  EXPECT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
  EXPECT_GE(Clock::now() - start, milliseconds(150));
  EXPECT_LT(Clock::now() - start, milliseconds(1500));
}

TEST_F(ChannelTest, SendToAFullRingStopsAtTheDeadline) {
  Connect();
  std::vector<uint8_t> half((32 << 10) - 64);
  Status s;
  int sent = 0;
  while ((s = owner_->Send(RecordType::kTrain, half.data(), half.size(),
                           DeadlineIn(milliseconds(100))))
             .ok()) {
    ASSERT_LT(++sent, 10);
  }
  EXPECT_TRUE(s.IsResourceExhausted()) << s.ToString();
  EXPECT_GT(owner_->Stats().send_ring_used, 0u);
  // Draining one record makes room again.
  ASSERT_TRUE(worker_->Receive(DeadlineIn(milliseconds(1000))).ok());
  worker_->Release();
  EXPECT_TRUE(
      owner_->Send(RecordType::kTrain, half.data(), half.size(), DeadlineIn(milliseconds(1000)))
          .ok());
}

TEST_F(ChannelTest, CloseAbortsABlockedReceiveAndLaterCalls) {
  Connect();
  Status blocked;
  std::thread t([&] { blocked = worker_->Receive(DeadlineIn(std::chrono::seconds(60))).status(); });
  worker_->Close();
  t.join();
  EXPECT_TRUE(blocked.IsAborted()) << blocked.ToString();
  EXPECT_TRUE(worker_->Send(RecordType::kHello, "x", 1, DeadlineIn(milliseconds(10))).IsAborted());
}

TEST_F(ChannelTest, PeerThatClosedIsUnavailable) {
  Connect();
  ASSERT_TRUE(worker_->Send(RecordType::kResult, "last", 4, DeadlineIn(milliseconds(100))).ok());
  worker_.reset();
  // What the peer published before it left is still delivered.
  auto last = owner_->Receive(DeadlineIn(milliseconds(1000)));
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->size, 4u);
  auto r = owner_->Receive(DeadlineIn(std::chrono::seconds(30)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("closed"), std::string::npos) << r.status().message();
  EXPECT_TRUE(
      owner_->Send(RecordType::kTrain, "x", 1, DeadlineIn(milliseconds(10))).IsUnavailable());
  EXPECT_FALSE(owner_->PeerAlive());
}

TEST_F(ChannelTest, PeerAliveOnceTheWorkerHasAttached) {
  auto o = Channel::Create(name_, options_);
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE((*o)->PeerAlive());
  auto w = Channel::Open(name_, options_);
  ASSERT_TRUE(w.ok());
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!((*o)->PeerAlive() && (*w)->PeerAlive()) && Clock::now() < give_up) {
    std::this_thread::yield();
  }
  EXPECT_TRUE((*o)->PeerAlive());
  EXPECT_TRUE((*w)->PeerAlive());
}

TEST_F(ChannelTest, SecondCreateOfALiveSegmentIsRefused) {
  Connect();
  auto again = Channel::Create(name_, options_);
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
}

TEST_F(ChannelTest, SecondWorkerIsRefused) {
  Connect();
  auto second = Channel::Open(name_, options_);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists) << second.status().ToString();
  worker_.reset();
  auto third = Channel::Open(name_, options_);
  EXPECT_EQ(third.status().code(), StatusCode::kFailedPrecondition) << third.status().ToString();
}

TEST_F(ChannelTest, OpenOfAMissingSegmentIsNotFound) {
  EXPECT_TRUE(Channel::Open(name_, options_).status().IsNotFound());
}

TEST_F(ChannelTest, BadNamesAndOptionsAreInvalidArguments) {
  for (const char* bad : {"", "a/b", ".hidden", "sp ace"}) {
    EXPECT_TRUE(Channel::Create(bad, options_).status().IsInvalidArgument()) << bad;
  }
  ChannelOptions o = options_;
  o.heartbeat_interval = milliseconds(0);
  EXPECT_TRUE(Channel::Create(name_, o).status().IsInvalidArgument());
  o = options_;
  o.ring_bytes = size_t{1} << 41;
  EXPECT_TRUE(Channel::Create(name_, o).status().IsInvalidArgument());
}

TEST_F(ChannelTest, RingSizeRoundsUpToAPowerOfTwo) {
  options_.ring_bytes = 5000;
  Connect();
  EXPECT_EQ(owner_->Stats().ring_bytes, 8192u);
  EXPECT_EQ(worker_->Stats().ring_bytes, 8192u);
}

TEST_F(ChannelTest, RingInternalTypesCannotBeSent) {
  Connect();
  for (RecordType t : {RecordType::kPadding, RecordType::kFragment, static_cast<RecordType>(99)}) {
    EXPECT_TRUE(owner_->Send(t, "x", 1, DeadlineIn(milliseconds(10))).IsInvalidArgument());
    EXPECT_TRUE(owner_->Reserve(t, 1, DeadlineIn(milliseconds(10))).status().IsInvalidArgument());
  }
}

TEST_F(ChannelTest, GarbageSegmentIsReclaimedByCreate) {
  WriteRawSegment(layout::SegmentBytes(4096), [](uint8_t* p) {
    for (int i = 0; i < 4096; ++i) p[i] = static_cast<uint8_t>(i * 7);
  });
  EXPECT_TRUE(Channel::Open(name_, options_).status().IsCorruption());
  auto o = Channel::Create(name_, options_);
  EXPECT_TRUE(o.ok()) << o.status().ToString();
}

TEST_F(ChannelTest, UnknownLayoutVersionIsRefusedByOpen) {
  // A well-formed segment from a newer build, its owner alive (this process).
  auto o = Channel::Create(name_, options_);
  ASSERT_TRUE(o.ok());
  int fd = ::shm_open(("/" + name_).c_str(), O_RDWR, 0);
  ASSERT_GE(fd, 0);
  void* p = ::mmap(nullptr, layout::kControlBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  ASSERT_NE(p, MAP_FAILED);
  auto* cb = static_cast<layout::ControlBlock*>(p);
  cb->layout_version = 2;
  cb->geometry_xxh3 = Xxh3_64(reinterpret_cast<uint8_t*>(cb) + 8, 56);
  auto w = Channel::Open(name_, options_);
  EXPECT_EQ(w.status().code(), StatusCode::kFailedPrecondition) << w.status().ToString();
  cb->layout_version = layout::kLayoutVersion;
  cb->ring_bytes = 12345;  // a damaged geometry, checksum not updated
  auto damaged = Channel::Open(name_, options_);
  EXPECT_TRUE(damaged.status().IsCorruption()) << damaged.status().ToString();
  ::munmap(p, layout::kControlBytes);
}

}  // namespace
}  // namespace ckpt::ipc
