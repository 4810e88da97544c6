// The [workers] keys of remote workers (listen, secret_file, local, max_remote,
// remote_memory_mib, max_remote_slots, task_timeout_factor,
// task_timeout_floor_s), shared by
// experiment files (config.cc) and the service file (service.cc) so the table
// is parsed in one place.
//
// Thread-safety: pure function.
#ifndef CKPT_RECORDS_SRC_WORKERS_TABLE_H_
#define CKPT_RECORDS_SRC_WORKERS_TABLE_H_

#include "ckpt/base/status.h"
#include "ckpt/records/config.h"
#include "toml_reader.h"

namespace ckpt::records {

// Reads those keys of `r` into `out` (keys not present keep their value). InvalidArgument naming
// the key and line: a listen address that is not HOST:PORT, listen without secret_file, local =
// false without listen. Does not check for unknown keys.
Status ReadRemoteWorkers(TomlTableReader* r, RemoteWorkersConfig* out);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_SRC_WORKERS_TABLE_H_
