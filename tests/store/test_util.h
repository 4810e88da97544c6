// Helpers shared by the store tests and their child process: temporary
// directories, real checkpoint blobs, child processes over pipes.
#ifndef CKPT_TESTS_STORE_TEST_UTIL_H_
#define CKPT_TESTS_STORE_TEST_UTIL_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/store/store.h"

extern char** environ;

namespace ckpt::store::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string tmpl = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-store-test-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A real checkpoint blob: two float tensors ("w" of `floats` values from
// `seed`, "optim.w.momentum_buffer" of 16) with step and hparams in metadata.
inline std::string MakeBlob(uint64_t seed, size_t floats = 256, int64_t step = 0) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(floats), m(16);
  for (auto& x : w) x = dist(rng);
  for (auto& x : m) x = dist(rng);
  format::CheckpointWriter writer;
  format::CheckpointMeta meta;
  meta.model_spec = "test";
  meta.optimizer = "sgd";
  meta.hparams = {{"lr", 0.1}};
  meta.step = step;
  meta.data_seed = seed;
  writer.SetMeta(meta);
  Status s = writer.AddTensor("w", format::DType::kF32, {static_cast<int64_t>(floats)}, w.data(),
                              w.size() * sizeof(float));
  if (!s.ok()) std::abort();
  s = writer.AddTensor("optim.w.momentum_buffer", format::DType::kF32, {16}, m.data(),
                       m.size() * sizeof(float));
  if (!s.ok()) std::abort();
  return writer.Encode();
}

// Names the environment variable that chooses where TestOptions keeps states,
// for the store tests and their child processes: unset (or "1") the blob log
// (StoreOptions::blob_log, the default), with small segments; "sync" the same
// with synced interval commits; "off" RocksDB's integrated blob files, as a
// store from before the blob log has them.
inline constexpr char kBlobLogVariable[] = "CKPT_STORE_TEST_BLOB_LOG";

inline StoreOptions TestOptions(const std::string& path) {
  StoreOptions o;
  o.path = path;
  const char* log = std::getenv(kBlobLogVariable);
  const std::string mode = log != nullptr ? log : "";
  o.blob_log = mode != "off";
  // Small segments, so that a test's few blobs fill several of them.
  o.blob_log_segment_bytes = uint64_t{256} << 10;
  o.sync_interval_commits = mode == "sync";
  return o;
}

// A child process with its stdin and stdout on pipes.
class Child {
 public:
  // Starts argv[0] with `argv`. Aborts the test process when spawning fails.
  explicit Child(const std::vector<std::string>& argv) {
    int in[2], out[2];
    if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) std::abort();
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &fa, nullptr, args.data(), environ) != 0) std::abort();
    posix_spawn_file_actions_destroy(&fa);
    close(in[0]);
    close(out[1]);
    stdin_ = in[1];
    stdout_ = out[0];
  }
  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      Wait();
    }
    CloseStdin();
    if (stdout_ >= 0) close(stdout_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  void CloseStdin() {
    if (stdin_ >= 0) close(stdin_);
    stdin_ = -1;
  }

  // Reads complete lines until `deadline` or EOF (or, with `first_only`, the
  // first complete line); returns them. Sets *eof at EOF.
  std::vector<std::string> ReadLinesUntil(std::chrono::steady_clock::time_point deadline, bool* eof,
                                          bool first_only = false) {
    std::vector<std::string> lines;
    *eof = false;
    char buf[4096];
    while (true) {
      auto now = std::chrono::steady_clock::now();
      int wait_ms =
          now >= deadline
              ? 0
              : static_cast<int>(
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count()) +
                    1;
      pollfd p{stdout_, POLLIN, 0};
      int r = poll(&p, 1, wait_ms);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;
      ssize_t n = read(stdout_, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        *eof = true;
        break;
      }
      partial_.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = partial_.find('\n')) != std::string::npos) {
        lines.push_back(partial_.substr(0, nl));
        partial_.erase(0, nl + 1);
      }
      if (first_only && !lines.empty()) break;
    }
    return lines;
  }

  // Reads lines until EOF (REQUIRES: the child exits or closes stdout).
  std::vector<std::string> ReadAllLines() {
    std::vector<std::string> all;
    bool eof = false;
    while (!eof) {
      auto more = ReadLinesUntil(std::chrono::steady_clock::now() + std::chrono::seconds(30), &eof);
      all.insert(all.end(), more.begin(), more.end());
      if (more.empty() && !eof) break;  // 30 s without output: give up
    }
    return all;
  }

  // Waits for exit; returns the wait status.
  int Wait() {
    int status = 0;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int stdin_ = -1;
  int stdout_ = -1;
  std::string partial_;
};

}  // namespace ckpt::store::testing

#endif  // CKPT_TESTS_STORE_TEST_UTIL_H_
