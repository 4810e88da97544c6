// ckpt::metrics on a GPU host (CTest label gpu): NVML is found at run time,
// its figures are present and sane, and they move when this process takes GPU
// memory through the CUDA driver API (testing::DeviceMemory). Skipped where NVML is not available.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "ckpt/metrics/metrics.h"
#include "exposition.h"
#include "gpu_memory.h"

namespace ckpt::metrics {
namespace {

using testing::Exposition;

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
  testing::DeviceMemory held(kBytes);
  ASSERT_TRUE(held.ok()) << held.why();
  auto after = testing::ParseExposition(m.RenderText());
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  const double used_after = Value(*after, "ckpt_gpu_memory_used_bytes", dev0);
  EXPECT_GE(used_after - used_before, 0.9 * kBytes);
  const double own =
      Value(*after, "ckpt_gpu_process_memory_bytes", {{"device", "cuda:0"}, {"worker", "self"}});
  // NVML names processes by the host's pids; in a container with its own pid
  // namespace this process is not recognisable, and the test says so.
  if (testing::InChildPidNamespace()) {
    std::printf("in a child PID namespace: NVML cannot name this process (%s)\n",
                std::isnan(own) ? "no series" : "a series anyway");
  } else {
    EXPECT_GE(own, 0.9 * kBytes);
  }
}

}  // namespace
}  // namespace ckpt::metrics
