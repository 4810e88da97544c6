// ckpt::metrics on a GPU host (CTest label gpu): NVML is found at run time,
// its figures are present and sane, and they move when this process takes GPU
// memory through the CUDA driver API (libcuda.so.1, also opened at run time,
// so this test builds everywhere). Skipped where NVML is not available.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "ckpt/metrics/metrics.h"
#include "exposition.h"

namespace ckpt::metrics {
namespace {

using testing::Exposition;

// The few driver API calls that make this process hold device memory.
class DeviceMemory {
 public:
  // Allocates `bytes` on CUDA device 0; ok() false (with why()) otherwise.
  explicit DeviceMemory(size_t bytes) {
    lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) {
      why_ = "dlopen libcuda.so.1 failed";
      return;
    }
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib_, "cuInit"));
    auto get = reinterpret_cast<int (*)(int*, int)>(dlsym(lib_, "cuDeviceGet"));
    auto retain = reinterpret_cast<int (*)(void**, int)>(dlsym(lib_, "cuDevicePrimaryCtxRetain"));
    auto set = reinterpret_cast<int (*)(void*)>(dlsym(lib_, "cuCtxSetCurrent"));
    auto alloc =
        reinterpret_cast<int (*)(unsigned long long*, size_t)>(dlsym(lib_, "cuMemAlloc_v2"));
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
  ~DeviceMemory() {
    if (ptr_ != 0) free_(ptr_);
  }
  bool ok() const { return why_.empty(); }
  const std::string& why() const { return why_; }

 private:
  void* lib_ = nullptr;
  int (*free_)(unsigned long long) = nullptr;
  unsigned long long ptr_ = 0;
  std::string why_;
};

double Value(const Exposition& e, const std::string& family, const testing::LabelSet& labels) {
  auto it = e.find(family);
  if (it == e.end()) return std::nan("");
  const auto* s = it->second.Find(family, labels);
  return s ? s->value : std::nan("");
}

TEST(MetricsGpuTest, NvmlFiguresArePresentAndMoveWithDeviceMemory) {
  MetricsOptions o;
  o.listen = "";
  auto opened = Metrics::Open(o);
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Metrics& m = **opened;
  if (!m.gpu_status().empty()) GTEST_SKIP() << "no NVML here: " << m.gpu_status();
  m.WorkerStarted("self", "cuda:0", ::getpid());

  auto before = testing::ParseExposition(m.RenderText());
  ASSERT_TRUE(before.ok()) << before.status().ToString();
  for (const char* f : {"ckpt_gpu_utilization_ratio", "ckpt_gpu_memory_used_bytes",
                        "ckpt_gpu_memory_total_bytes"}) {
    ASSERT_TRUE(before->count(f)) << f;
    ASSERT_FALSE(before->at(f).samples.empty()) << f;
  }
  for (const auto& s : before->at("ckpt_gpu_memory_total_bytes").samples) {
    const double used = Value(*before, "ckpt_gpu_memory_used_bytes", s.labels);
    EXPECT_GT(s.value, 0) << s.labels.at("device");
    EXPECT_LE(used, s.value) << s.labels.at("device");
  }
  for (const auto& s : before->at("ckpt_gpu_utilization_ratio").samples) {
    EXPECT_GE(s.value, 0);
    EXPECT_LE(s.value, 1);
  }
  const testing::LabelSet dev0{{"device", "cuda:0"}};
  const double used_before = Value(*before, "ckpt_gpu_memory_used_bytes", dev0);
  ASSERT_FALSE(std::isnan(used_before)) << "no cuda:0";

  constexpr size_t kBytes = size_t{1} << 30;
  DeviceMemory held(kBytes);
  ASSERT_TRUE(held.ok()) << held.why();
  auto after = testing::ParseExposition(m.RenderText());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const double used_after = Value(*after, "ckpt_gpu_memory_used_bytes", dev0);
  EXPECT_GE(used_after - used_before, 0.9 * kBytes);
  const double own =
      Value(*after, "ckpt_gpu_process_memory_bytes", {{"device", "cuda:0"}, {"worker", "self"}});
  // NVML names processes by the host's pids; in a container with its own pid
  // namespace this process is not recognisable, and the test says so.
  if (std::isnan(own)) {
    std::printf("ckpt_gpu_process_memory_bytes has no series for this pid (pid namespace?)\n");
  } else {
    EXPECT_GE(own, 0.9 * kBytes);
  }
}

}  // namespace
}  // namespace ckpt::metrics
