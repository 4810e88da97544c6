// tcp_attack_proxy: a man in the middle between one ckpt-worker and its
// scheduler, on loopback, for the attack tests (tests/attack). It accepts one
// connection on 127.0.0.1 (port written to PORT_FILE), connects to UPSTREAM,
// relays both ways, and attacks the worker -> scheduler stream once at byte
// OFFSET (past the TLS handshake, which is a few hundred bytes):
//
//   flip    flips one bit of the byte at OFFSET (a changed record)
//   inject  inserts, at the first TLS record boundary at or past OFFSET, a
//           forged RESULT: a ckpt frame carrying a RESULT
//           for MEMBER with val_accuracy 1e308, in a TLS application-data record
//           header (the proxy has no key: it can only make up the rest)
//   replay  relays honestly, records the worker's first OFFSET bytes, then
//           opens a second connection to UPSTREAM and sends them again (a
//           replayed session)
//
//   tcp_attack_proxy PORT_FILE UPSTREAM_HOST:PORT MODE OFFSET [MEMBER]
//
// Prints "attacked" on stdout when it has done its deed, then relays until
// either side closes.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/messages.h"
#include "tcp_frame.h"

namespace {

int Connect(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(std::stoi(host_port.substr(colon + 1))));
  if (inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &a.sin_addr) != 1) return -1;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) return -1;
  return fd;
}

