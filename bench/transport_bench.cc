// ckpt-bench transport: the per-record round trip of the two transports
// between two processes on this host: a 0.5 MiB TRAIN-sized request answered
// by a 0.5 MiB RESULT-sized reply, each read whole by its receiver, over the
// shared-memory ring (Channel::Create/Open) and over TCP on loopback
// (TcpListener/TcpChannel::Connect, authenticated as a worker is). Median and
// p99 of each, and their ratio. Also the one-way throughput of 16 MiB records
// over each.
//
//   ckpt-bench transport [--roundtrips 300] [--bytes 524288] [--mib 512]
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

namespace ckpt::bench {
namespace {

using ipc::Channel;
using ipc::RecordType;
using Seconds = std::chrono::duration<double>;
constexpr auto kWait = std::chrono::seconds(60);

volatile uint64_t g_sink;

uint64_t ReadAll(const uint8_t* p, size_t n) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc ^= w;
  }
  for (; i < n; ++i) acc += p[i];
  return acc;
}

Status WriteInPlace(Channel* ch, RecordType type, const std::vector<uint8_t>& src) {
  CKPT_ASSIGN_OR_RETURN(ipc::Reservation r, ch->Reserve(type, src.size(), ipc::DeadlineIn(kWait)));
  std::memcpy(r.data, src.data(), src.size());
  return ch->Commit(r, ipc::DeadlineIn(kWait));
}

