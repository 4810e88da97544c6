// Fuzz target for the checkpoint reader: arbitrary bytes must give a Status,
// never a crash, an out-of-bounds read or a view that escapes the blob; a blob
// that parses must re-encode to one that parses to the same tensors.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ckpt/format/checkpoint.h"

using ckpt::format::CheckpointWriter;
using ckpt::format::ParseCheckpoint;
using ckpt::format::ReadOptions;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Copy into an exactly-sized heap block so ASan sees any read past the end.
  std::vector<uint8_t> blob(data, data + size);
  ReadOptions options;
  options.max_header_bytes = 1 << 20;
  for (int mode = 0; mode < 3; ++mode) {
    options.verify_header_checksum = mode == 2;
    options.verify_checksums = mode >= 1;
    auto view = ParseCheckpoint(blob.data(), blob.size(), options);
    if (!view.ok()) continue;
    CheckpointWriter writer;
    writer.SetMeta(view->meta());
    for (const auto& t : view->tensors()) {
      if (t.data < blob.data() || t.data + t.nbytes > blob.data() + blob.size()) std::abort();
      if (!writer.AddTensor(t.name, t.dtype, t.shape, t.data, t.nbytes).ok()) std::abort();
    }
    const std::string again = writer.Encode();
    auto reread = ParseCheckpoint(again.data(), again.size());
    if (!reread.ok() || reread->tensors().size() != view->tensors().size()) std::abort();
    for (size_t i = 0; i < view->tensors().size(); ++i) {
      const auto& a = view->tensors()[i];
      const auto& b = reread->tensors()[i];
      if (a.name != b.name || a.shape != b.shape || a.nbytes != b.nbytes ||
          std::memcmp(a.data, b.data, a.nbytes) != 0) {
        std::abort();
      }
    }
  }
  return 0;
}
