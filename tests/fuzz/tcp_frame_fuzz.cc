// Fuzz target for the TCP transport's frame reader (worker/ipc/src/
// tcp_frame_reader.h, the code behind TcpChannel's reader thread): the bytes
// a peer sends after the TLS handshake, parsed without a socket.
//
// Input byte 0 sets the run:
//   bit 0    reseal each header's header_xxh3 (reaches the checks behind it)
//   bit 1    reseal each payload_xxh3 over the payload that follows
//   bit 2    renumber sequences 1, 2, ... (reaches the fragment bookkeeping)
//   bits 3-4 max_message_bytes: the TCP channel's default
//            (kDefaultTcpMaxMessageBytes, 1 GiB + 1 MiB), 4 MiB,
//            kTcpMaxFramePayload + 1, 1000
//   bit 5    claims from a 64 MiB budget, as the scheduler's remote channels
//            do (TcpOptions::budget); clear: no budget, as a worker's channel
// The rest is the stream: frames of a 64-byte FrameHeader then payload_bytes
// of payload, as on the wire; the stream may end anywhere (a truncated
// header or payload ends the run as a closed connection would).
//
// Any input must give a Status, never a crash, a read out of bounds or an
// allocation beyond the frame limit plus one reserved message (at most
// max_message_bytes, claimed before it is allocated); what is delivered must
// be a message type within max_message_bytes, no more bytes than the stream
// carried; and the claims must balance: never more given back than claimed,
// within the budget, and nothing held once the assembler is gone and every
// delivered message given back.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/tcp_channel.h"
#include "payload_checksum.h"
#include "tcp_frame.h"
#include "tcp_frame_reader.h"

namespace {

using ckpt::Status;
using ckpt::ipc::RecordType;
using ckpt::ipc::internal::FrameAssembler;
using ckpt::ipc::wire::FrameHeader;

bool IsMessage(RecordType t) { return t >= RecordType::kHello && t <= RecordType::kShutdown; }

// The channel's side of the claims (TcpChannel's, without its waiting: one
// channel alone cannot free what it holds): a budget, or none.
class Claims final : public ckpt::ipc::internal::ReceiveClaims {
 public:
  explicit Claims(uint64_t budget) : budget_(budget) {}
  Status Claim(RecordType, uint64_t message_bytes, uint64_t charge) override {
    if (charge > budget_ - held_) {
      return Status::ResourceExhausted("a claim of " + std::to_string(message_bytes) +
                                       " bytes exceeds the budget");
    }
    held_ += charge;
    return Status::OK();
  }
  void Unclaim(uint64_t charge) override {
    if (charge > held_) std::abort();  // given back more than was claimed
    held_ -= charge;
  }
  uint64_t held() const { return held_; }

 private:
  const uint64_t budget_;
  uint64_t held_ = 0;
};

// Feeds the stream to `frames` until it ends or becomes unusable, giving
// back each delivered message's claim as its consumer would.
void Feed(const uint8_t* data, size_t size, uint8_t mode, uint64_t max_message_bytes,
          FrameAssembler& frames, Claims& claims) {
  const bool reseal_header = (mode & 1) != 0;
  const bool reseal_payload = (mode & 2) != 0;
  const bool renumber = (mode & 4) != 0;
  size_t at = 1;
  uint64_t sequence = 0;
  uint64_t payload_bytes_read = 0;
  uint64_t delivered_bytes = 0;
  while (size - at >= sizeof(FrameHeader)) {
    FrameHeader h;
    std::memcpy(&h, data + at, sizeof(h));
    at += sizeof(h);
    const size_t left = size - at;
    if (renumber) h.sequence = ++sequence;
    if (reseal_payload && h.payload_bytes <= left) {
      h.payload_xxh3 = ckpt::ipc::internal::PayloadXxh3(data + at, h.payload_bytes);
    }
    if (reseal_header) h.header_xxh3 = ckpt::Xxh3_64(&h, ckpt::ipc::wire::kHeaderChecked);
    if (!frames.OnHeader(h).ok()) return;  // the stream is unusable from here
    const size_t n = frames.payload_size();
    if (n != h.payload_bytes || n > ckpt::ipc::kTcpMaxFramePayload) std::abort();
    if (n > 0 && frames.payload() == nullptr) std::abort();
    // Every buffer was claimed before it was allocated, within the limit.
    if (frames.partial_bytes() > max_message_bytes) std::abort();
    if (frames.partial_bytes() > frames.charge_held()) std::abort();
    if (frames.charge_held() != claims.held()) std::abort();
    if (n > left) return;  // a truncated payload: the connection ended
    if (n > 0) std::memcpy(frames.payload(), data + at, n);
    at += n;
    payload_bytes_read += n;
    auto item = frames.OnPayload();
    (void)frames.TakeDropped();
    if (!item) continue;
    claims.Unclaim(item->charge);  // its consumer is done with it
    if (!item->error.ok()) continue;
    if (!IsMessage(item->type) || item->payload.size() > max_message_bytes) std::abort();
    delivered_bytes += item->payload.size();
    if (delivered_bytes > payload_bytes_read) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  constexpr uint64_t kLimits[4] = {ckpt::ipc::kDefaultTcpMaxMessageBytes, uint64_t{4} << 20,
                                   ckpt::ipc::kTcpMaxFramePayload + 1, 1000};
  const uint64_t max_message_bytes = kLimits[(mode >> 3) & 3];
  Claims claims((mode & 32) != 0 ? uint64_t{64} << 20 : ~uint64_t{0});
  {
    FrameAssembler frames("fuzz peer", max_message_bytes, &claims);
    Feed(data, size, mode, max_message_bytes, frames, claims);
    if (frames.charge_held() != claims.held()) std::abort();
  }
  if (claims.held() != 0) std::abort();  // the assembler kept a claim
  return 0;
}
