// ckpt-bench store [--state-bytes N] [--dir PATH] [--total-bytes N] [--exploits N] [--blob-log]
//
// The checkpoint store against the approach it replaces (one file per state):
// commits of real checkpoint blobs (random float tensors written with
// CheckpointWriter) unsynced and synced, verified reads of head blobs, and
// metadata-only exploits; then the same bytes written to, fsynced and read
// from one file per state; and the CRC32C that RocksDB puts on each WAL and
// blob-file record, ckpt's against the library's own loop. Prints what it
// measured, then one JSON line. disk_bytes_per_state[_sync]: the bytes the
// process wrote to storage (/proc/self/io write_bytes, commits and the flush
// after them) per committed byte of state.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench.h"
#include "ckpt/format/checkpoint.h"
#include "ckpt/store/store.h"

namespace ckpt::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// `n` distinct blobs of about `state_bytes` each: four F32 tensors named like a
// small model's state_dict plus its momentum buffers, seeded by `salt`.
std::vector<std::string> MakeStates(size_t n, size_t state_bytes, uint64_t salt) {
  std::vector<std::string> out;
  const size_t floats = std::max<size_t>(16, state_bytes / sizeof(float));
  const size_t quarter = floats / 4;
  const size_t sizes[4] = {quarter, quarter, quarter, floats - 3 * quarter};
  const char* names[4] = {"fc1.weight", "fc2.weight", "optim.fc1.weight.momentum_buffer",
                          "optim.fc2.weight.momentum_buffer"};
  std::mt19937_64 rng(salt);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> data(floats);
  for (auto& x : data) x = dist(rng);
  for (size_t i = 0; i < n; ++i) {
    // A few fresh values per state make every blob distinct (no dedup).
    for (int k = 0; k < 8; ++k) data[rng() % floats] = dist(rng);
    format::CheckpointWriter w;
    format::CheckpointMeta meta;
    meta.model_spec = "bench";
    meta.optimizer = "sgd";
    meta.hparams = {{"lr", 0.1}, {"momentum", 0.9}};
    meta.step = static_cast<int64_t>(i);
    w.SetMeta(meta);
    size_t at = 0;
    for (int t = 0; t < 4; ++t) {
      CKPT_CHECK_OK(w.AddTensor(names[t], format::DType::kF32, {static_cast<int64_t>(sizes[t])},
                                data.data() + at, sizes[t] * sizeof(float)));
      at += sizes[t];
    }
    out.push_back(w.Encode());
  }
  return out;
}

struct CommitPhase {
  double seconds = 0;
  size_t bytes = 0;
  size_t commits = 0;
  // Bytes this process sent to the storage layer (/proc/self/io write_bytes)
  // from the first commit until the memtables were flushed after the last.
  uint64_t disk_bytes = 0;
};

// /proc/self/io write_bytes: bytes this process (every thread, RocksDB's
// background ones included) caused to be written to storage, counted when
// the page is dirtied. 0 where the file is missing (it is 0 on tmpfs too).
uint64_t ProcWriteBytes() {
  std::FILE* f = std::fopen("/proc/self/io", "re");
  if (f == nullptr) return 0;
  char line[128];
  uint64_t v = 0;
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    if (std::sscanf(line, "write_bytes: %" SCNu64, &v) == 1) break;
  }
  std::fclose(f);
  return v;
}

// Disk bytes per committed state, as a multiple of the state's size.
double WriteAmplification(const CommitPhase& p) {
  return p.bytes == 0 ? 0 : static_cast<double>(p.disk_bytes) / static_cast<double>(p.bytes);
}

// Commits every state round-robin to the members; REQUIRES: members exist.
StatusOr<CommitPhase> CommitAll(store::Store* s, const std::vector<std::string>& members,
                                const std::vector<std::string>& states) {
  CommitPhase p;
  auto t0 = Clock::now();
  for (size_t i = 0; i < states.size(); ++i) {
    const std::string& m = members[i % members.size()];
    CKPT_ASSIGN_OR_RETURN(store::MemberHead head, s->GetMember("bench", m));
    store::CommitRequest req;
    req.exp = "bench";
    req.member = m;
    req.expected_head_version = head.version;
    req.blob = states[i].data();
    req.blob_size = states[i].size();
    req.step = head.step + 100;
    req.metrics = {{store::kScoreMetric, static_cast<double>(i % 97)}, {"loss", 0.5}};
    req.hparams = {{"lr", 0.1}};
    CKPT_ASSIGN_OR_RETURN(int64_t v, s->CommitResult(req));
    (void)v;
    p.bytes += states[i].size();
    ++p.commits;
  }
  p.seconds = Seconds(t0, Clock::now());
  return p;
}

