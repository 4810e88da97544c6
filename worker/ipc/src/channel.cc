// ChannelImpl: a Channel over one segment of layout.h.
#include "ckpt/ipc/channel.h"

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>

#include "ckpt/format/checksum.h"
#include "futex.h"
#include "layout.h"
#include "liveness.h"
#include "payload_checksum.h"
#include "ring.h"
#include "shm_segment.h"

namespace ckpt::ipc {
namespace {

using internal::RingReader;
using internal::RingWriter;
using internal::SharedSegment;

// The longest one futex sleep lasts; every waiter re-checks closing, the
// peer's liveness and its deadline at least this often.
constexpr std::chrono::milliseconds kWaitSlice{100};

uint64_t GeometryChecksum(const layout::ControlBlock& cb) {
  return Xxh3_64(reinterpret_cast<const uint8_t*>(&cb) + 8, 56);
}

void FillGeometry(layout::ControlBlock* cb, uint64_t ring_bytes) {
  cb->layout_version = layout::kLayoutVersion;
  cb->control_bytes = static_cast<uint32_t>(layout::kControlBytes);
  cb->ring_bytes = ring_bytes;
  cb->segment_bytes = layout::SegmentBytes(ring_bytes);
  cb->request_ring_offset = layout::kRequestRingOffset;
  cb->result_ring_offset = layout::kResultRingOffset;
  cb->request_data_offset = layout::RequestDataOffset(ring_bytes);
  cb->result_data_offset = layout::ResultDataOffset(ring_bytes);
  cb->geometry_xxh3 = GeometryChecksum(*cb);
}

// Checks a control block read from a segment of `segment_bytes` bytes.
Status CheckGeometry(const std::string& name, const layout::ControlBlock& cb,
                     uint64_t segment_bytes) {
  const uint64_t magic = cb.magic.raw;
  if (magic == 0) {
    return Status::Unavailable("segment '" + name + "' is still being initialised by its owner");
  }
  if (magic != layout::kSegmentMagic) {
    return Status::Corruption("segment '" + name + "' is not a ckpt segment (bad magic)");
  }
  if (cb.layout_version != layout::kLayoutVersion) {
    return Status::FailedPrecondition("segment '" + name + "' has layout version " +
                                      std::to_string(cb.layout_version) + "; this build reads " +
                                      std::to_string(layout::kLayoutVersion));
  }
  if (GeometryChecksum(cb) != cb.geometry_xxh3) {
    return Status::Corruption("segment '" + name + "': control block checksum mismatch");
  }
  const uint64_t n = cb.ring_bytes;
  if (n < layout::kMinRingBytes || n > layout::kMaxRingBytes || (n & (n - 1)) != 0 ||
      cb.control_bytes != layout::kControlBytes || cb.segment_bytes != layout::SegmentBytes(n) ||
      cb.request_ring_offset != layout::kRequestRingOffset ||
      cb.result_ring_offset != layout::kResultRingOffset ||
      cb.request_data_offset != layout::RequestDataOffset(n) ||
      cb.result_data_offset != layout::ResultDataOffset(n)) {
    return Status::Corruption("segment '" + name + "': inconsistent geometry");
  }
  if (segment_bytes < cb.segment_bytes) {
    return Status::Corruption("segment '" + name + "' is " + std::to_string(segment_bytes) +
                              " bytes, its control block says " + std::to_string(cb.segment_bytes));
  }
  return Status::OK();
}

internal::ProcessIdentity IdentityOf(const layout::Participant& p) {
  internal::ProcessIdentity id;
  id.pid = p.pid;
  id.start_time = p.start_time;
  std::memcpy(id.boot_id, p.boot_id, sizeof(id.boot_id));
  return id;
}

// Fills the identity fields of a claimed slot and marks it attached.
void Attach(layout::Participant* slot, const internal::ProcessIdentity& self) {
  slot->pid = self.pid;
  slot->start_time = self.start_time;
  std::memcpy(slot->boot_id, self.boot_id, sizeof(slot->boot_id));
  slot->heartbeat.StoreRelaxed(1);
  // Release: the identity above is visible to whoever sees kSlotAttached.
  slot->state.StoreRelease(layout::kSlotAttached);
}

enum class Owner { kNotACkptSegment, kAlive, kDead };

// Who owns a segment that exists already: not a (fully initialised) ckpt
// segment, a live owner or a dead one. The control block is copied out first:
// the segment may be anyone's.
Owner OwnerOf(const SharedSegment& segment, std::string* who) {
  if (segment.size() < sizeof(layout::ControlBlock)) return Owner::kNotACkptSegment;
  layout::ControlBlock cb;
  std::memcpy(&cb, segment.data(), sizeof(cb));
  if (cb.magic.raw != layout::kSegmentMagic) return Owner::kNotACkptSegment;
  if (cb.owner.state.raw != layout::kSlotAttached) return Owner::kNotACkptSegment;
  std::string why;
  *who = "pid " + std::to_string(cb.owner.pid);
  return internal::ProcessAlive(IdentityOf(cb.owner), &why) ? Owner::kAlive : Owner::kDead;
}

// ChannelOptions::min_window_bytes as RingWriter takes it: 0 (the whole ring),
// else a power of two of at least 4 KiB. REQUIRES: CheckOptions passed.
uint64_t MinWindow(uint64_t bytes) {
  if (bytes == 0) return 0;
  uint64_t n = layout::kMinRingBytes;
  while (n < bytes) n <<= 1;
  return n;
}

class ChannelImpl final : public Channel {
 public:
  // REQUIRES: `segment` passed CheckGeometry with ring size `ring_bytes`; the
  // geometry is taken from the arguments, never re-read from the segment.
  ChannelImpl(std::string name, const ChannelOptions& options, bool owner,
              std::unique_ptr<SharedSegment> segment, uint64_t ring_bytes)
      : name_(std::move(name)),
        options_(options),
        ring_bytes_(ring_bytes),
        segment_(std::move(segment)),
        control_(reinterpret_cast<layout::ControlBlock*>(segment_->data())),
        self_(owner ? &control_->owner : &control_->worker),
        peer_(owner ? &control_->worker : &control_->owner),
        peer_role_(owner ? "worker" : "scheduler"),
        writer_(Ring(owner ? layout::kRequestRingOffset : layout::kResultRingOffset),
                Data(owner ? layout::RequestDataOffset(ring_bytes)
                           : layout::ResultDataOffset(ring_bytes)),
                ring_bytes, name_ + (owner ? " request ring" : " result ring"),
                MinWindow(options.min_window_bytes)),
        reader_(Ring(owner ? layout::kResultRingOffset : layout::kRequestRingOffset),
                Data(owner ? layout::ResultDataOffset(ring_bytes)
                           : layout::RequestDataOffset(ring_bytes)),
                ring_bytes, options.max_message_bytes,
                name_ + (owner ? " result ring" : " request ring")) {}

