#include "ckpt/ipc/ring_image.h"

#include <cstring>
#include <string>
#include <vector>

#include "ckpt/format/checksum.h"
#include "layout.h"
#include "ring.h"

namespace ckpt::ipc {
namespace {

// Walks the records from tail as a reader would and reseals each header that
// carries the magic, so the reader's later checks see mutated fields.
void RepairChecksums(std::vector<uint8_t>* ring, const RingImageOptions& options) {
  const uint64_t n = ring->size();
  uint64_t pos = options.tail;
  uint64_t steps = 0;
  while (pos < options.head && options.head - pos <= n && steps++ < n / layout::kAlign) {
    const uint64_t offset = pos & (n - 1);
    layout::RecordHeader h;
    std::memcpy(&h, ring->data() + offset, sizeof(h));
    if (h.magic != layout::kRecordMagic || h.payload_bytes > n - layout::kAlign) return;
    const uint64_t record = layout::kAlign + layout::RoundUp64(h.payload_bytes);
    if (offset + record > n) return;
    h.payload_xxh3 = Xxh3_64(ring->data() + offset + layout::kAlign, h.payload_bytes);
    h.header_xxh3 = Xxh3_64(&h, layout::kRecordHeaderChecked);
    std::memcpy(ring->data() + offset, &h, sizeof(h));
    pos += record;
  }
}

}  // namespace

RingImageScan ScanRingImage(
    const uint8_t* image, size_t ring_bytes, const RingImageOptions& options,
    const std::function<void(RecordType, const uint8_t*, size_t)>& on_message) {
  RingImageScan scan;
  if (image == nullptr || ring_bytes < layout::kMinRecordRingBytes ||
      (ring_bytes & (ring_bytes - 1)) != 0 || options.tail % layout::kAlign != 0 ||
      options.tail > options.head) {
    scan.broken = true;
    return scan;
  }
  // A private, exactly sized copy: the reader may only read inside it.
  std::vector<uint8_t> ring(image, image + ring_bytes);
  if (options.repair_checksums) RepairChecksums(&ring, options);
  layout::RingHeader header{};
  header.head.raw = options.head;
  header.tail.raw = options.tail;
  internal::RingReader reader(&header, ring.data(), ring_bytes, options.max_message_bytes,
                              "ring image", options.first_sequence);
  // Every Next() consumes at least one record or ends the scan.
  for (uint64_t i = 0; i <= ring_bytes / layout::kAlign + 1; ++i) {
    internal::RingReader::Message m;
    std::string error;
    switch (reader.Next(&m, &error)) {
      case internal::RingReader::Result::kMessage:
        ++scan.messages;
        scan.message_bytes += m.size;
        if (on_message) on_message(m.type, m.payload, m.size);
        continue;
      case internal::RingReader::Result::kBad:
        ++scan.bad_records;
        continue;
      case internal::RingReader::Result::kBroken:
        scan.broken = true;
        return scan;
      case internal::RingReader::Result::kEmpty:
        return scan;
    }
  }
  return scan;
}

}  // namespace ckpt::ipc
