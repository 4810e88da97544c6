// Byte layout of the ckpt::ipc TCP transport (tcp_channel.cc), version 2:
// the frames below travel inside TLS 1.3 (tls.h); the TLS handshake comes
// first and replaces version 1's challenge-response frames.
//
// A connection is a stream of frames in each direction. Integers are little
// endian (the only byte order ckpt builds for; asserted below, so a big-endian
// port must add conversions here rather than misread silently).
//
//   frame = FrameHeader (64 bytes) + payload (payload_bytes, no padding)
//
// FrameHeader mirrors the ring's RecordHeader (layout.h) with its own magic:
//   magic            "ckpT"
//   type             a message RecordType (kHello..kShutdown), kFragment, or
//                    one of the transport types below
//   flags            kFlagFirst / kFlagLast on fragments, 0 otherwise
//   sequence         per direction: 1 for the first frame, +1 per frame
//                    (heartbeats included)
//   payload_bytes    at most kTcpMaxFramePayload (so a frame's buffer is
//                    bounded before its length is trusted any further)
//   payload_xxh3     XXH3-64 of the payload
//   message_bytes    the whole message: payload_bytes unless a fragment; at
//                    most ChannelOptions::max_message_bytes
//   message_type     the message's RecordType (== type unless a fragment)
//   fragment_offset  payload bytes of the message before this frame
//   header_xxh3      XXH3-64 of bytes [0, 56)
//
// After the handshake: HEARTBEAT frames (no payload) whenever a side has sent
// nothing for its heartbeat interval; messages as single frames or runs of
// kFragment frames (First ... Last, contiguous offsets, one type and total).
// HEARTBEAT frames may sit between the fragments of a message. A message frame
// or a First fragment arriving while a fragmented message is incomplete drops
// the incomplete one (its sender gave up on it).
//
// The reader is a trust boundary (TLS authenticates the peer and every
// byte, but a peer holding the secret may still be hostile or broken): it checks magic, header
// checksum, a known type, known flags, payload_bytes, message_bytes, sequence == previous + 1 and
// the fragment bookkeeping before it reads the payload; any failure there loses the stream's
// framing, so the channel's receive side is broken for good (Corruption). A payload whose XXH3 does
// not match is skipped (the header's length is trusted by then) and reported once as Corruption.
// These reader rules are code in one place, FrameAssembler (tcp_frame_reader.h), which the channel
// and the fuzz target tests/fuzz/tcp_frame_fuzz.cc share. Once the header passes them, the reader
// claims the message's buffer (its type and message_bytes against the receiver's limit, its size
// plus kTcpReceivedItemBytes against its memory budget; ckpt/ipc/tcp_channel.h) before it
// allocates the buffer, at exactly that size; a refused claim breaks the stream like a bad header.
#ifndef CKPT_IPC_SRC_TCP_FRAME_H_
#define CKPT_IPC_SRC_TCP_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ckpt::ipc::wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP frames are little endian");

inline constexpr uint32_t kFrameMagic = 0x54706b63u;  // "ckpT"
inline constexpr uint32_t kProtocolVersion = 2;       // also in the TLS PSK identity (tls.cc)

// Transport-only frame types, outside RecordType's range.
inline constexpr uint16_t kTypeHeartbeat = 64;

inline constexpr uint16_t kFlagFirst = 1;
inline constexpr uint16_t kFlagLast = 2;
inline constexpr uint16_t kKnownFlags = kFlagFirst | kFlagLast;

struct FrameHeader {
  uint32_t magic;            // kFrameMagic
  uint16_t type;             // RecordType or kType*
  uint16_t flags;            // kFlag* on fragments, 0 otherwise
  uint64_t sequence;         // see above
  uint64_t payload_bytes;    // this frame's payload
  uint64_t payload_xxh3;     // XXH3-64 of the payload
  uint64_t message_bytes;    // the whole message
  uint16_t message_type;     // the message's RecordType
  uint16_t reserved16;       // 0
  uint32_t reserved32;       // 0
  uint64_t fragment_offset;  // payload bytes of the message before this frame
  uint64_t header_xxh3;      // XXH3-64 of bytes [0, 56)
};
static_assert(std::is_trivially_copyable_v<FrameHeader>);
static_assert(std::is_standard_layout_v<FrameHeader>);
static_assert(sizeof(FrameHeader) == 64);
static_assert(offsetof(FrameHeader, sequence) == 8 && offsetof(FrameHeader, payload_bytes) == 16);
static_assert(offsetof(FrameHeader, message_type) == 40);
static_assert(offsetof(FrameHeader, fragment_offset) == 48);
static_assert(offsetof(FrameHeader, header_xxh3) == 56);
inline constexpr size_t kHeaderChecked = offsetof(FrameHeader, header_xxh3);

}  // namespace ckpt::ipc::wire

#endif  // CKPT_IPC_SRC_TCP_FRAME_H_
