// ckpt-bench ring: the shared-memory transport between two processes.
//
// For record sizes 0.5 MiB and 16 MiB: ring_gb_s, bytes per second from a
// producer process that sends each record from its source in two parts (a
// 256-byte header and the state: SendParts, the scheduler's TRAIN) to a
// consumer process that reads every byte (and releases); ring_in_place_gb_s,
// the same with each record written in place (Reserve, copy the state in,
// Commit: the worker's RESULT); both against memcpy_gb_s, the same bytes copied within one process
// in the same run, to a destination as large as the ring's window once the records have grown it
// (the same memory footprint: for 0.5 MiB records in a 64 MiB ring, 4 MiB; the copy into one
// fixed, cache-hot destination is reported as memcpy_hot_gb_s). Then roundtrip_us: a 0.5 MiB
// TRAIN answered by a 0.5 MiB RESULT, each read whole by its receiver (median and p99 over the
// iterations). Also one_thread_transport_gb_s: the same records through a channel with both ends in
// this process, one thread doing both halves (the transport's CPU cost per byte, free of scheduling
// between processes).
//
// segment_bytes_allocated: the shared memory the segment holds at the end
// (st_blocks of /dev/shm/NAME), the rings' windows (ChannelOptions::
// min_window_bytes) and what they cost.
//
//   ckpt-bench ring [--ring-mib 64] [--min-window-kib 1024] [--mib-per-trial 1024]
//                   [--trials 3] [--roundtrips 300]
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench.h"
#include "ckpt/ipc/channel.h"
#include "echo_peer.h"

namespace ckpt::bench {
namespace {

using ipc::Channel;
using ipc::RecordType;
using Seconds = std::chrono::duration<double>;

// The consumer is EchoPeer (echo_peer.h).
constexpr auto kWait = kPeerWait;

volatile uint64_t g_sink;

// As the scheduler sends a TRAIN: a small encoded header, then the state.
constexpr size_t kHeaderPart = 256;
Status SendInParts(Channel* ch, RecordType type, const std::vector<uint8_t>& src) {
  const size_t head = std::min(kHeaderPart, src.size());
  const ipc::PayloadPart parts[2] = {{src.data(), head}, {src.data() + head, src.size() - head}};
  uint64_t sent = 0;
  return ch->SendParts(type, parts, 2, ipc::DeadlineIn(kWait), &sent);
}

enum class Way { kParts, kInPlace };

Status SendRecord(Way way, Channel* ch, RecordType type, const std::vector<uint8_t>& src) {
  return way == Way::kParts ? SendInParts(ch, type, src) : WriteInPlace(ch, type, src);
}

int ConsumerMain(const std::string& name, int go_fd) {
  char go;
  if (::read(go_fd, &go, 1) != 1) return 1;
  auto opened = Channel::Open(name, ipc::ChannelOptions());
  if (!opened.ok()) {
    std::fprintf(stderr, "ring bench consumer: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  return EchoPeer(opened->get(), "ring bench consumer");
}

// Seconds to push `count` records of `src` through the ring and have the
// consumer confirm it read them all.
StatusOr<double> RingTrial(Way way, Channel* ch, const std::vector<uint8_t>& src, int count) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i)
    CKPT_RETURN_IF_ERROR(SendRecord(way, ch, RecordType::kTrain, src));
  CKPT_RETURN_IF_ERROR(ch->Send(RecordType::kConfigure, nullptr, 0, ipc::DeadlineIn(kWait)));
  CKPT_ASSIGN_OR_RETURN(ipc::Received ack, ch->Receive(ipc::DeadlineIn(kWait)));
  if (ack.type != RecordType::kStats) return Status::Internal("ring bench: unexpected reply");
  ch->Release();
  return Seconds(std::chrono::steady_clock::now() - start).count();
}

// Seconds for the same records through a channel whose two ends are in this
// process and driven by this one thread: send, receive, read, release. The transport's per-byte CPU
// cost without any scheduling between processes; two idle cores running ring_gb_s overlap the two
// halves.
StatusOr<double> SerialTrial(Channel* owner, Channel* worker, const std::vector<uint8_t>& src,
                             int count) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    CKPT_RETURN_IF_ERROR(SendInParts(owner, RecordType::kTrain, src));
    CKPT_ASSIGN_OR_RETURN(ipc::Received r, worker->Receive(ipc::DeadlineIn(kWait)));
    g_sink = ReadAll(r.payload, r.size);
    worker->Release();
  }
  return Seconds(std::chrono::steady_clock::now() - start).count();
}

