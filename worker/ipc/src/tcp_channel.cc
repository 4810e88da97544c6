// The TCP transport (ckpt/ipc/tcp_channel.h). Boost.Asio makes the
// connections (resolve, connect, listen, the listener's asynchronous
// handshakes); the channel itself then drives the non-blocking socket with
// poll(2) in slices, so that every blocking call honours its deadline, Close
// and the peer's death. Asio errors become a Status here.
#include "ckpt/ipc/tcp_channel.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ckpt/format/checksum.h"
#include "hmac.h"
#include "payload_checksum.h"
#include "tcp_frame.h"

namespace ckpt::ipc {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using std::chrono::milliseconds;
using wire::FrameHeader;

constexpr milliseconds kSlice{50};  // longest poll between checks of Close and liveness

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
  h.payload_xxh3 = internal::PayloadXxh3(payload, size);
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

std::string Endpoint(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
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

// Reads exactly `size` bytes. `on_bytes` is told of each read. Unavailable
// naming the peer on EOF or a broken connection; ResourceExhausted at the
// deadline (then the stream is mid-frame: callers treat it as fatal).
Status ReadExact(int fd, void* out, size_t size, Deadline deadline, const StopCheck& stop,
                 const std::string& peer, const std::function<void()>& on_bytes) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = recv(fd, p + got, size - got, 0);
    if (n > 0) {
      got += static_cast<size_t>(n);
      if (on_bytes) on_bytes();
      continue;
    }
    if (n == 0) return Status::Unavailable("peer " + peer + " closed the connection");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      return Status::Unavailable("connection to " + peer + " lost: " + std::strerror(errno));
    }
    if (Status s = stop(); !s.ok()) return s;
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status::ResourceExhausted("reading from " + peer + ": deadline reached");
    }
    pollfd pf{fd, POLLIN, 0};
    const auto wait = std::min<milliseconds>(
        kSlice, std::chrono::duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    (void)poll(&pf, 1, static_cast<int>(wait.count()));
  }
  return Status::OK();
}

Status NoStop() { return Status::OK(); }

// One whole handshake frame (sequence 0) of `type` and exactly `size` bytes.
Status ReadHandshakeFrame(int fd, uint16_t type, size_t size, Deadline deadline,
                          const std::string& peer, std::vector<uint8_t>* payload) {
  FrameHeader h;
  CKPT_RETURN_IF_ERROR(ReadExact(fd, &h, sizeof(h), deadline, NoStop, peer, nullptr));
  CKPT_RETURN_IF_ERROR(CheckHeader(h, peer));
  if (h.type != type || h.payload_bytes != size || h.sequence != 0 || h.flags != 0) {
    return Status::Corruption("handshake from " + peer + ": expected frame type " +
                              std::to_string(type) + " of " + std::to_string(size) +
                              " bytes, got type " + std::to_string(h.type) + " of " +
                              std::to_string(h.payload_bytes));
  }
  payload->resize(size);
  CKPT_RETURN_IF_ERROR(ReadExact(fd, payload->data(), size, deadline, NoStop, peer, nullptr));
  if (internal::PayloadXxh3(payload->data(), size) != h.payload_xxh3) {
    return Status::Corruption("handshake from " + peer + ": payload checksum mismatch");
  }
  return Status::OK();
}

Status WriteHandshakeFrame(int fd, uint16_t type, const std::vector<uint8_t>& payload,
                           Deadline deadline, const std::string& peer) {
  FrameHeader h = MakeHeader(type, 0, 0, payload.data(), payload.size(), payload.size(), type, 0);
  std::vector<iovec> iov = {{&h, sizeof(h)},
                            {const_cast<uint8_t*>(payload.data()), payload.size()}};
  size_t written = 0;
  return WriteAll(fd, std::move(iov), deadline, NoStop, peer, &written);
}

StatusOr<internal::Mac> ProofMac(const std::string& secret, const uint8_t* first,
                                 const uint8_t* second, const char* label) {
  std::vector<uint8_t> in(first, first + wire::kNonceBytes);
  in.insert(in.end(), second, second + wire::kNonceBytes);
  in.insert(in.end(), label, label + std::strlen(label));
  return internal::HmacSha256(secret, in.data(), in.size());
}

// ---------------------------------------------------------------------------

// A received message (or a rejected record) waiting for Receive.
struct Item {
  Status error;  // non-OK: a rejected record, reported once
  RecordType type = RecordType::kPadding;
  uint64_t sequence = 0;
  std::vector<uint8_t> payload;
};

class TcpChannelImpl final : public Channel {
 public:
  TcpChannelImpl(int fd, std::string peer, std::string name, const ChannelOptions& options)
      : fd_(fd), peer_(std::move(peer)), name_(std::move(name)), options_(options) {
    last_rx_ns_.store(NowNs());
    last_tx_ns_.store(NowNs());
    reader_ = std::thread([this] { ReadLoop(); });
    heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  }

