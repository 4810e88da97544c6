// The two ends of one ring of layout.h: RingWriter (the producer) and
// RingReader (the consumer, a trust boundary). Neither waits: a Channel waits
// around them on the ring's futex words.
//
// Thread-safety: each object is used by one thread at a time (one producer
// thread, one consumer thread per ring). The ring's bytes are shared with the
// other process under the protocol of layout.h.
#ifndef CKPT_IPC_SRC_RING_H_
#define CKPT_IPC_SRC_RING_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/ipc/messages.h"
#include "layout.h"

namespace ckpt::ipc::internal {

// What one record says about itself, besides its payload.
struct RecordSpec {
  RecordType type = RecordType::kPadding;
  uint16_t flags = 0;
  uint64_t payload_bytes = 0;
  RecordType message_type = RecordType::kPadding;
  uint64_t message_bytes = 0;
  uint64_t fragment_offset = 0;
};

// The window: a writer places its records in the first window() bytes of the
// data area and, when the next record does not fit below the window's end,
// pads to the end of the data area (a padding record the consumer skips
// unread; see layout.h). No byte past the window is written, so the shared
// memory a ring costs is its window, not ring_bytes. A growing window
// starts at `min_window` and doubles, before a record is placed, until it holds
// kWindowRecords records of that size (at most ring_bytes); it never shrinks.
// The consumer needs no part of this: every record still lies inside the data
// area and every padding record fills exactly to its end.
class RingWriter {
 public:
  enum class Result { kReserved, kFull, kBroken };

  // Records of the largest size sent so far that a growing window holds.
  static constexpr uint64_t kWindowRecords = 4;

  // REQUIRES: ring_bytes is a power of two >= kMinRecordRingBytes; `data` holds
  // ring_bytes bytes; min_window is 0 (the whole ring from the start, never
  // growing) or a power of two >= kMinRecordRingBytes (taken as ring_bytes when
  // larger). Starts at the header's current head, sequence 1.
  RingWriter(layout::RingHeader* header, uint8_t* data, uint64_t ring_bytes, std::string name,
             uint64_t min_window = 0);

  uint64_t ring_bytes() const { return ring_bytes_; }
  uint64_t max_payload() const { return layout::MaxRecordPayload(ring_bytes_); }
  // Bytes at the start of the data area that records have been placed in, or
  // will be: the ring's memory footprint.
  uint64_t window() const { return window_; }

  // Reserves room for one record (and the padding before a wrap, written now
  // but published with the record). kReserved: *payload points at
  // spec.payload_bytes writable bytes in the ring. kFull: the consumer has not
  // released enough yet. kBroken: the consumer's tail is impossible (*error).
  // REQUIRES: spec.payload_bytes <= max_payload(); no reservation pending.
  Result TryReserve(const RecordSpec& spec, uint8_t** payload, std::string* error);
  // True when a record of `payload_bytes` fits now (sequentially consistent
  // read of tail: the re-check before sleeping).
  bool HasRoom(uint64_t payload_bytes) const;
  // Checksums and publishes the pending record and wakes a sleeping consumer.
  void Commit();
  // Publishes the pending record with `payload_xxh3`, the PayloadXxh3 of its
  // payload that the caller computed while writing it (CopyAndXxh3), so the
  // payload is not read a second time. A wrong value makes the consumer
  // reject the record.
  void Commit(uint64_t payload_xxh3);
  // Forgets the pending record; nothing of it becomes visible.
  void Abandon() { pending_ = false; }
  bool pending() const { return pending_; }

  // Bytes of records published and not yet released, as of the last read of
  // tail (the padding before the latest wrap is not counted).
  uint64_t used() const;
  layout::RingHeader* header() const { return header_; }

 private:
  // The window a record of `payload_bytes` is placed in: window_, grown for it.
  uint64_t WindowFor(uint64_t payload_bytes) const;
  // Bytes the record takes; *pad: padding before it (to the end of the data
  // area) when it does not fit below the end of `window`.
  uint64_t Need(uint64_t payload_bytes, uint64_t window, uint64_t* pad) const;

  layout::RingHeader* const header_;
  uint8_t* const data_;
  const uint64_t ring_bytes_;
  const std::string name_;
  const bool grow_;
  uint64_t window_;
  uint64_t head_;          // authoritative; only stored to the header
  uint64_t sequence_ = 1;  // of the next record
  bool pending_ = false;
  uint64_t pending_pad_ = 0;
  uint64_t pending_pos_ = 0;  // position of the pending record (after padding)
  uint64_t pad_start_ = 0;    // the latest padding record: [pad_start_, pad_end_)
  uint64_t pad_end_ = 0;
  RecordSpec pending_spec_;
};

class RingReader {
 public:
  enum class Result { kMessage, kEmpty, kBad, kBroken };

