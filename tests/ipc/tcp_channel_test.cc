// TcpChannel and TcpListener over real loopback sockets: records of every type
// both ways, peer death (closed channel, killed process), a silent peer,
// deadlines, corrupt frames from a hand-written peer, the handshake (right and
// wrong secrets, no proof, garbage), secret files, and a flood of bad
// connections.
#include "ckpt/ipc/tcp_channel.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/messages.h"
#include "tcp_frame.h"
#include "tcp_test_peer.h"
#include "tls.h"

namespace ckpt::ipc {
namespace {

using std::chrono::milliseconds;
namespace fs = std::filesystem;

using testing::Frame;
using testing::kSecret;
using testing::RawConnect;
using testing::RawListen;
using testing::ReadRaw;
using testing::ServerHandshake;
using testing::WriteRaw;
using testing::WriteSealed;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ckpt-tcp-test-XXXXXX";
    path_ = mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A listener on an ephemeral loopback port and one channel connected to it.
struct Pair {
  std::unique_ptr<TcpListener> listener;
  std::unique_ptr<Channel> scheduler;  // accepted side
  std::unique_ptr<Channel> worker;     // connecting side
  std::string peer;
};

Pair Connected(const TcpOptions& server = {}, const TcpOptions& client = {}) {
  Pair p;
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, server);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  p.listener = std::move(*l);
  const std::string addr = "127.0.0.1:" + std::to_string(p.listener->port());
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  std::thread t([&] { w = TcpChannel::Connect(addr, kSecret, client); });
  auto a = p.listener->Accept(DeadlineIn(milliseconds(10000)));
  t.join();
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  if (a.ok()) {
    p.scheduler = std::move(a->channel);
    p.peer = a->peer;
  }
  if (w.ok()) p.worker = std::move(*w);
  return p;
}

template <typename M>
std::vector<uint8_t> Encoded(const M& m) {
  std::vector<uint8_t> b(EncodedSize(m));
  EXPECT_TRUE(Encode(m, b.data(), b.size()).ok());
  return b;
}

TEST(TcpChannelTest, RoundTripsEveryRecordTypeIncludingMultiMegabyteState) {
  Pair p = Connected();
  ASSERT_TRUE(p.scheduler && p.worker);
  EXPECT_NE(p.peer.find("127.0.0.1:"), std::string::npos);
  const auto d = [] { return DeadlineIn(milliseconds(10000)); };

  Hello h;
  h.device = "cpu";
  h.slots = 3;
  ASSERT_TRUE(p.worker->Send(RecordType::kHello, Encoded(h).data(), EncodedSize(h), d()).ok());
  Configure c;
  c.experiment = "exp1";
  c.batch_size = 17;
  ASSERT_TRUE(
      p.scheduler->Send(RecordType::kConfigure, Encoded(c).data(), EncodedSize(c), d()).ok());

  // TRAIN with a 5 MB state through Reserve/Commit (fragments).
  std::vector<uint8_t> state(5 * 1000 * 1000 + 7);
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 131 + 7);
  Train t;
  t.task_id = 42;
  t.experiment = "exp1";
  t.member = "m3";
  t.steps = 10;
  t.state.size = state.size();
  auto r = p.scheduler->Reserve(RecordType::kTrain, EncodedSize(t), d());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto off = EncodeHeaderOnly(t, r->data, r->size);
  ASSERT_TRUE(off.ok());
  std::memcpy(r->data + *off, state.data(), state.size());
  ASSERT_TRUE(p.scheduler->Commit(*r, d()).ok());

  Result res;
  res.task_id = 42;
  res.experiment = "exp1";
  res.member = "m3";
  res.val_score = 0.5;
  res.state = ByteSpan{state.data(), state.size()};
  ASSERT_TRUE(p.worker->Send(RecordType::kResult, Encoded(res).data(), EncodedSize(res), d()).ok());
  Failed f;
  f.task_id = 43;
  f.experiment = "exp1";
  f.member = "m4";
  f.code = FailureCode::kNonFinite;
  ASSERT_TRUE(p.worker->Send(RecordType::kFailed, Encoded(f).data(), EncodedSize(f), d()).ok());
  Stats st;
  st.samples_total = 99;
  ASSERT_TRUE(p.worker->Send(RecordType::kStats, Encoded(st).data(), EncodedSize(st), d()).ok());
  Shutdown sd{"bye"};
  ASSERT_TRUE(
      p.scheduler->Send(RecordType::kShutdown, Encoded(sd).data(), EncodedSize(sd), d()).ok());

