// Fuzz target for the service file loader (ckpt-scheduler serve --config
// FILE, and every SIGHUP reload): any bytes must give a config or an
// InvalidArgument naming the problem, never a crash or an exception. User and
// group names are looked up on this machine, as the service does.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "ckpt/scheduler/service.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ckpt::records::ParseServiceConfig(text, "fuzz.toml");
  if (config.ok()) {
    if (config->store.empty() || config->socket.empty() || config->socket.size() > 107 ||
        config->devices.empty() || config->max_request_bytes < 1024 || config->max_clients < 1) {
      std::abort();
    }
    (void)ckpt::scheduler::SchedulerOptionsFor(*config);
    (void)ckpt::records::SettingsNeedingRestart(*config, *config);
  } else if (!config.status().IsInvalidArgument()) {
    std::abort();
  }
  return 0;
}
