// CUDA_VISIBLE_DEVICES read as CUDA reads it, for the code that must know
// which devices CUDA will show a process without creating a CUDA context: the
// scheduler counting GPUs for "auto", the NVML sampler naming devices as
// cuda:K, the worker choosing "auto".
//
// Thread-safety: constants and pure functions.
#ifndef CKPT_BASE_VISIBLE_DEVICES_H_
#define CKPT_BASE_VISIBLE_DEVICES_H_

#include <string>
#include <string_view>
#include <vector>

namespace ckpt::base {

inline constexpr char kCudaVisibleDevicesVariable[] = "CUDA_VISIBLE_DEVICES";

// One entry of the list; the k-th entry is the device CUDA calls cuda:k.
struct VisibleDevice {
  // The driver's (NVML's) index of the device, or -1 for a UUID entry.
  int index = -1;
  // For a UUID entry: what was written, "GPU-..." or "MIG-..." (a prefix of
  // the device's UUID, to be matched by the caller); empty for an index.
  std::string uuid;
};

// The devices a CUDA_VISIBLE_DEVICES value `visible` shows on a host with
// `gpus` driver devices (a negative `gpus`: not known, indices not bounded):
// its comma-separated entries, spaces around each ignored, up to (not
// including) the first that names no device, as CUDA stops there: not a
// decimal index below `gpus` nor a "GPU-"/"MIG-" UUID prefix, or the same
// device as an earlier entry (the same index, or the same UUID text). None
// when `gpus` is 0. UUIDs are taken on trust (checking them needs NVML). An
// empty `visible`, or "-1", shows none; the caller decides what an unset
// variable means (all devices).
std::vector<VisibleDevice> ParseVisibleDevices(std::string_view visible, int gpus);

// GPUs the NVIDIA driver lists: the entries of `proc_gpus` (one per bus id),
// or, where a container hides /proc/driver (gVisor), the device nodes
// nvidiaN of `dev` (every N, not only nvidia0; nvidiactl and nvidia-uvm are
// no GPUs). 0 when neither shows one. The scheduler (counting workers for
// "auto") and the worker (resolving "auto") both count by this.
int DriverGpuCount(const std::string& proc_gpus = "/proc/driver/nvidia/gpus",
                   const std::string& dev = "/dev");

// The number of devices CUDA shows a process whose CUDA_VISIBLE_DEVICES is
// `visible` (nullptr: unset, all of them) on a host with `gpus` driver GPUs,
// as ParseVisibleDevices reads it (a "GPU-" or "MIG-" UUID is taken on trust).
int VisibleGpuCount(int gpus, const char* visible);

}  // namespace ckpt::base

#endif  // CKPT_BASE_VISIBLE_DEVICES_H_