Status WriteFile(const std::string& path, const std::string& bytes, bool sync) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IOError(path + ": " + std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      ::close(fd);
      return Status::IOError(path + ": " + std::strerror(errno));
    }
    done += static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd) != 0) {
    ::close(fd);
    return Status::IOError(path + ": fsync: " + std::strerror(errno));
  }
  ::close(fd);
  return Status::OK();
}

// Reads a whole file into a fresh buffer, as a checkpoint loader would.
StatusOr<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::IOError(path + ": " + std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    return Status::IOError(path + ": " + std::strerror(errno));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      return Status::IOError(path + ": short read");
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return out;
}

double MBps(size_t bytes, double seconds) { return seconds > 0 ? bytes / seconds / 1e6 : 0; }

// GB/s of a CRC32C of RocksDB's over buffers of `bytes` (random), for about
// 0.3 s; 0 when `crc` is null.
double Crc32cGBps(store::Crc32cFn crc, size_t bytes) {
  if (crc == nullptr) return 0;
  std::string buf(bytes, '\0');
  std::mt19937_64 rng(7);
  for (char& c : buf) c = static_cast<char>(rng());
  uint32_t value = crc(0, buf.data(), buf.size());  // warm
  size_t done = 0;
  const auto start = Clock::now();
  double s = 0;
  do {
    value = crc(value, buf.data(), buf.size());
    done += bytes;
    s = Seconds(start, Clock::now());
  } while (s < 0.3);
  volatile uint32_t kept = value;  // the loop's result is used
  (void)kept;
  return done / s / 1e9;
}

struct ReadRates {
  double verified = 0;    // MB/s, ReadHeadBlob(verify = true), the default
  double unverified = 0;  // MB/s, ReadHeadBlob(verify = false)
  double file = 0;        // MB/s, whole-file read of the same size
};

// One warm-up pass, then rounds of (verified store read, unverified store
// read, file read) per member until `total_bytes` were read each way.
Status MeasureReads(store::Store* s, const std::vector<std::string>& members,
                    const std::string& dir, size_t total_bytes, ReadRates* out) {
  double t_verified = 0, t_unverified = 0, t_file = 0;
  size_t b_verified = 0, b_unverified = 0, b_file = 0;
  for (int warm = 1; warm >= 0; --warm) {
    size_t round_bytes = 0;
    do {
      for (size_t i = 0; i < members.size(); ++i) {
        auto t0 = Clock::now();
        auto b = s->ReadHeadBlob("bench", members[i], /*verify=*/true);
        auto t1 = Clock::now();
        if (!b.ok()) return b.status();
        const size_t n = b->size();
        b = s->ReadHeadBlob("bench", members[i], /*verify=*/false);
        auto t2 = Clock::now();
        if (!b.ok()) return b.status();
        auto f = ReadFile(dir + "/files/state" + std::to_string(i) + ".ckpt");
        auto t3 = Clock::now();
        if (!f.ok()) return f.status();
        round_bytes += n;
        if (warm) continue;
        t_verified += Seconds(t0, t1);
        t_unverified += Seconds(t1, t2);
        t_file += Seconds(t2, t3);
        b_verified += n;
        b_unverified += b->size();
        b_file += f->size();
      }
    } while (!warm && round_bytes < total_bytes);
  }
  out->verified = MBps(b_verified, t_verified);
  out->unverified = MBps(b_unverified, t_unverified);
  out->file = MBps(b_file, t_file);
  return Status::OK();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "ckpt-bench store: %s\n", s.ToString().c_str());
  return 1;
}

struct StoreBenchOptions {
  size_t state_bytes = 500000;
  size_t total_bytes = size_t{256} << 20;
  int exploits = 2000;
  bool blob_log = false;  // StoreOptions::blob_log
  size_t members = 8;     // the states are committed round-robin to this many
  std::string dir;        // empty: a temporary directory, removed at the end
};

