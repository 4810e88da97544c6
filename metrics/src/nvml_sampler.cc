#include "nvml_sampler.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "ckpt/base/visible_devices.h"

namespace ckpt::metrics {
namespace {

// The few NVML declarations used here, as nvml.h (CUDA 11/12) defines them;
// the driver keeps these entry points and structs stable per versioned name.
using NvmlReturn = int;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlErrorInsufficientSize = 7;
constexpr unsigned long long kNvmlValueNotAvailable = ~0ull;
constexpr unsigned int kNvmlUuidBufferBytes = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
using NvmlDevice = struct NvmlDeviceOpaque*;

struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
// nvmlProcessInfo_v1_t: nvmlDeviceGetComputeRunningProcesses.
struct NvmlProcessInfoV1 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
};
// nvmlProcessInfo_v2_t: nvmlDeviceGetComputeRunningProcesses_v2 and _v3.
struct NvmlProcessInfoV2 {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(NvmlProcessInfoV2) == 24, "nvmlProcessInfo_v2_t is 24 bytes");

}  // namespace

struct NvmlSampler::Api {
  NvmlReturn (*init)();
  NvmlReturn (*shutdown)();
  const char* (*error_string)(NvmlReturn);
  NvmlReturn (*device_count)(unsigned int*);
  NvmlReturn (*handle_by_index)(unsigned int, NvmlDevice*);
  NvmlReturn (*uuid)(NvmlDevice, char*, unsigned int);
  NvmlReturn (*memory_info)(NvmlDevice, NvmlMemory*);
  NvmlReturn (*utilization)(NvmlDevice, NvmlUtilization*);
  // Exactly one of these is set: the newest the driver has; the first
  // fills entries of process_info_bytes (NvmlProcessInfoV3Bytes for _v3).
  NvmlReturn (*processes_v2)(NvmlDevice, unsigned int*, void*);
  NvmlReturn (*processes_v1)(NvmlDevice, unsigned int*, NvmlProcessInfoV1*);
  size_t process_info_bytes = sizeof(NvmlProcessInfoV2);
};

struct NvmlSampler::Device {
  std::string name;  // "cuda:K"
  NvmlDevice handle;
};

namespace {

template <typename Fn>
bool Resolve(void* lib, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(lib, symbol));
  return *out != nullptr;
}

using ErrorStringFn = const char* (*)(NvmlReturn);

std::string NvmlError(ErrorStringFn error_string, const char* call, NvmlReturn rc) {
  const char* text = error_string ? error_string(rc) : nullptr;
  return std::string(call) + ": " + (text ? text : "error " + std::to_string(rc));
}

}  // namespace

size_t NvmlProcessInfoV3Bytes(const std::string& driver_version) {
  int major = 0, minor = 0;
  if (std::sscanf(driver_version.c_str(), "%d.%d", &major, &minor) == 2 && major == 535 &&
      minor >= 43 && minor <= 86) {
    return sizeof(NvmlProcessInfoV2) + sizeof(uint64_t);  // usedGpuCcProtectedMemory
  }
  return sizeof(NvmlProcessInfoV2);
}