  ~TcpChannelImpl() override {
    Close();
    if (reader_.joinable()) reader_.join();
    if (heartbeat_.joinable()) heartbeat_.join();
    ::close(fd_);
  }

  Status Send(RecordType type, const void* payload, size_t size, Deadline deadline) override {
    if (!IsMessageType(static_cast<uint16_t>(type))) {
      return Status::InvalidArgument(std::string("cannot send a record of type ") +
                                     RecordTypeName(type));
    }
    std::lock_guard<std::mutex> lock(send_mu_);
    reserved_ = false;  // a pending reservation is abandoned
    size_t progress = 0;
    return SendMessageLocked(type, static_cast<const uint8_t*>(payload), size, deadline, &progress);
  }

  StatusOr<Reservation> Reserve(RecordType type, size_t size, Deadline /*deadline*/) override {
    if (!IsMessageType(static_cast<uint16_t>(type))) {
      return Status::InvalidArgument(std::string("cannot reserve a record of type ") +
                                     RecordTypeName(type));
    }
    if (size > options_.max_message_bytes) {
      return Status::InvalidArgument("record of " + std::to_string(size) +
                                     " bytes exceeds max_message_bytes");
    }
    std::lock_guard<std::mutex> lock(send_mu_);
    CKPT_RETURN_IF_ERROR(Usable());
    stage_.resize(size);
    reserved_ = true;
    stage_type_ = type;
    stage_progress_ = 0;
    return Reservation{stage_.data(), size};
  }

  Status Commit(const Reservation& reservation, Deadline deadline) override {
    std::lock_guard<std::mutex> lock(send_mu_);
    if (!reserved_ || reservation.data != stage_.data() || reservation.size != stage_.size()) {
      return Status::InvalidArgument("Commit of a reservation that is not the pending one");
    }
    Status s =
        SendMessageLocked(stage_type_, stage_.data(), stage_.size(), deadline, &stage_progress_);
    if (!s.IsResourceExhausted()) reserved_ = false;
    return s;
  }

  void Abandon() override {
    std::lock_guard<std::mutex> lock(send_mu_);
    reserved_ = false;
  }

  StatusOr<Received> Receive(Deadline deadline) override {
    Release();
    std::unique_lock<std::mutex> lock(rx_mu_);
    while (true) {
      if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
      if (!queue_.empty()) {
        current_ = std::move(queue_.front());
        queue_.pop_front();
        if (!current_->error.ok()) {
          Status e = current_->error;
          current_.reset();
          return e;
        }
        Received r;
        r.type = current_->type;
        r.sequence = current_->sequence;
        r.payload = current_->payload.data();
        r.size = current_->payload.size();
        return r;
      }
      // The first reason a peer was declared dead wins (a heartbeat timeout
      // shuts the socket down, which the reader then sees as a close).
      if (dead_.load()) return DeadStatus();
      if (!reader_end_.ok()) return reader_end_;
      if (Clock::now() >= deadline) {
        return Status::ResourceExhausted("nothing received from " + peer_ + " by the deadline");
      }
      rx_cv_.wait_until(lock, std::min(deadline, Clock::now() + kSlice));
    }
  }

  void Release() override {
    std::lock_guard<std::mutex> lock(rx_mu_);
    if (current_) {
      queued_bytes_ -= current_->payload.size();
      current_.reset();
      rx_cv_.notify_all();
    }
  }

  bool PeerAlive() const override { return !dead_.load() && !closed_.load(); }

  void Close() override {
    if (closed_.exchange(true)) return;
    ::shutdown(fd_, SHUT_RDWR);
    { std::lock_guard<std::mutex> lock(rx_mu_); }
    rx_cv_.notify_all();
    { std::lock_guard<std::mutex> lock(hb_mu_); }
    hb_cv_.notify_all();
  }

  ChannelStats Stats() const override {
    ChannelStats s;
    s.records_sent = records_sent_.load();
    s.records_received = records_received_.load();
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    s.bad_records = bad_records_.load();
    s.dropped_messages = dropped_messages_.load();
    int outq = 0;
    if (ioctl(fd_, SIOCOUTQ, &outq) == 0 && outq > 0) s.send_ring_used = static_cast<size_t>(outq);
    s.ring_bytes = options_.ring_bytes;
    return s;
  }

  const std::string& name() const override { return name_; }

 private:
  Status DeadStatus() const {
    std::lock_guard<std::mutex> lock(dead_mu_);
    return Status::Unavailable(dead_reason_);
  }

  Status Usable() const {
    if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
    if (dead_.load()) return DeadStatus();
    return Status::OK();
  }

