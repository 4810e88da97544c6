// Fuzz target for the ring's record reader and the message decoders.
//
// Input byte 0 picks the target:
//   0-6   the message decoder of HELLO .. SHUTDOWN over bytes [1, n); a message
//         that decodes must re-encode to one that decodes to the same fields.
//   7-8   a ring image read by ScanRingImage (the Channel receiver's code):
//         byte 1: bit 0 reseal checksums (reaches the checks behind them),
//                 bit 1 expect sequence 1 first (else whatever comes)
//         byte 2: ring size 2^(8 + b % 9) bytes (256 B .. 64 KiB)
//         bytes 3-4, 5-6: tail and head - tail, in 64-byte units (LE)
//         the rest: the ring's bytes, zero-filled to the ring size.
//         Every delivered message also goes through its decoder.
// Any input must give a Status, never a crash or a read out of bounds.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ckpt/ipc/messages.h"
#include "ckpt/ipc/ring_image.h"

namespace {

using namespace ckpt::ipc;  // NOLINT

bool SameDouble(double a, double b) { return a == b || (std::isnan(a) && std::isnan(b)); }

template <typename M, typename DecodeFn>
M RoundTrip(const M& m, DecodeFn decode, std::vector<uint8_t>* buf) {
  buf->assign(EncodedSize(m), 0);
  if (buf->empty() || !Encode(m, buf->data(), buf->size()).ok()) std::abort();
  auto again = decode(buf->data(), buf->size());
  if (!again.ok()) std::abort();
  return *again;
}

void DecodeOne(int which, const uint8_t* p, size_t n) {
  std::vector<uint8_t> buf;
  switch (which) {
    case 0: {
      auto m = DecodeHello(p, n);
      if (!m.ok()) return;
      Hello b = RoundTrip(*m, DecodeHello, &buf);
      if (b.device != m->device || b.memory_bytes != m->memory_bytes || b.slots != m->slots ||
          b.fusion != m->fusion || b.pid != m->pid) {
        std::abort();
      }
      return;
    }
    case 1: {
      auto m = DecodeConfigure(p, n);
      if (!m.ok()) return;
      Configure b = RoundTrip(*m, DecodeConfigure, &buf);
      if (b.experiment != m->experiment || b.model_spec != m->model_spec ||
          b.batch_size != m->batch_size || b.seed != m->seed || b.optimizer != m->optimizer ||
          b.loss != m->loss || b.metric != m->metric || b.dataset_path != m->dataset_path ||
          b.tensor_data.has_value() != m->tensor_data.has_value() ||
          (b.tensor_data && (b.tensor_data->path != m->tensor_data->path ||
                             b.tensor_data->format != m->tensor_data->format))) {
        std::abort();
      }
      return;
    }
    case 2: {
      auto m = DecodeTrain(p, n);
      if (!m.ok()) return;
      if (m->state.size != 0 && (m->state.data < p || m->state.data + m->state.size > p + n)) {
        std::abort();
      }
      Train b = RoundTrip(*m, DecodeTrain, &buf);
      if (b.task_id != m->task_id || b.experiment != m->experiment || b.member != m->member ||
          b.steps != m->steps || b.hparams.size() != m->hparams.size() ||
          b.state.size != m->state.size ||
          (b.state.size != 0 && std::memcmp(b.state.data, m->state.data, b.state.size) != 0)) {
        std::abort();
      }
      return;
    }
    case 3: {
      auto m = DecodeResult(p, n);
      if (!m.ok()) return;
      if (m->state.size != 0 && (m->state.data < p || m->state.data + m->state.size > p + n)) {
        std::abort();
      }
      Result b = RoundTrip(*m, DecodeResult, &buf);
      if (b.task_id != m->task_id || b.member != m->member || b.step != m->step ||
          !SameDouble(b.train_loss, m->train_loss) || !SameDouble(b.val_score, m->val_score) ||
          b.state.size != m->state.size) {
        std::abort();
      }
      return;
    }
    case 4: {
      auto m = DecodeFailed(p, n);
      if (!m.ok()) return;
      Failed b = RoundTrip(*m, DecodeFailed, &buf);
      if (b.task_id != m->task_id || b.code != m->code || b.reason != m->reason) std::abort();
      return;
    }
    case 5: {
      auto m = DecodeStats(p, n);
      if (!m.ok()) return;
      Stats b = RoundTrip(*m, DecodeStats, &buf);
      if (b.samples_total != m->samples_total || !SameDouble(b.samples_per_s, m->samples_per_s)) {
        std::abort();
      }
      return;
    }
    case 6: {
      auto m = DecodeShutdown(p, n);
      if (!m.ok()) return;
      if (RoundTrip(*m, DecodeShutdown, &buf).reason != m->reason) std::abort();
      return;
    }
    default:
      return;
  }
}

int DecoderFor(RecordType type) {
  switch (type) {
    case RecordType::kHello:
      return 0;
    case RecordType::kConfigure:
      return 1;
    case RecordType::kTrain:
      return 2;
    case RecordType::kResult:
      return 3;
    case RecordType::kFailed:
      return 4;
    case RecordType::kStats:
      return 5;
    case RecordType::kShutdown:
      return 6;
    default:
      std::abort();  // the reader delivers message types only
  }
}

void ScanOne(const uint8_t* data, size_t size) {
  if (size < 7) return;
  const size_t ring_bytes = size_t{1} << (8 + data[2] % 9);
  RingImageOptions o;
  o.repair_checksums = (data[1] & 1) != 0;
  o.first_sequence = (data[1] & 2) != 0 ? 1 : 0;
  o.tail = uint64_t{static_cast<uint16_t>(data[3] | (data[4] << 8))} * 64;
  o.head = o.tail + uint64_t{static_cast<uint16_t>(data[5] | (data[6] << 8))} * 64;
  o.max_message_bytes = 1 << 20;
  std::vector<uint8_t> ring(ring_bytes, 0);
  std::memcpy(ring.data(), data + 7, std::min(ring_bytes, size - 7));
  uint64_t delivered = 0;
  RingImageScan scan =
      ScanRingImage(ring.data(), ring.size(), o, [&](RecordType type, const uint8_t* p, size_t n) {
        ++delivered;
        // An exactly sized copy, so ASan sees a decoder read past the end.
        std::vector<uint8_t> copy(p, p + n);
        DecodeOne(DecoderFor(type), copy.data(), copy.size());
      });
  if (scan.messages != delivered) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 9;
  if (which <= 6) {
    std::vector<uint8_t> payload(data + 1, data + size);
    DecodeOne(which, payload.data(), payload.size());
  } else {
    ScanOne(data, size);
  }
  return 0;
}
