// When the GPU tests may skip: only where no CUDA device can be expected (a
// build without CKPT_WITH_CUDA, or a host that shows no NVIDIA device to this
// process). Where one is visible, a trainer or worker that cannot use it is a
// failure: a broken CUDA path must not read as "skipped".
#ifndef CKPT_TESTS_GPU_CUDA_VISIBLE_H_
#define CKPT_TESTS_GPU_CUDA_VISIBLE_H_

#include <dirent.h>

#include <cstdlib>
#include <regex>
#include <string>

namespace ckpt::testing {

// "" when this build has CUDA code and a CUDA device is visible; else why not.
inline std::string NoCudaDevice() {
#if !CKPT_GPU_TEST_WITH_CUDA
  return "this build has no CUDA code (CKPT_WITH_CUDA=OFF)";
#else
  if (const char* v = std::getenv("CUDA_VISIBLE_DEVICES"); v != nullptr) {
    const std::string s = v;
    if (s.empty() || s == "-1" || s == "none" || s == "NoDevFiles") {
      return "CUDA_VISIBLE_DEVICES='" + s + "' hides every device";
    }
  }
  // The driver's device files: /dev/nvidia0, /dev/nvidia1, ...
  DIR* d = opendir("/dev");
  if (d == nullptr) return "cannot list /dev";
  static const std::regex device("nvidia[0-9]+");
  bool found = false;
  while (dirent* e = readdir(d)) found = found || std::regex_match(e->d_name, device);
  closedir(d);
  return found ? "" : "no CUDA device on this host (no /dev/nvidiaN)";
#endif
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_GPU_CUDA_VISIBLE_H_
