#include "ckpt/base/host_port.h"

#include <string>

namespace ckpt::base {

StatusOr<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& host_port) {
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("address '" + host_port + "': " + why +
                                   " (expected HOST:PORT, IPv6 as [ADDR]:PORT)");
  };
  std::string host;
  std::string port;
  if (!host_port.empty() && host_port[0] == '[') {
    const size_t close = host_port.find(']');
    if (close == std::string::npos || close + 1 >= host_port.size() ||
        host_port[close + 1] != ':') {
      return bad("unterminated [IPv6] address");
    }
    host = host_port.substr(1, close - 1);
    port = host_port.substr(close + 2);
  } else {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string::npos) return bad("no port");
    host = host_port.substr(0, colon);
    port = host_port.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("IPv6 addresses go in brackets");
  }
  if (host.empty()) return bad("no host");
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos) {
    return bad("port is not a number");
  }
  const int p = std::stoi(port);
  if (p > 65535) return bad("port above 65535");
  return std::make_pair(host, static_cast<uint16_t>(p));
}

}  // namespace ckpt::base
