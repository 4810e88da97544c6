#include "ring.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <utility>

#include "ckpt/format/checksum.h"
#include "futex.h"
#include "payload_checksum.h"

namespace ckpt::ipc::internal {

using layout::kAlign;
using layout::RecordHeader;

namespace {

void SealHeader(RecordHeader* h) { h->header_xxh3 = Xxh3_64(h, layout::kRecordHeaderChecked); }

std::string At(const std::string& ring, uint64_t position) {
  return ring + " at position " + std::to_string(position);
}

// Why a record header at data offset `offset`, with `available` bytes
// published from there, cannot be trusted (its length included), or nothing
// when it can. The checks run in layout.h's order.
std::optional<std::string> UntrustedHeaderReason(const RecordHeader& h, uint64_t offset,
                                                 uint64_t available, uint64_t ring_bytes) {
  if (h.magic != layout::kRecordMagic) return "bad record magic";
  if (Xxh3_64(&h, layout::kRecordHeaderChecked) != h.header_xxh3) {
    return "record header checksum mismatch";
  }
  if (h.type > static_cast<uint16_t>(RecordType::kShutdown)) {
    return "unknown record type " + std::to_string(h.type);
  }
  if (h.payload_bytes > ring_bytes - kAlign) {
    return "payload length " + std::to_string(h.payload_bytes) + " exceeds the ring";
  }
  const uint64_t record_bytes = kAlign + layout::RoundUp64(h.payload_bytes);
  if (offset + record_bytes > ring_bytes) {
    return "record of " + std::to_string(record_bytes) + " bytes crosses the ring's end";
  }
  if (record_bytes > available) {
    return "record of " + std::to_string(record_bytes) + " bytes, only " +
           std::to_string(available) + " published";
  }
  return std::nullopt;
}

// A padding record carries no flags or fragment fields and fills exactly to
// the end of the data area.
bool IsWellFormedPadding(const RecordHeader& h, bool fills_to_end) {
  return h.flags == 0 && fills_to_end && h.fragment_offset == 0 &&
         h.message_bytes == h.payload_bytes && h.message_type == h.type && h.reserved16 == 0 &&
         h.reserved32 == 0;
}

// True when a header carries fragment fields: a record that is not a fragment
// describes only itself.
bool HasFragmentFields(const RecordHeader& h) {
  return h.flags != 0 || h.message_type != h.type || h.message_bytes != h.payload_bytes ||
         h.fragment_offset != 0;
}

}  // namespace

// ---------------------------------------------------------------- RingWriter

RingWriter::RingWriter(layout::RingHeader* header, uint8_t* data, uint64_t ring_bytes,
                       std::string name, uint64_t min_window)
    : header_(header),
      data_(data),
      ring_bytes_(ring_bytes),
      name_(std::move(name)),
      grow_(min_window != 0 && min_window < ring_bytes),
      window_(grow_ ? min_window : ring_bytes),
      head_(header->head.LoadRelaxed()) {}

uint64_t RingWriter::WindowFor(uint64_t payload_bytes) const {
  if (!grow_) return window_;
  const uint64_t wanted = kWindowRecords * (kAlign + layout::RoundUp64(payload_bytes));
  uint64_t w = window_;
  while (w < wanted && w < ring_bytes_) w <<= 1;
  return w;
}

uint64_t RingWriter::Need(uint64_t payload_bytes, uint64_t window, uint64_t* pad) const {
  const uint64_t need = kAlign + layout::RoundUp64(payload_bytes);
  const uint64_t offset = head_ & (ring_bytes_ - 1);
  // A record that does not end below the window's end goes to the start; the
  // padding fills to the data area's end, as the consumer demands. In a window
  // smaller than the ring a record also leaves room below the end for that
  // padding's header, so nothing at all is written past the window.
  const uint64_t end = window < ring_bytes_ ? window - kAlign : window;
  *pad = offset + need > end ? ring_bytes_ - offset : 0;
  return need;
}

bool RingWriter::HasRoom(uint64_t payload_bytes) const {
  uint64_t pad = 0;
  const uint64_t need = Need(payload_bytes, WindowFor(payload_bytes), &pad);
  const uint64_t tail = header_->tail.LoadSeqCst();
  if (tail > head_ || head_ - tail > ring_bytes_) return true;  // let TryReserve report it
  return ring_bytes_ - (head_ - tail) >= pad + need;
}

uint64_t RingWriter::used() const {
  const uint64_t tail = header_->tail.LoadRelaxed();
  if (tail > head_) return 0;
  uint64_t used = head_ - tail;
  // The latest padding, while unreleased, is not records' bytes.
  if (tail < pad_end_) used -= std::min(used, pad_end_ - std::max(tail, pad_start_));
  return used;
}

RingWriter::Result RingWriter::TryReserve(const RecordSpec& spec, uint8_t** payload,
                                          std::string* error) {
  uint64_t pad = 0;
  const uint64_t window = WindowFor(spec.payload_bytes);
  const uint64_t need = Need(spec.payload_bytes, window, &pad);
  // Acquire: the consumer is done with the bytes before tail.
  const uint64_t tail = header_->tail.LoadAcquire();
  if (tail > head_ || head_ - tail > ring_bytes_ || tail % kAlign != 0) {
    *error = name_ + ": consumer position " + std::to_string(tail) +
             " is impossible (producer at " + std::to_string(head_) + ")";
    return Result::kBroken;
  }
  if (ring_bytes_ - (head_ - tail) < pad + need) return Result::kFull;
  window_ = window;
  if (pad != 0) {
    RecordHeader h{};
    h.magic = layout::kRecordMagic;
    h.type = static_cast<uint16_t>(RecordType::kPadding);
    h.sequence = sequence_;
    h.payload_bytes = pad - kAlign;
    h.message_bytes = h.payload_bytes;
    h.message_type = static_cast<uint16_t>(RecordType::kPadding);
    SealHeader(&h);
    std::memcpy(data_ + (head_ & (ring_bytes_ - 1)), &h, sizeof(h));
  }
  pending_ = true;
  pending_pad_ = pad;
  pending_pos_ = head_ + pad;
  pending_spec_ = spec;
  *payload = data_ + (pending_pos_ & (ring_bytes_ - 1)) + kAlign;
  return Result::kReserved;
}

void RingWriter::Commit() {
  const uint8_t* payload = data_ + (pending_pos_ & (ring_bytes_ - 1)) + kAlign;
  Commit(PayloadXxh3(payload, pending_spec_.payload_bytes));
}

void RingWriter::Commit(uint64_t payload_xxh3) {
  const RecordSpec& s = pending_spec_;
  uint8_t* record = data_ + (pending_pos_ & (ring_bytes_ - 1));
  RecordHeader h{};
  h.magic = layout::kRecordMagic;
  h.type = static_cast<uint16_t>(s.type);
  h.flags = s.flags;
  h.sequence = sequence_ + (pending_pad_ != 0 ? 1 : 0);
  h.payload_bytes = s.payload_bytes;
  h.payload_xxh3 = payload_xxh3;
  h.message_bytes = s.message_bytes;
  h.message_type = static_cast<uint16_t>(s.message_type);
  h.fragment_offset = s.fragment_offset;
  SealHeader(&h);
  std::memcpy(record, &h, sizeof(h));
  sequence_ = h.sequence + 1;
  if (pending_pad_ != 0) {
    pad_start_ = pending_pos_ - pending_pad_;
    pad_end_ = pending_pos_;
  }
  head_ = pending_pos_ + kAlign + layout::RoundUp64(s.payload_bytes);
  pending_ = false;
  // Seq_cst store: publishes the record (release) and orders against the
  // consumer_waiting load below (see layout.h, RingHeader::head).
  header_->head.StoreSeqCst(head_);
  if (header_->consumer_waiting.LoadSeqCst() != 0) FutexBumpAndWake(&header_->head_wake);
}

// ---------------------------------------------------------------- RingReader

RingReader::RingReader(layout::RingHeader* header, const uint8_t* data, uint64_t ring_bytes,
                       uint64_t max_message_bytes, std::string name, uint64_t first_sequence)
    : header_(header),
      data_(data),
      ring_bytes_(ring_bytes),
      max_message_bytes_(max_message_bytes),
      name_(std::move(name)),
      tail_(header->tail.LoadRelaxed()),
      cursor_(tail_),
      expected_sequence_(first_sequence),
      resync_(first_sequence == 0) {}

void RingReader::PublishTail() {
  if (tail_ == cursor_) return;
  tail_ = cursor_;
  // Seq_cst store: returns the bytes (release) and orders against the
  // producer_waiting load below (see layout.h, RingHeader::tail).
  header_->tail.StoreSeqCst(tail_);
  if (header_->producer_waiting.LoadSeqCst() != 0) FutexBumpAndWake(&header_->tail_wake);
}

void RingReader::Release() { PublishTail(); }

void RingReader::DropPartial() {
  if (!assembling_) return;
  assembling_ = false;
  assembly_size_ = 0;
  ++dropped_messages_;
}

bool RingReader::ReserveAssembly(uint64_t bytes) {
  if (bytes <= assembly_capacity_) return true;
  std::unique_ptr<uint8_t[]> bigger(new (std::nothrow) uint8_t[bytes]);
  if (bigger == nullptr) return false;
  if (assembly_size_ != 0) std::memcpy(bigger.get(), assembly_.get(), assembly_size_);
  assembly_ = std::move(bigger);
  assembly_capacity_ = bytes;
  return true;
}

RingReader::Result RingReader::Reject(bool skip_all, uint64_t head, uint64_t record_bytes,
                                      std::string why, std::string* error) {
  *error = At(name_, cursor_) + ": " + why;
  if (skip_all) {
    // The header cannot be trusted, so neither can its length: drop what is
    // published and take the next record's sequence as it comes.
    cursor_ = head;
    resync_ = true;
  } else {
    cursor_ += record_bytes;
  }
  DropPartial();
  PublishTail();
  return Result::kBad;
}

RingReader::Result RingReader::Next(Message* out, std::string* error) {
  PublishTail();
  for (;;) {
    if (broken_) {
      *error = broken_reason_;
      return Result::kBroken;
    }
    // Acquire: the records before head are complete.
    const uint64_t head = header_->head.LoadAcquire();
    if (head == cursor_) return Result::kEmpty;
    if (head < cursor_ || head - tail_ > ring_bytes_ || head % kAlign != 0) {
      broken_ = true;
      broken_reason_ = At(name_, cursor_) + ": producer position " + std::to_string(head) +
                       " is impossible; the ring is unusable";
      *error = broken_reason_;
      return Result::kBroken;
    }
    if (std::optional<Result> result = ReadRecord(head, out, error)) return *result;
  }
}

std::optional<RingReader::Result> RingReader::ReadRecord(uint64_t head, Message* out,
                                                         std::string* error) {
  const uint64_t offset = cursor_ & (ring_bytes_ - 1);
  CheckedRecord r;
  r.head = head;
  // The one copy of the header; nothing below reads the ring's header again.
  std::memcpy(&r.header, data_ + offset, sizeof(r.header));
  const RecordHeader& h = r.header;
  if (std::optional<std::string> why =
          UntrustedHeaderReason(h, offset, head - cursor_, ring_bytes_)) {
    return Reject(true, head, 0, std::move(*why), error);
  }
  r.bytes = kAlign + layout::RoundUp64(h.payload_bytes);
  r.payload = data_ + offset + kAlign;
  // From here on the length is trustworthy: a bad record is skipped alone.
  if (!resync_ && h.sequence != expected_sequence_) {
    const uint64_t seq = h.sequence;
    Result bad = Reject(
        false, head, r.bytes,
        "sequence " + std::to_string(seq) + ", expected " + std::to_string(expected_sequence_),
        error);
    expected_sequence_ = seq + 1;
    return bad;
  }
  resync_ = false;
  expected_sequence_ = h.sequence + 1;

  const auto type = static_cast<RecordType>(h.type);
  if (type == RecordType::kPadding) {
    if (!IsWellFormedPadding(h, offset + r.bytes == ring_bytes_)) {
      return Reject(false, head, r.bytes, "malformed padding record", error);
    }
    cursor_ += r.bytes;
    PublishTail();
    return std::nullopt;
  }
  if (h.reserved16 != 0 || h.reserved32 != 0 || (h.flags & ~layout::kKnownFlags) != 0) {
    return Reject(false, head, r.bytes, "reserved header bits set", error);
  }
  if (type == RecordType::kFragment) return ReadFragment(r, out, error);

  if (HasFragmentFields(h)) {
    return Reject(false, head, r.bytes,
                  std::string(RecordTypeName(type)) + " record with fragment fields set", error);
  }
  if (PayloadXxh3(r.payload, h.payload_bytes) != h.payload_xxh3) {
    return Reject(false, head, r.bytes,
                  std::string(RecordTypeName(type)) + " payload checksum mismatch", error);
  }
  // A whole message ends any partial fragmented one.
  DropPartial();
  out->type = type;
  out->sequence = h.sequence;
  out->payload = r.payload;
  out->size = h.payload_bytes;
  cursor_ += r.bytes;  // held until Release() or the next Next()
  return Result::kMessage;
}

// A fragment: its bookkeeping is validated against the assembly, then its
// payload is copied out and the copy checked, so later writes to the ring
// cannot change what was checked.
std::optional<RingReader::Result> RingReader::ReadFragment(const CheckedRecord& r, Message* out,
                                                           std::string* error) {
  const RecordHeader& h = r.header;
  if (!IsMessageType(h.message_type)) {
    return Reject(false, r.head, r.bytes,
                  "fragment of unknown message type " + std::to_string(h.message_type), error);
  }
  if (h.message_bytes > max_message_bytes_) {
    return Reject(false, r.head, r.bytes,
                  "fragmented message of " + std::to_string(h.message_bytes) +
                      " bytes exceeds the cap of " + std::to_string(max_message_bytes_),
                  error);
  }
  const bool first = (h.flags & layout::kFlagFirst) != 0;
  const bool last = (h.flags & layout::kFlagLast) != 0;
  if (first) {
    if (h.fragment_offset != 0) {
      return Reject(false, r.head, r.bytes, "first fragment at a non-zero offset", error);
    }
    DropPartial();
  } else if (!assembling_ || h.message_type != static_cast<uint16_t>(assembly_type_) ||
             h.message_bytes != assembly_total_ || h.fragment_offset != assembly_size_) {
    return Reject(false, r.head, r.bytes,
                  "fragment at offset " + std::to_string(h.fragment_offset) +
                      " does not continue the message being assembled",
                  error);
  }
  const uint64_t so_far = first ? 0 : assembly_size_;
  if (h.payload_bytes > h.message_bytes - so_far ||
      last != (so_far + h.payload_bytes == h.message_bytes)) {
    return Reject(false, r.head, r.bytes, "fragment lengths do not add up", error);
  }
  if (first) {
    assembling_ = true;
    assembly_type_ = static_cast<RecordType>(h.message_type);
    assembly_total_ = h.message_bytes;
    assembly_sequence_ = h.sequence;
    assembly_size_ = 0;
  }
  if (std::optional<std::string> why = AppendFragment(r, so_far)) {
    return Reject(false, r.head, r.bytes, std::move(*why), error);
  }
  cursor_ += r.bytes;
  PublishTail();
  if (!last) return std::nullopt;
  assembling_ = false;
  out->type = assembly_type_;
  out->sequence = assembly_sequence_;
  out->payload = assembly_.get();
  out->size = assembly_size_;
  return Result::kMessage;
}

std::optional<std::string> RingReader::AppendFragment(const CheckedRecord& r, uint64_t so_far) {
  const RecordHeader& h = r.header;
  // The claimed total is untrusted: room for at most 64 MiB of it up front,
  // then in doublings as fragments actually arrive.
  const uint64_t need = so_far + h.payload_bytes;
  const uint64_t room =
      need <= assembly_capacity_
          ? assembly_capacity_
          : std::min<uint64_t>(h.message_bytes,
                               std::max({need, assembly_capacity_ * 2,
                                         std::min<uint64_t>(h.message_bytes, uint64_t{64} << 20)}));
  if (!ReserveAssembly(room)) {
    const uint64_t total = assembly_total_;
    assembly_.reset();
    assembly_capacity_ = 0;
    assembly_size_ = 0;
    assembling_ = false;
    return "out of memory assembling a message of " + std::to_string(total) + " bytes";
  }
  // Copied out and checked in one pass over the bytes; what is checked is
  // the copy, so later writes to the ring cannot change it.
  if (CopyAndXxh3(assembly_.get() + so_far, r.payload, h.payload_bytes) != h.payload_xxh3) {
    assembly_size_ = so_far;
    return "fragment payload checksum mismatch";
  }
  assembly_size_ = need;
  return std::nullopt;
}

}  // namespace ckpt::ipc::internal
