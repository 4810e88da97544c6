#include "ckpt/base/visible_devices.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace ckpt::base {
namespace {

// One string per visible device: its index, or its UUID text.
std::vector<std::string> Visible(std::string_view visible, int gpus) {
  std::vector<std::string> out;
  for (const VisibleDevice& d : ParseVisibleDevices(visible, gpus)) {
    out.push_back(d.uuid.empty() ? std::to_string(d.index) : d.uuid);
  }
  return out;
}

using V = std::vector<std::string>;

TEST(VisibleDevicesTest, ReadsIndicesAndUuidsInOrder) {
  EXPECT_EQ(Visible("1", 2), V({"1"}));
  EXPECT_EQ(Visible("1,0", 2), V({"1", "0"}));
  EXPECT_EQ(Visible(" 1 , 0 ", 2), V({"1", "0"}));
  EXPECT_EQ(Visible("GPU-11111111, 0", 2), V({"GPU-11111111", "0"}));
  EXPECT_EQ(Visible("MIG-abc,0", 2), V({"MIG-abc", "0"}));
  const auto devices = ParseVisibleDevices("GPU-ab", 1);
  ASSERT_EQ(devices.size(), 1u);
  EXPECT_EQ(devices[0].index, -1);
}

TEST(VisibleDevicesTest, StopsAtTheFirstEntryThatNamesNoDevice) {
  EXPECT_EQ(Visible("1,5,0", 2), V({"1"}));       // out of range
  EXPECT_EQ(Visible("0,x,1", 2), V({"0"}));       // not an index nor a UUID
  EXPECT_EQ(Visible("0,,1", 2), V({"0"}));        // empty entry
  EXPECT_EQ(Visible("0,", 2), V({"0"}));          // trailing comma
  EXPECT_EQ(Visible("1,0,1", 2), V({"1", "0"}));  // repeated
  EXPECT_EQ(Visible("0,00", 2), V({"0"}));        // the same device again
  EXPECT_EQ(Visible("GPU-a,GPU-a", 2), V({"GPU-a"}));
  EXPECT_EQ(Visible("99999999999", 2), V({}));  // overflows int
}

TEST(VisibleDevicesTest, HidesEverythingWhenEmptyOrMinusOneOrNoGpus) {
  EXPECT_EQ(Visible("", 2), V({}));
  EXPECT_EQ(Visible("-1", 2), V({}));
  EXPECT_EQ(Visible("-1,0", 2), V({}));
  EXPECT_EQ(Visible("0", 0), V({}));
  EXPECT_EQ(Visible("GPU-ab", 0), V({}));
}

TEST(VisibleDevicesTest, UnknownCountLeavesIndicesUnbounded) {
  EXPECT_EQ(Visible("7,3", -1), V({"7", "3"}));
  EXPECT_EQ(Visible("-1", -1), V({}));
  EXPECT_EQ(Visible("", -1), V({}));
}

// The driver's GPUs: one per /proc/driver/nvidia/gpus entry; where that is
// hidden, one per /dev/nvidiaN node, every N (a host whose first GPU node is
// nvidia1 has one), never nvidiactl or nvidia-uvm.
TEST(DriverGpuCountTest, CountsBusIdsElseEveryNumberedDeviceNode) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/ckpt_gpus_XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const fs::path root = tmpl;
  const fs::path proc = root / "gpus", dev = root / "dev";
  fs::create_directories(proc);
  fs::create_directories(dev);
  auto touch = [](const fs::path& p) { std::ofstream(p).put('\n'); };
  EXPECT_EQ(DriverGpuCount(proc.string(), dev.string()), 0);
  for (const char* n : {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia", "nvidia1"}) {
    touch(dev / n);
  }
  EXPECT_EQ(DriverGpuCount(proc.string(), dev.string()), 1);
  touch(dev / "nvidia3");
  EXPECT_EQ(DriverGpuCount(proc.string(), dev.string()), 2);
  EXPECT_EQ(DriverGpuCount((root / "absent").string(), dev.string()), 2);
  fs::create_directories(proc / "0000:3b:00.0");
  EXPECT_EQ(DriverGpuCount(proc.string(), dev.string()), 1);
  EXPECT_EQ(VisibleGpuCount(2, nullptr), 2);
  EXPECT_EQ(VisibleGpuCount(2, "1"), 1);
  EXPECT_EQ(VisibleGpuCount(2, ""), 0);
  EXPECT_EQ(VisibleGpuCount(0, "0"), 0);
  fs::remove_all(root);
}

}  // namespace
}  // namespace ckpt::base
