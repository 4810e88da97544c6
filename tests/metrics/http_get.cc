#include "http_get.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;

int MsLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// Waits until `fd` is ready for `events`; false at the deadline.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, MsLeft(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

StatusOr<std::string> DecodeChunked(const std::string& in, const std::string& what) {
  std::string out;
  size_t pos = 0;
  for (;;) {
    const size_t eol = in.find("\r\n", pos);
    if (eol == std::string::npos) return Status::Corruption(what + ": truncated chunk size");
    const size_t size = std::strtoul(in.substr(pos, eol - pos).c_str(), nullptr, 16);
    pos = eol + 2;
    if (size == 0) return out;
    if (pos + size + 2 > in.size()) return Status::Corruption(what + ": truncated chunk");
    out.append(in, pos, size);
    pos += size + 2;
  }
}

}  // namespace

std::string UrlEncode(const std::string& s) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& target,
                               std::chrono::milliseconds timeout) {
  const std::string what = "GET http://" + host + ":" + std::to_string(port) + target;
  const auto deadline = Clock::now() + timeout;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument(what + ": host is not a numeric IPv4 address");
  }
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Status::IOError(what + ": socket: " + std::strerror(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};

  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) return Status::Unavailable(what + ": " + std::strerror(errno));
    if (!WaitFor(fd, POLLOUT, deadline)) return Status::Unavailable(what + ": connect timed out");
    int err = 0;
    socklen_t len = sizeof(err);
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Unavailable(what + ": " + std::strerror(err));
  }
  const std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host + ":" +
                              std::to_string(port) + "\r\nAccept: */*\r\nConnection: close\r\n\r\n";
  size_t sent = 0;
  while (sent < request.size()) {
    const ssize_t n = ::send(fd, request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
    } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      if (!WaitFor(fd, POLLOUT, deadline)) return Status::Unavailable(what + ": send timed out");
    } else {
      return Status::IOError(what + ": send: " + std::strerror(errno));
    }
  }
  std::string raw;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n > 0) {
      raw.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno == EAGAIN || errno == EINTR) {
      if (!WaitFor(fd, POLLIN, deadline)) return Status::Unavailable(what + ": response timed out");
    } else {
      return Status::IOError(what + ": recv: " + std::strerror(errno));
    }
  }
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.rfind("HTTP/1.", 0) != 0 || head_end == std::string::npos || raw.size() < 12) {
    return Status::Corruption(what + ": not an HTTP response");
  }
  HttpResponse response;
  response.status = std::atoi(raw.substr(9, 3).c_str());
  size_t line = raw.find("\r\n") + 2;
  while (line < head_end) {
    const size_t eol = raw.find("\r\n", line);
    const std::string header = raw.substr(line, eol - line);
    const size_t colon = header.find(':');
    if (colon != std::string::npos) {
      size_t v = colon + 1;
      while (v < header.size() && header[v] == ' ') ++v;
      response.headers[Lower(header.substr(0, colon))] = header.substr(v);
    }
    line = eol + 2;
  }
  response.body = raw.substr(head_end + 4);
  auto te = response.headers.find("transfer-encoding");
  if (te != response.headers.end() && Lower(te->second).find("chunked") != std::string::npos) {
    CKPT_ASSIGN_OR_RETURN(response.body, DecodeChunked(response.body, what));
  }
  return response;
}

}  // namespace ckpt::testing
