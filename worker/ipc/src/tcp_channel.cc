// The TCP channel (ckpt/ipc/tcp_channel.h) over a connected socket whose TLS
// handshake is done (tls.h): frames are sealed by TLS and sent, and read back
// through it; it drives the non-blocking socket with poll(2) in slices (tcp_io.h),
// so that every blocking call honours its deadline, Close and the peer's
// death; a reader thread validates frames into a bounded queue and a
// heartbeat thread keeps the link alive and watches the peer.
#include "ckpt/ipc/tcp_channel.h"

#include <linux/sockios.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "payload_checksum.h"
#include "tcp_frame.h"
#include "tcp_frame_reader.h"
#include "tcp_io.h"
#include "tls.h"

namespace ckpt::ipc::internal {
namespace {

using std::chrono::milliseconds;
using wire::FrameHeader;

// A received message (or a rejected record) waiting for Receive.
using Item = ReceivedItem;

// Plaintext bytes of a frame sealed and sent at a time (see WriteFrameLocked).
constexpr size_t kSealChunk = size_t{64} << 10;

class TcpChannelImpl final : public Channel, private ReceiveClaims {
 public:
  TcpChannelImpl(int fd, std::unique_ptr<TlsSession> tls, std::string peer, std::string name,
                 const TcpOptions& options)
      : fd_(fd),
        tls_(std::move(tls)),
        peer_(std::move(peer)),
        name_(std::move(name)),
        options_(options.channel),
        budget_(options.budget),
        limit_(options.receive_limit) {
    last_rx_ns_.store(NowNs());
    last_tx_ns_.store(NowNs());
    reader_ = std::thread([this] { Guarded("reader", [this] { ReadLoop(); }); });
    heartbeat_ = std::thread([this] { Guarded("heartbeat", [this] { HeartbeatLoop(); }); });
  }

  ~TcpChannelImpl() override {
    Close();
    if (reader_.joinable()) reader_.join();
    if (heartbeat_.joinable()) heartbeat_.join();
    // What the queue still holds goes back to the budget (the reader's
    // assembler gave back its own as the reader ended).
    Unclaim(held_.load());
    tls_.reset();
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

  // The parts are gathered into the staging buffer: a frame is sealed from
  // contiguous bytes, and the copy is small next to the encryption.
  Status SendParts(RecordType type, const PayloadPart* parts, size_t count, Deadline deadline,
                   uint64_t* sent) override {
    if (!IsMessageType(static_cast<uint16_t>(type))) {
      return Status::InvalidArgument(std::string("cannot send a record of type ") +
                                     RecordTypeName(type));
    }
    CKPT_ASSIGN_OR_RETURN(const uint64_t total, PayloadPartsSize(parts, count));
    const size_t size = total;
    if (*sent > size) {
      return Status::InvalidArgument("resuming at byte " + std::to_string(*sent) + " of a " +
                                     std::to_string(size) + "-byte payload");
    }
    std::lock_guard<std::mutex> lock(send_mu_);
    reserved_ = false;  // a pending reservation is abandoned
    stage_.resize(size);
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
      if (parts[i].size != 0) std::memcpy(stage_.data() + at, parts[i].data, parts[i].size);
      at += parts[i].size;
    }
    size_t progress = *sent;
    Status s = SendMessageLocked(type, stage_.data(), size, deadline, &progress);
    *sent = s.ok() ? size : progress;
    return s;
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
          ReleaseCurrentLocked();
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
    ReleaseCurrentLocked();
  }

  void SetReceiveLimit(const ReceiveLimit& limit) override {
    std::lock_guard<std::mutex> lock(limit_mu_);
    limit_ = limit;
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
    s.send_window_bytes = options_.ring_bytes;
    return s;
  }

  const std::string& name() const override { return name_; }

 private:
  // REQUIRES: rx_mu_ held.
  void ReleaseCurrentLocked() {
    if (!current_) return;
    queued_bytes_ -= current_->charge;
    Unclaim(current_->charge);
    current_.reset();
    rx_cv_.notify_all();
  }

  // ReceiveClaims, on the reader thread: the peer's limit for this message,
  // then its share of the budget, waited for (with the reader stopped, so
  // that neither side's heartbeat judges the wait) for up to
  // heartbeat_timeout.
  Status Claim(RecordType type, uint64_t message_bytes, uint64_t charge) override {
    {
      std::lock_guard<std::mutex> lock(limit_mu_);
      if (limit_) CKPT_RETURN_IF_ERROR(limit_(type, message_bytes));
    }
    if (budget_) {
      reader_paused_.store(true);
      Status s = budget_->Acquire(charge, DeadlineIn(options_.heartbeat_timeout), [this] {
        if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
        if (dead_.load()) return DeadStatus();
        return Status::OK();
      });
      reader_paused_.store(false);
      last_rx_ns_.store(NowNs());
      if (!s.ok()) {
        return Status(s.code(), std::string("a ") + RecordTypeName(type) + " of " +
                                    std::to_string(message_bytes) + " bytes: " + s.message());
      }
    }
    held_ += charge;
    return Status::OK();
  }

