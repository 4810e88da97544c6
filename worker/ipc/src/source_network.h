// The network a connecting peer is counted in for the listener's handshake
// slots (TcpOptions::max_handshakes_per_source): its IPv4 /24 or its IPv6
// /64, so that neither 8 addresses of one subnet nor the 2^64 addresses one
// IPv6 host may use hold every slot. An IPv4-mapped IPv6 address counts as
// its IPv4 address.
//
// Thread-safety: a pure function.
#ifndef CKPT_IPC_SRC_SOURCE_NETWORK_H_
#define CKPT_IPC_SRC_SOURCE_NETWORK_H_

#include <boost/asio/ip/address.hpp>
#include <string>

namespace ckpt::ipc::internal {

// "192.0.2.0/24", "2001:db8:1:2::/64".
std::string SourceNetwork(const boost::asio::ip::address& address);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_SOURCE_NETWORK_H_
