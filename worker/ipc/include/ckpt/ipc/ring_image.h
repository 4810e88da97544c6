// Reading a ring held in ordinary memory (a dump of a segment's data area, or
// a fuzzer's input) with exactly the code a Channel's receiver runs over shared
// memory. For the libFuzzer target and for offline inspection of a segment.
//
// Thread-safety: pure function.
#ifndef CKPT_IPC_RING_IMAGE_H_
#define CKPT_IPC_RING_IMAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>

#include "ckpt/ipc/messages.h"

namespace ckpt::ipc {

struct RingImageOptions {
  // Published position (the producer's head) and consumed position (tail);
  // the image's byte 0 is position 0 modulo its size. Default: 0, 0.
  uint64_t head = 0;
  uint64_t tail = 0;
  // Sequence number the first record must carry; 0 accepts whatever it says
  // (a dump taken mid-stream). Default: 0.
  uint64_t first_sequence = 0;
  // Fragmented messages above this are rejected. Default: 1 MiB.
  uint64_t max_message_bytes = uint64_t{1} << 20;
  // Rewrite both checksums of every record header met on the way before
  // reading (on a private copy). Off except to fuzz the checks the checksums
  // would otherwise shield from mutated inputs. Default: false.
  bool repair_checksums = false;
};

struct RingImageScan {
  uint64_t messages = 0;       // delivered whole and valid
  uint64_t message_bytes = 0;  // their payload bytes
  uint64_t bad_records = 0;    // rejected (each rejection counts once)
  bool broken = false;         // the positions were impossible
};

// Reads every record between tail and head of `image` (`ring_bytes` bytes, a
// power of two >= 256; otherwise nothing is read and `broken` is set). Each
// delivered message is passed to `on_message`, if given, while its bytes are
// valid.
RingImageScan ScanRingImage(
    const uint8_t* image, size_t ring_bytes, const RingImageOptions& options,
    const std::function<void(RecordType, const uint8_t*, size_t)>& on_message = nullptr);

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_RING_IMAGE_H_
