// ckpt-bench store [--state-bytes N] [--dir PATH] [--total-bytes N] [--exploits N]
//
// The checkpoint store against the approach it replaces (one file per state):
// commits of real checkpoint blobs (random float tensors written with
// CheckpointWriter) unsynced and synced, verified reads of head blobs, and
// metadata-only exploits; then the same bytes written to, fsynced and read
// from one file per state; and the CRC32C that RocksDB puts on each WAL and
// blob-file record, ckpt's against the library's own loop. Prints what it
// measured, then one JSON line.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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
};

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
  std::string dir;  // empty: a temporary directory, removed at the end
};

int StoreBench(const StoreBenchOptions& o) {
  const size_t state_bytes = o.state_bytes;
  const size_t total_bytes = o.total_bytes;
  const int exploits = o.exploits;
  const size_t n_states =
      std::clamp<size_t>(total_bytes / std::max<size_t>(state_bytes, 1), 8, 512);
  const size_t n_members = std::min<size_t>(8, n_states);

  std::string dir = o.dir;
  bool remove_dir = false;
  if (dir.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-store-bench-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) return Fail(Status::IOError("mkdtemp"));
    dir = tmpl;
    remove_dir = true;
  }
  std::filesystem::create_directories(dir + "/files");
  std::printf("store bench: %zu states of %zu bytes, %zu members, in %s\n", n_states, state_bytes,
              n_members, dir.c_str());

  std::vector<std::string> members;
  for (size_t i = 0; i < n_members; ++i) members.push_back("m" + std::to_string(i));

  store::StoreOptions options;
  options.path = dir + "/db";
  options.keep_last_n = 3;
  options.keep_best_k = 5;

  CommitPhase put, put_sync;
  size_t blob_size = 0;
  auto opened = store::Store::Open(options);
  if (!opened.ok()) return Fail(opened.status());
  std::unique_ptr<store::Store> s = std::move(*opened);
  {
    Status st = s->CreateExperiment("bench", "{}");
    if (!st.ok()) return Fail(st);
    std::map<std::string, std::map<std::string, double>> hp;
    for (const auto& m : members) hp[m] = {{"lr", 0.1}};
    st = s->CreateMembers("bench", hp);
    if (!st.ok()) return Fail(st);
    auto states = MakeStates(n_states, state_bytes, 1);
    blob_size = states[0].size();
    auto p = CommitAll(s.get(), members, states);
    if (!p.ok()) return Fail(p.status());
    put = *p;
    std::printf("commit unsynced: %zu x %zu B in %.3f s: %.1f MB/s, %.1f commits/s\n", put.commits,
                blob_size, put.seconds, MBps(put.bytes, put.seconds), put.commits / put.seconds);
    // Reads come from blob files, as after any restart or once memtables flushed.
    st = s->Flush();
    if (!st.ok()) return Fail(st);
  }

  // One file per state, the approach the store replaces.
  double file_put_s = 0, file_put_sync_s = 0;
  size_t file_bytes = 0, file_sync_bytes = 0;
  {
    auto states = MakeStates(n_states, state_bytes, 3);
    auto t0 = Clock::now();
    for (size_t i = 0; i < states.size(); ++i) {
      Status st = WriteFile(dir + "/files/state" + std::to_string(i % (n_members * 3)) + ".ckpt",
                            states[i], false);
      if (!st.ok()) return Fail(st);
      file_bytes += states[i].size();
    }
    file_put_s = Seconds(t0, Clock::now());
    const size_t n_sync = std::max<size_t>(8, n_states / 4);
    t0 = Clock::now();
    for (size_t i = 0; i < n_sync; ++i) {
      Status st = WriteFile(dir + "/files/sync" + std::to_string(i % (n_members * 3)) + ".ckpt",
                            states[i], true);
      if (!st.ok()) return Fail(st);
      file_sync_bytes += states[i].size();
    }
    file_put_sync_s = Seconds(t0, Clock::now());
    std::printf("files: put %.1f MB/s, put+fsync %.1f MB/s\n", MBps(file_bytes, file_put_s),
                MBps(file_sync_bytes, file_put_sync_s));
  }

  // Reads, interleaved so that the ways compared see the same machine load.
  ReadRates cached;
  auto st = MeasureReads(s.get(), members, dir, total_bytes, &cached);
  if (!st.ok()) return Fail(st);
  std::printf("get (blob cache): verified %.1f MB/s, unverified %.1f MB/s; file %.1f MB/s\n",
              cached.verified, cached.unverified, cached.file);

  std::vector<double> exploit_us;
  for (int i = 0; i < exploits; ++i) {
    const std::string& dst = members[i % n_members];
    const std::string& src = members[(i + 1) % n_members];
    auto t0 = Clock::now();
    auto v = s->Exploit("bench", dst, src, {{"lr", 0.05}}, "{\"why\":\"bench\"}");
    auto t1 = Clock::now();
    if (!v.ok()) return Fail(v.status());
    exploit_us.push_back(Seconds(t0, t1) * 1e6);
  }
  std::sort(exploit_us.begin(), exploit_us.end());
  s.reset();

  // The same reads with no blob cache: every read is a blob-file read.
  ReadRates uncached;
  {
    store::StoreOptions o = options;
    o.blob_cache_bytes = 0;
    auto reopened = store::Store::Open(o);
    if (!reopened.ok()) return Fail(reopened.status());
    st = MeasureReads(reopened->get(), members, dir, total_bytes, &uncached);
    if (!st.ok()) return Fail(st);
    std::printf("get (no blob cache): verified %.1f MB/s, unverified %.1f MB/s; file %.1f MB/s\n",
                uncached.verified, uncached.unverified, uncached.file);
  }

  {
    store::StoreOptions sync_options = options;
    sync_options.sync_interval_commits = true;
    auto reopened = store::Store::Open(sync_options);
    if (!reopened.ok()) return Fail(reopened.status());
    auto states = MakeStates(std::max<size_t>(8, n_states / 4), state_bytes, 2);
    auto p = CommitAll(reopened->get(), members, states);
    if (!p.ok()) return Fail(p.status());
    put_sync = *p;
    std::printf("commit synced: %zu in %.3f s: %.1f MB/s\n", put_sync.commits, put_sync.seconds,
                MBps(put_sync.bytes, put_sync.seconds));
    auto report = (*reopened)->Verify();
    if (!report.ok()) return Fail(report.status());
    if (!report->ok()) return Fail(Status::Corruption(report->problems.front()));
  }
  if (remove_dir) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }

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
  const double crc_bound = Crc32cGBps(crc.bound, blob_size);
  const double crc_library = Crc32cGBps(crc.library, blob_size);
  std::printf("crc32c over %zu B: %.2f GB/s (%s); RocksDB's own loop %.2f GB/s\n", blob_size,
              crc_bound, store::Crc32cImplementation(), crc_library);
  // get/file_get: the default store (blob cache on) against whole-file reads
  // from the page cache; *_uncached_*: every store read from a blob file.
  const nlohmann::json out = {
      {"bench", "store"},
      {"state_bytes", state_bytes},
      {"blob_bytes", blob_size},
      {"states", n_states},
      {"put_mb_s", MBps(put.bytes, put.seconds)},
      {"put_sync_mb_s", MBps(put_sync.bytes, put_sync.seconds)},
      {"get_mb_s", cached.verified},
      {"get_unverified_mb_s", cached.unverified},
      {"get_uncached_mb_s", uncached.verified},
      {"get_uncached_unverified_mb_s", uncached.unverified},
      {"commit_per_s", put.commits / put.seconds},
      {"exploit_us", exploit_mean},
      {"exploit_p50_us", pct(0.5)},
      {"exploit_p99_us", pct(0.99)},
      {"file_put_mb_s", MBps(file_bytes, file_put_s)},
      {"file_put_sync_mb_s", MBps(file_sync_bytes, file_put_sync_s)},
      {"file_get_mb_s", cached.file},
      {"get_vs_file_get", cached.verified / std::max(1e-9, cached.file)},
      {"get_uncached_vs_file_get", uncached.verified / std::max(1e-9, uncached.file)},
      {"crc32c_gb_s", crc_bound},
      {"crc32c_rocksdb_own_gb_s", crc_library},
      {"peak_rss_bytes", PeakRssBytes()},
      {"cpu", CpuDescription()}};
  PrintJsonLine(out);
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
  cmd.add_option("--dir", o->dir, "store and files here (default: a temporary directory)");
  return [o] { return StoreBench(*o); };
}

}  // namespace

CKPT_BENCHMARK("store", "RocksDB checkpoint store vs one file per state (--state-bytes N)",
               StoreFlags);

}  // namespace ckpt::bench
