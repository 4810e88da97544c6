// "HOST:PORT" addresses as the configuration spells them ([workers] listen,
// ckpt-worker --connect): one parser for the scheduler's records and the TCP
// channel.
//
// Thread-safety: pure functions.
#ifndef CKPT_BASE_HOST_PORT_H_
#define CKPT_BASE_HOST_PORT_H_

#include <cstdint>
#include <string>
#include <utility>

#include "ckpt/base/status.h"

namespace ckpt::base {

// Splits "HOST:PORT" (IPv6 as "[ADDR]:PORT") into host and port.
// InvalidArgument naming `host_port` when it is not of that form or the port
// is not in [0, 65535].
StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port);

}  // namespace ckpt::base

#endif  // CKPT_BASE_HOST_PORT_H_
