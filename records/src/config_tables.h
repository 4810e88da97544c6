// Readers of the TOML tables that experiment files (config.cc) and the service
// file (service.cc) share, so each is parsed in one place (shared by
// ckpt::records and the scheduler). Errors name the key and its line, as TomlTableReader does.
//
// Thread-safety: pure functions.
#ifndef CKPT_RECORDS_SRC_CONFIG_TABLES_H_
#define CKPT_RECORDS_SRC_CONFIG_TABLES_H_

#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "toml_reader.h"

namespace ckpt::records {

// The [[devices]] array of `top`, appended to `out`; entries without a
// `device` key get `default_device`. Leaves `out` as it is when the key is
// absent. InvalidArgument naming devices[i].KEY and its line.
Status ReadDevices(TomlTableReader* top, const std::string& origin,
                   const std::string& default_device, std::vector<DeviceConfig>* out);

// The supervision keys of table `r` (restart_backoff_s, max_restart_backoff_s,
// healthy_reset_s, max_restarts, max_member_failures) into `out`; keys not
// present keep their value. Does not check for unknown keys.
Status ReadSupervision(TomlTableReader* r, SupervisionOptions* out);

// A `metrics` value: "host:port" with a port in 1..65535, or "" (none).
bool ValidListenAddress(const std::string& address);

// "cpu", "cuda:N" (N decimal) or, when `allow_auto`, "auto".
bool ValidDeviceName(const std::string& name, bool allow_auto);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_SRC_CONFIG_TABLES_H_