  void Unclaim(uint64_t charge) override {
    if (charge == 0) return;
    held_ -= charge;
    if (budget_) budget_->Release(charge);
  }

  Status DeadStatus() const {
    std::lock_guard<std::mutex> lock(dead_mu_);
    return Status::Unavailable(dead_reason_);
  }

  Status Usable() const {
    if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
    if (dead_.load()) return DeadStatus();
    return Status::OK();
  }

  // A thread's root: whatever it throws (bad_alloc, a bug) ends this
  // connection alone, as a dead peer whose reason says so; never the process.
  template <typename F>
  void Guarded(const char* what, F&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      Fault(what, e.what());
    } catch (...) {
      Fault(what, "unknown exception");
    }
  }

  void Fault(const char* what, const char* why) {
    const std::string reason =
        "connection to " + peer_ + " closed: its " + what + " thread failed (" + why + ")";
    MarkDead(reason);
    std::lock_guard<std::mutex> lock(rx_mu_);
    if (reader_end_.ok()) reader_end_ = Status::Unavailable(reason);
    rx_cv_.notify_all();
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
  // frame rule. A frame is sealed (encrypted into tail_, its TLS record
  // sequence spent) only once the socket takes bytes, and from then on it is
  // started: what the deadline leaves unsent stays in tail_ and goes out
  // before anything else, so the stream stays whole. A large frame is sealed
  // and sent kSealChunk bytes at a time, so that the kernel carries one chunk
  // to the peer (which decrypts it) while the next one is encrypted; once
  // started, a deadline seals all that is left into tail_ at once.
  Status WriteFrameLocked(const FrameHeader& h, const uint8_t* payload, Deadline deadline,
                          bool* started) {
    *started = false;
    CKPT_RETURN_IF_ERROR(FlushTailLocked(deadline));
    Status s = WaitFor(
        fd_, POLLOUT, deadline, [this] { return Usable(); }, "sending to " + peer_);
    if (!s.ok()) return s;
    const size_t size = h.payload_bytes;
    size_t sealed = std::min(size, kSealChunk);
    tail_.clear();
    tail_sent_ = 0;
    const iovec first[2] = {{const_cast<FrameHeader*>(&h), sizeof(h)},
                            {const_cast<uint8_t*>(payload), sealed}};
    CKPT_RETURN_IF_ERROR(SealLocked(first, 2));
    *started = true;
    while (true) {
      s = FlushTailLocked(deadline);
      if (sealed == size || !s.ok()) break;
      const size_t n = std::min(size - sealed, kSealChunk);
      const iovec next{const_cast<uint8_t*>(payload + sealed), n};
      CKPT_RETURN_IF_ERROR(SealLocked(&next, 1));
      sealed += n;
    }
    if (s.IsResourceExhausted() && sealed < size) {
      // The deadline passed mid-frame: the rest goes out before anything else.
      const iovec rest{const_cast<uint8_t*>(payload + sealed), size - sealed};
      CKPT_RETURN_IF_ERROR(SealLocked(&rest, 1));
    }
    return s;
  }

  // Encrypts `parts` after what tail_ holds. REQUIRES: send_mu_ held.
  Status SealLocked(const iovec* parts, size_t count) {
    Status s = tls_->Seal(parts, count, &tail_);
    if (s.ok()) return s;
    s = Status::Unavailable("connection to " + peer_ + " lost: " + s.message());
    MarkDead(s.message());
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
    if (s.IsUnavailable()) {
      // The first reason wins: a heartbeat timeout shuts the socket down,
      // which fails a write in flight with EPIPE, and that is not the cause.
      MarkDead(s.message());
      s = DeadStatus();
    }
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
    queued_bytes_ += item.charge;
    queue_.push_back(std::move(item));
    rx_cv_.notify_all();
  }

  void EndReader(Status s) {
    if (s.IsUnavailable()) {
      MarkDead(s.message());
      s = DeadStatus();  // the first reason (see FlushTailLocked)
    }
    std::lock_guard<std::mutex> lock(rx_mu_);
    reader_end_ = s.IsUnavailable() || s.IsCorruption() ? s : Status::Aborted(s.message());
    rx_cv_.notify_all();
  }

  // The socket or TLS failed: a record that fails TLS's authentication
  // (changed, replayed, forged) ends the connection like a close.
  void EndRead(const Status& s) {
    if (s.IsCorruption()) MarkDead(s.message());
    EndReader(s);
  }

  void ReadLoop() {
    const Deadline never = Clock::time_point::max();
    const StopCheck stop = [this] {
      if (closed_.load()) return Status::Aborted("channel " + name_ + " closed");
      if (dead_.load()) return DeadStatus();
      return Status::OK();
    };
    const auto on_bytes = [this] { last_rx_ns_.store(NowNs()); };
    FrameAssembler frames(peer_, options_.max_message_bytes, this);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(rx_mu_);
        // The message being assembled counts too; it may grow alone up to
        // max_message_bytes (the queue holds at least one message). Each
        // queued message counts its charge (its payload and
        // kTcpReceivedItemBytes), so empty ones fill the queue too.
        partial_bytes_ = frames.partial_bytes();
        while (queued_bytes_ > 0 && queued_bytes_ + partial_bytes_ >= options_.ring_bytes &&
               !closed_.load() && !dead_.load()) {
          reader_paused_.store(true);
          rx_cv_.wait_for(lock, kSlice);
        }
        if (reader_paused_.exchange(false)) last_rx_ns_.store(NowNs());
      }
      FrameHeader h;
      Status s = ReadExact(*tls_, &h, sizeof(h), never, stop, peer_, on_bytes);
      if (!s.ok()) return EndRead(s);
      s = frames.OnHeader(h);
      dropped_messages_ += frames.TakeDropped();
      if (!s.ok()) {
        ++bad_records_;
        return EndReader(Status::Corruption(s.message() + "; the stream is unusable from here"));
      }
      s = ReadExact(*tls_, frames.payload(), frames.payload_size(), never, stop, peer_, on_bytes);
      if (!s.ok()) return EndRead(s);
      std::optional<Item> item = frames.OnPayload();
      if (!item) continue;
      if (!item->error.ok()) {
        ++bad_records_;
      } else {
        ++records_received_;
        bytes_received_ += item->payload.size();
      }
      PushItem(std::move(*item));
    }
  }