  // Worker side receives CONFIGURE, TRAIN, SHUTDOWN in order.
  auto rc = p.worker->Receive(d());
  ASSERT_TRUE(rc.ok()) << rc.status().ToString();
  EXPECT_EQ(rc->type, RecordType::kConfigure);
  auto dc = DecodeConfigure(rc->payload, rc->size);
  ASSERT_TRUE(dc.ok());
  EXPECT_EQ(dc->experiment, "exp1");
  EXPECT_EQ(dc->batch_size, 17);
  auto rt = p.worker->Receive(d());
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  ASSERT_EQ(rt->type, RecordType::kTrain);
  auto dt = DecodeTrain(rt->payload, rt->size);
  ASSERT_TRUE(dt.ok()) << dt.status().ToString();
  EXPECT_EQ(dt->task_id, 42u);
  ASSERT_EQ(dt->state.size, state.size());
  EXPECT_EQ(std::memcmp(dt->state.data, state.data(), state.size()), 0);
  auto rs = p.worker->Receive(d());
  ASSERT_TRUE(rs.ok());
  EXPECT_EQ(rs->type, RecordType::kShutdown);
  EXPECT_EQ(DecodeShutdown(rs->payload, rs->size)->reason, "bye");

  // Scheduler side receives HELLO, RESULT, FAILED, STATS in order.
  auto rh = p.scheduler->Receive(d());
  ASSERT_TRUE(rh.ok());
  EXPECT_EQ(rh->type, RecordType::kHello);
  EXPECT_EQ(DecodeHello(rh->payload, rh->size)->slots, 3);
  auto rr = p.scheduler->Receive(d());
  ASSERT_TRUE(rr.ok());
  ASSERT_EQ(rr->type, RecordType::kResult);
  auto dr = DecodeResult(rr->payload, rr->size);
  ASSERT_TRUE(dr.ok());
  ASSERT_EQ(dr->state.size, state.size());
  EXPECT_EQ(std::memcmp(dr->state.data, state.data(), state.size()), 0);
  auto rf = p.scheduler->Receive(d());
  ASSERT_TRUE(rf.ok());
  EXPECT_EQ(DecodeFailed(rf->payload, rf->size)->code, FailureCode::kNonFinite);
  auto rst = p.scheduler->Receive(d());
  ASSERT_TRUE(rst.ok());
  EXPECT_EQ(DecodeStats(rst->payload, rst->size)->samples_total, 99u);
  p.scheduler->Release();

  const ChannelStats s = p.scheduler->Stats();
  EXPECT_EQ(s.records_received, 4u);
  EXPECT_EQ(s.records_sent, 3u);
  EXPECT_EQ(s.bad_records, 0u);
  // Padding and fragments are not messages.
  EXPECT_TRUE(p.worker->Send(RecordType::kFragment, nullptr, 0, d()).IsInvalidArgument());
}