  ~ChannelImpl() override {
    Close();
    {
      std::lock_guard<std::mutex> lock(heartbeat_mu_);
      heartbeat_stop_ = true;
    }
    heartbeat_cv_.notify_all();
    if (heartbeat_.joinable()) heartbeat_.join();
    // Release: the peer sees a clean close rather than a vanished process.
    self_->state.StoreRelease(layout::kSlotDetached);
  }

  // Starts the heartbeat thread. Internal when the system has no thread to give.
  Status Start() {
    try {
      heartbeat_ = std::thread([this] { HeartbeatLoop(); });
    } catch (const std::system_error& e) {
      return Status::Internal(name_ + ": cannot start the heartbeat thread: " + e.what());
    }
    return Status::OK();
  }

  Status Send(RecordType type, const void* payload, size_t size, Deadline deadline) override {
    const PayloadPart part{payload, size};
    uint64_t sent = 0;
    return SendParts(type, &part, 1, deadline, &sent);
  }

  Status SendParts(RecordType type, const PayloadPart* parts, size_t count, Deadline deadline,
                   uint64_t* sent) override {
    if (!internal::IsMessageType(static_cast<uint16_t>(type))) {
      return Status::InvalidArgument(name_ + ": cannot send a record of type " +
                                     RecordTypeName(type));
    }
    auto total = PayloadPartsSize(parts, count);
    if (!total.ok()) return total.status().WithPrefix(name_);
    const uint64_t size = *total;
    Abandon();
    CKPT_RETURN_IF_ERROR(SendCheck());
    if (size > writer_.max_payload())
      return SendFragments(type, parts, count, size, sent, deadline);
    if (*sent != 0) {
      return Status::InvalidArgument(name_ + ": " + std::to_string(*sent) + " bytes of a " +
                                     std::to_string(size) +
                                     "-byte record sent: it goes whole or not at all");
    }
    internal::RecordSpec spec{type, 0, size, type, size, 0};
    uint8_t* dst = nullptr;
    CKPT_RETURN_IF_ERROR(ReserveInRing(spec, deadline, &dst));
    CommitInRing(size, internal::GatherAndXxh3(dst, parts, count, 0, size));
    *sent = size;
    return Status::OK();
  }

