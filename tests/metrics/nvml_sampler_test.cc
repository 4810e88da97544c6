// The GPU sampler's NVML path on any host, through fake_nvml.cc (a stand-in
// libnvidia-ml.so.1 with NVML's signatures and struct layouts): the families
// follow the driver's figures, worker processes are matched by pid, the
// process list is re-read when it outgrows the first guess, CUDA_VISIBLE_DEVICES
// renames and filters devices as CUDA does, and a scrape stuck inside NVML (a
// hung driver) never blocks the scheduler's updates. metrics_gpu_test covers
// the real driver on a GPU host.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <optional>
#include <string>
#include <thread>

#include "ckpt/metrics/metrics.h"
#include "exposition.h"
#include "http_get.h"

namespace ckpt::metrics {
namespace {

using testing::Exposition;
using testing::LabelSet;

constexpr double kGiB = 1024.0 * 1024 * 1024;

// The fake's controls, from the same loaded instance the library uses (one
// dlopen of one path is one instance).
class FakeNvml {
 public:
  FakeNvml() {
    handle_ = dlopen(CKPT_FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
    EXPECT_NE(handle_, nullptr) << dlerror();
    if (handle_ == nullptr) return;
    set_hang = reinterpret_cast<void (*)(int)>(dlsym(handle_, "fake_nvml_set_hang"));
    hung_calls = reinterpret_cast<int (*)()>(dlsym(handle_, "fake_nvml_hung_calls"));
    wait_hung_calls = reinterpret_cast<void (*)(int)>(dlsym(handle_, "fake_nvml_wait_hung_calls"));
    set_process = reinterpret_cast<void (*)(int, unsigned, unsigned long long)>(
        dlsym(handle_, "fake_nvml_set_process"));
    set_driver_version =
        reinterpret_cast<void (*)(const char*)>(dlsym(handle_, "fake_nvml_set_driver_version"));
  }
  ~FakeNvml() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  bool ok() const {
    return set_hang && hung_calls && wait_hung_calls && set_process && set_driver_version;
  }

  void (*set_hang)(int) = nullptr;
  int (*hung_calls)() = nullptr;
  void (*wait_hung_calls)(int) = nullptr;
  void (*set_process)(int, unsigned, unsigned long long) = nullptr;
  void (*set_driver_version)(const char*) = nullptr;

 private:
  void* handle_ = nullptr;
};

// Sets CUDA_VISIBLE_DEVICES (or unsets it, for nullopt) for one scope. Only
// this test's thread runs while it changes: no Metrics listener is open.
class ScopedCudaVisibleDevices {
 public:
  explicit ScopedCudaVisibleDevices(std::optional<std::string> value) {
    if (const char* old = std::getenv("CUDA_VISIBLE_DEVICES")) old_ = old;
    if (value) {
      ::setenv("CUDA_VISIBLE_DEVICES", value->c_str(), 1);
    } else {
      ::unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }
  ~ScopedCudaVisibleDevices() {
    if (old_) {
      ::setenv("CUDA_VISIBLE_DEVICES", old_->c_str(), 1);
    } else {
      ::unsetenv("CUDA_VISIBLE_DEVICES");
    }
  }

 private:
  std::optional<std::string> old_;
};

MetricsOptions FakeNvmlOptions(const std::string& listen) {
  MetricsOptions o;
  o.listen = listen;
  o.nvml_library = CKPT_FAKE_NVML;
  o.log = [](LogLevel, const std::string&) {};
  return o;
}

Exposition Render(const Metrics& m) {
  auto e = testing::ParseExposition(m.RenderText());
  EXPECT_TRUE(e.ok()) << e.status().ToString();
  return e.ok() ? *e : Exposition{};
}

double ValueOf(const Exposition& e, const std::string& family, const LabelSet& labels) {
  auto it = e.find(family);
  if (it == e.end()) return -1;
  const auto* s = it->second.Find(family, labels);
  return s ? s->value : -1;
}

TEST(NvmlSamplerTest, GpuFamiliesFollowTheDriver) {
  FakeNvml fake;
  ASSERT_TRUE(fake.ok());
  ScopedCudaVisibleDevices all(std::nullopt);
  fake.set_process(1, static_cast<unsigned>(::getpid()), 123ull << 20);
  auto m = Metrics::Open(FakeNvmlOptions(""));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ((*m)->gpu_status(), "");
  (*m)->WorkerStarted("w0", "cuda:1", ::getpid());

  const Exposition e = Render(**m);
  for (const char* f : {"ckpt_gpu_utilization_ratio", "ckpt_gpu_memory_used_bytes",
                        "ckpt_gpu_memory_total_bytes", "ckpt_gpu_process_memory_bytes"}) {
    ASSERT_TRUE(e.count(f)) << f;
    EXPECT_EQ(e.at(f).type, "gauge") << f;
  }
  EXPECT_DOUBLE_EQ(ValueOf(e, "ckpt_gpu_utilization_ratio", {{"device", "cuda:0"}}), 0.37);
  EXPECT_DOUBLE_EQ(ValueOf(e, "ckpt_gpu_utilization_ratio", {{"device", "cuda:1"}}), 0.74);
  EXPECT_EQ(ValueOf(e, "ckpt_gpu_memory_used_bytes", {{"device", "cuda:0"}}), 1 * kGiB);
  EXPECT_EQ(ValueOf(e, "ckpt_gpu_memory_used_bytes", {{"device", "cuda:1"}}), 2 * kGiB);
  EXPECT_EQ(ValueOf(e, "ckpt_gpu_memory_total_bytes", {{"device", "cuda:1"}}), 80 * kGiB);
  // Ten processes on cuda:1 (more than the first guess of room): only the
  // registered worker is reported, under its name.
  const auto& procs = e.at("ckpt_gpu_process_memory_bytes");
  ASSERT_EQ(procs.samples.size(), 1u);
  EXPECT_EQ(procs.samples[0].labels, (LabelSet{{"device", "cuda:1"}, {"worker", "w0"}}));
  EXPECT_EQ(procs.samples[0].value, 123.0 * 1024 * 1024);

  // The worker exits: its process series goes, the devices stay.
  (*m)->WorkerExited("w0", "cuda:1");
  const Exposition after = Render(**m);
  EXPECT_TRUE(after.at("ckpt_gpu_process_memory_bytes").samples.empty());
  EXPECT_EQ(after.at("ckpt_gpu_memory_used_bytes").samples.size(), 2u);
  fake.set_process(-1, 0, 0);
}

// Drivers 535.43 to 535.86 write 32-byte _v3 process entries (a fifth
// field, later dropped): read with that stride, the worker's process is found
// with its memory; read as 24-byte entries it would be garbage, and the
// driver would write past the buffer.
TEST(NvmlSamplerTest, ProcessEntriesOfDriver535AreReadAtTheirSize) {
  FakeNvml fake;
  ASSERT_TRUE(fake.ok());
  ScopedCudaVisibleDevices all(std::nullopt);
  for (const char* version : {"535.54.03", "535.86.10", "535.104.05", "550.54.15"}) {
    fake.set_driver_version(version);
    fake.set_process(1, static_cast<unsigned>(::getpid()), 77ull << 20);
    auto m = Metrics::Open(FakeNvmlOptions(""));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    (*m)->WorkerStarted("w0", "cuda:1", ::getpid());
    const Exposition e = Render(**m);
    ASSERT_TRUE(e.count("ckpt_gpu_process_memory_bytes")) << version;
    const auto& procs = e.at("ckpt_gpu_process_memory_bytes");
    ASSERT_EQ(procs.samples.size(), 1u) << version;
    EXPECT_EQ(procs.samples[0].value, 77.0 * 1024 * 1024) << version;
    (*m)->WorkerExited("w0", "cuda:1");
  }
  fake.set_driver_version("550.54.15");
  fake.set_process(-1, 0, 0);
}

// SampleGpus (what `ckpt-tool workers` and `top` show): the same figures as
// the families, in "cuda:K" order; none without NVML.
TEST(NvmlSamplerTest, SampleGpusGivesEachDevicesFigures) {
  FakeNvml fake;
  ASSERT_TRUE(fake.ok());
  ScopedCudaVisibleDevices all(std::nullopt);
  auto m = Metrics::Open(FakeNvmlOptions(""));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const std::vector<GpuFigures> gpus = (*m)->SampleGpus();
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].device, "cuda:0");
  EXPECT_EQ(gpus[1].device, "cuda:1");
  EXPECT_EQ(gpus[0].utilization, 0.37);
  EXPECT_EQ(gpus[1].utilization, 0.74);
  EXPECT_EQ(gpus[1].memory_used_bytes, 2 * kGiB);
  EXPECT_EQ(gpus[1].memory_total_bytes, 80 * kGiB);