// Where and with what the phases run.
struct StoreSetup {
  size_t n_states = 0;
  size_t n_members = 0;
  std::string dir;
  bool remove_dir = false;  // a temporary directory of ours
  std::vector<std::string> members;
  store::StoreOptions options;
};

// The same bytes written to one file per state, unsynced and fsynced.
struct FileWrites {
  double put_s = 0;
  double put_sync_s = 0;
  size_t bytes = 0;
  size_t sync_bytes = 0;
};

// What the phases measured.
struct StoreFigures {
  size_t blob_size = 0;  // bytes of one encoded state
  CommitPhase put;
  CommitPhase put_sync;
  FileWrites files;
  ReadRates cached;
  ReadRates uncached;
  std::vector<double> exploit_us;  // sorted
};

Status Prepare(const StoreBenchOptions& o, StoreSetup* setup) {
  setup->n_states = std::clamp<size_t>(o.total_bytes / std::max<size_t>(o.state_bytes, 1), 8, 512);
  setup->n_members = std::min<size_t>(o.members, setup->n_states);
  setup->dir = o.dir;
  if (setup->dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-store-bench-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return Status::IOError("mkdtemp");
    setup->dir = tmpl;
    setup->remove_dir = true;
  }
  std::filesystem::create_directories(setup->dir + "/files");
  std::printf("store bench: %zu states of %zu bytes, %zu members, in %s\n", setup->n_states,
              o.state_bytes, setup->n_members, setup->dir.c_str());
  for (size_t i = 0; i < setup->n_members; ++i) setup->members.push_back("m" + std::to_string(i));
  setup->options.path = setup->dir + "/db";
  setup->options.keep_last_n = 3;
  setup->options.keep_best_k = 5;
  setup->options.blob_log = o.blob_log;
  return Status::OK();
}

// Creates the experiment and its members and commits the states unsynced;
// then flushes, so that reads come from blob files, as after any restart or
// once memtables flushed.
StatusOr<CommitPhase> CommitUnsynced(store::Store* s, const StoreSetup& setup, size_t state_bytes,
                                     size_t* blob_size) {
  CKPT_RETURN_IF_ERROR(s->CreateExperiment("bench", "{}"));
  std::map<std::string, std::map<std::string, double>> hp;
  for (const auto& m : setup.members) hp[m] = {{"lr", 0.1}};
  CKPT_RETURN_IF_ERROR(s->CreateMembers("bench", hp));
  auto states = MakeStates(setup.n_states, state_bytes, 1);
  *blob_size = states[0].size();
  const uint64_t written = ProcWriteBytes();
  CKPT_ASSIGN_OR_RETURN(CommitPhase put, CommitAll(s, setup.members, states));
  std::printf("commit unsynced: %zu x %zu B in %.3f s: %.1f MB/s, %.1f commits/s\n", put.commits,
              *blob_size, put.seconds, MBps(put.bytes, put.seconds), put.commits / put.seconds);
  CKPT_RETURN_IF_ERROR(s->Flush());
  put.disk_bytes = ProcWriteBytes() - written;
  std::printf(
      "  written to disk (commits and flush): %.0f B per committed state, %.3f x the state\n",
      static_cast<double>(put.disk_bytes) / put.commits, WriteAmplification(put));
  return put;
}

// One file per state, the approach the store replaces.
StatusOr<FileWrites> WriteFiles(const StoreSetup& setup, size_t state_bytes) {
  FileWrites w;
  auto states = MakeStates(setup.n_states, state_bytes, 3);
  auto t0 = Clock::now();
  for (size_t i = 0; i < states.size(); ++i) {
    CKPT_RETURN_IF_ERROR(
        WriteFile(setup.dir + "/files/state" + std::to_string(i % (setup.n_members * 3)) + ".ckpt",
                  states[i], false));
    w.bytes += states[i].size();
  }
  w.put_s = Seconds(t0, Clock::now());
  const size_t n_sync = std::max<size_t>(8, setup.n_states / 4);
  t0 = Clock::now();
  for (size_t i = 0; i < n_sync; ++i) {
    CKPT_RETURN_IF_ERROR(
        WriteFile(setup.dir + "/files/sync" + std::to_string(i % (setup.n_members * 3)) + ".ckpt",
                  states[i], true));
    w.sync_bytes += states[i].size();
  }
  w.put_sync_s = Seconds(t0, Clock::now());
  std::printf("files: put %.1f MB/s, put+fsync %.1f MB/s\n", MBps(w.bytes, w.put_s),
              MBps(w.sync_bytes, w.put_sync_s));
  return w;
}

