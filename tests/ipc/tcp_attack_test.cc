// Hostile peers of the TCP transport over real loopback sockets: a man in the
// middle (a relay thread) that flips one bit of the TLS stream or replays a
// recorded opening, an authenticated peer that claims a 2 GiB message, and
// 1,000 slow connections from one address that must not keep a real worker
// out; the receive limit, the memory budget that channels share and empty
// messages against the receive queue. Loopback only (127.0.0.1 and 127.0.0.2).
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/ipc/messages.h"
#include "ckpt/ipc/tcp_channel.h"
#include "source_network.h"
#include "tcp_test_peer.h"

namespace ckpt::ipc {
namespace {

using std::chrono::milliseconds;
using testing::kSecret;

// Relays one connection between a client and `upstream_port`, handing each
// chunk of the client's stream to `tamper` (which may change it) and
// recording it.
class Relay {
 public:
  using Tamper = std::function<void(std::vector<uint8_t>* chunk, uint64_t offset)>;
  Relay(uint16_t upstream_port, Tamper tamper) : tamper_(std::move(tamper)) {
    lfd_ = testing::RawListen(&port_);
    thread_ = std::thread([this, upstream_port] { Run(upstream_port); });
  }
  ~Relay() {
    stop_ = true;
    thread_.join();
    close(lfd_);
  }
  uint16_t port() const { return port_; }
  std::vector<uint8_t> recorded() {
    std::lock_guard<std::mutex> l(mu_);
    return recorded_;
  }

 private:
  void Run(uint16_t upstream_port) {
    pollfd pl{lfd_, POLLIN, 0};
    while (!stop_ && poll(&pl, 1, 50) == 0) {
    }
    if (stop_) return;
    const int down = accept(lfd_, nullptr, nullptr);
    const int up = testing::RawConnect(upstream_port);
    uint64_t offset = 0;
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
      pollfd p[2] = {{down, POLLIN, 0}, {up, POLLIN, 0}};
      if (poll(p, 2, 50) <= 0) continue;
      if (p[1].revents != 0) {
        const ssize_t n = recv(up, buf.data(), buf.size(), 0);
        if (n <= 0 || send(down, buf.data(), static_cast<size_t>(n), MSG_NOSIGNAL) != n) break;
      }
      if (p[0].revents != 0) {
        const ssize_t n = recv(down, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        std::vector<uint8_t> chunk(buf.data(), buf.data() + n);
        {
          std::lock_guard<std::mutex> l(mu_);
          recorded_.insert(recorded_.end(), chunk.begin(), chunk.end());
        }
        if (tamper_) tamper_(&chunk, offset);
        offset += static_cast<uint64_t>(n);
        // The listener may have dropped the connection already (that is
        // what a tampered record earns): the relay then stops, as a wire would.
        if (!testing::TryWriteRaw(up, chunk.data(), chunk.size())) break;
      }
    }
    close(down);
    close(up);
  }

