// Two real processes over real shared memory: the test process and ipc_peer
// (CKPT_IPC_PEER), synchronised over pipes (ipc_test_util.h), never by sleeps.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/messages.h"
#include "ipc_test_util.h"

namespace ckpt::ipc {
namespace {

using std::chrono::milliseconds;
using testing::CheckRecord;
using testing::Child;
using testing::SendRecord;

constexpr uint64_t kRing = uint64_t{1} << 20;
constexpr milliseconds kLineTimeout{20000};
// Death must be noticed within this, from the SIGKILL to the failing call.
constexpr auto kNoticeWithin = std::chrono::seconds(2);

class ProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static std::atomic<int> counter{0};
    name_ = "ckpt-ipc-ptest-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
  }
  void TearDown() override { EXPECT_TRUE(Channel::Remove(name_).ok()); }

  ChannelOptions Options(int hb_ms = 100) {
    ChannelOptions o;
    o.ring_bytes = kRing;
    o.heartbeat_interval = milliseconds(hb_ms);
    return o;
  }

  std::unique_ptr<Channel> CreateOwner(const ChannelOptions& o) {
    auto ch = Channel::Create(name_, o);
    EXPECT_TRUE(ch.ok()) << ch.status().ToString();
    return ch.ok() ? std::move(*ch) : nullptr;
  }

  void StartPeer(Child* child, const std::string& mode, std::vector<std::string> args = {}) {
    args.insert(args.begin(), {mode, name_});
    ASSERT_TRUE(child->Start(CKPT_IPC_PEER, args));
  }

  std::string name_;
};

TEST_F(ProcessTest, TenThousandRecordsEachWayAtOnceArriveBitExactInOrder) {
  constexpr uint64_t kCount = 10000;
  auto owner = CreateOwner(Options());
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "stress",
            {"count=" + std::to_string(kCount), "seed_out=2", "seed_in=1",
             "ring=" + std::to_string(kRing)});
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;

  const auto deadline = DeadlineIn(std::chrono::seconds(90));
  Status send_status;
  std::thread sender([&] {
    std::vector<uint8_t> scratch;
    for (uint64_t i = 0; i < kCount && send_status.ok(); ++i) {
      send_status = SendRecord(owner.get(), 1, i, kRing, &scratch, deadline);
    }
  });
  std::vector<uint8_t> scratch;
  uint64_t fragmented = 0, received_bytes = 0;
  for (uint64_t i = 0; i < kCount; ++i) {
    auto r = owner->Receive(deadline);
    ASSERT_TRUE(r.ok()) << "record " << i << ": " << r.status().ToString();
    ASSERT_EQ(r->sequence != 0, true);
    ASSERT_EQ(CheckRecord(2, i, kRing, r->type, r->payload, r->size, &scratch), "");
    if (r->size > kRing / 2 - 64) ++fragmented;
    received_bytes += r->size;
    owner->Release();
  }
  sender.join();
  ASSERT_TRUE(send_status.ok()) << send_status.ToString();
  ASSERT_TRUE(peer.Expect("ok 0", kLineTimeout, &line)) << line;
  peer.WriteLine("bye");
  EXPECT_EQ(peer.Reap(), 0);

  const ChannelStats stats = owner->Stats();
  EXPECT_EQ(stats.records_received, kCount);
  EXPECT_EQ(stats.records_sent, kCount);
  EXPECT_EQ(stats.bad_records, 0u);
  EXPECT_EQ(stats.bytes_received, received_bytes);
  EXPECT_GT(fragmented, 100u);  // a good share travelled as fragments
  std::printf("received %llu records, %llu bytes, %llu fragmented\n",
              static_cast<unsigned long long>(kCount),
              static_cast<unsigned long long>(received_bytes),
              static_cast<unsigned long long>(fragmented));
}