// Copies `count` times into `footprint` bytes of `dst` in turn (one place when
// `hot`).
double MemcpyTrial(const std::vector<uint8_t>& src, std::vector<uint8_t>* dst, int count,
                   size_t footprint, bool hot) {
  const size_t slots = hot ? 1 : std::max<size_t>(1, std::min(footprint, dst->size()) / src.size());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < count; ++i) {
    std::memcpy(dst->data() + (i % slots) * src.size(), src.data(), src.size());
  }
  const double s = Seconds(std::chrono::steady_clock::now() - start).count();
  g_sink = ReadAll(dst->data(), 64);
  return s;
}

int Fail(const Status& s) {
  std::fprintf(stderr, "ckpt-bench ring: %s\n", s.ToString().c_str());
  return 1;
}

struct RingBenchOptions {
  size_t ring_mib = 64;          // the scheduler's default
  size_t min_window_kib = 1024;  // ChannelOptions' default
  double mib_per_trial = 1024;
  int trials = 3;
  int roundtrips = 300;
};

// The channels measured: `ch` to the consumer process, and a second one
// whose two ends are both in this process, for SerialTrial.
struct Channels {
  std::string name;
  std::string serial_name;
  pid_t consumer = -1;
  std::unique_ptr<Channel> ch;
  std::unique_ptr<Channel> serial_owner;
  std::unique_ptr<Channel> serial_worker;
};

// What one record size measured (GB/s; `serial_gb_s` 0 where not measured).
struct Row {
  const char* label;
  size_t bytes;
  double ring_gb_s = 0, in_place_gb_s = 0, memcpy_gb_s = 0, memcpy_hot_gb_s = 0, serial_gb_s = 0;
  size_t window_bytes = 0;
};

// The 0.5 MiB round trips: their median and p99, in microseconds.
struct RoundTrips {
  size_t bytes = 0;
  double median_us = 0;
  double p99_us = 0;
};

ipc::ChannelOptions RingOptions(const RingBenchOptions& o) {
  ipc::ChannelOptions options;
  options.ring_bytes = o.ring_mib << 20;
  options.min_window_bytes = o.min_window_kib << 10;
  return options;
}

// Forks the consumer (before any thread exists here) and creates the
// channels; 0, or the exit status that ends the benchmark.
int OpenChannels(const RingBenchOptions& o, Channels* c) {
  c->name = "ckpt-bench-ring-" + std::to_string(::getpid());
  int go[2];
  if (::pipe(go) != 0) return 1;
  c->consumer = ::fork();
  if (c->consumer < 0) return 1;
  if (c->consumer == 0) {
    ::close(go[1]);
    ::_exit(ConsumerMain(c->name, go[0]));
  }
  ::close(go[0]);

  const ipc::ChannelOptions options = RingOptions(o);
  auto created = Channel::Create(c->name, options);
  if (!created.ok()) return Fail(created.status());
  c->ch = std::move(*created);
  if (::write(go[1], "g", 1) != 1) return 1;
  ::close(go[1]);

  c->serial_name = c->name + "-serial";
  auto serial_owner = Channel::Create(c->serial_name, options);
  if (!serial_owner.ok()) return Fail(serial_owner.status());
  c->serial_owner = std::move(*serial_owner);
  auto serial_worker = Channel::Open(c->serial_name, options);
  if (!serial_worker.ok()) return Fail(serial_worker.status());
  c->serial_worker = std::move(*serial_worker);
  return 0;
}