TEST(TcpChannelTest, ATrainSentInPartsArrivesAsOneMessage) {
  Pair p = Connected();
  ASSERT_TRUE(p.scheduler && p.worker);
  const auto d = [] { return DeadlineIn(milliseconds(10000)); };
  // As the scheduler sends it: the encoded header, then the state (3 MB:
  // more than one frame).
  std::vector<uint8_t> state(3 * 1000 * 1000 + 5);
  for (size_t i = 0; i < state.size(); ++i) state[i] = static_cast<uint8_t>(i * 31 + 1);
  Train t;
  t.task_id = 7;
  t.experiment = "exp1";
  t.member = "m1";
  t.state.size = state.size();
  auto prefix = EncodeStatePrefix(t);
  ASSERT_TRUE(prefix.ok()) << prefix.status().ToString();
  const PayloadPart parts[2] = {{prefix->data(), prefix->size()}, {state.data(), state.size()}};
  uint64_t sent = 0;
  ASSERT_TRUE(p.scheduler->SendParts(RecordType::kTrain, parts, 2, d(), &sent).ok());
  EXPECT_EQ(sent, prefix->size() + state.size());
  auto rt = p.worker->Receive(d());
  ASSERT_TRUE(rt.ok()) << rt.status().ToString();
  ASSERT_EQ(rt->type, RecordType::kTrain);
  auto dt = DecodeTrain(rt->payload, rt->size);
  ASSERT_TRUE(dt.ok()) << dt.status().ToString();
  EXPECT_EQ(dt->task_id, 7u);
  ASSERT_EQ(dt->state.size, state.size());
  EXPECT_EQ(std::memcmp(dt->state.data, state.data(), state.size()), 0);
  const PayloadPart null_part[1] = {{nullptr, 3}};
  sent = 0;
  EXPECT_TRUE(
      p.scheduler->SendParts(RecordType::kTrain, null_part, 1, d(), &sent).IsInvalidArgument());
}

TEST(TcpChannelTest, ReceiveDeadlineIsResourceExhaustedAndCloseAborts) {
  Pair p = Connected();
  ASSERT_TRUE(p.scheduler && p.worker);
  auto r = p.scheduler->Receive(DeadlineIn(milliseconds(100)));
  EXPECT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
  std::thread closer([&] {
    std::this_thread::sleep_for(milliseconds(100));
    p.scheduler->Close();
  });
  r = p.scheduler->Receive(DeadlineIn(milliseconds(60000)));
  closer.join();
  EXPECT_TRUE(r.status().IsAborted()) << r.status().ToString();
  EXPECT_TRUE(
      p.scheduler->Send(RecordType::kStats, "x", 1, DeadlineIn(milliseconds(100))).IsAborted());
}

TEST(TcpChannelTest, SendBlocksOnAPeerThatDoesNotReadUntilTheDeadline) {
  TcpOptions small;
  small.channel.ring_bytes = 1 << 20;  // the reader queues at most ~1 MiB
  Pair p = Connected(small, {});
  ASSERT_TRUE(p.scheduler && p.worker);
  std::vector<uint8_t> mb(kTcpMaxFramePayload, 7);
  Status s;
  int sent = 0;
  // Kernel buffers hold a few MB; the peer's queue 1 MiB; then Send waits.
  for (; sent < 1000; ++sent) {
    s = p.worker->Send(RecordType::kStats, mb.data(), mb.size(), DeadlineIn(milliseconds(300)));
    if (!s.ok()) break;
  }
  EXPECT_TRUE(s.IsResourceExhausted()) << s.ToString() << " after " << sent;
  EXPECT_LT(sent, 1000);
  // The blocked peer is not mistaken for a dead one, and everything sent
  // arrives once it reads.
  EXPECT_TRUE(p.worker->PeerAlive());
  for (int i = 0; i < sent; ++i) {
    auto r = p.scheduler->Receive(DeadlineIn(milliseconds(10000)));
    ASSERT_TRUE(r.ok()) << r.status().ToString() << " at " << i;
    ASSERT_EQ(r->size, mb.size());
  }
}

