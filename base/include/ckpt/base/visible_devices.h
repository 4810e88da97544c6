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

}  // namespace ckpt::base

#endif  // CKPT_BASE_VISIBLE_DEVICES_H_