  StatusOr<Reservation> Reserve(RecordType type, size_t size, Deadline deadline) override {
    if (!internal::IsMessageType(static_cast<uint16_t>(type))) {
      return Status::InvalidArgument(name_ + ": cannot reserve a record of type " +
                                     RecordTypeName(type));
    }
    Abandon();
    CKPT_RETURN_IF_ERROR(SendCheck());
    Reservation r;
    r.size = size;
    if (size > writer_.max_payload()) {
      if (staging_capacity_ < size) {
        staging_.reset();
        staging_.reset(new (std::nothrow) uint8_t[size]);
        if (staging_ == nullptr) {
          staging_capacity_ = 0;
          return Status::ResourceExhausted(name_ + ": cannot stage " + std::to_string(size) +
                                           " bytes");
        }
        staging_capacity_ = size;
      }
      r.data = staging_.get();
      pending_ = Pending::kStaged;
      staged_sent_ = 0;
    } else {
      internal::RecordSpec spec{type, 0, size, type, size, 0};
      CKPT_RETURN_IF_ERROR(ReserveInRing(spec, deadline, &r.data));
      pending_ = Pending::kInRing;
    }
    pending_type_ = type;
    pending_reservation_ = r;
    return r;
  }

  Status Commit(const Reservation& reservation, Deadline deadline) override {
    if (pending_ == Pending::kNone || reservation.data != pending_reservation_.data ||
        reservation.size != pending_reservation_.size) {
      return Status::InvalidArgument(name_ + ": Commit of a reservation that is not pending");
    }
    if (pending_ == Pending::kInRing) {
      pending_ = Pending::kNone;
      if (closed_.load()) {
        writer_.Abandon();
        return Status::Aborted(name_ + ": channel closed");
      }
      CommitInRing(reservation.size);
      return Status::OK();
    }
    // Staged: fragments go out now. At the deadline the reservation stays
    // pending with its progress, so Commit again resumes where this one stopped.
    Status s = SendCheck();
    if (s.ok()) {
      const PayloadPart staged{staging_.get(), reservation.size};
      s = SendFragments(pending_type_, &staged, 1, reservation.size, &staged_sent_, deadline);
    }
    if (!s.IsResourceExhausted()) pending_ = Pending::kNone;
    return s;
  }

  void Abandon() override {
    if (pending_ == Pending::kInRing) writer_.Abandon();
    pending_ = Pending::kNone;
  }