  struct Message {
    RecordType type = RecordType::kPadding;
    uint64_t sequence = 0;
    const uint8_t* payload = nullptr;
    size_t size = 0;
  };

  // REQUIRES: as RingWriter. Fragmented messages above `max_message_bytes` are
  // rejected. Starts at the header's current tail, expecting `first_sequence`
  // (0: whatever the first record says).
  RingReader(layout::RingHeader* header, const uint8_t* data, uint64_t ring_bytes,
             uint64_t max_message_bytes, std::string name, uint64_t first_sequence = 1);

  // Releases the message held from the previous call, then reads what is
  // published: skips padding, assembles fragments.
  //  kMessage: *out is the next message, valid until the next Next()/Release().
  //  kEmpty:   nothing (more) is published; a partial fragmented message is kept.
  //  kBad:     one record (or, with an untrusted header, everything published)
  //            was rejected and skipped; *error says why. Call again to go on.
  //  kBroken:  the ring's positions are impossible; every later call says so.
  Result Next(Message* out, std::string* error);
  // Gives the held in-place record back to the producer. Idempotent.
  void Release();
  // True when the producer has published past what this reader consumed
  // (sequentially consistent read of head: the re-check before sleeping).
  bool HasData() const { return header_->head.LoadSeqCst() != cursor_; }

  // Partial fragmented messages dropped because the producer started another.
  uint64_t dropped_messages() const { return dropped_messages_; }
  layout::RingHeader* header() const { return header_; }

 private:
  // A record whose header was copied once and checked, so that its length is
  // trusted.
  struct CheckedRecord {
    layout::RecordHeader header;       // the one copy of the ring's header
    const uint8_t* payload = nullptr;  // in the ring, header.payload_bytes long
    uint64_t bytes = 0;                // the record's header and padded payload
    uint64_t head = 0;                 // the producer's position it was read below
  };

  // Advances the released position to cursor_ and wakes a sleeping producer.
  void PublishTail();
  void DropPartial();
  // Makes room for `bytes` assembled bytes, keeping those assembled so far.
  // False when the allocation fails. Never zero-fills: every byte is written
  // by a fragment's copy before it is read.
  bool ReserveAssembly(uint64_t bytes);
  Result Reject(bool skip_all, uint64_t head, uint64_t record_bytes, std::string why,
                std::string* error);

  // Reads the record at cursor_, below the published `head`: kMessage (*out
  // set), kBad (rejected, as Reject), or nothing when the record was consumed
  // without a message to deliver (padding, a fragment before the last).
  std::optional<Result> ReadRecord(uint64_t head, Message* out, std::string* error);
  // ReadRecord for a fragment: adds it to the assembly; kMessage after the last.
  std::optional<Result> ReadFragment(const CheckedRecord& r, Message* out, std::string* error);
  // Copies the fragment's payload into the assembly after its first `so_far`
  // bytes and checks the copy; why it could not (memory, checksum), or nothing.
  std::optional<std::string> AppendFragment(const CheckedRecord& r, uint64_t so_far);

  layout::RingHeader* const header_;
  const uint8_t* const data_;
  const uint64_t ring_bytes_;
  const uint64_t max_message_bytes_;
  const std::string name_;
  uint64_t tail_;    // released; authoritative, only stored to the header
  uint64_t cursor_;  // read; > tail_ while an in-place record is held
  uint64_t expected_sequence_;
  bool resync_;  // accept the next record's sequence as is
  bool broken_ = false;
  std::string broken_reason_;

  // Fragment assembly.
  bool assembling_ = false;
  RecordType assembly_type_ = RecordType::kPadding;
  uint64_t assembly_total_ = 0;
  uint64_t assembly_sequence_ = 0;
  std::unique_ptr<uint8_t[]> assembly_;  // kept between messages
  uint64_t assembly_size_ = 0;
  uint64_t assembly_capacity_ = 0;
  uint64_t dropped_messages_ = 0;
};

// True for the types a Channel delivers (HELLO .. SHUTDOWN).
inline bool IsMessageType(uint16_t type) {
  return type >= static_cast<uint16_t>(RecordType::kHello) &&
         type <= static_cast<uint16_t>(RecordType::kShutdown);
}

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_RING_H_
