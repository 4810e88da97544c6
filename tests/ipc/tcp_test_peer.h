// Hand-written peers for the TCP transport's tests (tcp_channel_test.cc,
// tcp_attack_test.cc): raw loopback sockets, hand-made frames, and the
// server's half of the TLS handshake done by hand with the private TLS
// adapter (worker/ipc/src/tls.h), so that a test can be an authenticated
// but hostile peer.
#ifndef CKPT_TESTS_IPC_TCP_TEST_PEER_H_
#define CKPT_TESTS_IPC_TCP_TEST_PEER_H_

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "tcp_frame.h"
#include "tls.h"

namespace ckpt::ipc::testing {

inline const std::string kSecret = "0123456789abcdef0123456789abcdef0123456789abcdef";

// A listening socket on 127.0.0.1, ephemeral port in *port.
inline int RawListen(uint16_t* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(listen(fd, 8), 0);
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  *port = ntohs(a.sin_port);
  return fd;
}

// A connection to 127.0.0.1:port, from `from` (a loopback address) when set.
inline int RawConnect(uint16_t port, const char* from = nullptr) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (from != nullptr) {
    sockaddr_in b{};
    b.sin_family = AF_INET;
    inet_pton(AF_INET, from, &b.sin_addr);
    EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&b), sizeof(b)), 0) << from;
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

// Writes all n bytes; false when the peer is gone (reset, closed) first.
inline bool TryWriteRaw(int fd, const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  while (n > 0) {
    ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    b += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

inline void WriteRaw(int fd, const void* p, size_t n) { ASSERT_TRUE(TryWriteRaw(fd, p, n)); }

inline bool ReadRaw(int fd, void* p, size_t n) {
  auto* b = static_cast<uint8_t*>(p);
  while (n > 0) {
    ssize_t r = read(fd, b, n);
    if (r <= 0) return false;
    b += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// A frame by hand: a message of `type`, or a fragment when message_bytes is
// set (flags, offset and total as given).
inline std::vector<uint8_t> Frame(uint16_t type, uint64_t seq, const std::vector<uint8_t>& payload,
                                  bool bad_payload = false, bool bad_header = false) {
  wire::FrameHeader h{};
  h.magic = wire::kFrameMagic;
  h.type = type;
  h.sequence = seq;
  h.payload_bytes = payload.size();
  h.payload_xxh3 = Xxh3_64(payload.data(), payload.size()) ^ (bad_payload ? 1 : 0);
  h.message_bytes = payload.size();
  h.message_type = type;
  h.header_xxh3 = Xxh3_64(&h, wire::kHeaderChecked) ^ (bad_header ? 1 : 0);
  std::vector<uint8_t> out(sizeof(h) + payload.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (!payload.empty()) std::memcpy(out.data() + sizeof(h), payload.data(), payload.size());
  return out;
}

// The server's half of the TLS handshake, by hand, on an accepted socket,
// keyed by `secret`. Returns the session (nullptr when it failed); the
// socket is left blocking.
inline std::unique_ptr<internal::TlsSession> ServerHandshake(int fd, const std::string& secret) {
  const int fl = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  auto ctx = internal::TlsContext::Make(internal::TlsRole::kServer, secret);
  EXPECT_TRUE(ctx.ok());
  auto tls = internal::TlsSession::Make(*ctx, fd);
  EXPECT_TRUE(tls.ok());
  while (true) {
    internal::TlsWant want;
    Status r = (*tls)->Handshake(&want);
    std::vector<uint8_t> out;
    (*tls)->TakeOutput(&out);
    fcntl(fd, F_SETFL, fl);
    if (!out.empty()) WriteRaw(fd, out.data(), out.size());
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    if (r.ok()) break;
    if (!r.IsResourceExhausted()) {
      fcntl(fd, F_SETFL, fl);
      return nullptr;
    }
    pollfd pf{fd, static_cast<short>(want == internal::TlsWant::kWrite ? POLLOUT : POLLIN), 0};
    poll(&pf, 1, 1000);
  }
  fcntl(fd, F_SETFL, fl);
  return std::move(*tls);
}

// Sends `bytes` through `tls` on (blocking) `fd`: sealed, then written.
inline void WriteSealed(int fd, internal::TlsSession& tls, const std::vector<uint8_t>& bytes) {
  const iovec part{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  std::vector<uint8_t> out;
  ASSERT_TRUE(tls.Seal(&part, 1, &out).ok());
  WriteRaw(fd, out.data(), out.size());
}

}  // namespace ckpt::ipc::testing

#endif  // CKPT_TESTS_IPC_TCP_TEST_PEER_H_