  StatusOr<Received> Receive(Deadline deadline) override {
    for (;;) {
      if (closed_.load()) return Status::Aborted(name_ + ": channel closed");
      RingReader::Message m;
      std::string error;
      const RingReader::Result result = reader_.Next(&m, &error);
      dropped_messages_.store(reader_.dropped_messages(), std::memory_order_relaxed);
      switch (result) {
        case RingReader::Result::kMessage: {
          records_received_.fetch_add(1, std::memory_order_relaxed);
          bytes_received_.fetch_add(m.size, std::memory_order_relaxed);
          Received r;
          r.type = m.type;
          r.sequence = m.sequence;
          r.payload = m.payload;
          r.size = m.size;
          return r;
        }
        case RingReader::Result::kBad:
          bad_records_.fetch_add(1, std::memory_order_relaxed);
          return Status::Corruption(error);
        case RingReader::Result::kBroken:
          if (!receive_broken_) {
            receive_broken_ = true;
            bad_records_.fetch_add(1, std::memory_order_relaxed);
          }
          return Status::Corruption(error);
        case RingReader::Result::kEmpty:
          break;
      }
      CKPT_RETURN_IF_ERROR(Wait(
          &reader_.header()->head_wake, &reader_.header()->consumer_waiting,
          [this] { return reader_.HasData(); }, deadline, "a record"));
    }
  }

  void Release() override { reader_.Release(); }

  bool PeerAlive() const override { return peer_attached_.load() && !peer_dead_.load(); }

  void Close() override {
    closed_.store(true);
    // The words this side sleeps on; bumped so a sleeper that read them
    // before the flag was set returns at once.
    internal::FutexBumpAndWake(&writer_.header()->tail_wake);
    internal::FutexBumpAndWake(&reader_.header()->head_wake);
  }

  PayloadPart SharedMemory() const override {
    return {segment_->data(), static_cast<size_t>(segment_->size())};
  }

  ChannelStats Stats() const override {
    ChannelStats s;
    s.records_sent = records_sent_.load(std::memory_order_relaxed);
    s.records_received = records_received_.load(std::memory_order_relaxed);
    s.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
    s.bytes_received = bytes_received_.load(std::memory_order_relaxed);
    s.bad_records = bad_records_.load(std::memory_order_relaxed);
    s.dropped_messages = dropped_messages_.load(std::memory_order_relaxed);
    s.send_ring_used = send_ring_used_.load(std::memory_order_relaxed);
    s.ring_bytes = ring_bytes_;
    s.send_window_bytes = send_window_.load(std::memory_order_relaxed);
    return s;
  }

  const std::string& name() const override { return name_; }

 private:
  enum class Pending { kNone, kInRing, kStaged };

  layout::RingHeader* Ring(uint64_t offset) const {
    return reinterpret_cast<layout::RingHeader*>(segment_->data() + offset);
  }
  uint8_t* Data(uint64_t offset) const { return segment_->data() + offset; }

  Status PeerUnavailable() const {
    std::lock_guard<std::mutex> lock(peer_mu_);
    return Status::Unavailable(name_ + ": " + peer_role_ + " " + peer_dead_reason_);
  }

  Status SendCheck() const {
    if (closed_.load()) return Status::Aborted(name_ + ": channel closed");
    if (peer_dead_.load()) return PeerUnavailable();
    return Status::OK();
  }

  // Waits until `ready` (which reads the ring with seq_cst loads) holds, the
  // deadline passes, the channel closes or the peer dies. `wake` is the futex
  // word the peer bumps; `waiting` the flag that tells it to.
  template <typename Ready>
  Status Wait(layout::SharedU32* wake, layout::SharedU32* waiting, Ready ready, Deadline deadline,
              const char* what) {
    const auto spin_until = Clock::now() + options_.spin;
    for (int i = 0;; ++i) {
      if (ready()) return Status::OK();
      if ((i & 63) == 63 && Clock::now() >= spin_until) break;
      internal::CpuRelax();
    }
    for (;;) {
      // Read the word before the checks: a bump after this read (by the peer,
      // Close or the heartbeat thread) makes the futex wait return at once.
      const uint32_t seen = wake->LoadAcquire();
      if (closed_.load()) return Status::Aborted(name_ + ": channel closed");
      if (peer_dead_.load()) {
        if (ready()) return Status::OK();
        return PeerUnavailable();
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        return Status::ResourceExhausted(name_ + ": deadline passed waiting for " +
                                         std::string(what));
      }
      waiting->StoreSeqCst(1);
      if (ready()) {
        waiting->StoreSeqCst(0);
        return Status::OK();
      }
      auto slice = std::min<Clock::duration>(deadline - now, kWaitSlice);
      internal::FutexWait(wake, seen, slice);
      waiting->StoreSeqCst(0);
      if (ready()) return Status::OK();
    }
  }

