// A minimal HTTP/1.1 client over a plain TCP socket, for tests that talk to a
// real server (the metrics listener, a real Prometheus). One request per
// connection ("Connection: close"); chunked bodies are decoded; no TLS, no
// redirects, no compression (none is asked for).
//
// Thread-safety: stateless; call from any thread.
#ifndef CKPT_TESTS_METRICS_HTTP_GET_H_
#define CKPT_TESTS_METRICS_HTTP_GET_H_

#include <chrono>
#include <map>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::testing {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
};

// GET http://HOST:PORT<target> with a numeric IPv4 `host`. Unavailable when the
// connection is refused or times out (naming the address), IOError on another
// socket error, Corruption for a response that is not HTTP.
StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& target,
                               std::chrono::milliseconds timeout = std::chrono::seconds(10));

// Percent-encodes `s` for a query string (everything but A-Z a-z 0-9 - _ . ~).
std::string UrlEncode(const std::string& s);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_METRICS_HTTP_GET_H_
