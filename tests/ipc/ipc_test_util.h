// Shared by the ipc tests and their peer process (ipc_peer.cc): deterministic
// record sizes and payloads, so that either side can check what the other sent
// from (seed, index) alone, and a child process with two pipes for sync points.
#ifndef CKPT_TESTS_IPC_IPC_TEST_UTIL_H_
#define CKPT_TESTS_IPC_IPC_TEST_UTIL_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/messages.h"

namespace ckpt::ipc::testing {

inline uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Size of record `i` of stream `seed` over a ring of `ring` bytes: the edge
// cases first (empty, around 64-byte alignment, around the one-record limit of
// ring/2 - 64, up to 4x the ring), then mostly small records, some up to half
// the ring and a few fragmented ones up to 4x the ring.
inline size_t RecordSize(uint64_t seed, uint64_t i, uint64_t ring) {
  const uint64_t limit = ring / 2 - 64;
  const uint64_t edges[] = {0,    1,         63,       64,           65,
                            4095, limit - 1, limit,    limit + 1,    ring - 64,
                            ring, ring + 1,  2 * ring, 4 * ring - 1, 4 * ring};
  if (i < sizeof(edges) / sizeof(edges[0])) return edges[i];
  const uint64_t r = Mix(seed * 0x100000001b3ull + i);
  const uint64_t pick = r % 100;
  const uint64_t v = r >> 8;
  if (pick < 2) return ring / 2 + v % (4 * ring - ring / 2 + 1);
  if (pick < 12) return v % (ring / 2 + 1);
  return v % 4096;
}

inline RecordType TypeFor(uint64_t seed, uint64_t i) {
  return static_cast<RecordType>(static_cast<uint16_t>(RecordType::kHello) +
                                 Mix(seed ^ (i << 20)) % 7);
}

inline void FillPayload(uint64_t seed, uint64_t i, uint8_t* p, size_t n) {
  uint64_t x = Mix(seed ^ Mix(i));
  size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    const uint64_t w = x ^ (x >> 29);
    std::memcpy(p + k, &w, 8);
  }
  x = x * 6364136223846793005ull + 1442695040888963407ull;
  for (; k < n; ++k) p[k] = static_cast<uint8_t>(x >> (8 * (k % 8)));
}

// Empty when the payload is record `i` of stream `seed`, else what differs.
inline std::string CheckRecord(uint64_t seed, uint64_t i, uint64_t ring, RecordType type,
                               const uint8_t* p, size_t n, std::vector<uint8_t>* scratch) {
  const size_t want = RecordSize(seed, i, ring);
  if (type != TypeFor(seed, i)) {
    return "record " + std::to_string(i) + ": type " + RecordTypeName(type) + ", want " +
           RecordTypeName(TypeFor(seed, i));
  }
  if (n != want) {
    return "record " + std::to_string(i) + ": " + std::to_string(n) + " bytes, want " +
           std::to_string(want);
  }
  scratch->resize(want);
  FillPayload(seed, i, scratch->data(), want);
  if (want != 0 && std::memcmp(scratch->data(), p, want) != 0) {
    return "record " + std::to_string(i) + ": payload differs";
  }
  return "";
}

// Sends record `i` of stream `seed`: written in place for even i, copied in
// with Send for odd i (both paths, in place and staged, get exercised).
inline Status SendRecord(Channel* ch, uint64_t seed, uint64_t i, uint64_t ring,
                         std::vector<uint8_t>* scratch, Deadline deadline) {
  const size_t size = RecordSize(seed, i, ring);
  if (i % 2 == 0) {
    CKPT_ASSIGN_OR_RETURN(Reservation r, ch->Reserve(TypeFor(seed, i), size, deadline));
    FillPayload(seed, i, r.data, r.size);
    return ch->Commit(r, deadline);
  }
  scratch->resize(size);
  FillPayload(seed, i, scratch->data(), size);
  return ch->Send(TypeFor(seed, i), scratch->data(), size, deadline);
}

// A child process running the peer binary, with a line pipe each way: the
// child writes to fd 3 and reads fd 4.
class Child {
 public:
  Child() = default;
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      Reap();
    }
    if (from_child_ >= 0) ::close(from_child_);
    if (to_child_ >= 0) ::close(to_child_);
  }

  // Starts `path args...`. False when fork/exec fails.
  bool Start(const std::string& path, const std::vector<std::string>& args) {
    int up[2], down[2];
    if (::pipe2(up, O_CLOEXEC) != 0 || ::pipe2(down, O_CLOEXEC) != 0) return false;
    std::vector<std::string> all = {path};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) return false;
    if (pid_ == 0) {
      ::dup2(up[1], 3);  // dup2 clears FD_CLOEXEC on the new descriptor
      ::dup2(down[0], 4);
      ::execv(path.c_str(), argv.data());
      ::_exit(127);
    }
    ::close(up[1]);
    ::close(down[0]);
    from_child_ = up[0];
    to_child_ = down[1];
    return true;
  }

  // Reads one line from the child, waiting at most `timeout`. False on
  // timeout or EOF (the child died).
  bool ReadLine(std::string* line, std::chrono::milliseconds timeout) {
    const auto end = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      auto nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        *line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return true;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      struct pollfd pfd = {from_child_, POLLIN, 0};
      if (::poll(&pfd, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[256];
      ssize_t n = ::read(from_child_, buf, sizeof(buf));
      if (n <= 0) return false;
      buffer_.append(buf, static_cast<size_t>(n));
    }
  }
  // Expects exactly `want` as the next line.
  bool Expect(const std::string& want, std::chrono::milliseconds timeout, std::string* got) {
    return ReadLine(got, timeout) && *got == want;
  }
  bool WriteLine(const std::string& line) {
    std::string l = line + "\n";
    return ::write(to_child_, l.data(), l.size()) == static_cast<ssize_t>(l.size());
  }

  pid_t pid() const { return pid_; }
  void Kill(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Waits for the child to end; returns its wait status, -1 if none.
  int Reap() {
    if (pid_ <= 0) return -1;
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }

 private:
  pid_t pid_ = -1;
  int from_child_ = -1;
  int to_child_ = -1;
  std::string buffer_;
};

}  // namespace ckpt::ipc::testing

#endif  // CKPT_TESTS_IPC_IPC_TEST_UTIL_H_
