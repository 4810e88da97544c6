// A stand-in for libnvidia-ml.so.1, loaded by ckpt::metrics through
// MetricsOptions::nvml_library in tests on hosts without a GPU. It exports the
// NVML entry points the GPU sampler resolves, with the real signatures and
// struct layouts, over two fixed devices; and, for the one fault a real driver
// cannot be made to show on demand, a hang: while fake_nvml_set_hang(1) holds,
// nvmlDeviceGetUtilizationRates blocks until fake_nvml_set_hang(0).
//
// The real driver is exercised by metrics_gpu_test on a GPU host.
//
// Devices: index 0 "GPU-00000000-aaaa-...", index 1 "GPU-11111111-bbbb-...";
// memory total 80 GiB, used (1 + index) GiB; utilization 37 % and 74 %.
// Compute processes: 9 unrelated pids on each device (more than a first guess
// of 8 entries, so the caller must retry on NVML_ERROR_INSUFFICIENT_SIZE), and
// on device fake_nvml_set_process' device, that pid with its bytes.
// Driver version "550.54.15", or fake_nvml_set_driver_version's: under
// 535.43 to 535.86 the _v3 process entries are 32 bytes, as those drivers
// wrote them (a fifth field, usedGpuCcProtectedMemory), else 24.
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace {

constexpr int kSuccess = 0;
constexpr int kInvalidArgument = 2;
constexpr int kInsufficientSize = 7;
constexpr unsigned int kDevices = 2;
constexpr unsigned int kUnrelated = 9;
constexpr unsigned long long kGiB = 1ull << 30;

struct Memory {
  unsigned long long total, free, used;
};
struct Utilization {
  unsigned int gpu, memory;
};
struct ProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
};

// Device handles are pointers to these.
int g_device_ids[kDevices] = {0, 1};

std::mutex g_mu;
std::condition_variable g_cv;
bool g_hang = false;
int g_hung_calls = 0;  // calls waiting in the hang now
unsigned int g_process_pid = 0;
int g_process_device = -1;
unsigned long long g_process_bytes = 0;
char g_driver_version[32] = "550.54.15";

int Index(void* device) {
  for (unsigned int i = 0; i < kDevices; ++i) {
    if (device == &g_device_ids[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

extern "C" {

// --- test controls -----------------------------------------------------------

void fake_nvml_set_hang(int hang) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_hang = hang != 0;
  g_cv.notify_all();
}

// Calls blocked in the hang right now.
int fake_nvml_hung_calls() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g_hung_calls;
}

// Waits until `n` calls are blocked in the hang (no timeout: the test's own
// timeout bounds it).
void fake_nvml_wait_hung_calls(int n) {
  std::unique_lock<std::mutex> lock(g_mu);
  g_cv.wait(lock, [n] { return g_hung_calls >= n; });
}

void fake_nvml_set_process(int device, unsigned int pid, unsigned long long bytes) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_process_device = device;
  g_process_pid = pid;
  g_process_bytes = bytes;
}

void fake_nvml_set_driver_version(const char* version) {
  std::lock_guard<std::mutex> lock(g_mu);
  std::snprintf(g_driver_version, sizeof(g_driver_version), "%s", version);
}

// --- NVML --------------------------------------------------------------------

int nvmlSystemGetDriverVersion(char* version, unsigned int length) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (length < std::strlen(g_driver_version) + 1) return kInsufficientSize;
  std::snprintf(version, length, "%s", g_driver_version);
  return kSuccess;
}

int nvmlInit_v2() { return kSuccess; }
int nvmlShutdown() { return kSuccess; }
const char* nvmlErrorString(int rc) { return rc == kSuccess ? "Success" : "Fake error"; }

int nvmlDeviceGetCount_v2(unsigned int* count) {
  *count = kDevices;
  return kSuccess;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int index, void** device) {
  if (index >= kDevices) return kInvalidArgument;
  *device = &g_device_ids[index];
  return kSuccess;
}

int nvmlDeviceGetUUID(void* device, char* uuid, unsigned int length) {
  const int i = Index(device);
  if (i < 0) return kInvalidArgument;
  const char* text = i == 0 ? "GPU-00000000-aaaa-0000-0000-000000000000"
                            : "GPU-11111111-bbbb-1111-1111-111111111111";
  if (std::strlen(text) + 1 > length) return kInsufficientSize;
  std::strcpy(uuid, text);
  return kSuccess;
}

int nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  const int i = Index(device);
  if (i < 0) return kInvalidArgument;
  memory->total = 80 * kGiB;
  memory->used = static_cast<unsigned long long>(1 + i) * kGiB;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

int nvmlDeviceGetUtilizationRates(void* device, Utilization* utilization) {
  const int i = Index(device);
  if (i < 0) return kInvalidArgument;
  {
    std::unique_lock<std::mutex> lock(g_mu);
    if (g_hang) {
      ++g_hung_calls;
      g_cv.notify_all();
      g_cv.wait(lock, [] { return !g_hang; });
      --g_hung_calls;
    }
  }
  utilization->gpu = 37u * static_cast<unsigned int>(1 + i);
  utilization->memory = 5;
  return kSuccess;
}

int nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned int* count, void* out) {
  const int i = Index(device);
  if (i < 0) return kInvalidArgument;
  std::lock_guard<std::mutex> lock(g_mu);
  int major = 0, minor = 0;
  std::sscanf(g_driver_version, "%d.%d", &major, &minor);
  const size_t stride = major == 535 && minor >= 43 && minor <= 86 ? 32 : sizeof(ProcessInfo);
  auto put = [&](unsigned int k, const ProcessInfo& info) {
    unsigned char* entry = static_cast<unsigned char*>(out) + k * stride;
    std::memset(entry, 0xee, stride);  // the fifth field, where there is one
    std::memcpy(entry, &info, sizeof(info));
  };
  const bool ours = g_process_device == i && g_process_pid != 0;
  const unsigned int needed = kUnrelated + (ours ? 1 : 0);
  if (*count < needed) {
    *count = needed;
    return kInsufficientSize;
  }
  for (unsigned int k = 0; k < kUnrelated; ++k) {
    // Pids no test process has: above the kernel's pid_max limit (2^22).
    put(k, ProcessInfo{(1u << 22) + 100 * static_cast<unsigned int>(i) + k, kGiB / 4, 0, 0});
  }
  if (ours) put(kUnrelated, ProcessInfo{g_process_pid, g_process_bytes, 0, 0});
  *count = needed;
  return kSuccess;
}

}  // extern "C"
