// Fuzz target for the zip directory check that runs before LibTorch's reader
// opens a .pt archive (tools/src/pt_archive.h). The input is the file,
// written to a temporary path (the check reads a file by its path). Any
// input must give OK or a Corruption (IOError only if the write failed),
// never a crash, a read out of bounds or an allocation past the file.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "pt_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/pt_archive_fuzz." +
           std::to_string(getpid()) + ".pt";
  }();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    if (!out) return 0;
  }
  const ckpt::Status s = ckpt::tool::CheckPtRecordsStored(path);
  unlink(path.c_str());
  if (!s.ok() && !s.IsCorruption()) std::abort();
  return 0;
}
