#include "tcp_frame_reader.h"

#include <algorithm>
#include <utility>

#include "ckpt/ipc/tcp_channel.h"
#include "payload_checksum.h"
#include "tcp_io.h"

namespace ckpt::ipc::internal {

FrameAssembler::~FrameAssembler() {
  Unclaim(&single_charge_);
  Unclaim(&partial_charge_);
  Unclaim(&skip_charge_);
}

Status FrameAssembler::Claim(uint16_t type, uint64_t message_bytes, uint64_t payload_bytes,
                             uint64_t* charge) {
  const uint64_t want = payload_bytes + kTcpReceivedItemBytes;
  if (claims_ != nullptr) {
    CKPT_RETURN_IF_ERROR(claims_->Claim(static_cast<RecordType>(type), message_bytes, want));
  }
  *charge = want;
  return Status::OK();
}

void FrameAssembler::Unclaim(uint64_t* charge) {
  const uint64_t c = std::exchange(*charge, 0);
  if (claims_ != nullptr && c != 0) claims_->Unclaim(c);
}

void FrameAssembler::DropPartial() {
  if (!partial_) return;
  partial_.reset();
  Unclaim(&partial_charge_);
  ++dropped_;
}

Status FrameAssembler::OnHeader(const wire::FrameHeader& h) {
  dst_ = nullptr;
  skip_ = false;
  Status s = CheckHeader(h, peer_);
  const bool fragment = h.type == static_cast<uint16_t>(RecordType::kFragment);
  if (s.ok() && h.sequence != expect_seq_) {
    s = Status::Corruption("frame from " + peer_ + ": sequence " + std::to_string(h.sequence) +
                           ", expected " + std::to_string(expect_seq_));
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
              h.message_bytes > max_message_bytes_ || h.fragment_offset > h.message_bytes ||
              h.payload_bytes > h.message_bytes - h.fragment_offset ||
              ((h.flags & wire::kFlagLast) != 0) !=
                  (h.fragment_offset + h.payload_bytes == h.message_bytes) ||
              ((h.flags & wire::kFlagFirst) != 0) != (h.fragment_offset == 0))) {
    s = Status::Corruption("frame from " + peer_ + ": bad fragment header (offset " +
                           std::to_string(h.fragment_offset) + " of " +
                           std::to_string(h.message_bytes) + ")");
  }
  if (!s.ok()) {
    header_ = wire::FrameHeader{};
    return s;
  }
  header_ = h;
  ++expect_seq_;
  if (h.type == wire::kTypeHeartbeat) return Status::OK();
  // A new message while a fragmented one is incomplete: its sender gave up.
  if (partial_ && (!fragment || (h.flags & wire::kFlagFirst) != 0)) DropPartial();
  if (!fragment) {
    single_ = PayloadBytes();
    Unclaim(&single_charge_);
    s = Claim(h.type, h.payload_bytes, h.payload_bytes, &single_charge_);
    if (!s.ok()) return Refused(s);
    single_.resize(h.payload_bytes);  // exactly: allocated from empty
    dst_ = single_.data();
    return Status::OK();
  }
  if ((h.flags & wire::kFlagFirst) != 0) {
    s = Claim(h.message_type, h.message_bytes, h.message_bytes, &partial_charge_);
    if (!s.ok()) return Refused(s);
    partial_.emplace();
    partial_->type = static_cast<RecordType>(h.message_type);
    partial_->sequence = h.sequence;
    partial_total_ = h.message_bytes;
    // The claim at once: the buffer never moves, and its pages become
    // resident only as payloads are written into them.
    partial_->payload.reserve(h.message_bytes);
  } else if (!partial_ || partial_total_ != h.message_bytes ||
             static_cast<uint16_t>(partial_->type) != h.message_type ||
             partial_->payload.size() != h.fragment_offset) {
    // The rest of a message already dropped (bad payload before), or one
    // that does not continue the current one: skip it.
    DropPartial();
    s = Claim(h.message_type, h.message_bytes, h.payload_bytes, &skip_charge_);
    if (!s.ok()) return Refused(s);
    skip_ = true;
    discard_.resize(h.payload_bytes);
    dst_ = discard_.data();
    return Status::OK();
  }
  const size_t at = partial_->payload.size();
  partial_->payload.resize(at + h.payload_bytes);  // within the reserved claim
  dst_ = partial_->payload.data() + at;
  return Status::OK();
}

Status FrameAssembler::Refused(const Status& why) {
  header_ = wire::FrameHeader{};
  return Status::Corruption("frame from " + peer_ + ": " + why.message());
}

std::optional<ReceivedItem> FrameAssembler::OnPayload() {
  const wire::FrameHeader h = std::exchange(header_, wire::FrameHeader{});
  if (skip_) {
    discard_ = PayloadBytes();
    Unclaim(&skip_charge_);
  }
  if (h.magic != wire::kFrameMagic || h.type == wire::kTypeHeartbeat || skip_) return std::nullopt;
  const bool fragment = h.type == static_cast<uint16_t>(RecordType::kFragment);
  if (PayloadXxh3(dst_, h.payload_bytes) != h.payload_xxh3) {
    if (fragment) {
      partial_.reset();
      Unclaim(&partial_charge_);
    } else {
      single_ = PayloadBytes();
      Unclaim(&single_charge_);
    }
    ReceivedItem bad;
    bad.error = Status::Corruption("record " + std::to_string(h.sequence) + " from " + peer_ +
                                   ": payload checksum mismatch (skipped)");
    return bad;
  }
  if (!fragment) {
    ReceivedItem item;
    item.type = static_cast<RecordType>(h.type);
    item.sequence = h.sequence;
    item.payload = std::move(single_);
    item.charge = std::exchange(single_charge_, 0);
    single_ = {};
    return item;
  }
  if ((h.flags & wire::kFlagLast) == 0) return std::nullopt;
  ReceivedItem done = std::move(*partial_);
  done.charge = std::exchange(partial_charge_, 0);
  partial_.reset();
  return done;
}

}  // namespace ckpt::ipc::internal