// The wall time of each metadata-only exploit, in microseconds, sorted.
StatusOr<std::vector<double>> TimeExploits(store::Store* s, const std::vector<std::string>& members,
                                           int exploits) {
  std::vector<double> exploit_us;
  for (int i = 0; i < exploits; ++i) {
    const std::string& dst = members[i % members.size()];
    const std::string& src = members[(i + 1) % members.size()];
    auto t0 = Clock::now();
    auto v = s->Exploit("bench", dst, src, {{"lr", 0.05}}, "{\"why\":\"bench\"}");
    auto t1 = Clock::now();
    if (!v.ok()) return v.status();
    exploit_us.push_back(Seconds(t0, t1) * 1e6);
  }
  std::sort(exploit_us.begin(), exploit_us.end());
  return exploit_us;
}

// The same reads with no blob cache: every read is a blob-file read.
StatusOr<ReadRates> MeasureUncachedReads(const StoreSetup& setup, size_t total_bytes) {
  store::StoreOptions o = setup.options;
  o.blob_cache_bytes = 0;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, store::Store::Open(o));
  ReadRates uncached;
  CKPT_RETURN_IF_ERROR(MeasureReads(s.get(), setup.members, setup.dir, total_bytes, &uncached));
  std::printf("get (no blob cache): verified %.1f MB/s, unverified %.1f MB/s; file %.1f MB/s\n",
              uncached.verified, uncached.unverified, uncached.file);
  return uncached;
}

// Commits fresh states with every interval commit synced, then verifies the
// whole store.
StatusOr<CommitPhase> CommitSyncedAndVerify(const StoreSetup& setup, size_t state_bytes) {
  store::StoreOptions sync_options = setup.options;
  sync_options.sync_interval_commits = true;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, store::Store::Open(sync_options));
  auto states = MakeStates(std::max<size_t>(8, setup.n_states / 4), state_bytes, 2);
  const uint64_t written = ProcWriteBytes();
  CKPT_ASSIGN_OR_RETURN(CommitPhase put_sync, CommitAll(s.get(), setup.members, states));
  std::printf("commit synced: %zu in %.3f s: %.1f MB/s\n", put_sync.commits, put_sync.seconds,
              MBps(put_sync.bytes, put_sync.seconds));
  CKPT_RETURN_IF_ERROR(s->Flush());
  put_sync.disk_bytes = ProcWriteBytes() - written;
  std::printf(
      "  written to disk (commits and flush): %.0f B per committed state, %.3f x the state\n",
      static_cast<double>(put_sync.disk_bytes) / put_sync.commits, WriteAmplification(put_sync));
  CKPT_ASSIGN_OR_RETURN(auto report, s->Verify());
  if (!report.ok()) return Status::Corruption(report.problems.front());
  return put_sync;
}

Status RunPhases(const StoreBenchOptions& o, const StoreSetup& setup, StoreFigures* f) {
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, store::Store::Open(setup.options));
  CKPT_ASSIGN_OR_RETURN(f->put, CommitUnsynced(s.get(), setup, o.state_bytes, &f->blob_size));
  CKPT_ASSIGN_OR_RETURN(f->files, WriteFiles(setup, o.state_bytes));
  // Reads, interleaved so that the ways compared see the same machine load.
  CKPT_RETURN_IF_ERROR(MeasureReads(s.get(), setup.members, setup.dir, o.total_bytes, &f->cached));
  std::printf("get (blob cache): verified %.1f MB/s, unverified %.1f MB/s; file %.1f MB/s\n",
              f->cached.verified, f->cached.unverified, f->cached.file);
  CKPT_ASSIGN_OR_RETURN(f->exploit_us, TimeExploits(s.get(), setup.members, o.exploits));
  s.reset();
  CKPT_ASSIGN_OR_RETURN(f->uncached, MeasureUncachedReads(setup, o.total_bytes));
  CKPT_ASSIGN_OR_RETURN(f->put_sync, CommitSyncedAndVerify(setup, o.state_bytes));
  return Status::OK();
}