  Tamper tamper_;
  int lfd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::mutex mu_;
  std::vector<uint8_t> recorded_;
};

struct Refusals {
  std::mutex mu;
  std::vector<std::string> seen;
  void Add(const std::string& peer, const Status& why) {
    std::lock_guard<std::mutex> l(mu);
    seen.push_back(peer + ": " + why.ToString());
  }
  std::string All() {
    std::lock_guard<std::mutex> l(mu);
    std::string out;
    for (const auto& s : seen) out += s + "\n";
    return out;
  }
  size_t size() {
    std::lock_guard<std::mutex> l(mu);
    return seen.size();
  }
};

std::vector<uint8_t> StatsRecord(uint64_t samples) {
  Stats st;
  st.samples_total = samples;
  std::vector<uint8_t> b(EncodedSize(st));
  EXPECT_TRUE(Encode(st, b.data(), b.size()).ok());
  return b;
}

TEST(TcpAttackTest, OneFlippedBitAfterTheHandshakeKillsTheConnectionAndIsNotDelivered) {
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, {});
  ASSERT_TRUE(l.ok());
  // The handshake is a few hundred bytes; from 4 KiB on the worker sends
  // records only. One bit flips there.
  std::atomic<bool> flipped{false};
  constexpr uint64_t kAt = 4096 + 100;
  Relay relay((*l)->port(), [&](std::vector<uint8_t>* c, uint64_t off) {
    if (off <= kAt && kAt < off + c->size()) {
      (*c)[kAt - off] ^= 0x01;
      flipped = true;
    }
  });
  auto w = TcpChannel::Connect("127.0.0.1:" + std::to_string(relay.port()), kSecret, {});
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  auto a = (*l)->Accept(DeadlineIn(milliseconds(10000)));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // Records of 1 KiB: the first few arrive intact, then the flipped one is
  // refused, and nothing after it is delivered.
  const std::vector<uint8_t> kib(1024, 0x33);
  for (int i = 0; i < 64; ++i) {
    if (!(*w)->Send(RecordType::kStats, kib.data(), kib.size(), DeadlineIn(milliseconds(5000)))
             .ok()) {
      break;
    }
  }
  int delivered = 0;
  Status end;
  while (true) {
    auto r = a->channel->Receive(DeadlineIn(milliseconds(10000)));
    if (!r.ok()) {
      end = r.status();
      break;
    }
    ASSERT_EQ(r->size, kib.size());
    ASSERT_EQ(std::memcmp(r->payload, kib.data(), kib.size()), 0) << "a changed record delivered";
    ++delivered;
  }
  EXPECT_TRUE(flipped.load());
  EXPECT_LT(delivered, 64);
  EXPECT_TRUE(end.IsUnavailable()) << end.ToString();
  EXPECT_NE(end.message().find("TLS record refused"), std::string::npos) << end.ToString();
  EXPECT_NE(end.message().find(a->peer), std::string::npos) << end.ToString();
  EXPECT_FALSE(a->channel->PeerAlive());
}

TEST(TcpAttackTest, AReplayedOpeningIsRefusedByTheListener) {
  Refusals refusals;
  TcpOptions o;
  o.on_refused = [&](const std::string& peer, const Status& why) { refusals.Add(peer, why); };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  std::vector<uint8_t> recorded;
  {
    Relay relay((*l)->port(), nullptr);
    auto w = TcpChannel::Connect("127.0.0.1:" + std::to_string(relay.port()), kSecret, {});
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    auto a = (*l)->Accept(DeadlineIn(milliseconds(10000)));
    ASSERT_TRUE(a.ok());
    const auto rec = StatsRecord(7);
    ASSERT_TRUE(
        (*w)->Send(RecordType::kStats, rec.data(), rec.size(), DeadlineIn(milliseconds(5000)))
            .ok());
    ASSERT_TRUE(a->channel->Receive(DeadlineIn(milliseconds(5000))).ok());
    recorded = relay.recorded();
  }
  ASSERT_GT(recorded.size(), 200u);
  // On the wire, nothing of the frames shows: not their magic ("ckpT").
  const std::string wire_bytes(recorded.begin(), recorded.end());
  EXPECT_EQ(wire_bytes.find("ckpT"), std::string::npos) << "a frame travelled in the clear";
  // The whole recorded client side, sent again on a new connection.
  const int fd = testing::RawConnect((*l)->port());
  testing::WriteRaw(fd, recorded.data(), recorded.size());
  std::vector<uint8_t> sink(4096);
  while (read(fd, sink.data(), sink.size()) > 0) {
  }
  close(fd);
  auto again = (*l)->Accept(DeadlineIn(milliseconds(500)));
  EXPECT_TRUE(again.status().IsResourceExhausted()) << "a replayed session was accepted";
  EXPECT_EQ((*l)->Stats().accepted, 1u);
  EXPECT_EQ((*l)->Stats().refused, 1u);
  EXPECT_NE(refusals.All().find("not a ckpt worker"), std::string::npos) << refusals.All();
}

int64_t PeakRssKiB() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(TcpAttackTest, AnAuthenticatedPeerClaimingA2GiBMessageBreaksOnlyItsStream) {
  uint16_t port = 0;
  const int lfd = testing::RawListen(&port);
  StatusOr<std::unique_ptr<Channel>> w = Status::Internal("unset");
  std::thread t([&] { w = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {}); });
  const int fd = accept(lfd, nullptr, nullptr);
  auto tls = testing::ServerHandshake(fd, kSecret);
  ASSERT_TRUE(tls != nullptr);
  t.join();
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int64_t before = PeakRssKiB();
  // The first fragment of a 2 GiB RESULT: its header claims the whole size.
  std::vector<uint8_t> mib(kTcpMaxFramePayload, 0x77);
  auto f = testing::Frame(static_cast<uint16_t>(RecordType::kFragment), 1, mib);
  auto* h = reinterpret_cast<wire::FrameHeader*>(f.data());
  h->flags = wire::kFlagFirst;
  h->message_type = static_cast<uint16_t>(RecordType::kResult);
  h->message_bytes = uint64_t{2} << 30;
  h->header_xxh3 = Xxh3_64(h, wire::kHeaderChecked);
  testing::WriteSealed(fd, *tls, f);
  auto r = (*w)->Receive(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("bad fragment header"), std::string::npos)
      << r.status().ToString();
  EXPECT_LT(PeakRssKiB() - before, 64 * 1024) << "the claim was buffered";
  tls.reset();
  close(fd);
  close(lfd);
}