  Status ReserveInRing(const internal::RecordSpec& spec, Deadline deadline, uint8_t** dst) {
    for (;;) {
      std::string error;
      switch (writer_.TryReserve(spec, dst, &error)) {
        case RingWriter::Result::kReserved:
          return Status::OK();
        case RingWriter::Result::kBroken:
          return Status::Corruption(error);
        case RingWriter::Result::kFull:
          break;
      }
      const uint64_t bytes = spec.payload_bytes;
      CKPT_RETURN_IF_ERROR(Wait(
          &writer_.header()->tail_wake, &writer_.header()->producer_waiting,
          [this, bytes] { return writer_.HasRoom(bytes); }, deadline, "room in the ring"));
    }
  }

  // Publishes the pending record; `payload_xxh3` when the caller hashed it
  // while copying it in, else it is read again here.
  void CommitInRing(size_t size, std::optional<uint64_t> payload_xxh3 = std::nullopt) {
    if (payload_xxh3.has_value()) {
      writer_.Commit(*payload_xxh3);
    } else {
      writer_.Commit();
    }
    records_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(size, std::memory_order_relaxed);
    send_ring_used_.store(writer_.used(), std::memory_order_relaxed);
    send_window_.store(writer_.window(), std::memory_order_relaxed);
  }

  // Sends the `size` payload bytes of `parts` as fragments from offset *sent
  // on, advancing *sent past each fragment committed.
  Status SendFragments(RecordType type, const PayloadPart* parts, size_t count, uint64_t size,
                       uint64_t* sent, Deadline deadline) {
    if (*sent > size) {
      return Status::InvalidArgument(name_ + ": resuming at byte " + std::to_string(*sent) +
                                     " of a " + std::to_string(size) + "-byte payload");
    }
    const uint64_t chunk = writer_.max_payload();
    while (*sent < size) {
      const uint64_t off = *sent;
      const uint64_t n = std::min<uint64_t>(chunk, size - off);
      uint16_t flags = 0;
      if (off == 0) flags |= layout::kFlagFirst;
      if (off + n == size) flags |= layout::kFlagLast;
      internal::RecordSpec spec{RecordType::kFragment, flags, n, type, size, off};
      uint8_t* dst = nullptr;
      CKPT_RETURN_IF_ERROR(ReserveInRing(spec, deadline, &dst));
      writer_.Commit(internal::GatherAndXxh3(dst, parts, count, off, n));
      *sent = off + n;
    }
    records_sent_.fetch_add(1, std::memory_order_relaxed);
    bytes_sent_.fetch_add(size, std::memory_order_relaxed);
    send_ring_used_.store(writer_.used(), std::memory_order_relaxed);
    send_window_.store(writer_.window(), std::memory_order_relaxed);
    return Status::OK();
  }

  void MarkPeerDead(const std::string& reason) {
    {
      std::lock_guard<std::mutex> lock(peer_mu_);
      if (peer_dead_.load()) return;
      peer_dead_reason_ = reason;
    }
    peer_dead_.store(true);
    internal::FutexBumpAndWake(&writer_.header()->tail_wake);
    internal::FutexBumpAndWake(&reader_.header()->head_wake);
  }