  void MarkDead(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(dead_mu_);
      if (dead_.load()) return;
      dead_reason_ = reason;
      dead_.store(true);
    }
    ::shutdown(fd_, SHUT_RDWR);
    { std::lock_guard<std::mutex> lock(rx_mu_); }
    rx_cv_.notify_all();
  }

  // Writes frames; REQUIRES: send_mu_ held. See the header for the partial-
  // frame rule. The unsent rest of a frame goes to tail_.
  Status WriteFrameLocked(const FrameHeader& h, const uint8_t* payload, Deadline deadline,
                          bool* started) {
    *started = false;
    CKPT_RETURN_IF_ERROR(FlushTailLocked(deadline));
    std::vector<iovec> iov = {{const_cast<FrameHeader*>(&h), sizeof(h)},
                              {const_cast<uint8_t*>(payload), h.payload_bytes}};
    size_t written = 0;
    Status s = WriteAll(
        fd_, iov, deadline, [this] { return Usable(); }, peer_, &written);
    if (written > 0) {
      *started = true;
      last_tx_ns_.store(NowNs());
    }
    const size_t total = sizeof(h) + h.payload_bytes;
    if (s.IsResourceExhausted() && written > 0 && written < total) {
      // The frame is on the wire in part: keep the rest to send before
      // anything else, so the stream stays framed.
      tail_.clear();
      const auto* hb = reinterpret_cast<const uint8_t*>(&h);
      if (written < sizeof(h)) tail_.insert(tail_.end(), hb + written, hb + sizeof(h));
      const size_t pay_from = written > sizeof(h) ? written - sizeof(h) : 0;
      tail_.insert(tail_.end(), payload + pay_from, payload + h.payload_bytes);
      tail_sent_ = 0;
      return s;
    }
    if (s.IsUnavailable()) MarkDead(s.message());
    return s;
  }

  Status FlushTailLocked(Deadline deadline) {
    if (tail_sent_ >= tail_.size()) return Status::OK();
    std::vector<iovec> iov = {{tail_.data() + tail_sent_, tail_.size() - tail_sent_}};
    size_t written = 0;
    Status s = WriteAll(
        fd_, iov, deadline, [this] { return Usable(); }, peer_, &written);
    tail_sent_ += written;
    if (written > 0) last_tx_ns_.store(NowNs());
    if (s.ok()) {
      tail_.clear();
      tail_sent_ = 0;
    }
    if (s.IsUnavailable()) MarkDead(s.message());
    return s;
  }

  // Sends one message from `*progress` (payload bytes already sent); on
  // ResourceExhausted `*progress` says where to resume.
  Status SendMessageLocked(RecordType type, const uint8_t* data, size_t size, Deadline deadline,
                           size_t* progress) {
    CKPT_RETURN_IF_ERROR(Usable());
    if (size > options_.max_message_bytes) {
      return Status::InvalidArgument("record of " + std::to_string(size) +
                                     " bytes exceeds max_message_bytes");
    }
    const auto t = static_cast<uint16_t>(type);
    if (size <= kTcpMaxFramePayload) {
      FrameHeader h = MakeHeader(t, 0, ++send_seq_, data, size, size, t, 0);
      bool started = false;
      Status s = WriteFrameLocked(h, data, deadline, &started);
      if (!started && !s.ok()) {
        --send_seq_;
        return s;
      }
      // Started: the rest is in tail_ and the message will arrive whole.
      if (s.ok() || s.IsResourceExhausted()) {
        ++records_sent_;
        bytes_sent_ += size;
        return Status::OK();
      }
      return s;
    }
    while (*progress < size) {
      const size_t off = *progress;
      const size_t len = std::min(kTcpMaxFramePayload, size - off);
      uint16_t flags = 0;
      if (off == 0) flags |= wire::kFlagFirst;
      if (off + len == size) flags |= wire::kFlagLast;
      FrameHeader h = MakeHeader(static_cast<uint16_t>(RecordType::kFragment), flags, ++send_seq_,
                                 data + off, len, size, t, off);
      bool started = false;
      Status s = WriteFrameLocked(h, data + off, deadline, &started);
      if (started) *progress = off + len;
      if (!started) --send_seq_;
      if (!s.ok()) return s;
    }
    ++records_sent_;
    bytes_sent_ += size;
    return Status::OK();
  }

  void HeartbeatLoop() {
    const auto interval = std::max(options_.heartbeat_interval, milliseconds(1));
    const auto tick = std::min<milliseconds>(interval, kSlice);
    std::unique_lock<std::mutex> hb_lock(hb_mu_);
    while (!closed_.load()) {
      hb_cv_.wait_for(hb_lock, tick);
      if (closed_.load() || dead_.load()) break;
      const int64_t now = NowNs();
      if (now - last_tx_ns_.load() >= std::chrono::nanoseconds(interval).count()) {
        std::unique_lock<std::mutex> lock(send_mu_, std::try_to_lock);
        if (lock.owns_lock()) {
          const Deadline now_deadline = Clock::now();
          if (FlushTailLocked(now_deadline).ok()) {
            FrameHeader h = MakeHeader(wire::kTypeHeartbeat, 0, ++send_seq_, nullptr, 0, 0,
                                       wire::kTypeHeartbeat, 0);
            bool started = false;
            (void)WriteFrameLocked(h, nullptr, now_deadline, &started);
            if (!started) --send_seq_;
          }
        }
      }
      const auto silent = std::chrono::nanoseconds(NowNs() - last_rx_ns_.load());
      if (!reader_paused_.load() && silent > options_.heartbeat_timeout) {
        MarkDead("peer " + peer_ + " sent nothing for " +
                 std::to_string(std::chrono::duration_cast<milliseconds>(silent).count()) +
                 " ms (heartbeat timeout " + std::to_string(options_.heartbeat_timeout.count()) +
                 " ms)");
        break;
      }
    }
  }

  void PushItem(Item item) {
    std::lock_guard<std::mutex> lock(rx_mu_);
    queued_bytes_ += item.payload.size();
    queue_.push_back(std::move(item));
    rx_cv_.notify_all();
  }

  void EndReader(Status s) {
    if (s.IsUnavailable()) MarkDead(s.message());
    std::lock_guard<std::mutex> lock(rx_mu_);
    reader_end_ = s.IsUnavailable() || s.IsCorruption() ? s : Status::Aborted(s.message());
    rx_cv_.notify_all();
  }

  void ReadLoop() {
    const Deadline never = Clock::time_point::max();
    const StopCheck stop = [this] {
      if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
      if (dead_.load()) return DeadStatus();
      return Status::OK();
    };
    const auto on_bytes = [this] { last_rx_ns_.store(NowNs()); };
    uint64_t expect_seq = 1;
    // The fragmented message being assembled.
    std::optional<Item> partial;
    uint64_t partial_total = 0;
    while (true) {
      {
        std::unique_lock<std::mutex> lock(rx_mu_);
        while (queued_bytes_ >= options_.ring_bytes && !closed_.load() && !dead_.load()) {
          reader_paused_.store(true);
          rx_cv_.wait_for(lock, kSlice);
        }
        if (reader_paused_.exchange(false)) last_rx_ns_.store(NowNs());
      }
      FrameHeader h;
      Status s = ReadExact(fd_, &h, sizeof(h), never, stop, peer_, on_bytes);
      if (!s.ok()) return EndReader(s);
      s = CheckHeader(h, peer_);
      const bool fragment = h.type == static_cast<uint16_t>(RecordType::kFragment);
      if (s.ok() && h.sequence != expect_seq) {
        s = Status::Corruption("frame from " + peer_ + ": sequence " + std::to_string(h.sequence) +
                               ", expected " + std::to_string(expect_seq));
      }
      if (s.ok() && h.type == wire::kTypeHeartbeat) {
        if (h.payload_bytes != 0 || h.flags != 0) {
          s = Status::Corruption("frame from " + peer_ + ": heartbeat with a payload or flags");
        }
      } else if (s.ok() && !fragment && !IsMessageType(h.type)) {
        s = Status::Corruption("frame from " + peer_ + ": unknown type " + std::to_string(h.type));
      } else if (s.ok() && !fragment &&
                 (h.flags != 0 || h.message_bytes != h.payload_bytes || h.message_type != h.type ||
                  h.fragment_offset != 0)) {
        s = Status::Corruption("frame from " + peer_ + ": inconsistent record header");
      } else if (s.ok() && fragment &&
                 ((h.flags & ~wire::kKnownFlags) != 0 || !IsMessageType(h.message_type) ||
                  h.message_bytes > options_.max_message_bytes ||
                  h.fragment_offset > h.message_bytes ||
                  h.payload_bytes > h.message_bytes - h.fragment_offset ||
                  ((h.flags & wire::kFlagLast) != 0) !=
                      (h.fragment_offset + h.payload_bytes == h.message_bytes) ||
                  ((h.flags & wire::kFlagFirst) != 0) != (h.fragment_offset == 0))) {
        s = Status::Corruption("frame from " + peer_ + ": bad fragment header (offset " +
                               std::to_string(h.fragment_offset) + " of " +
                               std::to_string(h.message_bytes) + ")");
      }
      if (!s.ok()) {
        ++bad_records_;
        return EndReader(Status::Corruption(s.message() + "; the stream is unusable from here"));
      }
      ++expect_seq;
      if (h.type == wire::kTypeHeartbeat) continue;
      // A new message while a fragmented one is incomplete: its sender gave up.
      if (partial && (!fragment || (h.flags & wire::kFlagFirst) != 0)) {
        partial.reset();
        ++dropped_messages_;
      }
      std::vector<uint8_t> single;
      uint8_t* dst = nullptr;
      bool skip = false;
      if (!fragment) {
        single.resize(h.payload_bytes);
        dst = single.data();
      } else if ((h.flags & wire::kFlagFirst) != 0) {
        partial.emplace();
        partial->type = static_cast<RecordType>(h.message_type);
        partial->sequence = h.sequence;
        partial_total = h.message_bytes;
        partial->payload.reserve(std::min<uint64_t>(h.message_bytes, uint64_t{64} << 20));
      } else if (!partial || partial_total != h.message_bytes ||
                 static_cast<uint16_t>(partial->type) != h.message_type ||
                 partial->payload.size() != h.fragment_offset) {
        // The rest of a message already dropped (bad payload before), or
        // one that does not continue the current one: skip it.
        if (partial) {
          partial.reset();
          ++dropped_messages_;
        }
        skip = true;
      }
      if (fragment && !skip) {
        const size_t at = partial->payload.size();
        partial->payload.resize(at + h.payload_bytes);
        dst = partial->payload.data() + at;
      }
      std::vector<uint8_t> discard;
      if (skip) {
        discard.resize(h.payload_bytes);
        dst = discard.data();
      }
      s = ReadExact(fd_, dst, h.payload_bytes, never, stop, peer_, on_bytes);
      if (!s.ok()) return EndReader(s);
      if (skip) continue;
      if (internal::PayloadXxh3(dst, h.payload_bytes) != h.payload_xxh3) {
        ++bad_records_;
        if (fragment) partial.reset();
        Item bad;
        bad.error = Status::Corruption("record " + std::to_string(h.sequence) + " from " + peer_ +
                                       ": payload checksum mismatch (skipped)");
        PushItem(std::move(bad));
        continue;
      }
      if (!fragment) {
        Item item;
        item.type = static_cast<RecordType>(h.type);
        item.sequence = h.sequence;
        item.payload = std::move(single);
        ++records_received_;
        bytes_received_ += item.payload.size();
        PushItem(std::move(item));
      } else if ((h.flags & wire::kFlagLast) != 0) {
        ++records_received_;
        bytes_received_ += partial->payload.size();
        PushItem(std::move(*partial));
        partial.reset();
      }
    }
  }

  const int fd_;
  const std::string peer_;
  const std::string name_;
  const ChannelOptions options_;

  std::atomic<bool> closed_{false};
  std::atomic<bool> dead_{false};
  mutable std::mutex dead_mu_;
  std::string dead_reason_;  // GUARDED_BY(dead_mu_)

  // Send side.
  std::mutex send_mu_;
  uint64_t send_seq_ = 0;       // GUARDED_BY(send_mu_)
  std::vector<uint8_t> tail_;   // GUARDED_BY(send_mu_): unsent rest of a started frame
  size_t tail_sent_ = 0;        // GUARDED_BY(send_mu_)
  std::vector<uint8_t> stage_;  // GUARDED_BY(send_mu_): the pending reservation
  bool reserved_ = false;       // GUARDED_BY(send_mu_)
  RecordType stage_type_ = RecordType::kPadding;  // GUARDED_BY(send_mu_)
  size_t stage_progress_ = 0;                     // GUARDED_BY(send_mu_)
  std::atomic<int64_t> last_tx_ns_{0};

  // Receive side.
  std::mutex rx_mu_;
  std::condition_variable rx_cv_;
  std::deque<Item> queue_;       // GUARDED_BY(rx_mu_)
  std::optional<Item> current_;  // GUARDED_BY(rx_mu_): the last received, until Release
  size_t queued_bytes_ = 0;      // GUARDED_BY(rx_mu_): queue_ and current_
  Status reader_end_;            // GUARDED_BY(rx_mu_): why the reader stopped
  std::atomic<int64_t> last_rx_ns_{0};
  std::atomic<bool> reader_paused_{false};

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;

  std::atomic<uint64_t> records_sent_{0}, records_received_{0}, bytes_sent_{0}, bytes_received_{0},
      bad_records_{0}, dropped_messages_{0};

  std::thread reader_;
  std::thread heartbeat_;
};

