#include "gpu_memory.h"

#include <dlfcn.h>

#include <fstream>
#include <sstream>

namespace ckpt::testing {

DeviceMemory::DeviceMemory(size_t bytes) {
  lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib_ == nullptr) {
    const char* err = dlerror();
    why_ = std::string("dlopen libcuda.so.1: ") + (err ? err : "failed");
    return;
  }
  auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib_, "cuInit"));
  auto get = reinterpret_cast<int (*)(int*, int)>(dlsym(lib_, "cuDeviceGet"));
  auto retain = reinterpret_cast<int (*)(void**, int)>(dlsym(lib_, "cuDevicePrimaryCtxRetain"));
  auto set = reinterpret_cast<int (*)(void*)>(dlsym(lib_, "cuCtxSetCurrent"));
  auto alloc = reinterpret_cast<int (*)(unsigned long long*, size_t)>(dlsym(lib_, "cuMemAlloc_v2"));
  free_ = reinterpret_cast<int (*)(unsigned long long)>(dlsym(lib_, "cuMemFree_v2"));
  if (!init || !get || !retain || !set || !alloc || !free_) {
    why_ = "libcuda.so.1 lacks a driver API symbol";
    return;
  }
  int dev = 0;
  void* ctx = nullptr;
  int rc = init(0);
  if (rc == 0) rc = get(&dev, 0);
  if (rc == 0) rc = retain(&ctx, dev);
  if (rc == 0) rc = set(ctx);
  if (rc == 0) rc = alloc(&ptr_, bytes);
  if (rc != 0) why_ = "CUDA driver API error " + std::to_string(rc);
}

DeviceMemory::~DeviceMemory() {
  if (ptr_ != 0) free_(ptr_);
}

bool InChildPidNamespace() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream pids(line.substr(6));
    int n = 0;
    std::string pid;
    while (pids >> pid) ++n;
    return n > 1;
  }
  return false;
}

}  // namespace ckpt::testing