bool WriteAll(int fd, const uint8_t* p, size_t n) {
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// A RESULT frame for `member` claiming the best score there is, in a TLS 1.3
// application-data record header; the "ciphertext" is the plain frame.
std::vector<uint8_t> ForgedResult(const std::string& member) {
  ckpt::ipc::Result r;
  r.task_id = 1;
  r.member = member;
  r.val_score = 1e308;
  r.step = 1;
  std::vector<uint8_t> payload(ckpt::ipc::EncodedSize(r));
  (void)ckpt::ipc::Encode(r, payload.data(), payload.size());
  namespace wire = ckpt::ipc::wire;
  wire::FrameHeader h{};
  h.magic = wire::kFrameMagic;
  h.type = static_cast<uint16_t>(ckpt::ipc::RecordType::kResult);
  h.sequence = 2;
  h.payload_bytes = payload.size();
  h.payload_xxh3 = ckpt::Xxh3_64(payload.data(), payload.size());
  h.message_bytes = payload.size();
  h.message_type = h.type;
  h.header_xxh3 = ckpt::Xxh3_64(&h, wire::kHeaderChecked);
  std::vector<uint8_t> frame(sizeof(h) + payload.size());
  std::memcpy(frame.data(), &h, sizeof(h));
  std::memcpy(frame.data() + sizeof(h), payload.data(), payload.size());
  const size_t len = frame.size() + 16;  // as if followed by an AEAD tag
  // Sized once and filled in place: GCC 12 at -O2 under -fsanitize=thread
  // reports a false -Warray-bounds on inserting into a 5-byte vector.
  std::vector<uint8_t> out(5 + frame.size() + 16, 0);
  const uint8_t record_header[5] = {0x17, 0x03, 0x03, static_cast<uint8_t>(len >> 8),
                                    static_cast<uint8_t>(len & 0xff)};
  std::memcpy(out.data(), record_header, sizeof(record_header));
  std::memcpy(out.data() + sizeof(record_header), frame.data(), frame.size());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tcp_attack_proxy PORT_FILE UPSTREAM MODE OFFSET [MEMBER]\n");
    return 2;
  }
  const std::string mode = argv[3];
  const uint64_t offset = std::strtoull(argv[4], nullptr, 10);
  const std::string member = argc > 5 ? argv[5] : "exp/m0";
  if (mode != "flip" && mode != "inject" && mode != "replay") return 2;

  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd, 4) != 0) {
    std::perror("tcp_attack_proxy: listen");
    return 1;
  }
  socklen_t alen = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen);
  {
    const std::string tmp = std::string(argv[1]) + ".tmp";
    std::ofstream(tmp) << "127.0.0.1:" << ntohs(a.sin_port) << "\n";
    std::rename(tmp.c_str(), argv[1]);
  }
  const int down = accept(lfd, nullptr, nullptr);
  const int up = Connect(argv[2]);
  if (down < 0 || up < 0) {
    std::perror("tcp_attack_proxy: connect");
    return 1;
  }
  uint64_t seen = 0;  // worker -> scheduler bytes relayed
  // TLS record boundaries of that stream: bytes left of the current record's
  // header (5) or body.
  size_t header_left = 5;
  uint8_t header[5];
  size_t body_left = 0;
  bool done = false;
  std::vector<uint8_t> recorded;
  std::vector<uint8_t> buf(1 << 16);
  while (true) {
    pollfd p[2] = {{down, POLLIN, 0}, {up, POLLIN, 0}};
    if (poll(p, 2, -1) < 0) continue;
    if (p[1].revents != 0) {
      const ssize_t n = recv(up, buf.data(), buf.size(), 0);
      if (n <= 0 || !WriteAll(down, buf.data(), static_cast<size_t>(n))) break;
    }
    if (p[0].revents != 0) {
      const ssize_t n = recv(down, buf.data(), buf.size(), 0);
      if (n <= 0) break;
      size_t len = static_cast<size_t>(n);
      if (mode == "replay" && recorded.size() < offset) {
        recorded.insert(recorded.end(), buf.data(),
                        buf.data() + std::min<size_t>(len, offset - recorded.size()));
      }
      // Where, in this chunk, the first record boundary at or past OFFSET is.
      size_t boundary = len + 1;
      for (size_t i = 0; i < len;) {
        if (header_left == 5 && body_left == 0 && seen + i >= offset && boundary > len) {
          boundary = i;
        }
        if (header_left > 0) {
          header[5 - header_left] = buf[i];
          --header_left;
          ++i;
          if (header_left == 0) body_left = (size_t{header[3]} << 8) | header[4];
          continue;
        }
        const size_t take = std::min(body_left, len - i);
        body_left -= take;
        i += take;
        if (body_left == 0) header_left = 5;
      }
      if (header_left == 5 && body_left == 0 && seen + len >= offset && boundary > len) {
        boundary = len;  // at the chunk's end
      }
      const bool flip_now = mode == "flip" && seen + len > offset;
      const bool inject_now = mode == "inject" && boundary <= len;
      if (!done && (flip_now || inject_now)) {
        const size_t at = flip_now ? static_cast<size_t>(offset - seen) : boundary;
        if (mode == "flip") {
          buf[at] ^= 0x10;
          if (!WriteAll(up, buf.data(), len)) break;
        } else {
          const auto forged = ForgedResult(member);
          if (!WriteAll(up, buf.data(), at) || !WriteAll(up, forged.data(), forged.size()) ||
              !WriteAll(up, buf.data() + at, len - at)) {
            break;
          }
        }
        done = true;
        std::printf("attacked\n");
        std::fflush(stdout);
      } else if (!WriteAll(up, buf.data(), len)) {
        break;
      }
      seen += len;
      if (mode == "replay" && !done && recorded.size() >= offset) {
        // The recorded opening, sent again on a connection of its own, by a
        // child, so that the honest session goes on meanwhile.
        if (fork() == 0) {
          const int again = Connect(argv[2]);
          if (again >= 0) {
            (void)WriteAll(again, recorded.data(), recorded.size());
            std::vector<uint8_t> sink(1 << 16);
            pollfd q{again, POLLIN, 0};
            while (poll(&q, 1, 10000) > 0 && recv(again, sink.data(), sink.size(), 0) > 0) {
            }
          }
          _exit(0);
        }
        done = true;
        std::printf("attacked\n");
        std::fflush(stdout);
      }
    }
  }
  close(down);
  close(up);
  return 0;
}