// The peer produces records of random sizes; it is killed at a random moment
// (mid-write, in place or between fragments, or blocked on a full ring). The
// survivor checks every record it got and must see Unavailable within 2 s.
TEST_F(ProcessTest, ProducerKilledAtRandomMomentsSurvivorGetsUnavailable) {
  std::mt19937 rng(12345);
  for (int iter = 0; iter < 24; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    SetUp();
    auto owner = CreateOwner(Options(20));
    ASSERT_NE(owner, nullptr);
    const uint64_t seed = 100 + iter;
    Child peer;
    StartPeer(&peer, "produce", {"seed_out=" + std::to_string(seed), "hb_ms=20"});
    std::string line;
    ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;

    const auto kill_at = Clock::now() + std::chrono::microseconds(rng() % 30000);
    Clock::time_point killed{};
    std::vector<uint8_t> scratch;
    uint64_t got = 0;
    Status end;
    for (;;) {
      if (killed == Clock::time_point{} && Clock::now() >= kill_at) {
        peer.Kill(SIGKILL);
        killed = Clock::now();
      }
      auto r = owner->Receive(DeadlineIn(milliseconds(killed == Clock::time_point{} ? 5 : 5000)));
      if (!r.ok()) {
        if (r.status().IsResourceExhausted() && killed == Clock::time_point{}) continue;
        end = r.status();
        break;
      }
      ASSERT_EQ(CheckRecord(seed, got, kRing, r->type, r->payload, r->size, &scratch), "");
      ++got;
      owner->Release();
    }
    EXPECT_TRUE(end.IsUnavailable()) << end.ToString();
    EXPECT_LT(Clock::now() - killed, kNoticeWithin);
    EXPECT_GE(got, 1u);
    EXPECT_EQ(owner->Stats().bad_records, 0u);
    EXPECT_FALSE(owner->PeerAlive());
    peer.Reap();
    owner.reset();
    TearDown();
  }
}

// The peer consumes; it is killed at a random moment while the survivor keeps
// sending: the survivor's Send must fail with Unavailable within 2 s.
TEST_F(ProcessTest, ConsumerKilledAtRandomMomentsSenderGetsUnavailable) {
  std::mt19937 rng(777);
  for (int iter = 0; iter < 24; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    SetUp();
    auto owner = CreateOwner(Options(20));
    ASSERT_NE(owner, nullptr);
    const uint64_t seed = 200 + iter;
    Child peer;
    StartPeer(&peer, "consume", {"seed_in=" + std::to_string(seed), "hb_ms=20"});
    std::vector<uint8_t> scratch;
    ASSERT_TRUE(
        SendRecord(owner.get(), seed, 0, kRing, &scratch, DeadlineIn(milliseconds(5000))).ok());
    std::string line;
    ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;

    const auto kill_at = Clock::now() + std::chrono::microseconds(rng() % 30000);
    Clock::time_point killed{};
    Status end;
    for (uint64_t i = 1;; ++i) {
      if (killed == Clock::time_point{} && Clock::now() >= kill_at) {
        peer.Kill(SIGKILL);
        killed = Clock::now();
      }
      end = SendRecord(owner.get(), seed, i, kRing, &scratch, DeadlineIn(milliseconds(5000)));
      if (!end.ok()) break;
    }
    EXPECT_TRUE(end.IsUnavailable()) << end.ToString();
    ASSERT_NE(killed, Clock::time_point{});
    EXPECT_LT(Clock::now() - killed, kNoticeWithin);
    peer.Reap();
    owner.reset();
    TearDown();
  }
}

// The owner (scheduler side) dies; the worker side is the survivor.
TEST_F(ProcessTest, OwnerKilledWorkerGetsUnavailable) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 6; ++iter) {
    SCOPED_TRACE("iteration " + std::to_string(iter));
    SetUp();
    const uint64_t seed = 300 + iter;
    Child owner_proc;
    StartPeer(&owner_proc, "produce", {"own=1", "hb_ms=20", "seed_out=" + std::to_string(seed)});
    std::string line;
    ASSERT_TRUE(owner_proc.Expect("created", kLineTimeout, &line)) << line;
    auto opened = Channel::Open(name_, Options(20));
    ASSERT_TRUE(opened.ok()) << opened.status().ToString();
    auto worker = std::move(*opened);
    ASSERT_TRUE(owner_proc.Expect("ready", kLineTimeout, &line)) << line;
    const auto kill_at = Clock::now() + std::chrono::microseconds(rng() % 20000);
    Clock::time_point killed{};
    std::vector<uint8_t> scratch;
    uint64_t got = 0;
    Status end;
    for (;;) {
      if (killed == Clock::time_point{} && Clock::now() >= kill_at) {
        owner_proc.Kill(SIGKILL);
        killed = Clock::now();
      }
      auto r = worker->Receive(DeadlineIn(milliseconds(killed == Clock::time_point{} ? 5 : 5000)));
      if (!r.ok()) {
        if (r.status().IsResourceExhausted() && killed == Clock::time_point{}) continue;
        end = r.status();
        break;
      }
      ASSERT_EQ(CheckRecord(seed, got, kRing, r->type, r->payload, r->size, &scratch), "");
      ++got;
      worker->Release();
    }
    EXPECT_TRUE(end.IsUnavailable()) << end.ToString();
    EXPECT_LT(Clock::now() - killed, kNoticeWithin);
    owner_proc.Reap();
    worker.reset();
    TearDown();
  }
}