  MetricsOptions none = FakeNvmlOptions("");
  none.nvml_library = "/nonexistent/libnvidia-ml.so.1";
  auto without = Metrics::Open(none);
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_TRUE((*without)->SampleGpus().empty());
}

TEST(NvmlSamplerTest, CudaVisibleDevicesRenamesAndFiltersAsCudaDoes) {
  FakeNvml fake;
  ASSERT_TRUE(fake.ok());
  struct Case {
    std::string visible;
    // NVML index behind cuda:0, cuda:1, ... (told apart by memory used).
    std::vector<int> nvml_index;
  };
  for (const Case& c : std::vector<Case>{{"1", {1}},
                                         {"GPU-00000000-aaaa,1", {0, 1}},
                                         {"GPU-11111111, 0", {1, 0}},
                                         {"1,5,0", {1}},  // CUDA stops at the first bad entry
                                         {"MIG-abc,0", {}}}) {
    SCOPED_TRACE("CUDA_VISIBLE_DEVICES=" + c.visible);
    ScopedCudaVisibleDevices visible(c.visible);
    auto m = Metrics::Open(FakeNvmlOptions(""));
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (c.nvml_index.empty()) {
      EXPECT_NE((*m)->gpu_status().find("no NVML device visible"), std::string::npos)
          << (*m)->gpu_status();
      EXPECT_EQ(Render(**m).count("ckpt_gpu_memory_used_bytes"), 0u);
      continue;
    }
    ASSERT_EQ((*m)->gpu_status(), "");
    const Exposition e = Render(**m);
    ASSERT_EQ(e.at("ckpt_gpu_memory_used_bytes").samples.size(), c.nvml_index.size());
    for (size_t k = 0; k < c.nvml_index.size(); ++k) {
      EXPECT_EQ(ValueOf(e, "ckpt_gpu_memory_used_bytes", {{"device", "cuda:" + std::to_string(k)}}),
                (1 + c.nvml_index[k]) * kGiB)
          << "cuda:" << k;
    }
  }
}

TEST(NvmlSamplerTest, ScrapeStuckInNvmlNeverBlocksUpdates) {
  FakeNvml fake;
  ASSERT_TRUE(fake.ok());
  ScopedCudaVisibleDevices all(std::nullopt);
  auto opened = Metrics::Open(FakeNvmlOptions("127.0.0.1:0"));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  Metrics& m = **opened;

  fake.set_hang(1);
  StatusOr<testing::HttpResponse> stuck = Status::Unavailable("not scraped yet");
  std::thread scraper([&] {
    stuck = testing::HttpGet("127.0.0.1", m.port(), "/metrics", std::chrono::seconds(120));
  });
  // Sync point: the scrape is inside NVML and stays there until released.
  fake.wait_hung_calls(1);

  // Every update the scheduler makes returns while it is stuck.
  m.WorkerStarted("w0", "cuda:0", ::getpid());
  m.IntervalCommitted("e", "cuda:0", 0.5, 6400);
  m.Exploited("e");
  m.MemberFailed("e", ipc::FailureCode::kOutOfMemory);
  m.SetMemberCounts("e", MemberCounts{});
  m.SetScores("e", format::MetricKind::kAccuracy, 0.9, 0.8);
  m.StoreOperation(StoreOp::kCommitResult, 1e-3, 4096);
  WorkerStats stats;
  stats.samples_total = 6400;
  stats.slots = 4;
  m.SetWorkerStats("w0", "cuda:0", stats);
  m.SetRingStats("w0", "cuda:0", RingStats{});
  m.RingSendObserved("w0", "cuda:0", 1e-4);
  m.WorkerExited("w0", "cuda:0");
  m.ForgetExperiment("other");
  EXPECT_EQ(fake.hung_calls(), 1) << "the scrape was not stuck all along";

  fake.set_hang(0);
  scraper.join();
  ASSERT_TRUE(stuck.ok()) << stuck.status().ToString();
  EXPECT_EQ(stuck->status, 200);
  ASSERT_TRUE(testing::ParseExposition(stuck->body).ok());
  // The next scrape shows what was reported meanwhile.
  auto next = testing::HttpGet("127.0.0.1", m.port(), "/metrics");
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  auto e = testing::ParseExposition(next->body);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  EXPECT_EQ(ValueOf(*e, "ckpt_exploits_total", {{"experiment", "e"}}), 1);
  EXPECT_EQ(ValueOf(*e, "ckpt_worker_samples_total", {{"worker", "w0"}, {"device", "cuda:0"}}),
            6400);
}

}  // namespace
}  // namespace ckpt::metrics