// Times records of `row->bytes` through the ring both ways, through one
// thread and with memcpy into `dst`, the best of the trials each, and prints
// the row.
Status MeasureRow(const RingBenchOptions& o, Channels& c, std::vector<uint8_t>* dst, Row* row) {
  const size_t ring_bytes = o.ring_mib << 20;
  Channel* ch = c.ch.get();
  std::vector<uint8_t> src(row->bytes);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 131 + 7);
  const int count =
      std::max(4, static_cast<int>(o.mib_per_trial * (1 << 20) / static_cast<double>(row->bytes)));
  // Warm-up: every page of both rings and of the copy destination touched.
  for (Way way : {Way::kParts, Way::kInPlace}) {
    CKPT_RETURN_IF_ERROR(
        RingTrial(way, ch, src, static_cast<int>(2 * ring_bytes / row->bytes) + 2).status());
  }
  // The same memory footprint as the ring's records: the window they grew
  // to (the whole ring without one), not the ring's size.
  const size_t footprint = ch->Stats().send_window_bytes;
  MemcpyTrial(src, dst, count, footprint, false);
  // One thread cannot both send and receive a fragmented record.
  const bool serial_fits = row->bytes <= ring_bytes / 2 - 64;
  if (serial_fits) {
    CKPT_RETURN_IF_ERROR(SerialTrial(c.serial_owner.get(), c.serial_worker.get(), src,
                                     static_cast<int>(2 * ring_bytes / row->bytes) + 2)
                             .status());
  }
  double best_ring = 1e30, best_in_place = 1e30, best_copy = 1e30, best_hot = 1e30,
         best_serial = 1e30;
  for (int t = 0; t < o.trials; ++t) {
    CKPT_ASSIGN_OR_RETURN(const double s, RingTrial(Way::kParts, ch, src, count));
    best_ring = std::min(best_ring, s);
    CKPT_ASSIGN_OR_RETURN(const double in_place, RingTrial(Way::kInPlace, ch, src, count));
    best_in_place = std::min(best_in_place, in_place);
    best_copy = std::min(best_copy, MemcpyTrial(src, dst, count, footprint, false));
    best_hot = std::min(best_hot, MemcpyTrial(src, dst, count, footprint, true));
    if (serial_fits) {
      CKPT_ASSIGN_OR_RETURN(const double serial,
                            SerialTrial(c.serial_owner.get(), c.serial_worker.get(), src, count));
      best_serial = std::min(best_serial, serial);
    }
  }
  const double total = static_cast<double>(row->bytes) * count;
  row->ring_gb_s = total / best_ring / 1e9;
  row->in_place_gb_s = total / best_in_place / 1e9;
  row->window_bytes = ch->Stats().send_window_bytes;
  row->memcpy_gb_s = total / best_copy / 1e9;
  row->memcpy_hot_gb_s = total / best_hot / 1e9;
  row->serial_gb_s = serial_fits ? total / best_serial / 1e9 : 0;
  std::printf(
      "ring %-6s x %5d: ring %.2f GB/s (in place %.2f)  memcpy %.2f GB/s (hot %.2f)  ratio %.2f"
      "  window %zu KiB\n",
      row->label, count, row->ring_gb_s, row->in_place_gb_s, row->memcpy_gb_s, row->memcpy_hot_gb_s,
      row->ring_gb_s / row->memcpy_gb_s, row->window_bytes >> 10);
  if (serial_fits) std::printf("  one thread through the transport: %.2f GB/s\n", row->serial_gb_s);
  return Status::OK();
}

// Round trips: 0.5 MiB request, 0.5 MiB result, both read whole.
StatusOr<RoundTrips> TimeRoundTrips(Channel* ch, int roundtrips) {
  std::vector<uint8_t> request(size_t{1} << 19, 0x33);
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
  RoundTrips rt;
  rt.bytes = request.size();
  rt.median_us = us[us.size() / 2];
  rt.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  std::printf("roundtrip 0.5MB -> 0.5MB: median %.1f us, p99 %.1f us\n", rt.median_us, rt.p99_us);
  return rt;
}