// Kill point: a reservation half written and never committed is never seen.
TEST_F(ProcessTest, KilledInsideAReservationNothingIsDelivered) {
  for (const char* size : {"100", "300000", "3000000"}) {  // in place, in place, staged
    SCOPED_TRACE(size);
    SetUp();
    auto owner = CreateOwner(Options(20));
    ASSERT_NE(owner, nullptr);
    Child peer;
    StartPeer(&peer, "die-mid-write", {"hb_ms=20", std::string("size=") + size});
    std::string line;
    ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
    peer.Kill(SIGKILL);
    const auto killed = Clock::now();
    auto r = owner->Receive(DeadlineIn(milliseconds(5000)));
    EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
    EXPECT_LT(Clock::now() - killed, kNoticeWithin);
    EXPECT_EQ(owner->Stats().records_received, 0u);
    peer.Reap();
    owner.reset();
    TearDown();
  }
}

// Kill point: the consumer holds a record it never releases, then dies while
// the sender waits for room.
TEST_F(ProcessTest, KilledHoldingARecordBlockedSenderGetsUnavailable) {
  auto owner = CreateOwner(Options(20));
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "hold-read", {"hb_ms=20"});
  std::vector<uint8_t> big(kRing / 2 - 64, 7);
  ASSERT_TRUE(
      owner->Send(RecordType::kTrain, big.data(), big.size(), DeadlineIn(milliseconds(5000))).ok());
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  ASSERT_TRUE(
      owner->Send(RecordType::kTrain, big.data(), big.size(), DeadlineIn(milliseconds(5000))).ok());
  // The ring is full now: a third record waits for room that never comes.
  auto blocked =
      owner->Send(RecordType::kTrain, big.data(), big.size(), DeadlineIn(milliseconds(50)));
  EXPECT_TRUE(blocked.IsResourceExhausted()) << blocked.ToString();
  peer.Kill(SIGKILL);
  const auto killed = Clock::now();
  Status s =
      owner->Send(RecordType::kTrain, big.data(), big.size(), DeadlineIn(milliseconds(5000)));
  EXPECT_TRUE(s.IsUnavailable()) << s.ToString();
  EXPECT_LT(Clock::now() - killed, kNoticeWithin);
  peer.Reap();
}

TEST_F(ProcessTest, DefaultOptionsNoticeDeathWithinTwoSeconds) {
  ChannelOptions defaults;
  defaults.ring_bytes = kRing;
  auto owner = CreateOwner(defaults);
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "echo");
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  ASSERT_TRUE(owner->Send(RecordType::kHello, "hi", 2, DeadlineIn(milliseconds(5000))).ok());
  auto echoed = owner->Receive(DeadlineIn(milliseconds(5000)));
  ASSERT_TRUE(echoed.ok()) << echoed.status().ToString();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(echoed->payload), echoed->size), "hi");
  peer.Kill(SIGKILL);  // not reaped: a zombie must count as dead
  const auto killed = Clock::now();
  auto r = owner->Receive(DeadlineIn(std::chrono::seconds(30)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("worker"), std::string::npos) << r.status().message();
  EXPECT_LT(Clock::now() - killed, kNoticeWithin);
  peer.Reap();
}

TEST_F(ProcessTest, StoppedPeerIsUnavailableAfterHeartbeatTimeout) {
  ChannelOptions o = Options(20);
  o.heartbeat_timeout = milliseconds(300);
  auto owner = CreateOwner(o);
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "echo", {"hb_ms=20"});
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  ASSERT_TRUE(owner->Send(RecordType::kHello, "x", 1, DeadlineIn(milliseconds(5000))).ok());
  ASSERT_TRUE(owner->Receive(DeadlineIn(milliseconds(5000))).ok());
  owner->Release();
  peer.Kill(SIGSTOP);
  const auto stopped = Clock::now();
  auto r = owner->Receive(DeadlineIn(std::chrono::seconds(30)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("heart-beating"), std::string::npos) << r.status().message();
  EXPECT_LT(Clock::now() - stopped, kNoticeWithin);
  peer.Kill(SIGKILL);
  peer.Kill(SIGCONT);
  peer.Reap();
}