  const int fd_;
  std::unique_ptr<TlsSession> tls_;  // reads: the reader; seals: under send_mu_
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
  std::vector<uint8_t> tail_;   // GUARDED_BY(send_mu_): a sealed frame, sent up to tail_sent_
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
  size_t queued_bytes_ = 0;      // GUARDED_BY(rx_mu_): the charges of queue_ and current_
  size_t partial_bytes_ = 0;     // GUARDED_BY(rx_mu_): the message being assembled
  Status reader_end_;            // GUARDED_BY(rx_mu_): why the reader stopped
  std::atomic<int64_t> last_rx_ns_{0};
  std::atomic<bool> reader_paused_{false};
  const std::shared_ptr<ReceiveBudget> budget_;  // null: none
  std::atomic<uint64_t> held_{0};                // claimed from budget_, not given back
  std::mutex limit_mu_;
  ReceiveLimit limit_;  // GUARDED_BY(limit_mu_)

  std::mutex hb_mu_;
  std::condition_variable hb_cv_;

  std::atomic<uint64_t> records_sent_{0}, records_received_{0}, bytes_sent_{0}, bytes_received_{0},
      bad_records_{0}, dropped_messages_{0};

  std::thread reader_;
  std::thread heartbeat_;
};

}  // namespace

std::unique_ptr<Channel> MakeTcpChannel(int fd, std::unique_ptr<TlsSession> tls, std::string peer,
                                        std::string name, const TcpOptions& options) {
  return std::make_unique<TcpChannelImpl>(fd, std::move(tls), std::move(peer), std::move(name),
                                          options);
}

}  // namespace ckpt::ipc::internal

namespace ckpt::ipc {

Status ReceiveBudget::Acquire(uint64_t bytes, Deadline deadline,
                              const std::function<Status()>& stop) {
  std::unique_lock<std::mutex> lock(mu_);
  if (bytes > limit_) {
    return Status::ResourceExhausted("above the whole remote memory budget of " +
                                     std::to_string(limit_) + " bytes");
  }
  while (limit_ - used_ < bytes) {
    CKPT_RETURN_IF_ERROR(stop());
    const auto now = Clock::now();
    if (now >= deadline) {
      return Status::ResourceExhausted("the remote memory budget of " + std::to_string(limit_) +
                                       " bytes (" + std::to_string(used_) +
                                       " held by connected workers) had no room by the deadline");
    }
    cv_.wait_until(lock, std::min(deadline, now + internal::kSlice));
  }
  used_ += bytes;
  peak_ = std::max(peak_, used_);
  return Status::OK();
}

void ReceiveBudget::Release(uint64_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    used_ -= std::min(bytes, used_);
  }
  cv_.notify_all();
}

uint64_t ReceiveBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t ReceiveBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

}  // namespace ckpt::ipc
