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

enum class Mode { kFlip, kInject, kReplay };

bool ParseMode(const std::string& name, Mode* mode) {
  static const struct {
    const char* name;
    Mode mode;
  } kModes[] = {{"flip", Mode::kFlip}, {"inject", Mode::kInject}, {"replay", Mode::kReplay}};
  for (const auto& m : kModes) {
    if (name == m.name) {
      *mode = m.mode;
      return true;
    }
  }
  return false;
}

struct Options {
  std::string upstream;  // HOST:PORT
  Mode mode = Mode::kFlip;
  uint64_t offset = 0;
  std::string member;
};

// Listens on an ephemeral loopback port and writes "127.0.0.1:PORT" to
// `port_file` (renamed into place, so that a reader sees all or nothing).
// Returns the listening socket, -1 on failure (reported on stderr).
int ListenAndPublish(const char* port_file) {
  const int lfd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(lfd, 4) != 0) {
    std::perror("tcp_attack_proxy: listen");
    return -1;
  }
  socklen_t alen = sizeof(a);
  getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &alen);
  const std::string tmp = std::string(port_file) + ".tmp";
  std::ofstream(tmp) << "127.0.0.1:" << ntohs(a.sin_port) << "\n";
  std::rename(tmp.c_str(), port_file);
  return lfd;
}

// The TLS record boundaries of one stream, followed chunk by chunk.
class TlsRecords {
 public:
  // Follows `len` more bytes of the stream, the first at stream position
  // `seen`. Returns the index in them of the first record boundary at or
  // past stream position `offset` (`len`: at the chunk's end), len + 1 if
  // there is none in this chunk.
  size_t Follow(const uint8_t* data, size_t len, uint64_t seen, uint64_t offset) {
    size_t boundary = len + 1;
    for (size_t i = 0; i < len;) {
      if (AtBoundary() && seen + i >= offset && boundary > len) boundary = i;
      if (header_left_ > 0) {
        header_[5 - header_left_] = data[i];
        --header_left_;
        ++i;
        if (header_left_ == 0) body_left_ = (size_t{header_[3]} << 8) | header_[4];
        continue;
      }
      const size_t take = std::min(body_left_, len - i);
      body_left_ -= take;
      i += take;
      if (body_left_ == 0) header_left_ = 5;
    }
    if (AtBoundary() && seen + len >= offset && boundary > len) {
      boundary = len;  // at the chunk's end
    }
    return boundary;
  }

 private:
  bool AtBoundary() const { return header_left_ == 5 && body_left_ == 0; }

  // Bytes left of the current record's header (5) or body.
  size_t header_left_ = 5;
  uint8_t header_[5] = {};
  size_t body_left_ = 0;
};

// The attack tests look for this line in the proxy's output.
void ReportAttacked() {
  std::printf("attacked\n");
  std::fflush(stdout);
}

// Sends `recorded` again on a connection of its own to `upstream`, from a
// child, so that the honest session goes on meanwhile.
void ReplayInChild(const std::string& upstream, const std::vector<uint8_t>& recorded) {
  if (fork() == 0) {
    const int again = Connect(upstream);
    if (again >= 0) {
      (void)WriteAll(again, recorded.data(), recorded.size());
      std::vector<uint8_t> sink(1 << 16);
      pollfd q{again, POLLIN, 0};
      while (poll(&q, 1, 10000) > 0 && recv(again, sink.data(), sink.size(), 0) > 0) {
      }
    }
    _exit(0);
  }
}

// The worker -> scheduler stream, relayed to `up` and attacked once.
class WorkerStream {
 public:
  WorkerStream(const Options& options, int up) : options_(options), up_(up) {}

  // Relays one chunk `buf[0, len)` read from the worker, attacked when its
  // offset has come. Returns false once the scheduler's side fails.
  bool Relay(std::vector<uint8_t>& buf, size_t len) {
    const uint64_t offset = options_.offset;
    const Mode mode = options_.mode;
    if (mode == Mode::kReplay && recorded_.size() < offset) {
      recorded_.insert(recorded_.end(), buf.data(),
                       buf.data() + std::min<size_t>(len, offset - recorded_.size()));
    }
    const size_t boundary = records_.Follow(buf.data(), len, seen_, offset);
    const bool flip_now = mode == Mode::kFlip && seen_ + len > offset;
    const bool inject_now = mode == Mode::kInject && boundary <= len;
    if (!done_ && (flip_now || inject_now)) {
      const size_t at = flip_now ? static_cast<size_t>(offset - seen_) : boundary;
      if (!Attack(buf, len, at)) return false;
      done_ = true;
      ReportAttacked();
    } else if (!WriteAll(up_, buf.data(), len)) {
      return false;
    }
    seen_ += len;
    if (mode == Mode::kReplay && !done_ && recorded_.size() >= offset) {
      ReplayInChild(options_.upstream, recorded_);
      done_ = true;
      ReportAttacked();
    }
    return true;
  }

 private:
  // Sends the chunk with a bit flipped at `at` (flip) or a forged RESULT
  // inserted at `at` (inject).
  bool Attack(std::vector<uint8_t>& buf, size_t len, size_t at) {
    if (options_.mode == Mode::kFlip) {
      buf[at] ^= 0x10;
      return WriteAll(up_, buf.data(), len);
    }
    const auto forged = ForgedResult(options_.member);
    return WriteAll(up_, buf.data(), at) && WriteAll(up_, forged.data(), forged.size()) &&
           WriteAll(up_, buf.data() + at, len - at);
  }

  const Options& options_;
  const int up_;
  uint64_t seen_ = 0;  // bytes relayed
  TlsRecords records_;
  bool done_ = false;
  std::vector<uint8_t> recorded_;  // replay: the worker's first `offset` bytes
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: tcp_attack_proxy PORT_FILE UPSTREAM MODE OFFSET [MEMBER]\n");
    return 2;
  }
  Options options;
  options.upstream = argv[2];
  options.offset = std::strtoull(argv[4], nullptr, 10);
  options.member = argc > 5 ? argv[5] : "exp/m0";
  if (!ParseMode(argv[3], &options.mode)) return 2;

  const int lfd = ListenAndPublish(argv[1]);
  if (lfd < 0) return 1;
  const int down = accept(lfd, nullptr, nullptr);
  const int up = Connect(options.upstream);
  if (down < 0 || up < 0) {
    std::perror("tcp_attack_proxy: connect");
    return 1;
  }
  WorkerStream worker(options, up);
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
      if (n <= 0 || !worker.Relay(buf, static_cast<size_t>(n))) break;
    }
  }
  close(down);
  close(up);
  return 0;
}