// The shared memory the segment holds (the pages its records touched), or
// -1; then shuts the consumer down and removes both channels. False when the
// consumer failed.
bool CloseChannels(Channels* c, int64_t* segment_allocated) {
  struct stat st {};
  const std::string shm_path = "/dev/shm/" + c->name;
  *segment_allocated =
      ::stat(shm_path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_blocks) * 512 : -1;
  c->serial_worker.reset();
  c->serial_owner.reset();
  (void)Channel::Remove(c->serial_name);
  Status s = c->ch->Send(RecordType::kShutdown, nullptr, 0, ipc::DeadlineIn(kWait));
  int status = 0;
  ::waitpid(c->consumer, &status, 0);
  c->ch.reset();
  (void)Channel::Remove(c->name);
  return s.ok() && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void Report(const RingBenchOptions& o, const std::vector<Row>& rows, const RoundTrips& rt,
            int64_t segment_allocated) {
  nlohmann::json records = nlohmann::json::object();
  for (const Row& r : rows) {
    records[r.label] = {
        {"bytes", r.bytes},
        {"ring_gb_s", r.ring_gb_s},
        {"ring_in_place_gb_s", r.in_place_gb_s},
        {"in_place_ratio", r.in_place_gb_s / r.memcpy_gb_s},
        {"send_window_bytes", r.window_bytes},
        {"memcpy_gb_s", r.memcpy_gb_s},
        {"memcpy_hot_gb_s", r.memcpy_hot_gb_s},
        {"ratio", r.ring_gb_s / r.memcpy_gb_s},
        // Not measured for fragmented records.
        {"one_thread_transport_gb_s",
         r.serial_gb_s > 0 ? nlohmann::json(r.serial_gb_s) : nlohmann::json(nullptr)}};
  }
  const ipc::ChannelOptions options = RingOptions(o);
  const nlohmann::json out = {{"bench", "ring"},
                              {"cpu", CpuDescription()},
                              {"ring_bytes", options.ring_bytes},
                              {"min_window_bytes", options.min_window_bytes},
                              {"segment_bytes_allocated", segment_allocated},
                              {"records", records},
                              {"roundtrip_bytes", rt.bytes},
                              {"roundtrip_us", rt.median_us},
                              {"roundtrip_p99_us", rt.p99_us},
                              {"peak_rss_bytes", PeakRssBytes()},
                              {"peak_rss_children_bytes", PeakRssChildrenBytes()}};
  PrintJsonLine(out);
}

int RingBench(const RingBenchOptions& o) {
  Channels c;
  if (int rc = OpenChannels(o, &c); rc != 0) return rc;
  std::vector<Row> rows = {{"0.5MB", size_t{1} << 19}, {"16MB", size_t{16} << 20}};
  // As large as the ring, and at least one record.
  std::vector<uint8_t> dst(std::max(o.ring_mib << 20, rows.back().bytes));
  std::memset(dst.data(), 1, dst.size());
  for (Row& row : rows) {
    if (Status s = MeasureRow(o, c, &dst, &row); !s.ok()) return Fail(s);
  }
  auto rt = TimeRoundTrips(c.ch.get(), o.roundtrips);
  if (!rt.ok()) return Fail(rt.status());
  int64_t segment_allocated = -1;
  if (!CloseChannels(&c, &segment_allocated)) {
    std::fprintf(stderr, "ckpt-bench ring: consumer failed\n");
    return 1;
  }
  Report(o, rows, *rt, segment_allocated);
  return 0;
}

BenchRun RingFlags(CLI::App& cmd) {
  auto o = std::make_shared<RingBenchOptions>();
  cmd.add_option("--ring-mib", o->ring_mib, "bytes of each ring, in MiB")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  cmd.add_option("--min-window-kib", o->min_window_kib,
                 "each ring's first window, in KiB (0: the whole ring)")
      ->check(CLI::Range(0, 4 << 20))
      ->capture_default_str();
  cmd.add_option("--mib-per-trial", o->mib_per_trial, "MiB sent per throughput trial")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--trials", o->trials, "throughput trials per record size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--roundtrips", o->roundtrips, "0.5 MiB round trips timed")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  return [o] { return RingBench(*o); };
}

}  // namespace

CKPT_BENCHMARK("ring", "shared-memory ring: throughput vs memcpy, 0.5 MB round trip", RingFlags);

}  // namespace ckpt::bench
