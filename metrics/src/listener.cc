#include "listener.h"

#include <arpa/inet.h>
#include <prometheus/exposer.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <string>
#include <utility>

namespace ckpt::metrics {
namespace {

StatusOr<ListenAddress> ParseListen(const std::string& listen) {
  auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("metrics listen address \"" + listen + "\": " + why);
  };
  if (!listen.empty() && listen.front() == '[') {
    return bad("IPv6 is not supported by the HTTP server (civetweb built without it)");
  }
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0) {
    return bad("expected HOST:PORT with a numeric IPv4 host (127.0.0.1:9464, 0.0.0.0:9464)");
  }
  const std::string port_text = listen.substr(colon + 1);
  if (port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoi(port_text) > 65535) {
    return bad("port must be a number in 0..65535");
  }
  const std::string host = listen.substr(0, colon);
  ListenAddress out;
  out.addr.sin_family = AF_INET;
  out.addr.sin_port = htons(static_cast<uint16_t>(std::stoi(port_text)));
  if (inet_pton(AF_INET, host.c_str(), &out.addr.sin_addr) != 1) {
    return bad("host must be a numeric IPv4 address");
  }
  return out;
}

// Why binding `a` fails now (strerror), or "" when it would succeed. Binds as
// the listener does (SO_REUSEADDR), so a port in TIME_WAIT is not reported
// busy, and closes at once without listening.
std::string BindProbe(const ListenAddress& a) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::string("socket: ") + std::strerror(errno);
  const int one = 1;
  (void)::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  std::string why;
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&a.addr), sizeof(a.addr)) != 0) {
    why = std::strerror(errno);
  }
  ::close(fd);
  return why;
}

}  // namespace

StatusOr<ListenAddress> CheckListenAddress(const std::string& listen) {
  CKPT_ASSIGN_OR_RETURN(ListenAddress address, ParseListen(listen));
  if (std::string why = BindProbe(address); !why.empty()) {
    return Status::Unavailable("metrics listener " + listen + ": cannot bind: " + why);
  }
  return address;
}

StatusOr<std::unique_ptr<Listener>> Listener::Start(
    const MetricsOptions& options, const ListenAddress& address,
    const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables) {
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", options.listen, "num_threads", std::to_string(options.http_threads)});
    for (const auto& collectable : collectables) exposer->RegisterCollectable(collectable);
    const std::vector<int> ports = exposer->GetListeningPorts();
    if (ports.empty()) {
      return Status::Unavailable("metrics listener " + options.listen + ": no listening port");
    }
    return std::unique_ptr<Listener>(new Listener(std::move(exposer), ports.front()));
  } catch (const std::exception& e) {
    exposer.reset();
    // CheckListenAddress's probe passed; say what the system says now, if anything.
    const std::string why = BindProbe(address);
    return Status::Unavailable("metrics listener " + options.listen +
                               ": cannot listen: " + (why.empty() ? e.what() : why));
  }
}

Listener::Listener(std::unique_ptr<prometheus::Exposer> exposer, int port)
    : exposer_(std::move(exposer)), port_(port) {}

Listener::~Listener() = default;

}  // namespace ckpt::metrics
