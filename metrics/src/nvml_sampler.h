// GPU figures read through NVML, which is opened at run time with dlopen so
// that neither the build nor a host without the NVIDIA driver needs it.
//
// NvmlSampler owns the library handle and NVML's initialisation: Open loads and
// initialises, the destructor shuts NVML down and closes the library. Sample()
// may be called from any thread (NVML is thread-safe) and only reads.
//
// Devices are named "cuda:K" by the CUDA ordinal the workers see: without
// CUDA_VISIBLE_DEVICES, K is NVML's index (PCI bus order, which is CUDA's with
// CUDA_DEVICE_ORDER=PCI_BUS_ID); with it, the K-th entry (an NVML index or a
// "GPU-" UUID prefix) is "cuda:K", and like CUDA the list ends at its first
// entry that names no device. Process ids are those of NVML, i.e. of the host's
// pid namespace.
#ifndef CKPT_METRICS_SRC_NVML_SAMPLER_H_
#define CKPT_METRICS_SRC_NVML_SAMPLER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::metrics {

struct GpuProcessSample {
  uint32_t pid = 0;
  uint64_t used_bytes = 0;
};

struct GpuSample {
  std::string device;  // "cuda:K"
  // Each figure is absent when NVML refuses it for this device.
  std::optional<double> utilization;  // 0..1 over NVML's last sample period
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
  std::vector<GpuProcessSample> processes;  // compute processes and their memory
};

// Bytes of one entry of nvmlDeviceGetComputeRunningProcesses_v3's array under
// a driver whose nvmlSystemGetDriverVersion says `driver_version`: 32 for
// 535.43 up to 535.86, whose nvmlProcessInfo_t carried a fifth field
// (usedGpuCcProtectedMemory, dropped again in 535.98), else 24 (pid, used
// memory, GPU and compute instance ids). The pid and the used memory sit at
// the same offsets in both.
size_t NvmlProcessInfoV3Bytes(const std::string& driver_version);

class NvmlSampler {
 public:
  // Loads `library` and initialises NVML. Unavailable, with dlopen's or
  // NVML's own words, when the library cannot be loaded, lacks a needed
  // symbol, fails to initialise, or shows no device (after
  // CUDA_VISIBLE_DEVICES of this process).
  static StatusOr<std::unique_ptr<NvmlSampler>> Open(const std::string& library);
  ~NvmlSampler();
  NvmlSampler(const NvmlSampler&) = delete;
  NvmlSampler& operator=(const NvmlSampler&) = delete;

  // One sample of every visible device, in "cuda:K" order.
  std::vector<GpuSample> Sample() const;

 private:
  struct Api;
  struct Device;
  NvmlSampler(void* handle, std::unique_ptr<Api> api, std::vector<Device> devices);
  void* handle_;
  std::unique_ptr<Api> api_;
  std::vector<Device> devices_;
};

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_NVML_SAMPLER_H_
