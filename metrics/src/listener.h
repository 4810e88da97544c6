// The HTTP listener: prometheus-cpp's Exposer (civetweb through it) serving
// collectables as the Prometheus text format on GET /metrics, on its own
// threads. Its exceptions are caught in listener.cc and become a Status.
//
// A Listener serves from Start until it is destroyed; it holds its
// collectables weakly, so their owner keeps them alive as long as it.
#ifndef CKPT_METRICS_SRC_LISTENER_H_
#define CKPT_METRICS_SRC_LISTENER_H_

#include <netinet/in.h>
#include <prometheus/collectable.h>

#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/metrics/metrics.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace ckpt::metrics {

// "HOST:PORT" with a numeric IPv4 host. IPv6 is refused: Debian's civetweb,
// which prometheus-cpp serves with, is built without it.
struct ListenAddress {
  sockaddr_in addr{};
};

// `listen` parsed, and bindable now (probed as the listener binds, with
// SO_REUSEADDR, so a port in TIME_WAIT is not reported busy). InvalidArgument
// naming the address when it is malformed; Unavailable naming it, with the
// system's reason, when the bind fails.
StatusOr<ListenAddress> CheckListenAddress(const std::string& listen);

class Listener {
 public:
  // Serves `collectables` on options.listen (which parsed to `address`) with
  // options.http_threads threads. Unavailable naming the address when it
  // cannot listen, with the system's reason when a new bind probe gives one.
  static StatusOr<std::unique_ptr<Listener>> Start(
      const MetricsOptions& options, const ListenAddress& address,
      const std::vector<std::weak_ptr<prometheus::Collectable>>& collectables);

  // Stops serving; an in-progress scrape completes first.
  ~Listener();
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // The port bound (the chosen one when the address asked for port 0).
  int port() const { return port_; }

 private:
  Listener(std::unique_ptr<prometheus::Exposer> exposer, int port);

  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_;
};

}  // namespace ckpt::metrics

#endif  // CKPT_METRICS_SRC_LISTENER_H_