TEST_F(ProcessTest, StaleSegmentOfKilledOwnerIsReclaimed) {
  for (bool reap : {false, true}) {
    SCOPED_TRACE(reap ? "reaped" : "zombie");
    Child owner_proc;
    StartPeer(&owner_proc, "own");
    std::string line;
    ASSERT_TRUE(owner_proc.Expect("ready", kLineTimeout, &line)) << line;
    owner_proc.Kill(SIGKILL);
    if (reap) {
      owner_proc.Reap();
    } else {
      // Wait until the kernel has turned it into a zombie: /proc says 'Z'.
      const auto give_up = Clock::now() + std::chrono::seconds(5);
      while (Clock::now() < give_up) {
        char state = '?';
        FILE* f = std::fopen(("/proc/" + std::to_string(owner_proc.pid()) + "/stat").c_str(), "r");
        if (f != nullptr) {
          char buf[512] = {};
          size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
          std::fclose(f);
          std::string s(buf, n);
          auto close = s.rfind(')');
          if (close != std::string::npos && close + 2 < s.size()) state = s[close + 2];
        }
        if (state == 'Z') break;
        std::this_thread::yield();
      }
    }
    auto ch = Channel::Create(name_, Options());
    ASSERT_TRUE(ch.ok()) << ch.status().ToString();
    ch->reset();
    ASSERT_TRUE(Channel::Remove(name_).ok());
    owner_proc.Reap();
  }
}

TEST_F(ProcessTest, SweepRemovesOnlySegmentsOfDeadOwners) {
  const std::string dead = name_ + "-dead", live = name_ + "-live", junk = name_ + "-junk";
  Child owner_proc;
  ASSERT_TRUE(owner_proc.Start(CKPT_IPC_PEER, {"own", dead}));
  std::string line;
  ASSERT_TRUE(owner_proc.Expect("ready", kLineTimeout, &line)) << line;
  owner_proc.Kill(SIGKILL);
  owner_proc.Reap();
  auto mine = Channel::Create(live, Options());
  ASSERT_TRUE(mine.ok()) << mine.status().ToString();
  { std::ofstream("/dev/shm/" + junk) << "not a ckpt segment"; }
  ASSERT_TRUE(std::filesystem::exists("/dev/shm/" + dead));

  const std::string prefix = name_ + "-";
  auto mine_only = [&](const std::string& n) { return n.compare(0, prefix.size(), prefix) == 0; };
  auto removed = Channel::RemoveStale(mine_only);
  ASSERT_TRUE(removed.ok()) << removed.status().ToString();
  EXPECT_EQ(*removed, std::vector<std::string>{dead});
  EXPECT_FALSE(std::filesystem::exists("/dev/shm/" + dead));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + live));
  EXPECT_TRUE(std::filesystem::exists("/dev/shm/" + junk));
  // The live owner's segment still works: a worker opens it.
  auto worker = Channel::Open(live, Options());
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
  // Nothing is left to sweep; a missing directory is no error.
  removed = Channel::RemoveStale(mine_only);
  ASSERT_TRUE(removed.ok());
  EXPECT_TRUE(removed->empty());
  removed = Channel::RemoveStale(mine_only, "/nonexistent-shm-dir");
  EXPECT_TRUE(removed.ok() && removed->empty());
  EXPECT_TRUE(Channel::RemoveStale(nullptr).status().IsInvalidArgument());
  worker->reset();
  mine->reset();
  EXPECT_TRUE(Channel::Remove(live).ok());
  std::filesystem::remove("/dev/shm/" + junk);
}

