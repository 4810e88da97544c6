// The receive side of the TCP frame protocol (tcp_frame.h) without the
// socket: FrameAssembler checks each frame header against the stream so far,
// says where its payload goes, and assembles fragments into messages. The
// channel's reader thread (tcp_channel.cc) feeds it bytes read through TLS;
// the fuzz target (tests/fuzz/tcp_frame_fuzz.cc) feeds it a byte buffer.
//
// Use, per frame: OnHeader(h); if OK, read exactly payload_size() bytes into
// payload() (nullptr when 0); then OnPayload(). A non-OK OnHeader means the
// stream's framing is lost: stop reading (the channel's receive side is broken
// for good). Memory: every buffer is claimed (ReceiveClaims) at the header of
// its message's first frame, before it is allocated, and is allocated at the
// claimed size at once, never grown by doubling: a single frame's payload (at
// most kTcpMaxFramePayload bytes, checked first), a fragmented message's whole
// claim (at most max_message_bytes; its pages become resident only as payloads
// arrive), a skipped fragment's payload (freed once read).
//
// Thread-safety: one thread at a time (the reader).
#ifndef CKPT_IPC_SRC_TCP_FRAME_READER_H_
#define CKPT_IPC_SRC_TCP_FRAME_READER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/tcp_channel.h"
#include "tcp_frame.h"

namespace ckpt::ipc::internal {

// std::allocator, except that a value-initialized element (what resize()
// makes) is left uninitialized: a payload buffer is grown only to be filled at
// once by the read of exactly its size, and zeroing it first cost a pass over
// every received byte.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  static_assert(std::is_trivially_default_constructible_v<T>);
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  explicit UninitializedAllocator(const UninitializedAllocator<U>& /*other*/) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// A payload buffer: resize() does not zero what it adds.
using PayloadBytes = std::vector<uint8_t, UninitializedAllocator<uint8_t>>;

// A received message, or a rejected record (error non-OK, reported once).
struct ReceivedItem {
  Status error;
  RecordType type = RecordType::kPadding;
  uint64_t sequence = 0;
  PayloadBytes payload;
  // What its consumer gives back (ReceiveClaims::Unclaim) once done with it.
  uint64_t charge = 0;
};

// A queued message's bookkeeping is within what the budget charges for it.
static_assert(sizeof(ReceivedItem) + 2 * sizeof(void*) <= kTcpReceivedItemBytes);

// Where a FrameAssembler's buffers are accounted (the channel's receive
// limit and budget).
class ReceiveClaims {
 public:
  virtual ~ReceiveClaims() = default;
  // Before a buffer of `charge` bytes is allocated for a message of `type`
  // claiming `message_bytes`: OK to go on; else why not (the stream breaks).
  virtual Status Claim(RecordType type, uint64_t message_bytes, uint64_t charge) = 0;
  // A claim's buffer was freed by the assembler, not handed over.
  virtual void Unclaim(uint64_t charge) = 0;
};

class FrameAssembler {
 public:
  // `peer` names the other side in errors; a fragmented message may claim at
  // most `max_message_bytes`. `claims` (null: none) must outlive the
  // assembler; every message handed out carries the charge its consumer gives
  // back, the rest the assembler gives back itself (at the latest when
  // destroyed).
  FrameAssembler(std::string peer, uint64_t max_message_bytes, ReceiveClaims* claims = nullptr)
      : peer_(std::move(peer)), max_message_bytes_(max_message_bytes), claims_(claims) {}
  ~FrameAssembler();
  FrameAssembler(const FrameAssembler&) = delete;
  FrameAssembler& operator=(const FrameAssembler&) = delete;

  // Checks `h` (magic, header checksum, payload limit, reserved fields, type,
  // flags, sequence == previous + 1, fragment bookkeeping), then claims the
  // buffer its payload needs (ReceiveClaims::Claim). OK: read the payload
  // next. Corruption naming the peer and the fault, or the claim's refusal,
  // otherwise (the stream is unusable from here).
  Status OnHeader(const wire::FrameHeader& h);

  // Where the payload of the header just accepted goes, and its size.
  // REQUIRES: the last OnHeader returned OK.
  uint8_t* payload() { return dst_; }
  size_t payload_size() const { return static_cast<size_t>(header_.payload_bytes); }

  // After payload_size() bytes were written to payload(): a finished message,
  // a rejected record (payload checksum mismatch: error set, the message is
  // skipped), or nothing (a heartbeat, a fragment of an unfinished message, the
  // rest of a message already dropped).
  std::optional<ReceivedItem> OnPayload();

  // Bytes held by the message being assembled.
  size_t partial_bytes() const { return partial_ ? partial_->payload.capacity() : 0; }
  // Bytes claimed and not yet handed over or given back.
  uint64_t charge_held() const { return single_charge_ + partial_charge_ + skip_charge_; }
  // Messages abandoned by their sender (a new one began before they ended)
  // since the last call.
  uint64_t TakeDropped() { return std::exchange(dropped_, 0); }

 private:
  void DropPartial();
  Status Claim(uint16_t type, uint64_t message_bytes, uint64_t payload_bytes, uint64_t* charge);
  void Unclaim(uint64_t* charge);
  // A refused claim: the stream breaks (Corruption naming the peer and why).
  Status Refused(const Status& why);

  const std::string peer_;
  const uint64_t max_message_bytes_;
  uint64_t expect_seq_ = 1;
  wire::FrameHeader header_{};  // the header accepted last
  uint8_t* dst_ = nullptr;
  bool skip_ = false;                    // payload read and thrown away
  PayloadBytes single_;                  // an unfragmented message's payload
  PayloadBytes discard_;                 // a skipped fragment's payload
  std::optional<ReceivedItem> partial_;  // the fragmented message being assembled
  uint64_t partial_total_ = 0;
  uint64_t dropped_ = 0;
  ReceiveClaims* const claims_;
  uint64_t single_charge_ = 0;   // single_'s claim
  uint64_t partial_charge_ = 0;  // partial_'s claim
  uint64_t skip_charge_ = 0;     // discard_'s claim
};

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_TCP_FRAME_READER_H_
