// Fuzz target for the experiment file loader (ckpt-scheduler run FILE, and
// TOML submitted over the control socket): any bytes must give a config or an
// InvalidArgument naming the problem, never a crash, an exception or a hang
// (a model spec naming a FIFO or device is refused without reading it).
//
// Paths in the input are looked up on this machine (the dataset directory,
// a TorchScript file), as the scheduler does.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/records/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ckpt::records::ParseExperimentConfig(text, "fuzz.toml");
  if (config.ok()) {
    if (config->name.empty() || config->population < 1 ||
        config->population > ckpt::records::kMaxPopulation || config->devices.empty() ||
        config->name.size() > ckpt::records::kMaxExperimentNameBytes) {
      std::abort();
    }
  } else if (!config.status().IsInvalidArgument()) {
    std::abort();
  }
  return 0;
}