TEST(TcpChannelTest, PeerThatClosesIsUnavailableNamingIt) {
  Pair p = Connected();
  ASSERT_TRUE(p.scheduler && p.worker);
  Stats st;
  ASSERT_TRUE(p.worker
                  ->Send(RecordType::kStats, Encoded(st).data(), EncodedSize(st),
                         DeadlineIn(milliseconds(5000)))
                  .ok());
  p.worker.reset();
  // What it sent before closing is still delivered, then Unavailable.
  auto r = p.scheduler->Receive(DeadlineIn(milliseconds(10000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  r = p.scheduler->Receive(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(p.peer), std::string::npos) << r.status().ToString();
  EXPECT_FALSE(p.scheduler->PeerAlive());
  EXPECT_TRUE(p.scheduler->Send(RecordType::kStats, "x", 1, DeadlineIn(milliseconds(5000)))
                  .IsUnavailable());
}

TEST(TcpChannelTest, KilledPeerProcessIsUnavailable) {
  TempDir dir;
  const std::string secret_path = dir.path() + "/secret";
  ASSERT_TRUE(CreateSecretFile(secret_path).ok());
  auto secret = LoadSecretFile(secret_path);
  ASSERT_TRUE(secret.ok());
  TcpOptions o;
  o.channel.heartbeat_timeout = milliseconds(60000);  // death must be seen without it
  auto l = TcpListener::Listen("127.0.0.1:0", *secret, o);
  ASSERT_TRUE(l.ok());
  const std::string addr = "127.0.0.1:" + std::to_string((*l)->port());
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  std::vector<std::string> args = {CKPT_TCP_PEER, addr, secret_path};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  ASSERT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  auto a = (*l)->Accept(DeadlineIn(milliseconds(30000)));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  char line[16] = {};
  ASSERT_GT(read(out[0], line, 6), 0);  // "ready\n": its STATS is on the way
  close(out[0]);
  auto r = a->channel->Receive(DeadlineIn(milliseconds(10000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, RecordType::kStats);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  r = a->channel->Receive(DeadlineIn(milliseconds(30000)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find(a->peer), std::string::npos);
}

TEST(TcpChannelTest, SilentPeerIsUnavailableAfterTheHeartbeatTimeout) {
  TcpOptions watcher;
  watcher.channel.heartbeat_timeout = milliseconds(500);
  TcpOptions silent;
  silent.channel.heartbeat_interval = milliseconds(3600 * 1000);  // never beats
  Pair p = Connected(watcher, silent);
  ASSERT_TRUE(p.scheduler && p.worker);
  auto r = p.scheduler->Receive(DeadlineIn(milliseconds(30000)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("sent nothing"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find(p.peer), std::string::npos);
  // The silent side hears its connection closed.
  r = p.worker->Receive(DeadlineIn(milliseconds(30000)));
  EXPECT_TRUE(r.status().IsUnavailable()) << r.status().ToString();
}

TEST(TcpChannelTest, HeartbeatsKeepAnIdleConnectionAlive) {
  TcpOptions o;
  o.channel.heartbeat_interval = milliseconds(20);
  o.channel.heartbeat_timeout = milliseconds(1500);
  Pair p = Connected(o, o);
  ASSERT_TRUE(p.scheduler && p.worker);
  // Idle for more than two timeouts: heartbeats flow both ways.
  for (int i = 0; i < 8; ++i) {
    auto r = p.scheduler->Receive(DeadlineIn(milliseconds(500)));
    ASSERT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
  }
  EXPECT_TRUE(p.scheduler->PeerAlive());
  EXPECT_TRUE(p.worker->PeerAlive());
}

// ---------------------------------------------------------------------------
// A hand-written listener: does the handshake by the book, then sends frames
// that a TcpChannel must reject.

TEST(TcpChannelTest, CorruptPayloadIsSkippedAndCorruptHeaderBreaksTheStream) {
  uint16_t port = 0;
  int lfd = RawListen(&port);
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  std::thread t([&] { w = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {}); });
  int fd = accept(lfd, nullptr, nullptr);
  auto tls = ServerHandshake(fd, kSecret);
  ASSERT_TRUE(tls != nullptr);
  t.join();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto& ch = *w;
  Shutdown sd{"x"};
  const auto good = Encoded(sd);
  const auto type = static_cast<uint16_t>(RecordType::kShutdown);
  auto f1 = Frame(type, 1, good, /*bad_payload=*/true);
  auto f2 = Frame(type, 2, good);
  auto f3 = Frame(type, 3, good, false, /*bad_header=*/true);
  auto f4 = Frame(type, 4, good);
  for (const auto* f : {&f1, &f2, &f3, &f4}) WriteSealed(fd, *tls, *f);
  auto r = ch->Receive(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  r = ch->Receive(DeadlineIn(milliseconds(10000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, RecordType::kShutdown);
  r = ch->Receive(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  // Broken for good: the good frame after the bad header is not trusted.
  r = ch->Receive(DeadlineIn(milliseconds(1000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_EQ(ch->Stats().bad_records, 2u);
  close(fd);
  close(lfd);
}

TEST(TcpChannelTest, ListenerThatCannotProveTheSecretIsRefusedByTheWorker) {
  uint16_t port = 0;
  int lfd = RawListen(&port);
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  std::thread t([&] { w = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {}); });
  int fd = accept(lfd, nullptr, nullptr);
  // A TLS server keyed by another secret: the handshake fails on both sides.
  auto tls = ServerHandshake(fd, "another secret, at least 32 bytes long");
  EXPECT_EQ(tls, nullptr);
  t.join();
  EXPECT_TRUE(w.status().code() == StatusCode::kFailedPrecondition) << w.status().ToString();
  close(fd);
  close(lfd);
}

TEST(TcpChannelTest, PlaintextListenerIsRefusedByTheWorker) {
  // Something that answers in plain bytes (a version-1 listener, or anything
  // else) is not a TLS 1.3 peer holding the key.
  uint16_t port = 0;
  int lfd = RawListen(&port);
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  TcpOptions o;
  o.handshake_timeout = milliseconds(2000);
  std::thread t([&] { w = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, o); });
  int fd = accept(lfd, nullptr, nullptr);
  std::vector<uint8_t> hello(4096);
  (void)read(fd, hello.data(), hello.size());
  Shutdown sd{"x"};
  auto f = Frame(static_cast<uint16_t>(RecordType::kShutdown), 1, Encoded(sd));
  WriteRaw(fd, f.data(), f.size());
  t.join();
  EXPECT_FALSE(w.ok());
  EXPECT_TRUE(w.status().code() == StatusCode::kFailedPrecondition) << w.status().ToString();
  close(fd);
  close(lfd);
}

struct Refusals {
  std::mutex mu;
  std::vector<std::string> seen;
  void Add(const std::string& peer, const Status& why) {
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(peer + ": " + why.ToString());
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return seen.size();
  }
};

TEST(TcpChannelTest, WrongSecretIsRefusedAndLogged) {
  Refusals refusals;
  TcpOptions o;
  o.on_refused = [&](const std::string& peer, const Status& why) { refusals.Add(peer, why); };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  const std::string addr = "127.0.0.1:" + std::to_string((*l)->port());
  auto w = TcpChannel::Connect(addr, "a different secret of at least 32 bytes", {});
  EXPECT_TRUE(w.status().code() == StatusCode::kFailedPrecondition) << w.status().ToString();
  auto a = (*l)->Accept(DeadlineIn(milliseconds(200)));
  EXPECT_TRUE(a.status().IsResourceExhausted());
  EXPECT_EQ((*l)->Stats().refused, 1u);
  EXPECT_EQ((*l)->Stats().accepted, 0u);
  ASSERT_EQ(refusals.size(), 1u);
  EXPECT_NE(refusals.seen[0].find("127.0.0.1:"), std::string::npos) << refusals.seen[0];
  EXPECT_NE(refusals.seen[0].find("wrong secret"), std::string::npos) << refusals.seen[0];
}

TEST(TcpChannelTest, NoProofAndGarbageAreRefused) {
  Refusals refusals;
  TcpOptions o;
  o.handshake_timeout = milliseconds(300);
  o.on_refused = [&](const std::string& peer, const Status& why) { refusals.Add(peer, why); };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  int silent = RawConnect((*l)->port());
  int garbage = RawConnect((*l)->port());
  std::vector<uint8_t> junk(64, 0xAB);
  WriteRaw(garbage, junk.data(), junk.size());
  // Both connections are closed by the listener: reads end (after an alert).
  for (int fd : {silent, garbage}) {
    std::vector<uint8_t> buf(4096);
    ssize_t n;
    while ((n = read(fd, buf.data(), buf.size())) > 0) {
    }
    EXPECT_LE(n, 0);
    close(fd);
  }
  EXPECT_EQ((*l)->Stats().refused, 2u);
  EXPECT_EQ((*l)->Stats().accepted, 0u);
  ASSERT_EQ(refusals.size(), 2u);
  std::string all = refusals.seen[0] + refusals.seen[1];
  EXPECT_NE(all.find("handshake not done"), std::string::npos) << all;
  EXPECT_NE(all.find("not a ckpt worker"), std::string::npos) << all;
}

TEST(TcpChannelTest, ListenerSurvivesAFloodOfBadConnections) {
  TcpOptions o;
  o.handshake_timeout = milliseconds(500);
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  const uint16_t port = (*l)->port();
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {
    int fd = RawConnect(port);
    if (i % 3 == 0) {
      std::vector<uint8_t> junk(100, static_cast<uint8_t>(i));
      WriteRaw(fd, junk.data(), junk.size());
    } else if (i % 3 == 1) {
      close(fd);  // gone at once
      continue;
    }
    fds.push_back(fd);  // silent ones stay open
  }
  // A real worker still gets in.
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  std::thread t([&] {
    for (int attempt = 0; attempt < 20; ++attempt) {
      w = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {});
      if (w.ok()) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
  });
  auto a = (*l)->Accept(DeadlineIn(milliseconds(30000)));
  t.join();
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (int fd : fds) close(fd);
  EXPECT_EQ((*l)->Stats().accepted, 1u);
  EXPECT_GE((*l)->Stats().refused, 100u);
}

TEST(TcpChannelTest, OnAcceptedGetsTheAuthenticatedConnectionsInsteadOfAccept) {
  std::mutex mu;
  std::vector<Accepted> got;
  TcpOptions o;
  o.on_accepted = [&](Accepted a) {
    std::lock_guard<std::mutex> l(mu);
    got.push_back(std::move(a));
  };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  auto w = TcpChannel::Connect("127.0.0.1:" + std::to_string((*l)->port()), kSecret, {});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  // Handed over when the listener's proof has gone out: about when Connect
  // returns.
  const auto until = Clock::now() + milliseconds(10000);
  while (Clock::now() < until) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!got.empty()) break;
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  (*l)->Close();
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ((*l)->Stats().accepted, 1u);
  EXPECT_TRUE((*l)->Accept(DeadlineIn(milliseconds(10))).status().IsAborted());
  Stats st;
  ASSERT_TRUE((*w)->Send(RecordType::kStats, Encoded(st).data(), EncodedSize(st),
                         DeadlineIn(milliseconds(5000)))
                  .ok());
  auto r = got[0].channel->Receive(DeadlineIn(milliseconds(10000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, RecordType::kStats);
}

TEST(TcpChannelTest, SecretFileIsCreatedPrivateAndOpenOnesAreRefused) {
  TempDir dir;
  const std::string path = dir.path() + "/secret";
  ASSERT_TRUE(CreateSecretFile(path).ok());
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto s = LoadSecretFile(path);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->size(), 64u);
  EXPECT_TRUE(CreateSecretFile(path).code() == StatusCode::kAlreadyExists);
  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  s = LoadSecretFile(path);
  EXPECT_TRUE(s.status().code() == StatusCode::kFailedPrecondition) << s.status().ToString();
  EXPECT_NE(s.status().message().find("0644"), std::string::npos) << s.status().ToString();
  EXPECT_NE(s.status().message().find(path), std::string::npos);
  ASSERT_EQ(chmod(path.c_str(), 0620), 0);
  EXPECT_TRUE(LoadSecretFile(path).status().code() == StatusCode::kFailedPrecondition);

  const std::string short_path = dir.path() + "/short";
  { std::ofstream(short_path) << "too short\n"; }
  ASSERT_EQ(chmod(short_path.c_str(), 0600), 0);
  EXPECT_TRUE(LoadSecretFile(short_path).status().code() == StatusCode::kFailedPrecondition);
  EXPECT_TRUE(LoadSecretFile(dir.path() + "/absent").status().IsNotFound());
}

}  // namespace
}  // namespace ckpt::ipc
