// Framing and poll-sliced socket I/O of the TCP transport (tcp_io.h).
#include "tcp_io.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/tcp_channel.h"
#include "payload_checksum.h"

namespace ckpt::ipc::internal {

using std::chrono::milliseconds;
using wire::FrameHeader;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

bool IsMessageType(uint16_t t) {
  return t >= static_cast<uint16_t>(RecordType::kHello) &&
         t <= static_cast<uint16_t>(RecordType::kShutdown);
}

FrameHeader MakeHeader(uint16_t type, uint16_t flags, uint64_t sequence, const void* payload,
                       size_t size, uint64_t message_bytes, uint16_t message_type,
                       uint64_t fragment_offset) {
  FrameHeader h{};
  h.magic = wire::kFrameMagic;
  h.type = type;
  h.flags = flags;
  h.sequence = sequence;
  h.payload_bytes = size;
  h.payload_xxh3 = PayloadXxh3(payload, size);
  h.message_bytes = message_bytes;
  h.message_type = message_type;
  h.fragment_offset = fragment_offset;
  h.header_xxh3 = Xxh3_64(&h, wire::kHeaderChecked);
  return h;
}

// Checks what can be checked of a header alone.
Status CheckHeader(const FrameHeader& h, const std::string& peer) {
  if (h.magic != wire::kFrameMagic) {
    return Status::Corruption("frame from " + peer + ": bad magic " + std::to_string(h.magic));
  }
  if (Xxh3_64(&h, wire::kHeaderChecked) != h.header_xxh3) {
    return Status::Corruption("frame from " + peer + ": header checksum mismatch");
  }
  if (h.payload_bytes > kTcpMaxFramePayload) {
    return Status::Corruption("frame from " + peer + ": payload of " +
                              std::to_string(h.payload_bytes) + " bytes exceeds the frame limit");
  }
  if (h.reserved16 != 0 || h.reserved32 != 0) {
    return Status::Corruption("frame from " + peer + ": reserved fields set");
  }
  return Status::OK();
}

void SetSocketOptions(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  const int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

// Blocking I/O on a non-blocking socket in poll slices. `stop` says why to
// give up early (Close, a dead peer): a non-OK status returned as is.
using StopCheck = std::function<Status()>;

// Writes all of `iov` (modified) or stops at the deadline; `*written` counts
// the bytes the kernel took. ResourceExhausted at the deadline, Unavailable
// when the connection breaks.
Status WriteAll(int fd, std::vector<iovec> iov, Deadline deadline, const StopCheck& stop,
                const std::string& peer, size_t* written) {
  *written = 0;
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    const ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n > 0) {
      *written += static_cast<size_t>(n);
      size_t left = static_cast<size_t>(n);
      while (left > 0) {
        const size_t take = std::min(left, iov[first].iov_len);
        iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + take;
        iov[first].iov_len -= take;
        left -= take;
        if (iov[first].iov_len == 0) ++first;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable("connection to " + peer + " lost: " + std::strerror(errno));
    }
    if (Status s = stop(); !s.ok()) return s;
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status::ResourceExhausted("sending to " + peer + ": deadline reached");
    }
    pollfd p{fd, POLLOUT, 0};
    const auto wait = std::min<milliseconds>(
        kSlice, std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    (void)poll(&p, 1, static_cast<int>(wait.count()));
  }
  return Status::OK();
}

Status WaitFor(int fd, short events, Deadline deadline, const StopCheck& stop,
               const std::string& what) {
  while (true) {
    pollfd p{fd, events, 0};
    if (poll(&p, 1, 0) > 0) return Status::OK();
    if (Status s = stop(); !s.ok()) return s;
    const auto now = Clock::now();
    if (now >= deadline) return Status::ResourceExhausted(what + ": deadline reached");
    const auto wait = std::min<milliseconds>(
        kSlice, std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    (void)poll(&p, 1, static_cast<int>(wait.count()));
  }
}

Status ReadExact(TlsSession& tls, void* out, size_t size, Deadline deadline, const StopCheck& stop,
                 const std::string& peer, const std::function<void()>& on_bytes) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    TlsWant want = TlsWant::kNone;
    StatusOr<size_t> n = tls.Read(p + got, size - got, &want);
    if (!n.ok()) {
      const Status& e = n.status();
      return e.IsUnavailable() ? Status::Unavailable("peer " + peer + " " + e.message())
                               : Status(e.code(), "from " + peer + ": " + e.message());
    }
    if (*n > 0) {
      got += *n;
      if (on_bytes) on_bytes();
      continue;
    }
    CKPT_RETURN_IF_ERROR(WaitFor(tls.fd(), want == TlsWant::kWrite ? POLLOUT : POLLIN, deadline,
                                 stop, "reading from " + peer));
  }
  return Status::OK();
}

Status NoStop() { return Status::OK(); }

}  // namespace ckpt::ipc::internal