// ---------------------------------------------------------------------------

Status AsioStatus(const std::string& what, const boost::system::error_code& ec) {
  return Status::Unavailable(what + ": " + ec.message());
}

class TcpListenerImpl final : public TcpListener {
 public:
  TcpListenerImpl(std::string secret, TcpOptions options)
      : secret_(std::move(secret)), options_(std::move(options)), acceptor_(io_) {}

  ~TcpListenerImpl() override {
    Close();
    for (auto& a : ready_) ::close(a.fd);
  }

  Status Bind(const std::string& host_port) {
    CKPT_ASSIGN_OR_RETURN(auto hp, ParseHostPort(host_port));
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(hp.first, std::to_string(hp.second),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) return AsioStatus("resolving " + host_port, ec);
    const tcp::endpoint ep = results.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return AsioStatus("listening on " + host_port, ec);
    const tcp::endpoint bound = acceptor_.local_endpoint(ec);
    if (ec) return AsioStatus("listening on " + host_port, ec);
    port_ = bound.port();
    address_ = Endpoint(bound);
    AcceptNext();
    thread_ = std::thread([this] { io_.run(); });
    return Status::OK();
  }

  StatusOr<Accepted> Accept(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] { return closed_ || !ready_.empty(); });
    if (closed_) return Status::Aborted("listener on " + address_ + " closed");
    if (ready_.empty()) return Status::ResourceExhausted("no worker connected by the deadline");
    Pending p = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    Accepted a;
    a.peer = p.peer;
    a.channel = std::make_unique<TcpChannelImpl>(p.fd, "worker at " + p.peer, "tcp:" + p.peer,
                                                 options_.channel);
    return a;
  }

  uint16_t port() const override { return port_; }
  std::string address() const override { return address_; }
  TcpListenerStats Stats() const override { return {accepted_.load(), refused_.load()}; }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Pending {
    int fd = -1;
    std::string peer;
  };

  // One connection being authenticated; lives in its handlers.
  struct Session {
    explicit Session(asio::io_context& io) : socket(io), timer(io) {}
    tcp::socket socket;
    asio::steady_timer timer;
    std::string peer;
    std::vector<uint8_t> out;
    FrameHeader out_header{};
    FrameHeader in_header{};
    std::vector<uint8_t> in;
    uint8_t nonce[wire::kNonceBytes];
    bool done = false;
  };
  using SessionPtr = std::shared_ptr<Session>;

  void AcceptNext() {
    auto s = std::make_shared<Session>(io_);
    acceptor_.async_accept(s->socket, [this, s](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) Begin(s);
      AcceptNext();
    });
  }

  void Refuse(const SessionPtr& s, const Status& why) {
    if (s->done) return;
    s->done = true;
    ++refused_;
    --pending_;
    if (options_.on_refused) options_.on_refused(s->peer, why);
    boost::system::error_code ec;
    s->timer.cancel(ec);
    s->socket.close(ec);
  }

  void Begin(const SessionPtr& s) {
    boost::system::error_code ec;
    const tcp::endpoint remote = s->socket.remote_endpoint(ec);
    s->peer = ec ? std::string("unknown peer") : Endpoint(remote);
    ++pending_;
    if (pending_ > options_.max_pending_handshakes) {
      Refuse(s, Status::ResourceExhausted("too many handshakes in progress (" +
                                          std::to_string(options_.max_pending_handshakes) + ")"));
      return;
    }
    s->timer.expires_after(options_.handshake_timeout);
    s->timer.async_wait([this, s](const boost::system::error_code& e) {
      if (e) return;
      Refuse(s,
             Status::ResourceExhausted("handshake not done within " +
                                       std::to_string(options_.handshake_timeout.count()) + " ms"));
    });
    Status r = internal::RandomBytes(s->nonce, sizeof(s->nonce));
    if (!r.ok()) return Refuse(s, r);
    s->out.assign(wire::kChallengeBytes, 0);
    const uint32_t version = wire::kProtocolVersion;
    std::memcpy(s->out.data(), &version, 4);
    std::memcpy(s->out.data() + 8, s->nonce, wire::kNonceBytes);
    s->out_header = MakeHeader(wire::kTypeChallenge, 0, 0, s->out.data(), s->out.size(),
                               s->out.size(), wire::kTypeChallenge, 0);
    std::vector<asio::const_buffer> bufs = {asio::buffer(&s->out_header, sizeof(FrameHeader)),
                                            asio::buffer(s->out)};
    asio::async_write(s->socket, bufs, [this, s](const boost::system::error_code& e, size_t) {
      if (s->done) return;
      if (e) return Refuse(s, AsioStatus("sending the challenge", e));
      asio::async_read(s->socket, asio::buffer(&s->in_header, sizeof(FrameHeader)),
                       [this, s](const boost::system::error_code& e2, size_t) {
                         if (s->done) return;
                         if (e2) return Refuse(s, AsioStatus("reading the proof", e2));
                         OnProofHeader(s);
                       });
    });
  }

  void OnProofHeader(const SessionPtr& s) {
    const FrameHeader& h = s->in_header;
    Status c = CheckHeader(h, s->peer);
    if (c.ok() && (h.type != wire::kTypeProof || h.payload_bytes != wire::kProofBytes ||
                   h.sequence != 0 || h.flags != 0)) {
      c = Status::Corruption("first frame is not a proof (type " + std::to_string(h.type) + ", " +
                             std::to_string(h.payload_bytes) + " bytes)");
    }
    if (!c.ok()) return Refuse(s, c);
    s->in.resize(wire::kProofBytes);
    asio::async_read(s->socket, asio::buffer(s->in),
                     [this, s](const boost::system::error_code& e, size_t) {
                       if (s->done) return;
                       if (e) return Refuse(s, AsioStatus("reading the proof", e));
                       OnProof(s);
                     });
  }

  void OnProof(const SessionPtr& s) {
    if (internal::PayloadXxh3(s->in.data(), s->in.size()) != s->in_header.payload_xxh3) {
      return Refuse(s, Status::Corruption("proof payload checksum mismatch"));
    }
    const uint8_t* worker_nonce = s->in.data();
    internal::Mac got;
    std::memcpy(got.data(), s->in.data() + wire::kNonceBytes, internal::kMacBytes);
    auto want = ProofMac(secret_, s->nonce, worker_nonce, wire::kWorkerLabel);
    if (!want.ok()) return Refuse(s, want.status());
    if (!internal::MacEqual(got, *want)) {
      return Refuse(s, Status::FailedPrecondition("wrong proof (the worker's secret differs)"));
    }
    auto mine = ProofMac(secret_, worker_nonce, s->nonce, wire::kSchedulerLabel);
    if (!mine.ok()) return Refuse(s, mine.status());
    s->out.assign(mine->begin(), mine->end());
    s->out_header = MakeHeader(wire::kTypeAccept, 0, 0, s->out.data(), s->out.size(), s->out.size(),
                               wire::kTypeAccept, 0);
    std::vector<asio::const_buffer> bufs = {asio::buffer(&s->out_header, sizeof(FrameHeader)),
                                            asio::buffer(s->out)};
    asio::async_write(s->socket, bufs, [this, s](const boost::system::error_code& e, size_t) {
      if (s->done) return;
      if (e) return Refuse(s, AsioStatus("sending the acceptance", e));
      s->done = true;
      --pending_;
      boost::system::error_code ec;
      s->timer.cancel(ec);
      Pending p;
      p.peer = s->peer;
      p.fd = s->socket.release(ec);
      if (ec) {
        ++refused_;
        if (options_.on_refused) options_.on_refused(s->peer, AsioStatus("releasing socket", ec));
        return;
      }
      SetSocketOptions(p.fd);
      ++accepted_;
      if (options_.on_accepted) {
        Accepted a;
        a.peer = p.peer;
        a.channel = std::make_unique<TcpChannelImpl>(p.fd, "worker at " + p.peer, "tcp:" + p.peer,
                                                     options_.channel);
        options_.on_accepted(std::move(a));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) {
          ::close(p.fd);
          return;
        }
        ready_.push_back(std::move(p));
      }
      cv_.notify_all();
    });
  }

  const std::string secret_;
  const TcpOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;  // listener thread (io_) only, after Bind
  int pending_ = 0;         // listener thread only
  uint16_t port_ = 0;
  std::string address_;
  std::thread thread_;
  std::atomic<uint64_t> accepted_{0}, refused_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> ready_;  // GUARDED_BY(mu_)
  bool closed_ = false;        // GUARDED_BY(mu_)
};

}  // namespace

StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("address '" + host_port + "': " + why +
                                   " (expected HOST:PORT, IPv6 as [ADDR]:PORT)");
  };
  std::string host;
  std::string port;
  if (!host_port.empty() && host_port[0] == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return bad("unterminated [IPv6] address");
    }
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("IPv6 addresses go in brackets");
  }
  if (host.empty()) return bad("no host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad("port is not a number");
  }
  const int p = std::stoi(port);
  if (p > 65535) return bad("port above 65535");
  return std::make_pair(host, static_cast<uint16_t>(p));
}

StatusOr<std::string> LoadSecretFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::NotFound("secret file " + path + " does not exist");
    return Status::IOError("secret file " + path + ": " + std::strerror(e));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Status::IOError("secret file " + path + ": " + std::strerror(e));
  }
  char mode[8];
  std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " is not a regular file");
  }
  if ((st.st_mode & 077) != 0) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " has mode " + mode +
                                      ": group or others may read or write it (chmod 600 it)");
  }
  if (st.st_uid != geteuid()) {
    ::close(fd);
    return Status::FailedPrecondition("secret file " + path + " (mode " + mode +
                                      ") is owned by uid " + std::to_string(st.st_uid) +
                                      ", not by this user (uid " + std::to_string(geteuid()) + ")");
  }
  std::string secret;
  char buf[4096];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      ::close(fd);
      return Status::IOError("secret file " + path + ": " + std::strerror(e));
    }
    if (n == 0) break;
    secret.append(buf, static_cast<size_t>(n));
    if (secret.size() > (1u << 20)) {
      ::close(fd);
      return Status::FailedPrecondition("secret file " + path + " is larger than 1 MiB");
    }
  }
  ::close(fd);
  while (!secret.empty() && std::isspace(static_cast<unsigned char>(secret.back()))) {
    secret.pop_back();
  }
  if (secret.size() < kMinSecretBytes) {
    return Status::FailedPrecondition("secret file " + path + " (mode " + mode + ") holds " +
                                      std::to_string(secret.size()) + " bytes, fewer than " +
                                      std::to_string(kMinSecretBytes));
  }
  return secret;
}

