// The receive side of the TCP frame protocol (tcp_frame.h) without the
// socket: FrameAssembler checks each frame header against the stream so far,
// says where its payload goes, and assembles fragments into messages. The
// channel's reader thread (tcp_channel.cc) feeds it bytes read through TLS;
// the fuzz target (tests/fuzz/tcp_frame_fuzz.cc) feeds it a byte buffer.
//
// Use, per frame: OnHeader(h); if OK, read exactly payload_size() bytes into
// payload() (nullptr when 0); then OnPayload(). A non-OK OnHeader means the
// stream's framing is lost: stop reading (the channel's receive side is broken
// for good). Memory: a payload buffer is at most kTcpMaxFramePayload bytes
// (OnHeader checks the length before anything is allocated); the message being
// assembled grows only by payloads actually received, up to max_message_bytes.
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
};

class FrameAssembler {
 public:
  // `peer` names the other side in errors; a fragmented message may claim at
  // most `max_message_bytes`.
  FrameAssembler(std::string peer, uint64_t max_message_bytes)
      : peer_(std::move(peer)), max_message_bytes_(max_message_bytes) {}

  // Checks `h` (magic, header checksum, payload limit, reserved fields, type,
  // flags, sequence == previous + 1, fragment bookkeeping). OK: read the
  // payload next. Corruption naming the peer and the fault otherwise (the
  // stream is unusable from here).
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
  // Messages abandoned by their sender (a new one began before they ended)
  // since the last call.
  uint64_t TakeDropped() { return std::exchange(dropped_, 0); }

 private:
  void DropPartial();

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
};

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_TCP_FRAME_READER_H_