StatusOr<std::unique_ptr<NvmlSampler>> NvmlSampler::Open(const std::string& library) {
  void* lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    return Status::Unavailable("dlopen " + library + ": " + (why ? why : "failed"));
  }
  auto api = std::make_unique<Api>();
  std::string missing;
  auto need = [&](const char* symbol, auto* fn) {
    if (!Resolve(lib, symbol, fn) && missing.empty()) missing = symbol;
  };
  need("nvmlInit_v2", &api->init);
  need("nvmlShutdown", &api->shutdown);
  need("nvmlErrorString", &api->error_string);
  need("nvmlDeviceGetCount_v2", &api->device_count);
  need("nvmlDeviceGetHandleByIndex_v2", &api->handle_by_index);
  need("nvmlDeviceGetUUID", &api->uuid);
  need("nvmlDeviceGetMemoryInfo", &api->memory_info);
  need("nvmlDeviceGetUtilizationRates", &api->utilization);
  const bool v3 = Resolve(lib, "nvmlDeviceGetComputeRunningProcesses_v3", &api->processes_v2);
  if (!v3 && !Resolve(lib, "nvmlDeviceGetComputeRunningProcesses_v2", &api->processes_v2)) {
    need("nvmlDeviceGetComputeRunningProcesses", &api->processes_v1);
  }
  NvmlReturn (*driver_version)(char*, unsigned int) = nullptr;
  Resolve(lib, "nvmlSystemGetDriverVersion", &driver_version);
  if (!missing.empty()) {
    dlclose(lib);
    return Status::Unavailable(library + ": no symbol " + missing);
  }
  if (NvmlReturn rc = api->init(); rc != kNvmlSuccess) {
    std::string why = NvmlError(api->error_string, "nvmlInit", rc);
    dlclose(lib);
    return Status::Unavailable(why);
  }
  // From here on, NVML is initialised: every failure path shuts it down.
  auto fail = [&](std::string why) {
    api->shutdown();
    dlclose(lib);
    return Status::Unavailable(std::move(why));
  };
  if (v3 && driver_version != nullptr) {
    char version[96] = {};
    if (driver_version(version, sizeof(version)) == kNvmlSuccess) {
      api->process_info_bytes = NvmlProcessInfoV3Bytes(version);
    }
  }
  unsigned int count = 0;
  if (NvmlReturn rc = api->device_count(&count); rc != kNvmlSuccess) {
    return fail(NvmlError(api->error_string, "nvmlDeviceGetCount", rc));
  }
  struct Found {
    NvmlDevice handle;
    std::string uuid;
  };
  std::vector<Found> all;
  for (unsigned int i = 0; i < count; ++i) {
    Found f{};
    if (NvmlReturn rc = api->handle_by_index(i, &f.handle); rc != kNvmlSuccess) {
      return fail(NvmlError(api->error_string, "nvmlDeviceGetHandleByIndex", rc) + " (device " +
                  std::to_string(i) + ")");
    }
    char uuid[kNvmlUuidBufferBytes] = {};
    if (api->uuid(f.handle, uuid, sizeof(uuid)) == kNvmlSuccess) f.uuid = uuid;
    all.push_back(std::move(f));
  }
  std::vector<Device> devices;
  const char* visible = std::getenv(base::kCudaVisibleDevicesVariable);
  if (visible == nullptr) {
    for (size_t i = 0; i < all.size(); ++i) {
      devices.push_back(Device{"cuda:" + std::to_string(i), all[i].handle});
    }
  } else {
    for (const base::VisibleDevice& entry :
         base::ParseVisibleDevices(visible, static_cast<int>(all.size()))) {
      const Found* match = entry.uuid.empty() ? &all[entry.index] : nullptr;
      for (const Found& f : all) {
        if (!entry.uuid.empty() && f.uuid.rfind(entry.uuid, 0) == 0) match = &f;
      }
      if (match == nullptr) break;  // CUDA ignores the list from its first bad entry on
      devices.push_back(Device{"cuda:" + std::to_string(devices.size()), match->handle});
    }
  }
  if (devices.empty()) {
    return fail("no NVML device visible (" + std::to_string(count) + " in NVML" +
                (visible ? std::string(", CUDA_VISIBLE_DEVICES=\"") + visible + "\"" : "") + ")");
  }
  return std::unique_ptr<NvmlSampler>(new NvmlSampler(lib, std::move(api), std::move(devices)));
}

NvmlSampler::NvmlSampler(void* handle, std::unique_ptr<Api> api, std::vector<Device> devices)
    : handle_(handle), api_(std::move(api)), devices_(std::move(devices)) {}

NvmlSampler::~NvmlSampler() {
  api_->shutdown();
  dlclose(handle_);
}

std::vector<GpuSample> NvmlSampler::Sample() const {
  std::vector<GpuSample> out;
  out.reserve(devices_.size());
  for (const Device& d : devices_) {
    GpuSample s;
    s.device = d.name;
    NvmlUtilization util{};
    if (api_->utilization(d.handle, &util) == kNvmlSuccess) s.utilization = util.gpu / 100.0;
    NvmlMemory mem{};
    if (api_->memory_info(d.handle, &mem) == kNvmlSuccess) {
      s.memory_used_bytes = mem.used;
      s.memory_total_bytes = mem.total;
    }
    // The process list can grow between the size query and the read: retry a
    // few times with room to spare, then report what the last call gave.
    unsigned int n = 0;
    for (int attempt = 0; attempt < 3; ++attempt) {
      NvmlReturn rc;
      if (api_->processes_v2 != nullptr) {
        // Entries of the driver's size; pid and used memory at the offsets
        // of NvmlProcessInfoV2 in either size.
        const size_t stride = api_->process_info_bytes;
        const unsigned int room = n;
        std::vector<unsigned char> infos(room * stride + 1);
        rc = api_->processes_v2(d.handle, &n, infos.data());
        if (rc == kNvmlSuccess) {
          for (unsigned int i = 0; i < n && i < room; ++i) {
            NvmlProcessInfoV2 info;
            std::memcpy(&info, infos.data() + i * stride, sizeof(info));
            if (info.used_gpu_memory == kNvmlValueNotAvailable) continue;
            s.processes.push_back({info.pid, info.used_gpu_memory});
          }
        }
      } else {
        std::vector<NvmlProcessInfoV1> infos(n);
        rc = api_->processes_v1(d.handle, &n, infos.data());
        if (rc == kNvmlSuccess) {
          for (unsigned int i = 0; i < n && i < infos.size(); ++i) {
            if (infos[i].used_gpu_memory == kNvmlValueNotAvailable) continue;
            s.processes.push_back({infos[i].pid, infos[i].used_gpu_memory});
          }
        }
      }
      if (rc != kNvmlErrorInsufficientSize) break;
      n += 8;
    }
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace ckpt::metrics