TEST(TcpAttackTest, AThousandSlowConnectionsDoNotKeepAWorkerOut) {
  // Descriptors for 1,000 connections, both ends, in this process.
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_cur < 2500) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 4096);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  if (nofile.rlim_cur < 2500) GTEST_SKIP() << "RLIMIT_NOFILE too low: " << nofile.rlim_cur;
  std::atomic<uint64_t> refusals{0};
  TcpOptions o;
  o.handshake_timeout = milliseconds(1000);
  o.on_refused = [&](const std::string&, const Status&) { ++refusals; };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  const uint16_t port = (*l)->port();
  // 1,000 connections from 127.0.1.2 (another /24 than the worker's), each
  // with the first byte of a TLS record and then nothing (a slow client).
  const auto start = Clock::now();
  std::vector<int> slow;
  for (int i = 0; i < 1000; ++i) {
    const int fd = testing::RawConnect(port, "127.0.1.2");
    const uint8_t first = 0x16;
    testing::WriteRaw(fd, &first, 1);
    slow.push_back(fd);
  }
  // A real worker, from 127.0.0.1, gets in at once: the slow ones hold at
  // most max_handshakes_per_source slots.
  const auto before_worker = Clock::now();
  auto wk = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {});
  ASSERT_TRUE(wk.ok()) << wk.status().ToString();
  auto a = (*l)->Accept(DeadlineIn(milliseconds(5000)));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_LT(Clock::now() - before_worker, milliseconds(3000));
  // Every slow one is refused within the handshake timeout of its slot.
  const auto until = Clock::now() + milliseconds(20000);
  while ((*l)->Stats().refused < 1000 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ((*l)->Stats().refused, 1000u);
  EXPECT_EQ(refusals.load(), 1000u);
  EXPECT_EQ((*l)->Stats().accepted, 1u);
  EXPECT_LT(Clock::now() - start, milliseconds(20000));
  for (int fd : slow) close(fd);
  // And the worker's link works.
  const auto rec = StatsRecord(3);
  ASSERT_TRUE(
      (*wk)->Send(RecordType::kStats, rec.data(), rec.size(), DeadlineIn(milliseconds(5000))).ok());
  auto r = a->channel->Receive(DeadlineIn(milliseconds(5000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

TEST(TcpAttackTest, OneSubnetHoldsAtMostItsShareOfHandshakes) {
  std::vector<std::string> why;
  std::mutex mu;
  TcpOptions o;
  o.handshake_timeout = milliseconds(20000);
  o.on_refused = [&](const std::string& peer, const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    why.push_back(peer + ": " + s.ToString());
  };
  auto l = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(l.ok());
  const uint16_t port = (*l)->port();
  // One more slow client than the per-network share, each from an address
  // of its own in 127.0.2.0/24: counted per address, every one would hold a
  // slot; counted per /24, the last is refused at once.
  std::vector<int> slow;
  for (int i = 0; i <= o.max_handshakes_per_source; ++i) {
    const std::string from = "127.0.2." + std::to_string(10 + i);
    const int fd = testing::RawConnect(port, from.c_str());
    const uint8_t first = 0x16;
    testing::WriteRaw(fd, &first, 1);
    slow.push_back(fd);
  }
  const auto until = Clock::now() + milliseconds(10000);
  while ((*l)->Stats().refused < 1 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(why.size(), 1u);
    EXPECT_NE(why[0].find("too many handshakes in progress from 127.0.2.0/24 (" +
                          std::to_string(o.max_handshakes_per_source) + ")"),
              std::string::npos)
        << why[0];
  }
  // Another /24 still gets a slot: a worker from 127.0.0.1 is accepted.
  auto wk = TcpChannel::Connect("127.0.0.1:" + std::to_string(port), kSecret, {});
  ASSERT_TRUE(wk.ok()) << wk.status().ToString();
  auto a = (*l)->Accept(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  for (int fd : slow) close(fd);
}

TEST(SourceNetworkTest, IPv4CountsPerSlash24AndIPv6PerSlash64) {
  namespace ip = boost::asio::ip;
  using internal::SourceNetwork;
  EXPECT_EQ(SourceNetwork(ip::make_address("192.0.2.77")), "192.0.2.0/24");
  EXPECT_EQ(SourceNetwork(ip::make_address("192.0.2.1")),
            SourceNetwork(ip::make_address("192.0.2.254")));
  EXPECT_NE(SourceNetwork(ip::make_address("192.0.2.1")),
            SourceNetwork(ip::make_address("192.0.3.1")));
  EXPECT_EQ(SourceNetwork(ip::make_address("2001:db8:1:2:aaaa:bbbb:cccc:dddd")),
            "2001:db8:1:2::/64");
  EXPECT_EQ(SourceNetwork(ip::make_address("2001:db8:1:2::1")),
            SourceNetwork(ip::make_address("2001:db8:1:2:ffff::9")));
  EXPECT_NE(SourceNetwork(ip::make_address("2001:db8:1:2::1")),
            SourceNetwork(ip::make_address("2001:db8:1:3::1")));
  EXPECT_EQ(SourceNetwork(ip::make_address("::ffff:198.51.100.9")), "198.51.100.0/24");
  EXPECT_EQ(SourceNetwork(ip::make_address("::1")), "::/64");
}

// docs/LIMITS.md's TCP rows say what the code's constants are: each number
// is printed from the constant and looked for in the row that names it.
std::string Mib(size_t bytes) {
  return bytes % (size_t{1} << 30) == 0 ? std::to_string(bytes >> 30) + " GiB"
                                        : std::to_string(bytes >> 20) + " MiB";
}

TEST(TcpAttackTest, LimitsDocMatchesTheConstants) {
  std::ifstream in(std::string(CKPT_SOURCE_DIR) + "/docs/LIMITS.md");
  ASSERT_TRUE(in) << "docs/LIMITS.md";
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  const TcpOptions o;
  const std::vector<std::string> want = {
      "`kDefaultTcpMaxMessageBytes`: the store's default blob limit (" +
          Mib(kDefaultTcpMaxMessageBytes - kTcpMessageSlackBytes) + ") + " +
          Mib(kTcpMessageSlackBytes) + " (`kTcpMessageSlackBytes`)",
      Mib(kTcpMaxFramePayload) + " (`kTcpMaxFramePayload`)",
      std::to_string(o.max_pending_handshakes) + " (`max_pending_handshakes`), " +
          std::to_string(o.max_handshakes_per_source) +
          " from one network, an IPv4 /24 or an IPv6 /64 (`max_handshakes_per_source`), each "
          "done within " +
          std::to_string(o.handshake_timeout.count() / 1000) + " s",
  };
  for (const auto& w : want) EXPECT_NE(doc.find(w), std::string::npos) << "not in LIMITS.md: " << w;
  EXPECT_EQ(o.channel.max_message_bytes, kDefaultTcpMaxMessageBytes);
}

// A listener on loopback with `options` and a worker connected to it: the
// scheduler's side of the connection and the worker's.
struct Link {
  std::unique_ptr<TcpListener> listener;
  std::unique_ptr<Channel> server;
  std::unique_ptr<Channel> client;
};

Link Connected(const TcpOptions& options, std::unique_ptr<TcpListener> listener = nullptr) {
  Link l;
  if (!listener) {
    auto made = TcpListener::Listen("127.0.0.1:0", kSecret, options);
    EXPECT_TRUE(made.ok()) << made.status().ToString();
    if (!made.ok()) return l;
    listener = std::move(*made);
  }
  TcpOptions client;
  client.channel.max_message_bytes = uint64_t{1} << 40;  // the sender claims what it likes
  auto c = TcpChannel::Connect("127.0.0.1:" + std::to_string(listener->port()), kSecret, client);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  if (!c.ok()) return l;
  auto a = listener->Accept(DeadlineIn(milliseconds(10000)));
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  if (!a.ok()) return l;
  l.listener = std::move(listener);
  l.server = std::move(a->channel);
  l.client = std::move(*c);
  return l;
}

// `bytes` of anonymous memory never written: reading it costs no resident page.
struct Zeros {
  explicit Zeros(size_t n) : bytes(n) {
    p = mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) std::abort();
  }
  ~Zeros() { munmap(p, bytes); }
  size_t bytes;
  void* p;
};

TEST(TcpAttackTest, AMessageOverItsLimitIsRefusedAtItsFirstHeaderBeforeAnyBuffer) {
  TcpOptions o;
  o.receive_limit = [](RecordType type, uint64_t bytes) {
    if (type == RecordType::kResult && bytes <= (uint64_t{1} << 20)) return Status::OK();
    return Status::ResourceExhausted("no " + std::string(RecordTypeName(type)) + " of " +
                                     std::to_string(bytes) + " bytes here");
  };
  Link l = Connected(o);
  ASSERT_TRUE(l.server && l.client);
  const int64_t before = PeakRssKiB();
  const Zeros claim(size_t{256} << 20);
  std::thread sender([&] {
    (void)l.client->Send(RecordType::kResult, claim.p, claim.bytes,
                         DeadlineIn(milliseconds(60000)));
  });
  auto r = l.server->Receive(DeadlineIn(milliseconds(60000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("no RESULT of 268435456 bytes here"), std::string::npos)
      << r.status().ToString();
  l.server->Close();
  l.client->Close();
  sender.join();
  EXPECT_LT(PeakRssKiB() - before, 32 * 1024) << "the refused message was buffered";
}

TEST(TcpAttackTest, ChannelsShareOneReceiveBudget) {
  auto budget = std::make_shared<ReceiveBudget>(uint64_t{8} << 20);
  TcpOptions o;
  o.budget = budget;
  o.channel.heartbeat_timeout = milliseconds(120000);  // a claim waits this long for room
  auto listener = TcpListener::Listen("127.0.0.1:0", kSecret, o);
  ASSERT_TRUE(listener.ok());
  Link a = Connected(o, std::move(*listener));
  ASSERT_TRUE(a.server && a.client);
  Link b = Connected(o, std::move(a.listener));
  ASSERT_TRUE(b.server && b.client);
  // 6 MiB each: the two never fit at once.
  const std::vector<uint8_t> six(size_t{6} << 20, 0x5a);
  std::thread sa([&] {
    EXPECT_TRUE(
        a.client
            ->Send(RecordType::kResult, six.data(), six.size(), DeadlineIn(milliseconds(120000)))
            .ok());
  });
  std::thread sb([&] {
    EXPECT_TRUE(
        b.client
            ->Send(RecordType::kResult, six.data(), six.size(), DeadlineIn(milliseconds(120000)))
            .ok());
  });
  // Whichever claimed first arrives; the other's claim waits while it is held.
  Channel* first = nullptr;
  Channel* second = nullptr;
  const auto until = Clock::now() + milliseconds(120000);
  while (first == nullptr && Clock::now() < until) {
    for (Channel* c : {a.server.get(), b.server.get()}) {
      auto r = c->Receive(DeadlineIn(milliseconds(50)));
      if (r.ok()) {
        EXPECT_EQ(r->size, six.size());
        first = c;
        second = c == a.server.get() ? b.server.get() : a.server.get();
        break;
      }
      ASSERT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
    }
  }
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(budget->used(), six.size() + kTcpReceivedItemBytes);
  first->Release();
  auto r = second->Receive(DeadlineIn(milliseconds(120000)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->size, six.size());
  second->Release();
  sa.join();
  sb.join();
  EXPECT_LE(budget->peak(), budget->limit());
  EXPECT_EQ(budget->used(), 0u);
  // A claim larger than the whole budget is refused at once.
  const std::vector<uint8_t> nine(size_t{9} << 20, 0x5a);
  std::thread sc([&] {
    (void)a.client->Send(RecordType::kResult, nine.data(), nine.size(),
                         DeadlineIn(milliseconds(10000)));
  });
  r = a.server->Receive(DeadlineIn(milliseconds(60000)));
  EXPECT_TRUE(r.status().IsCorruption()) << r.status().ToString();
  EXPECT_NE(r.status().message().find("above the whole remote memory budget of 8388608 bytes"),
            std::string::npos)
      << r.status().ToString();
  a.client->Close();
  sc.join();
}

TEST(TcpAttackTest, EmptyMessagesCountAgainstTheReceiveQueue) {
  auto budget = std::make_shared<ReceiveBudget>(uint64_t{1} << 30);  // to watch the queue
  TcpOptions o;
  o.budget = budget;
  o.channel.ring_bytes = 4096;
  o.channel.heartbeat_timeout = milliseconds(120000);
  Link l = Connected(o);
  ASSERT_TRUE(l.server && l.client);
  constexpr int kMessages = 20000;
  std::thread sender([&] {
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE(
          l.client->Send(RecordType::kStats, nullptr, 0, DeadlineIn(milliseconds(120000))).ok());
    }
  });
  // Nothing is taken until the reader has filled its queue and stopped.
  const auto until = Clock::now() + milliseconds(120000);
  while (budget->used() < 4096 && Clock::now() < until) {
    std::this_thread::sleep_for(milliseconds(5));
  }
  int received = 0;
  while (received < kMessages) {
    auto r = l.server->Receive(DeadlineIn(milliseconds(120000)));
    ASSERT_TRUE(r.ok()) << r.status().ToString() << " after " << received;
    ++received;
  }
  sender.join();
  // The queue held at most its bound and one more message, never all of them.
  EXPECT_GE(budget->peak(), 4096u);
  EXPECT_LE(budget->peak(), 4096u + kTcpReceivedItemBytes);
}

}  // namespace
}  // namespace ckpt::ipc