void Report(const StoreBenchOptions& o, const StoreSetup& setup, const StoreFigures& f) {
  const std::vector<double>& exploit_us = f.exploit_us;
  double exploit_mean = 0;
  for (double u : exploit_us) exploit_mean += u;
  exploit_mean /= std::max<size_t>(1, exploit_us.size());
  auto pct = [&](double q) {
    return exploit_us.empty() ? 0.0 : exploit_us[static_cast<size_t>(q * (exploit_us.size() - 1))];
  };
  std::printf("exploit: mean %.1f us, p50 %.1f us, p99 %.1f us over %zu\n", exploit_mean, pct(0.5),
              pct(0.99), exploit_us.size());
  // The CRC32C over each WAL and blob-file record (twice per commit), as
  // RocksDB computes it here and as its own loop would (store.h).
  const store::Crc32cFunctions crc = store::RocksDbCrc32cFunctions();
  const double crc_bound = Crc32cGBps(crc.bound, f.blob_size);
  const double crc_library = Crc32cGBps(crc.library, f.blob_size);
  std::printf("crc32c over %zu B: %.2f GB/s (%s); RocksDB's own loop %.2f GB/s\n", f.blob_size,
              crc_bound, store::Crc32cImplementation(), crc_library);
  // get/file_get: the default store (blob cache on) against whole-file reads
  // from the page cache; *_uncached_*: every store read from a blob file.
  const nlohmann::json out = {
      {"bench", "store"},
      {"state_bytes", o.state_bytes},
      {"blob_log", o.blob_log},
      {"members", setup.n_members},
      {"blob_bytes", f.blob_size},
      {"states", setup.n_states},
      {"put_mb_s", MBps(f.put.bytes, f.put.seconds)},
      {"put_sync_mb_s", MBps(f.put_sync.bytes, f.put_sync.seconds)},
      {"get_mb_s", f.cached.verified},
      {"get_unverified_mb_s", f.cached.unverified},
      {"get_uncached_mb_s", f.uncached.verified},
      {"get_uncached_unverified_mb_s", f.uncached.unverified},
      {"commit_per_s", f.put.commits / f.put.seconds},
      {"disk_bytes_per_state", WriteAmplification(f.put)},
      {"disk_bytes_per_state_sync", WriteAmplification(f.put_sync)},
      {"exploit_us", exploit_mean},
      {"exploit_p50_us", pct(0.5)},
      {"exploit_p99_us", pct(0.99)},
      {"file_put_mb_s", MBps(f.files.bytes, f.files.put_s)},
      {"file_put_sync_mb_s", MBps(f.files.sync_bytes, f.files.put_sync_s)},
      {"file_get_mb_s", f.cached.file},
      {"get_vs_file_get", f.cached.verified / std::max(1e-9, f.cached.file)},
      {"get_uncached_vs_file_get", f.uncached.verified / std::max(1e-9, f.uncached.file)},
      {"crc32c_gb_s", crc_bound},
      {"crc32c_rocksdb_own_gb_s", crc_library},
      {"peak_rss_bytes", PeakRssBytes()},
      {"cpu", CpuDescription()}};
  PrintJsonLine(out);
}

int StoreBench(const StoreBenchOptions& o) {
  StoreSetup setup;
  if (Status st = Prepare(o, &setup); !st.ok()) return Fail(st);
  StoreFigures figures;
  if (Status st = RunPhases(o, setup, &figures); !st.ok()) return Fail(st);
  if (setup.remove_dir) {
    std::error_code ec;
    std::filesystem::remove_all(setup.dir, ec);
  }
  Report(o, setup, figures);
  return 0;
}

BenchRun StoreFlags(CLI::App& cmd) {
  auto o = std::make_shared<StoreBenchOptions>();
  cmd.add_option("--state-bytes", o->state_bytes, "bytes of one state")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--total-bytes", o->total_bytes, "bytes committed (8 to 512 states)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_option("--exploits", o->exploits, "metadata-only exploits timed")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd.add_option("--members", o->members,
                 "members the states are committed to, round-robin (more members than the "
                 "blobs memtable holds states: each state outlives the memtable it is in)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd.add_flag("--blob-log", o->blob_log,
               "the store keeps states in its own blob log (StoreOptions::blob_log)");
  cmd.add_option("--dir", o->dir, "store and files here (default: a temporary directory)");
  return [o] { return StoreBench(*o); };
}

}  // namespace

CKPT_BENCHMARK("store", "RocksDB checkpoint store vs one file per state (--state-bytes N)",
               StoreFlags);

}  // namespace ckpt::bench
