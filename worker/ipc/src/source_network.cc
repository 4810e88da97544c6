#include "source_network.h"

#include <boost/asio/ip/address_v4.hpp>
#include <boost/asio/ip/address_v6.hpp>

namespace ckpt::ipc::internal {

std::string SourceNetwork(const boost::asio::ip::address& address) {
  namespace ip = boost::asio::ip;
  ip::address_v4 v4;
  if (address.is_v4()) {
    v4 = address.to_v4();
  } else if (address.to_v6().is_v4_mapped()) {
    v4 = ip::make_address_v4(ip::v4_mapped, address.to_v6());
  } else {
    ip::address_v6::bytes_type bytes = address.to_v6().to_bytes();
    for (size_t i = 8; i < bytes.size(); ++i) bytes[i] = 0;
    return ip::address_v6(bytes).to_string() + "/64";
  }
  ip::address_v4::bytes_type bytes = v4.to_bytes();
  bytes[3] = 0;
  return ip::address_v4(bytes).to_string() + "/24";
}

}  // namespace ckpt::ipc::internal