  void CheckPeer(Clock::time_point now) {
    if (peer_dead_.load()) return;
    // Acquire: the identity fields are complete once the slot says Attached.
    const uint32_t state = peer_->state.LoadAcquire();
    if (state == layout::kSlotEmpty || state == layout::kSlotAttaching) return;
    if (state == layout::kSlotDetached) return MarkPeerDead("closed the channel");
    if (state != layout::kSlotAttached) {
      return MarkPeerDead("slot holds an impossible state " + std::to_string(state));
    }
    const internal::ProcessIdentity id = IdentityOf(*peer_);
    if (!peer_attached_.load()) {
      peer_identity_ = id;
      last_peer_beat_ = peer_->heartbeat.LoadRelaxed();
      last_peer_beat_change_ = now;
      peer_attached_.store(true);
    } else if (id.pid != peer_identity_.pid || id.start_time != peer_identity_.start_time ||
               std::memcmp(id.boot_id, peer_identity_.boot_id, sizeof(id.boot_id)) != 0) {
      return MarkPeerDead("pid " + std::to_string(peer_identity_.pid) +
                          ": its identity in the segment changed");
    }
    std::string why;
    if (!internal::ProcessAlive(peer_identity_, &why)) return MarkPeerDead(why);
    // Relaxed: only whether it moved matters.
    const uint64_t beat = peer_->heartbeat.LoadRelaxed();
    if (beat != last_peer_beat_) {
      last_peer_beat_ = beat;
      last_peer_beat_change_ = now;
    } else if (now - last_peer_beat_change_ > options_.heartbeat_timeout) {
      MarkPeerDead("pid " + std::to_string(peer_identity_.pid) + " stopped heart-beating for " +
                   std::to_string(options_.heartbeat_timeout.count()) + " ms");
    }
  }

  // Thread root: nothing below is expected to throw (std::string allocation
  // aside); if it does, the peer is declared dead so both sides notice and
  // the scheduler restarts the worker, instead of the process terminating.
  void HeartbeatLoop() {
    try {
      HeartbeatLoopBody();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "ckpt ipc %s: heartbeat thread failed: %s\n", name_.c_str(), e.what());
      MarkPeerDead(std::string("heartbeat thread failed: ") + e.what());
    } catch (...) {
      std::fprintf(stderr, "ckpt ipc %s: heartbeat thread failed\n", name_.c_str());
      MarkPeerDead("heartbeat thread failed");
    }
  }

  void HeartbeatLoopBody() {
    std::unique_lock<std::mutex> lock(heartbeat_mu_);
    while (!heartbeat_stop_) {
      // Relaxed: the peer only checks that the counter moves.
      self_->heartbeat.FetchAddRelaxed(1);
      CheckPeer(Clock::now());
      heartbeat_cv_.wait_for(lock, options_.heartbeat_interval, [this] { return heartbeat_stop_; });
    }
  }

  const std::string name_;
  const ChannelOptions options_;
  const uint64_t ring_bytes_;
  const std::unique_ptr<SharedSegment> segment_;
  layout::ControlBlock* const control_;
  layout::Participant* const self_;
  layout::Participant* const peer_;
  const char* const peer_role_;

  // Sending thread.
  RingWriter writer_;
  Pending pending_ = Pending::kNone;
  RecordType pending_type_ = RecordType::kPadding;
  Reservation pending_reservation_;
  std::unique_ptr<uint8_t[]> staging_;
  size_t staging_capacity_ = 0;
  uint64_t staged_sent_ = 0;  // bytes of the staged reservation already sent

  // Receiving thread.
  RingReader reader_;
  bool receive_broken_ = false;

  std::atomic<bool> closed_{false};

  // Written by the heartbeat thread; read anywhere.
  std::atomic<bool> peer_attached_{false};
  std::atomic<bool> peer_dead_{false};
  mutable std::mutex peer_mu_;
  std::string peer_dead_reason_;  // GUARDED_BY(peer_mu_), set once before peer_dead_

  // Heartbeat thread only.
  internal::ProcessIdentity peer_identity_;
  uint64_t last_peer_beat_ = 0;
  Clock::time_point last_peer_beat_change_;

  std::mutex heartbeat_mu_;
  std::condition_variable heartbeat_cv_;
  bool heartbeat_stop_ = false;  // GUARDED_BY(heartbeat_mu_)
  std::thread heartbeat_;