// The worker side: HELLO = answer a RESULT of the same size; TRAIN = read and
// drop; CONFIGURE = answer STATS (end of a batch); SHUTDOWN = exit.
int Echo(Channel* ch) {
  std::vector<uint8_t> reply;
  uint64_t acc = 0;
  for (;;) {
    auto r = ch->Receive(ipc::DeadlineIn(kWait));
    if (!r.ok()) {
      std::fprintf(stderr, "transport bench peer: %s\n", r.status().ToString().c_str());
      return 1;
    }
    const RecordType type = r->type;
    const size_t size = r->size;
    acc ^= ReadAll(r->payload, size);
    ch->Release();
    Status s;
    if (type == RecordType::kShutdown) break;
    if (type == RecordType::kHello) {
      if (reply.size() != size) reply.assign(size, 0x5a);
      s = WriteInPlace(ch, RecordType::kResult, reply);
    } else if (type == RecordType::kConfigure) {
      s = ch->Send(RecordType::kStats, &acc, sizeof(acc), ipc::DeadlineIn(kWait));
    }
    if (!s.ok()) {
      std::fprintf(stderr, "transport bench peer: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  g_sink = acc;
  return 0;
}

struct Figures {
  double median_us = 0;
  double p99_us = 0;
  double gb_s = 0;
};

StatusOr<Figures> Measure(Channel* ch, size_t bytes, int roundtrips, double mib) {
  Figures f;
  std::vector<uint8_t> request(bytes, 0x33);
  std::vector<double> us;
  for (int i = 0; i < roundtrips + 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    CKPT_RETURN_IF_ERROR(WriteInPlace(ch, RecordType::kHello, request));
    CKPT_ASSIGN_OR_RETURN(ipc::Received r, ch->Receive(ipc::DeadlineIn(kWait)));
    g_sink = ReadAll(r.payload, r.size);
    ch->Release();
    const double t = Seconds(std::chrono::steady_clock::now() - start).count() * 1e6;
    if (i >= 20) us.push_back(t);  // the first ones warm up
  }
  std::sort(us.begin(), us.end());
  f.median_us = us[us.size() / 2];
  f.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  // One-way throughput of 16 MiB records, confirmed by the peer.
  std::vector<uint8_t> big(size_t{16} << 20, 0x44);
  const int count = std::max(2, static_cast<int>(mib / 16));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) CKPT_RETURN_IF_ERROR(WriteInPlace(ch, RecordType::kTrain, big));
  CKPT_RETURN_IF_ERROR(ch->Send(RecordType::kConfigure, nullptr, 0, ipc::DeadlineIn(kWait)));
  CKPT_ASSIGN_OR_RETURN(ipc::Received ack, ch->Receive(ipc::DeadlineIn(kWait)));
  ch->Release();
  if (ack.type != RecordType::kStats) return Status::Internal("transport bench: unexpected reply");
  const double s = Seconds(std::chrono::steady_clock::now() - start).count();
  f.gb_s = static_cast<double>(big.size()) * count / s / 1e9;
  CKPT_RETURN_IF_ERROR(ch->Send(RecordType::kShutdown, nullptr, 0, ipc::DeadlineIn(kWait)));
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

int TransportBench(const TransportBenchOptions& o) {
  const int roundtrips = o.roundtrips;
  const size_t bytes = o.bytes;
  const double mib = o.mib;
  const std::string name = "ckpt-bench-transport-" + std::to_string(::getpid());
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("ckpt-bench-transport-" + std::to_string(getpid())))
                              .string();
  std::filesystem::create_directories(dir);
  const std::string secret_path = dir + "/secret";
  if (Status s = ipc::CreateSecretFile(secret_path); !s.ok()) return Fail(s);
  auto secret = ipc::LoadSecretFile(secret_path);
  if (!secret.ok()) return Fail(secret.status());

  // Both peers are forked before any thread exists here; each waits for its
  // go byte.
  int go[2][2];
  if (::pipe(go[0]) != 0 || ::pipe(go[1]) != 0) return 1;
  const pid_t ring_child = ::fork();
  if (ring_child == 0) {
    char c;
    if (::read(go[0][0], &c, 1) != 1) ::_exit(1);
    auto opened = Channel::Open(name, ipc::ChannelOptions());
    if (!opened.ok()) ::_exit(1);
    ::_exit(Echo(opened->get()));
  }
  const pid_t tcp_child = ::fork();
  if (tcp_child == 0) {
    char buf[64] = {};
    if (::read(go[1][0], buf, sizeof(buf) - 1) <= 0) ::_exit(1);
    auto ch = ipc::TcpChannel::Connect(buf, *secret, ipc::TcpOptions());
    if (!ch.ok()) {
      std::fprintf(stderr, "transport bench peer: %s\n", ch.status().ToString().c_str());
      ::_exit(1);
    }
    ::_exit(Echo(ch->get()));
  }

  ipc::ChannelOptions options;  // the scheduler's default ring
  options.ring_bytes = size_t{16} << 20;
  auto created = Channel::Create(name, options);
  if (!created.ok()) return Fail(created.status());
  if (::write(go[0][1], "g", 1) != 1) return 1;
  auto ring = Measure(created->get(), bytes, roundtrips, mib);
  created->reset();
  (void)Channel::Remove(name);
  int status = 0;
  ::waitpid(ring_child, &status, 0);
  if (!ring.ok()) return Fail(ring.status());

  ipc::TcpOptions topt;
  auto listener = ipc::TcpListener::Listen("127.0.0.1:0", *secret, topt);
  if (!listener.ok()) return Fail(listener.status());
  const std::string where = "127.0.0.1:" + std::to_string((*listener)->port());
  if (::write(go[1][1], where.c_str(), where.size()) != static_cast<ssize_t>(where.size())) {
    return 1;
  }
  auto accepted = (*listener)->Accept(ipc::DeadlineIn(kWait));
  if (!accepted.ok()) return Fail(accepted.status());
  auto tcp = Measure(accepted->channel.get(), bytes, roundtrips, mib);
  ::waitpid(tcp_child, &status, 0);
  accepted->channel.reset();
  std::filesystem::remove_all(dir);
  if (!tcp.ok()) return Fail(tcp.status());

  std::printf(
      "roundtrip %zu B -> %zu B: ring median %.1f us (p99 %.1f), tcp median %.1f us "
      "(p99 %.1f); one-way 16 MiB records: ring %.2f GB/s, tcp %.2f GB/s\n",
      bytes, bytes, ring->median_us, ring->p99_us, tcp->median_us, tcp->p99_us, ring->gb_s,
      tcp->gb_s);
  nlohmann::json out = {{"bench", "transport"},
                        {"roundtrip_bytes", bytes},
                        {"ring_roundtrip_us", ring->median_us},
                        {"ring_roundtrip_p99_us", ring->p99_us},
                        {"tcp_roundtrip_us", tcp->median_us},
                        {"tcp_roundtrip_p99_us", tcp->p99_us},
                        {"tcp_vs_ring_roundtrip_ratio", tcp->median_us / ring->median_us},
                        {"ring_gb_s_16mb", ring->gb_s},
                        {"tcp_gb_s_16mb", tcp->gb_s}};
  PrintJsonLine(out);
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