TEST_F(ProcessTest, SegmentOfLiveOwnerIsRefused) {
  Child owner_proc;
  StartPeer(&owner_proc, "own");
  std::string line;
  ASSERT_TRUE(owner_proc.Expect("ready", kLineTimeout, &line)) << line;
  auto ch = Channel::Create(name_, Options());
  ASSERT_EQ(ch.status().code(), StatusCode::kAlreadyExists) << ch.status().ToString();
  EXPECT_NE(ch.status().message().find("pid " + std::to_string(owner_proc.pid())),
            std::string::npos)
      << ch.status().message();
  // The live owner's segment is intact: a worker can still open it.
  auto worker = Channel::Open(name_, Options());
  EXPECT_TRUE(worker.ok()) << worker.status().ToString();
  worker->reset();
  owner_proc.WriteLine("exit");
  EXPECT_EQ(owner_proc.Reap(), 0);
  auto again = Channel::Create(name_, Options());
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// The hostile peer attaches as the worker and writes one bad record per case;
// each is rejected with Corruption and counted, and a good record right after
// it is delivered intact.
TEST_F(ProcessTest, HostilePeerGarbageIsRejectedAndCounted) {
  auto owner = CreateOwner(Options(20));
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "hostile");
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  int good = 0;
  auto run = [&](const std::string& cmd) {
    ASSERT_TRUE(peer.WriteLine(cmd));
    ASSERT_TRUE(peer.Expect("done", kLineTimeout, &line)) << cmd << ": " << line;
  };
  auto expect_good = [&] {
    run("good");
    auto r = owner->Receive(DeadlineIn(milliseconds(5000)));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->type, RecordType::kStats);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(r->payload), r->size),
              "good " + std::to_string(good++));
    owner->Release();
  };
  expect_good();
  const std::vector<std::string> bad = {
      "garbage",         "bad_header_sum", "huge_len",    "short_publish", "bad_payload_sum",
      "seq_jump",        "flip_payload",   "flip_header", "unknown_type",  "bad_flags",
      "frag_huge_total", "frag_gap",       "frag_orphan", "bad_padding"};
  uint64_t rejected = 0;
  for (const auto& cmd : bad) {
    SCOPED_TRACE(cmd);
    run(cmd);
    auto r = owner->Receive(DeadlineIn(milliseconds(5000)));
    EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
    ++rejected;
    EXPECT_EQ(owner->Stats().bad_records, rejected);
    expect_good();
  }
  EXPECT_EQ(owner->Stats().dropped_messages, 1u);  // frag_gap's first half

  // A well-framed record whose payload is not a valid message: the channel
  // delivers it, the decoder refuses it.
  run("json_garbage");
  auto r = owner->Receive(DeadlineIn(milliseconds(5000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(DecodeTrain(r->payload, r->size).status().IsCorruption());
  owner->Release();
  expect_good();

  // An impossible producer position breaks the receive side for good.
  run("head_back");
  for (int i = 0; i < 2; ++i) {
    auto broken = owner->Receive(DeadlineIn(milliseconds(5000)));
    EXPECT_TRUE(broken.status().IsCorruption()) << broken.status().ToString();
  }
  EXPECT_EQ(owner->Stats().bad_records, rejected + 1);
  peer.WriteLine("quit");
  EXPECT_EQ(peer.Reap(), 0);
}

TEST_F(ProcessTest, HostileConsumerPositionFailsTheSender) {
  auto owner = CreateOwner(Options(20));
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "hostile");
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  ASSERT_TRUE(peer.WriteLine("tail_garbage"));
  ASSERT_TRUE(peer.Expect("done", kLineTimeout, &line)) << line;
  Status s = owner->Send(RecordType::kTrain, "abc", 3, DeadlineIn(milliseconds(5000)));
  EXPECT_TRUE(s.IsCorruption()) << s.ToString();
  peer.WriteLine("quit");
  EXPECT_EQ(peer.Reap(), 0);
}

TEST_F(ProcessTest, PeerIdentityRewrittenCountsAsDeath) {
  auto owner = CreateOwner(Options(20));
  ASSERT_NE(owner, nullptr);
  Child peer;
  StartPeer(&peer, "hostile");
  std::string line;
  ASSERT_TRUE(peer.Expect("ready", kLineTimeout, &line)) << line;
  ASSERT_TRUE(peer.WriteLine("good"));
  ASSERT_TRUE(peer.Expect("done", kLineTimeout, &line)) << line;
  ASSERT_TRUE(owner->Receive(DeadlineIn(milliseconds(5000))).ok());
  // The heartbeat thread sees the attach within a few intervals.
  const auto give_up = Clock::now() + std::chrono::seconds(5);
  while (!owner->PeerAlive() && Clock::now() < give_up) std::this_thread::yield();
  ASSERT_TRUE(owner->PeerAlive());
  ASSERT_TRUE(peer.WriteLine("identity"));
  ASSERT_TRUE(peer.Expect("done", kLineTimeout, &line)) << line;
  const auto changed = Clock::now();
  auto r = owner->Receive(DeadlineIn(std::chrono::seconds(30)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_LT(Clock::now() - changed, kNoticeWithin);
  peer.WriteLine("quit");
  peer.Reap();
}

}  // namespace
}  // namespace ckpt::ipc
