// Fuzz target for the experiment file loader (ckpt-scheduler run FILE, and
// TOML submitted over the control socket): any bytes must give a config or an
// InvalidArgument naming the problem, never a crash, an exception or a hang
// (a model spec naming a FIFO or device is refused without reading it).
//
// Paths in the input are looked up on this machine (the dataset directory,
// a TorchScript file), as the scheduler does; the same input is also parsed
// without file checks, as ckpt-tool reads a stored configuration.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/records/config.h"

namespace {

using ckpt::records::FileChecks;

void CheckOutcome(const ckpt::StatusOr<ckpt::records::ExperimentConfig>& config) {
  if (config.ok()) {
    if (config->name.empty() || config->population < 1 ||
        config->population > ckpt::records::kMaxPopulation || config->devices.empty() ||
        config->name.size() > ckpt::records::kMaxExperimentNameBytes) {
      std::abort();
    }
  } else if (!config.status().IsInvalidArgument()) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  // As the scheduler reads it (the files it names checked) and as ckpt-tool
  // reads a stored one (FileChecks::kSkip): the file checks only add
  // refusals, so what the first accepts the second accepts, equal.
  auto checked = ckpt::records::ParseExperimentConfig(text, "fuzz.toml", FileChecks::kCheck);
  auto skipped = ckpt::records::ParseExperimentConfig(text, "fuzz.toml", FileChecks::kSkip);
  CheckOutcome(checked);
  CheckOutcome(skipped);
  if (checked.ok() && (!skipped.ok() || skipped->source != checked->source ||
                       skipped->population != checked->population)) {
    std::abort();
  }
  return 0;
}
