// ckpt-bench transport: the per-record round trip of the two transports
// between two processes on this host: a 0.5 MiB TRAIN-sized request answered
// by a 0.5 MiB RESULT-sized reply, each read whole by its receiver, over the
// shared-memory ring (Channel::Create/Open) and over TCP on loopback
// (TcpListener/TcpChannel::Connect: TLS 1.3, as a worker's link). Median and
// p99 of each, and their ratio. Also the one-way throughput of 16 MiB records
// over each.
//
// And the floor under any TCP channel, in the same run: the same round trips
// and 16 MiB records over a bare loopback socket (`tcp_raw_*`: the kernel's
// copy alone, no frames, no checksum, no TLS). A plain-TCP channel (ckpt's
// before TLS: 64-byte frames with an XXH3 of each payload) cannot be faster,
// so `tls_vs_raw_tcp_throughput` (raw GB/s / TLS GB/s) bounds from above what
// TLS costs against plain TCP on this host.
//
//   ckpt-bench transport [--roundtrips 300] [--bytes 524288] [--mib 512]
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/tcp_channel.h"
#include "echo_peer.h"

namespace ckpt::bench {
namespace {

using ipc::Channel;
using ipc::RecordType;
using Seconds = std::chrono::duration<double>;
constexpr auto kWait = kPeerWait;

volatile uint64_t g_sink;

struct Figures {
  double median_us = 0;
  double p99_us = 0;
  double gb_s = 0;
};

// ---------------------------------------------------------------- bare socket
// A message on the bare socket: a 9-byte header (kind, size) and `size`
// bytes. Kinds: 'h' answer with as many bytes, 't' read and drop, 'c' answer
// 8 bytes (end of a batch), 's' exit.
struct RawHeader {
  char kind;
  uint64_t size;
} __attribute__((packed));
static_assert(sizeof(RawHeader) == 9);

bool WriteFully(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadFully(int fd, void* data, size_t n) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

bool SendRaw(int fd, char kind, const std::vector<uint8_t>& payload) {
  const RawHeader h{kind, payload.size()};
  return WriteFully(fd, &h, sizeof(h)) && WriteFully(fd, payload.data(), payload.size());
}

// Reads a message into *buf (grown as needed); its kind, or 0 when the
// connection broke.
char ReceiveRaw(int fd, std::vector<uint8_t>* buf) {
  RawHeader h{};
  if (!ReadFully(fd, &h, sizeof(h))) return 0;
  if (buf->size() < h.size) buf->resize(h.size);
  buf->resize(h.size);
  return ReadFully(fd, buf->data(), h.size) ? h.kind : 0;
}

int RawEcho(int fd) {
  std::vector<uint8_t> in, reply;
  uint64_t acc = 0;
  for (;;) {
    const char kind = ReceiveRaw(fd, &in);
    if (kind == 0) return 1;
    acc ^= ReadAll(in.data(), in.size());
    if (kind == 's') break;
    bool ok = true;
    if (kind == 'h') {
      if (reply.size() != in.size()) reply.assign(in.size(), 0x5a);
      ok = SendRaw(fd, 'r', reply);
    } else if (kind == 'c') {
      ok = SendRaw(fd, 'r', std::vector<uint8_t>(sizeof(acc), 0));
    }
    if (!ok) return 1;
  }
  g_sink = acc;
  return 0;
}

// A loopback socket listening on an ephemeral port: its fd and port.
bool ListenLoopback(int* fd, int* port) {
  *fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (*fd < 0 || ::bind(*fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::listen(*fd, 1) != 0 || ::getsockname(*fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    return false;
  }
  *port = ntohs(a.sin_port);
  return true;
}

int ConnectLoopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  return fd;
}

// As a channel does: no Nagle delay on the small headers.
void NoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// The timing both kinds of link share: `roundtrips` round trips after 20
// that warm up (`roundtrip(request)`: send it, read the reply whole), then the
// one-way throughput of 16 MiB records (`send(big)` each, then `confirm()`:
// the peer has read them all).
template <typename RoundTrip, typename Send, typename Confirm>
StatusOr<Figures> Time(size_t bytes, int roundtrips, double mib, RoundTrip roundtrip, Send send,
                       Confirm confirm) {
  Figures f;
  const std::vector<uint8_t> request(bytes, 0x33);
  std::vector<double> us;
  for (int i = 0; i < roundtrips + 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CKPT_RETURN_IF_ERROR(roundtrip(request));
    const double t = Seconds(std::chrono::steady_clock::now() - start).count() * 1e6;
    if (i >= 20) us.push_back(t);
  }
  std::sort(us.begin(), us.end());
  f.median_us = us[us.size() / 2];
  f.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  const std::vector<uint8_t> big(size_t{16} << 20, 0x44);
  const int count = std::max(2, static_cast<int>(mib / 16));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) CKPT_RETURN_IF_ERROR(send(big));
  CKPT_RETURN_IF_ERROR(confirm());
  const double s = Seconds(std::chrono::steady_clock::now() - start).count();
  f.gb_s = static_cast<double>(big.size()) * count / s / 1e9;
  return f;
}

// Over a channel (the ring or TLS): records written in place, read whole.
StatusOr<Figures> Measure(Channel* ch, size_t bytes, int roundtrips, double mib) {
  const auto roundtrip = [ch](const std::vector<uint8_t>& request) -> Status {
    CKPT_RETURN_IF_ERROR(WriteInPlace(ch, RecordType::kHello, request));
    CKPT_ASSIGN_OR_RETURN(ipc::Received r, ch->Receive(ipc::DeadlineIn(kWait)));
    g_sink = ReadAll(r.payload, r.size);
    ch->Release();
    return Status::OK();
  };
  const auto send = [ch](const std::vector<uint8_t>& big) {
    return WriteInPlace(ch, RecordType::kTrain, big);
  };
  const auto confirm = [ch]() -> Status {
    CKPT_RETURN_IF_ERROR(ch->Send(RecordType::kConfigure, nullptr, 0, ipc::DeadlineIn(kWait)));
    CKPT_ASSIGN_OR_RETURN(ipc::Received ack, ch->Receive(ipc::DeadlineIn(kWait)));
    ch->Release();
    if (ack.type != RecordType::kStats)
      return Status::Internal("transport bench: unexpected reply");
    return Status::OK();
  };
  auto f = Time(bytes, roundtrips, mib, roundtrip, send, confirm);
  if (!f.ok()) return f;
  CKPT_RETURN_IF_ERROR(ch->Send(RecordType::kShutdown, nullptr, 0, ipc::DeadlineIn(kWait)));
  return f;
}

// Over the bare socket.
StatusOr<Figures> MeasureRaw(int fd, size_t bytes, int roundtrips, double mib) {
  const auto ok = [](bool sent) {
    return sent ? Status::OK() : Status::Unavailable("transport bench: bare socket broke");
  };
  std::vector<uint8_t> reply;
  const auto roundtrip = [&](const std::vector<uint8_t>& request) {
    if (!SendRaw(fd, 'h', request) || ReceiveRaw(fd, &reply) == 0) return ok(false);
    g_sink = ReadAll(reply.data(), reply.size());
    return ok(true);
  };
  const auto send = [&](const std::vector<uint8_t>& big) { return ok(SendRaw(fd, 't', big)); };
  const auto confirm = [&] { return ok(SendRaw(fd, 'c', {}) && ReceiveRaw(fd, &reply) != 0); };
  auto f = Time(bytes, roundtrips, mib, roundtrip, send, confirm);
  if (!f.ok()) return f;
  CKPT_RETURN_IF_ERROR(ok(SendRaw(fd, 's', {})));
  return f;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "ckpt-bench transport: %s\n", s.ToString().c_str());
  return 1;
}

struct TransportBenchOptions {
  int roundtrips = 300;
  size_t bytes = size_t{1} << 19;
  double mib = 512;
};

// Where the three peers meet this process: the ring's name, the TLS secret
// (its file in `dir`, removed once the TLS peer is done) and the bare
// socket's listener.
struct Rendezvous {
  std::string ring_name;
  std::string dir;
  std::string secret;
  int raw_listen = -1;
  int raw_port = 0;
};

// The forked peers. Each waits on its pipe in `go` (ring, TLS, bare socket)
// for its go byte, or for the TLS peer the address to connect to.
struct Peers {
  int go[3][2];
  pid_t ring = -1;
  pid_t tcp = -1;
  pid_t raw = -1;
};

// What each transport measured.
struct TransportFigures {
  Figures ring;
  Figures tcp;
  Figures raw;
};

// Every phase below returns 0 to go on, or the exit status that ends the
// benchmark (having said why on stderr where it knows).

int MakeSecret(Rendezvous* r) {
  r->ring_name = "ckpt-bench-transport-" + std::to_string(::getpid());
  r->dir = (std::filesystem::temp_directory_path() /
            ("ckpt-bench-transport-" + std::to_string(getpid())))
               .string();
  std::filesystem::create_directories(r->dir);
  const std::string secret_path = r->dir + "/secret";
  if (Status s = ipc::CreateSecretFile(secret_path); !s.ok()) return Fail(s);
  auto secret = ipc::LoadSecretFile(secret_path);
  if (!secret.ok()) return Fail(secret.status());
  r->secret = *std::move(secret);
  return 0;
}

// Forks the three peers before any thread exists here.
int ForkPeers(Rendezvous* r, Peers* p) {
  if (::pipe(p->go[0]) != 0 || ::pipe(p->go[1]) != 0 || ::pipe(p->go[2]) != 0) return 1;
  if (!ListenLoopback(&r->raw_listen, &r->raw_port)) {
    return Fail(Status::IOError("transport bench: cannot listen on loopback"));
  }
  p->ring = ::fork();
  if (p->ring == 0) {
    char c;
    if (::read(p->go[0][0], &c, 1) != 1) ::_exit(1);
    auto opened = Channel::Open(r->ring_name, ipc::ChannelOptions());
    if (!opened.ok()) ::_exit(1);
    ::_exit(EchoPeer(opened->get(), "transport bench peer"));
  }
  p->tcp = ::fork();
  if (p->tcp == 0) {
    char buf[64] = {};
    if (::read(p->go[1][0], buf, sizeof(buf) - 1) <= 0) ::_exit(1);
    auto ch = ipc::TcpChannel::Connect(buf, r->secret, ipc::TcpOptions());
    if (!ch.ok()) {
      std::fprintf(stderr, "transport bench peer: %s\n", ch.status().ToString().c_str());
      ::_exit(1);
    }
    ::_exit(EchoPeer(ch->get(), "transport bench peer"));
  }
  p->raw = ::fork();
  if (p->raw == 0) {
    char c;
    if (::read(p->go[2][0], &c, 1) != 1) ::_exit(1);
    const int fd = ConnectLoopback(r->raw_port);
    if (fd < 0) ::_exit(1);
    NoDelay(fd);
    ::_exit(RawEcho(fd));
  }
  return 0;
}

int MeasureRing(const TransportBenchOptions& o, const Rendezvous& r, const Peers& p,
                Figures* figures) {
  ipc::ChannelOptions options;  // the scheduler's default ring
  options.ring_bytes = size_t{16} << 20;
  auto created = Channel::Create(r.ring_name, options);
  if (!created.ok()) return Fail(created.status());
  if (::write(p.go[0][1], "g", 1) != 1) return 1;
  auto ring = Measure(created->get(), o.bytes, o.roundtrips, o.mib);
  created->reset();
  (void)Channel::Remove(r.ring_name);
  int status = 0;
  ::waitpid(p.ring, &status, 0);
  if (!ring.ok()) return Fail(ring.status());
  *figures = *ring;
  return 0;
}

int MeasureTls(const TransportBenchOptions& o, const Rendezvous& r, const Peers& p,
               Figures* figures) {
  ipc::TcpOptions topt;
  auto listener = ipc::TcpListener::Listen("127.0.0.1:0", r.secret, topt);
  if (!listener.ok()) return Fail(listener.status());
  const std::string where = "127.0.0.1:" + std::to_string((*listener)->port());
  if (::write(p.go[1][1], where.c_str(), where.size()) != static_cast<ssize_t>(where.size())) {
    return 1;
  }
  auto accepted = (*listener)->Accept(ipc::DeadlineIn(kWait));
  if (!accepted.ok()) return Fail(accepted.status());
  auto tcp = Measure(accepted->channel.get(), o.bytes, o.roundtrips, o.mib);
  int status = 0;
  ::waitpid(p.tcp, &status, 0);
  accepted->channel.reset();
  std::filesystem::remove_all(r.dir);
  if (!tcp.ok()) return Fail(tcp.status());
  *figures = *tcp;
  return 0;
}

int MeasureBareSocket(const TransportBenchOptions& o, const Rendezvous& r, const Peers& p,
                      Figures* figures) {
  if (::write(p.go[2][1], "g", 1) != 1) return 1;
  const int raw_fd = ::accept4(r.raw_listen, nullptr, nullptr, SOCK_CLOEXEC);
  if (raw_fd < 0) return Fail(Status::IOError("transport bench: accept on loopback failed"));
  NoDelay(raw_fd);
  auto raw = MeasureRaw(raw_fd, o.bytes, o.roundtrips, o.mib);
  int status = 0;
  ::waitpid(p.raw, &status, 0);
  ::close(raw_fd);
  ::close(r.raw_listen);
  if (!raw.ok()) return Fail(raw.status());
  *figures = *raw;
  return 0;
}

void Report(size_t bytes, const TransportFigures& f) {
  const Figures& ring = f.ring;
  const Figures& tcp = f.tcp;
  const Figures& raw = f.raw;
  std::printf(
      "roundtrip %zu B -> %zu B: ring median %.1f us (p99 %.1f), tcp median %.1f us "
      "(p99 %.1f), bare socket median %.1f us; one-way 16 MiB records: ring %.2f GB/s, tcp "
      "(TLS) %.2f GB/s, bare socket %.2f GB/s\n",
      bytes, bytes, ring.median_us, ring.p99_us, tcp.median_us, tcp.p99_us, raw.median_us,
      ring.gb_s, tcp.gb_s, raw.gb_s);
  nlohmann::json out = {{"bench", "transport"},
                        {"roundtrip_bytes", bytes},
                        {"ring_roundtrip_us", ring.median_us},
                        {"ring_roundtrip_p99_us", ring.p99_us},
                        {"tcp_roundtrip_us", tcp.median_us},
                        {"tcp_roundtrip_p99_us", tcp.p99_us},
                        {"tcp_vs_ring_roundtrip_ratio", tcp.median_us / ring.median_us},
                        {"ring_gb_s_16mb", ring.gb_s},
                        {"tcp_gb_s_16mb", tcp.gb_s},
                        {"tcp_raw_roundtrip_us", raw.median_us},
                        {"tcp_raw_roundtrip_p99_us", raw.p99_us},
                        {"tcp_raw_gb_s_16mb", raw.gb_s},
                        {"tls_vs_raw_tcp_throughput", raw.gb_s / tcp.gb_s},
                        {"tls_vs_raw_tcp_roundtrip", tcp.median_us / raw.median_us},
                        {"tls_vs_ring_throughput", ring.gb_s / tcp.gb_s},
                        {"cpu", CpuDescription()}};
  PrintJsonLine(out);
}

int TransportBench(const TransportBenchOptions& o) {
  Rendezvous r;
  Peers p;
  TransportFigures f;
  if (int rc = MakeSecret(&r); rc != 0) return rc;
  if (int rc = ForkPeers(&r, &p); rc != 0) return rc;
  if (int rc = MeasureRing(o, r, p, &f.ring); rc != 0) return rc;
  if (int rc = MeasureTls(o, r, p, &f.tcp); rc != 0) return rc;
  if (int rc = MeasureBareSocket(o, r, p, &f.raw); rc != 0) return rc;
  Report(o.bytes, f);
  return 0;
}

BenchRun TransportFlags(CLI::App& cmd) {
  auto o = std::make_shared<TransportBenchOptions>();
  cmd.add_option("--roundtrips", o->roundtrips, "round trips timed per transport")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--bytes", o->bytes, "bytes of each request and reply")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--mib", o->mib, "MiB sent one way for the throughput")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return [o] { return TransportBench(*o); };
}

CKPT_BENCHMARK("transport", "0.5 MB round trip and throughput: shared-memory ring vs TCP loopback",
               TransportFlags);

}  // namespace
}  // namespace ckpt::bench
