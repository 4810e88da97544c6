#include "ckpt/base/visible_devices.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>
#include <utility>

namespace ckpt::base {

std::vector<VisibleDevice> ParseVisibleDevices(std::string_view visible, int gpus) {
  std::vector<VisibleDevice> out;
  if (gpus == 0) return out;
  size_t pos = 0;
  while (pos <= visible.size()) {
    size_t comma = visible.find(',', pos);
    if (comma == std::string_view::npos) comma = visible.size();
    std::string_view entry = visible.substr(pos, comma - pos);
    const size_t first = entry.find_first_not_of(' ');
    entry = first == std::string_view::npos ? std::string_view() : entry.substr(first);
    entry = entry.substr(0, entry.find_last_not_of(' ') + 1);
    VisibleDevice device;
    if (!entry.empty() && entry.find_first_not_of("0123456789") == std::string_view::npos) {
      const auto [end, ec] =
          std::from_chars(entry.data(), entry.data() + entry.size(), device.index);
      if (ec != std::errc() || (gpus > 0 && device.index >= gpus)) break;
    } else if (entry.substr(0, 4) == "GPU-" || entry.substr(0, 4) == "MIG-") {
      device.uuid = std::string(entry);
    } else {
      break;
    }
    const bool repeated = std::any_of(out.begin(), out.end(), [&](const VisibleDevice& d) {
      return d.index == device.index && d.uuid == device.uuid;
    });
    if (repeated) break;
    out.push_back(std::move(device));
    pos = comma + 1;
  }
  return out;
}

int DriverGpuCount(const std::string& proc_gpus, const std::string& dev) {
  namespace fs = std::filesystem;
  int gpus = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(proc_gpus, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    ++gpus;
  }
  if (gpus > 0) return gpus;
  for (auto it = fs::directory_iterator(dev, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() > 6 && name.compare(0, 6, "nvidia") == 0 &&
        name.find_first_not_of("0123456789", 6) == std::string::npos) {
      ++gpus;
    }
  }
  return gpus;
}

int VisibleGpuCount(int gpus, const char* visible) {
  if (visible == nullptr) return gpus;
  return static_cast<int>(ParseVisibleDevices(visible, gpus).size());
}

}  // namespace ckpt::base