Status CreateSecretFile(const std::string& path) {
  uint8_t raw[32];
  CKPT_RETURN_IF_ERROR(internal::RandomBytes(raw, sizeof(raw)));
  std::string text;
  static const char kHex[] = "0123456789abcdef";
  for (uint8_t b : raw) {
    text.push_back(kHex[b >> 4]);
    text.push_back(kHex[b & 15]);
  }
  text.push_back('\n');
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    const int e = errno;
    if (e == EEXIST) return Status::AlreadyExists("secret file " + path + " already exists");
    return Status::IOError("creating secret file " + path + ": " + std::strerror(e));
  }
  // The umask cannot widen 0600, but an fchmod makes it exact.
  (void)fchmod(fd, 0600);
  size_t off = 0;
  while (off < text.size()) {
    const ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      ::close(fd);
      ::unlink(path.c_str());
      return Status::IOError("writing secret file " + path + ": " + std::strerror(e));
    }
    off += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    return Status::IOError("writing secret file " + path + ": " + std::strerror(errno));
  }
  return Status::OK();
}

StatusOr<std::unique_ptr<Channel>> TcpChannel::Connect(const std::string& host_port,
                                                       const std::string& secret,
                                                       const TcpOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto hp, ParseHostPort(host_port));
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
  const Deadline deadline = Clock::now() + options.handshake_timeout;
  asio::io_context io;
  tcp::socket socket(io);
  boost::system::error_code result = asio::error::timed_out;
  bool finished = false;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints =
      resolver.resolve(hp.first, std::to_string(hp.second), tcp::resolver::numeric_service, ec);
  if (ec) return AsioStatus("resolving " + host_port, ec);
  asio::async_connect(socket, endpoints,
                      [&](const boost::system::error_code& e, const tcp::endpoint&) {
                        result = e;
                        finished = true;
                      });
  io.run_until(deadline);
  if (!finished) {
    socket.close(ec);
    return Status::Unavailable("connecting to " + host_port + ": timed out");
  }
  if (result) return AsioStatus("connecting to " + host_port, result);
  const int fd = socket.release(ec);
  if (ec) return AsioStatus("connecting to " + host_port, ec);
  SetSocketOptions(fd);
  const std::string peer = "scheduler at " + host_port;
  auto fail = [&](Status s) {
    ::close(fd);
    return s;
  };
  std::vector<uint8_t> challenge;
  Status s = ReadHandshakeFrame(fd, wire::kTypeChallenge, wire::kChallengeBytes, deadline, peer,
                                &challenge);
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  uint32_t version = 0;
  std::memcpy(&version, challenge.data(), 4);
  if (version != wire::kProtocolVersion) {
    return fail(Status::FailedPrecondition(peer + " speaks protocol version " +
                                           std::to_string(version) + ", this worker " +
                                           std::to_string(wire::kProtocolVersion)));
  }
  const uint8_t* server_nonce = challenge.data() + 8;
  std::vector<uint8_t> proof(wire::kProofBytes);
  s = internal::RandomBytes(proof.data(), wire::kNonceBytes);
  if (!s.ok()) return fail(s);
  auto mac = ProofMac(secret, server_nonce, proof.data(), wire::kWorkerLabel);
  if (!mac.ok()) return fail(mac.status());
  std::memcpy(proof.data() + wire::kNonceBytes, mac->data(), internal::kMacBytes);
  s = WriteHandshakeFrame(fd, wire::kTypeProof, proof, deadline, peer);
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  std::vector<uint8_t> accept;
  s = ReadHandshakeFrame(fd, wire::kTypeAccept, wire::kAcceptBytes, deadline, peer, &accept);
  if (s.IsUnavailable()) {
    return fail(Status::FailedPrecondition(
        peer +
        " refused this worker's proof (is the secret file the scheduler's?): " + s.message()));
  }
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  auto want = ProofMac(secret, proof.data(), server_nonce, wire::kSchedulerLabel);
  if (!want.ok()) return fail(want.status());
  internal::Mac got;
  std::memcpy(got.data(), accept.data(), internal::kMacBytes);
  if (!internal::MacEqual(got, *want)) {
    return fail(Status::FailedPrecondition(
        peer +
        " did not prove it holds the secret (a different scheduler, or a different "
        "secret file)"));
  }
  return std::unique_ptr<Channel>(
      new TcpChannelImpl(fd, peer, "tcp:" + host_port, options.channel));
}

StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host_port,
                                                           const std::string& secret,
                                                           const TcpOptions& options) {
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
  auto l = std::make_unique<TcpListenerImpl>(secret, options);
  CKPT_RETURN_IF_ERROR(l->Bind(host_port));
  return std::unique_ptr<TcpListener>(std::move(l));
}

}  // namespace ckpt::ipc
