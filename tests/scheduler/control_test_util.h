// Helpers for the control-socket tests: a raw client that can send any bytes
// (half lines, oversized lines, garbage) and read replies with a timeout.
#ifndef CKPT_TESTS_SCHEDULER_CONTROL_TEST_UTIL_H_
#define CKPT_TESTS_SCHEDULER_CONTROL_TEST_UTIL_H_

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/scheduler/control_client.h"

namespace ckpt::testing {

class RawClient {
 public:
  enum class Got { kLine, kClosed, kTimeout };

  explicit RawClient(const std::string& path) {
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
    if (fd_ >= 0 && connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      close(fd_);
      fd_ = -1;
    }
  }
  ~RawClient() {
    if (fd_ >= 0) close(fd_);
  }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return fd_ >= 0; }

  // Sends every byte (false when the server closed the connection).
  bool Send(const std::string& bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return false;
      sent += static_cast<size_t>(n);
    }
    return true;
  }

  // Reads one line. A zero timeout still looks once, so it tells an open
  // connection (kTimeout) from a closed one (kClosed).
  Got ReadLine(std::string* line, std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    bool last_look = false;
    while (true) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        *line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return Got::kLine;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                      until - std::chrono::steady_clock::now())
                      .count();
      if (left <= 0) {
        if (last_look) return Got::kTimeout;
        last_look = true;
        left = 0;
      }
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left)) <= 0) continue;
      char chunk[65536];
      ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Got::kClosed;
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // Sends one line and parses the reply. Without one (closed, timed out, not
  // JSON) it returns {"ok": false, "code": "", "error": "no reply: <why>"},
  // so callers can always use value().
  nlohmann::json Call(const std::string& line,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(30000)) {
    auto none = [](const std::string& why) {
      return nlohmann::json{{"ok", false}, {"code", ""}, {"error", "no reply: " + why}};
    };
    if (!Send(line + "\n")) return none("send failed");
    std::string reply;
    switch (ReadLine(&reply, timeout)) {
      case Got::kClosed:
        return none("connection closed");
      case Got::kTimeout:
        return none("timed out");
      case Got::kLine:
        break;
    }
    nlohmann::json j = nlohmann::json::parse(reply, nullptr, false);
    return j.is_object() ? j : none("not a JSON object: " + reply.substr(0, 200));
  }

 private:
  int fd_ = -1;
  std::string buffer_;
};

// Connects a ControlClient, retrying while the server is not up yet.
inline std::unique_ptr<scheduler::ControlClient> ConnectWhenUp(const std::string& path,
                                                               std::chrono::milliseconds within,
                                                               const std::function<bool()>& alive) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (std::chrono::steady_clock::now() < until && alive()) {
    scheduler::ControlClientOptions o;
    o.socket_path = path;
    o.timeout = std::chrono::milliseconds(30000);
    auto c = scheduler::ControlClient::Connect(o);
    if (c.ok()) {
      auto list = (*c)->List();
      if (list.ok()) return std::move(*c);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return nullptr;
}

// Sends `requests` (one JSON object per line) over one connection made by a
// child process running as `uid`/`gid` (fork, setgroups({}), setgid, setuid,
// connect; only async-signal-safe calls in the child, the test being
// threaded), and returns the replies in order. A reply that did not come is
// {"ok": false, "code": "", "error": "no reply: <why>"}. REQUIRES: root.
inline std::vector<nlohmann::json> CallAs(uid_t uid, gid_t gid, const std::string& socket_path,
                                          const std::vector<std::string>& requests) {
  std::vector<nlohmann::json> replies;
  auto none = [](const std::string& why) {
    return nlohmann::json{{"ok", false}, {"code", ""}, {"error", "no reply: " + why}};
  };
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  std::string wire;
  for (const auto& r : requests) wire += r + "\n";
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) return {none("pipe failed")};
  const pid_t pid = fork();
  if (pid == 0) {
    close(out[0]);
    auto fail = [&](const char* what) {
      (void)!write(out[1], what, std::strlen(what));
      _exit(1);
    };
    if (setgroups(0, nullptr) != 0 || setgid(gid) != 0 || setuid(uid) != 0) fail("ERR setuid\n");
    const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) fail("ERR socket\n");
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
      fail(errno == EACCES ? "ERR connect: permission denied (socket or directory mode)\n"
                           : "ERR connect\n");
    }
    // One request at a time: each reply is read before the next is sent.
    size_t at = 0;
    char buf[65536];
    while (at < wire.size()) {
      const size_t nl = wire.find('\n', at);
      if (send(fd, wire.data() + at, nl + 1 - at, MSG_NOSIGNAL) !=
          static_cast<ssize_t>(nl + 1 - at)) {
        fail("ERR send\n");
      }
      at = nl + 1;
      bool line = false;
      while (!line) {
        const ssize_t n = read(fd, buf, sizeof buf);
        if (n <= 0) _exit(0);
        (void)!write(out[1], buf, static_cast<size_t>(n));
        line = std::memchr(buf, '\n', static_cast<size_t>(n)) != nullptr;
      }
    }
    _exit(0);
  }
  close(out[1]);
  std::string got;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (pid > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{out[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) == 0) {
      kill(pid, SIGKILL);
      break;
    }
    char chunk[65536];
    const ssize_t n = read(out[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(chunk, static_cast<size_t>(n));
  }
  close(out[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  size_t at = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const size_t nl = got.find('\n', at);
    if (nl == std::string::npos) {
      replies.push_back(none(pid < 0 ? "fork failed" : "child got no reply: " + got.substr(at)));
      continue;
    }
    const std::string line = got.substr(at, nl - at);
    at = nl + 1;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    replies.push_back(j.is_object() ? j : none(line));
  }
  return replies;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SCHEDULER_CONTROL_TEST_UTIL_H_
