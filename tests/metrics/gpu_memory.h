// GPU memory held by this process through the CUDA driver API (libcuda.so.1,
// opened at run time, so that tests using it build on any host), for tests
// that need NVML's figures to move on a GPU host.
//
// Thread-compatible. The destructor frees the memory.
#ifndef CKPT_TESTS_METRICS_GPU_MEMORY_H_
#define CKPT_TESTS_METRICS_GPU_MEMORY_H_

#include <cstddef>
#include <string>

namespace ckpt::testing {

class DeviceMemory {
 public:
  // Allocates `bytes` on CUDA device 0 (of this process's visible devices);
  // ok() is false, and why() says why, when that is impossible.
  explicit DeviceMemory(size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  void* lib_ = nullptr;
  int (*free_)(unsigned long long) = nullptr;  // NOLINT(google-runtime-int): the driver's type
  unsigned long long ptr_ = 0;                 // NOLINT(google-runtime-int)
  std::string why_;
};

// True when this process lives in a PID namespace below the one its procfs
// shows as outermost (a container): NVML names processes by the host's pids,
// so it cannot name this one.
bool InChildPidNamespace();

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_GPU_MEMORY_H_