  std::atomic<uint64_t> records_sent_{0};
  std::atomic<uint64_t> records_received_{0};
  std::atomic<uint64_t> bytes_sent_{0};
  std::atomic<uint64_t> bytes_received_{0};
  std::atomic<uint64_t> bad_records_{0};
  std::atomic<uint64_t> dropped_messages_{0};
  std::atomic<size_t> send_ring_used_{0};
  std::atomic<size_t> send_window_{writer_.window()};
};

StatusOr<uint64_t> RingBytesFor(const ChannelOptions& options) {
  uint64_t n = layout::kMinRingBytes;
  if (options.ring_bytes > layout::kMaxRingBytes) {
    return Status::InvalidArgument("ring_bytes " + std::to_string(options.ring_bytes) +
                                   " exceeds 1 TiB");
  }
  while (n < options.ring_bytes) n <<= 1;
  return n;
}

Status CheckOptions(const ChannelOptions& options) {
  if (options.heartbeat_interval.count() <= 0 || options.heartbeat_timeout.count() <= 0) {
    return Status::InvalidArgument("heartbeat_interval and heartbeat_timeout must be positive");
  }
  if (options.spin.count() < 0) return Status::InvalidArgument("spin must not be negative");
  if (options.min_window_bytes > layout::kMaxRingBytes) {
    return Status::InvalidArgument("min_window_bytes " + std::to_string(options.min_window_bytes) +
                                   " exceeds 1 TiB");
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<Channel>> Channel::Create(const std::string& name,
                                                   const ChannelOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckOptions(options));
  CKPT_ASSIGN_OR_RETURN(const uint64_t ring_bytes, RingBytesFor(options));
  CKPT_ASSIGN_OR_RETURN(const internal::ProcessIdentity self, internal::SelfIdentity());
  const uint64_t bytes = layout::SegmentBytes(ring_bytes);
  auto segment = SharedSegment::Create(name, bytes, options.populate);
  if (!segment.ok() && segment.status().code() == StatusCode::kAlreadyExists) {
    // A leftover: reclaim it unless its owner still runs.
    auto old = SharedSegment::Open(name, /*writable=*/false);
    if (old.ok()) {
      std::string who;
      if (OwnerOf(**old, &who) == Owner::kAlive) {
        return Status::AlreadyExists("shared-memory segment '" + name +
                                     "' is in use by its live owner, " + who);
      }
      old->reset();
    } else if (old.status().code() != StatusCode::kNotFound) {
      return old.status();
    }
    CKPT_RETURN_IF_ERROR(SharedSegment::Remove(name));
    segment = SharedSegment::Create(name, bytes, options.populate);
  }
  if (!segment.ok()) return segment.status();

  uint8_t* base = (*segment)->data();
  auto* cb = reinterpret_cast<layout::ControlBlock*>(base);
  FillGeometry(cb, ring_bytes);
  for (uint64_t off : {layout::kRequestRingOffset, layout::kResultRingOffset}) {
    auto* ring = reinterpret_cast<layout::RingHeader*>(base + off);
    ring->ring_bytes = ring_bytes;
    ring->data_offset = off == layout::kRequestRingOffset ? layout::RequestDataOffset(ring_bytes)
                                                          : layout::ResultDataOffset(ring_bytes);
  }
  cb->owner.state.StoreRelaxed(layout::kSlotAttaching);
  Attach(&cb->owner, self);
  // Release, last: an opener that reads the magic (acquire) sees all of the above.
  cb->magic.StoreRelease(layout::kSegmentMagic);

  auto impl =
      std::make_unique<ChannelImpl>(name, options, /*owner=*/true, std::move(*segment), ring_bytes);
  CKPT_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Channel>(std::move(impl));
}

StatusOr<std::unique_ptr<Channel>> Channel::Open(const std::string& name,
                                                 const ChannelOptions& options) {
  CKPT_RETURN_IF_ERROR(CheckOptions(options));
  CKPT_ASSIGN_OR_RETURN(const internal::ProcessIdentity self, internal::SelfIdentity());
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<SharedSegment> segment,
                        SharedSegment::Open(name, /*writable=*/true));
  if (segment->size() < layout::kDataOffset) {
    return Status::Corruption("segment '" + name + "' is too small for a ckpt segment");
  }
  auto* cb = reinterpret_cast<layout::ControlBlock*>(segment->data());
  // Acquire: everything the owner wrote before the magic is visible.
  layout::ControlBlock copy;
  copy.magic.raw = cb->magic.LoadAcquire();
  std::memcpy(reinterpret_cast<uint8_t*>(&copy) + 8, reinterpret_cast<uint8_t*>(cb) + 8,
              sizeof(copy) - 8);
  CKPT_RETURN_IF_ERROR(CheckGeometry(name, copy, segment->size()));

  if (copy.owner.state.raw != layout::kSlotAttached) {
    return Status::Unavailable("segment '" + name + "': its owner has detached");
  }
  std::string why;
  if (!internal::ProcessAlive(IdentityOf(copy.owner), &why)) {
    return Status::Unavailable("segment '" + name + "': its owner (scheduler) " + why);
  }
  uint32_t expected = layout::kSlotEmpty;
  if (!cb->worker.state.CompareExchange(&expected, layout::kSlotAttaching)) {
    layout::Participant held;
    std::memcpy(&held, &cb->worker, sizeof(held));
    if (expected == layout::kSlotAttached && internal::ProcessAlive(IdentityOf(held), &why)) {
      return Status::AlreadyExists("segment '" + name + "' is held by a live worker, pid " +
                                   std::to_string(held.pid));
    }
    return Status::FailedPrecondition("segment '" + name +
                                      "' was used by another worker; the owner must recreate it");
  }
  Attach(&cb->worker, self);
  auto impl = std::make_unique<ChannelImpl>(name, options, /*owner=*/false, std::move(segment),
                                            copy.ring_bytes);
  CKPT_RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<Channel>(std::move(impl));
}

Status Channel::Remove(const std::string& name) { return SharedSegment::Remove(name); }

StatusOr<uint64_t> PayloadPartsSize(const PayloadPart* parts, size_t count) {
  uint64_t size = 0;
  for (size_t i = 0; i < count; ++i) {
    if (parts[i].size != 0 && parts[i].data == nullptr) {
      return Status::InvalidArgument("null payload part " + std::to_string(i) + " of " +
                                     std::to_string(parts[i].size) + " bytes");
    }
    size += parts[i].size;
  }
  return size;
}

StatusOr<std::vector<std::string>> Channel::RemoveStale(
    const std::function<bool(const std::string& name)>& select, const std::string& shm_dir) {
  if (!select) return Status::InvalidArgument("RemoveStale needs a selector");
  std::vector<std::string> removed;
  std::error_code ec;
  std::filesystem::directory_iterator it(shm_dir, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return removed;
    return Status::IOError("shared-memory directory " + shm_dir + ": " + ec.message());
  }
  for (; it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const auto& entry = *it;
    const std::string name = entry.path().filename().string();
    if (!internal::ValidateSegmentName(name).ok() || !select(name)) continue;
    struct stat before;
    if (::stat(entry.path().c_str(), &before) != 0 || !S_ISREG(before.st_mode)) continue;
    // Only a segment that is ours beyond doubt: our magic, an owner that had
    // attached, and that owner gone. Half-initialised segments (no magic yet)
    // and anything else stay.
    bool stale = false;
    {
      auto seg = SharedSegment::Open(name, /*writable=*/false);
      std::string who;
      stale = seg.ok() && OwnerOf(**seg, &who) == Owner::kDead;
    }
    if (!stale) continue;
    // The name must still be the file we looked at: a scheduler may have
    // reclaimed and recreated it meanwhile (it would then be a live one).
    struct stat now;
    if (::stat(entry.path().c_str(), &now) != 0 || now.st_ino != before.st_ino ||
        now.st_dev != before.st_dev) {
      continue;
    }
    CKPT_RETURN_IF_ERROR(SharedSegment::Remove(name));
    removed.push_back(name);
  }
  if (ec) return Status::IOError("shared-memory directory " + shm_dir + ": " + ec.message());
  return removed;
}

}  // namespace ckpt::ipc
