// The zip directory of a .pt archive, read before LibTorch's reader touches
// it: PyTorchStreamReader::getRecord allocates what a record's directory
// entry claims, its uncompressed size, and inflates into it, so a deflated
// record of a few hundred kilobytes holds it to gigabytes (a 261 KB file
// made it fill 256 MiB). torch.save stores every record as it is (zip method
// 0, whose size miniz checks against the file), so a .pt whose records are
// all stored costs at most the file per record; anything else is refused
// here, before an allocation.
//
// Layout read (PKWARE APPNOTE 4.3): the end-of-central-directory record (its
// signature searched from the end, over at most 64 KiB of comment, as miniz
// does), the ZIP64 locator and record when a locator precedes it, then every
// central-directory entry: method (u16 at 10), sizes (u32 at 20 and 24, or
// the ZIP64 extra field's u64s when 0xFFFFFFFF), name, extra and comment
// lengths (u16 at 28, 30, 32).
//
// Thread-safety: pure function (reads the file).
#ifndef CKPT_TOOLS_SRC_PT_ARCHIVE_H_
#define CKPT_TOOLS_SRC_PT_ARCHIVE_H_

#include <cstdint>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::tool {

// OK when every record of the zip archive at `path` is stored (method 0)
// and no larger than the file. Corruption naming `path` and the record for
// a compressed record ("record R is compressed (zip method 8) ...") or one
// that claims more bytes than the file holds; Corruption "PATH is not a
// readable .pt archive: ..." for a directory that is missing, truncated or
// outside the file; InvalidArgument for a path that is not a regular file
// (a FIFO is not waited on); IOError naming it when it cannot be opened or
// read. Reads the directory only: memory is bounded by
// the directory's size, itself checked to lie inside the file.
Status CheckPtRecordsStored(const std::string& path);

}  // namespace ckpt::tool

#endif  // CKPT_TOOLS_SRC_PT_ARCHIVE_H_
