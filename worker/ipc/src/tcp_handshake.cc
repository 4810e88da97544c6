// The TCP transport's connection setup (ckpt/ipc/tcp_channel.h): the worker's
// TcpChannel::Connect and the scheduler's TcpListener, each with its half of
// the TLS 1.3 handshake (tls.h); Boost.Asio makes the connections (resolve,
// connect, listen) and drives the listener's handshakes asynchronously on its
// thread. Asio errors become a Status here. A socket whose handshake is done
// becomes a channel through MakeTcpChannel (tcp_io.h).
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/base/host_port.h"
#include "ckpt/ipc/tcp_channel.h"
#include "source_network.h"
#include "tcp_io.h"
#include "tls.h"

namespace ckpt::ipc {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using internal::NoStop;
using internal::SetSocketOptions;
using internal::TlsContext;
using internal::TlsRole;
using internal::TlsSession;
using internal::TlsWant;
using internal::WaitFor;
using internal::WriteAll;
using std::chrono::milliseconds;

std::string Endpoint(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
}

Status AsioStatus(const std::string& what, const boost::system::error_code& ec) {
  return Status::Unavailable(what + ": " + ec.message());
}

// Longest pause after a failed accept (EMFILE, ENOBUFS...): the listener
// backs off from 10 ms, doubling, up to this, instead of spinning.
constexpr milliseconds kMaxAcceptBackoff{1000};

class TcpListenerImpl final : public TcpListener {
 public:
  TcpListenerImpl(std::shared_ptr<TlsContext> tls, TcpOptions options)
      : tls_(std::move(tls)), options_(std::move(options)), acceptor_(io_), backoff_timer_(io_) {}

  ~TcpListenerImpl() override {
    Close();
    for (auto& a : ready_) {
      a.tls.reset();
      ::close(a.fd);
    }
  }

  Status Bind(const std::string& host_port) {
    CKPT_ASSIGN_OR_RETURN(auto hp, base::ParseHostPort(host_port));
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(hp.first, std::to_string(hp.second),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) return AsioStatus("resolving " + host_port, ec);
    const tcp::endpoint ep = results.begin()->endpoint();
    acceptor_.open(ep.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(ep, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return AsioStatus("listening on " + host_port, ec);
    const tcp::endpoint bound = acceptor_.local_endpoint(ec);
    if (ec) return AsioStatus("listening on " + host_port, ec);
    port_ = bound.port();
    address_ = Endpoint(bound);
    AcceptNext();
    thread_ = std::thread([this] { Run(); });
    return Status::OK();
  }

  StatusOr<Accepted> Accept(Deadline deadline) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_until(lock, deadline, [&] { return closed_ || !ready_.empty(); });
    if (closed_) return Status::Aborted("listener on " + address_ + " closed");
    if (ready_.empty()) return Status::ResourceExhausted("no worker connected by the deadline");
    Pending p = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    Accepted a;
    a.peer = p.peer;
    a.channel = internal::MakeTcpChannel(p.fd, std::move(p.tls), "worker at " + p.peer,
                                         "tcp:" + p.peer, options_);
    return a;
  }

  uint16_t port() const override { return port_; }
  std::string address() const override { return address_; }
  TcpListenerStats Stats() const override {
    TcpListenerStats st;
    st.accepted = accepted_.load();
    st.refused = refused_.load();
    st.accept_errors = accept_errors_.load();
    st.faults = faults_.load();
    return st;
  }

  void Close() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
    }
    cv_.notify_all();
    asio::post(io_, [this] {
      boost::system::error_code ec;
      acceptor_.close(ec);
      io_.stop();
    });
    if (thread_.joinable()) thread_.join();
  }

 private:
  struct Pending {
    int fd = -1;
    std::unique_ptr<TlsSession> tls;
    std::string peer;
  };

  // One connection being authenticated; lives in its handlers.
  struct Session {
    explicit Session(asio::io_context& io) : socket(io), timer(io) {}
    tcp::socket socket;
    asio::steady_timer timer;
    std::string peer;    // ADDRESS:PORT
    std::string source;  // its network (SourceNetwork): the key of its handshake slot
    std::unique_ptr<TlsSession> tls;
    std::vector<uint8_t> out;  // handshake bytes being sent
    bool done = false;
  };
  using SessionPtr = std::shared_ptr<Session>;

  // The listener thread's root: a handler that throws (bad_alloc, a bug) is
  // counted and told, and the loop goes on; the session it served is closed
  // by its deadline.
  void Run() {
    while (true) {
      try {
        io_.run();
        return;
      } catch (const std::exception& e) {
        ++faults_;
        if (options_.on_refused) {
          options_.on_refused("(listener)",
                              Status::Internal(std::string("handler failed: ") + e.what()));
        }
      } catch (...) {
        ++faults_;
      }
    }
  }

  void AcceptNext() {
    auto s = std::make_shared<Session>(io_);
    acceptor_.async_accept(s->socket, [this, s](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (ec) {
        // Out of descriptors or buffers: back off, do not spin.
        ++accept_errors_;
        backoff_ = std::min(kMaxAcceptBackoff,
                            backoff_ == milliseconds(0) ? milliseconds(10) : backoff_ * 2);
        if (options_.on_refused) {
          options_.on_refused("(accept)", AsioStatus("accepting a connection (retrying in " +
                                                         std::to_string(backoff_.count()) + " ms)",
                                                     ec));
        }
        backoff_timer_.expires_after(backoff_);
        backoff_timer_.async_wait([this](const boost::system::error_code& e) {
          if (!e && acceptor_.is_open()) AcceptNext();
        });
        return;
      }
      backoff_ = milliseconds(0);
      Begin(s);
      AcceptNext();
    });
  }

  void Release(const SessionPtr& s) {
    --pending_;
    auto it = by_source_.find(s->source);
    if (it != by_source_.end() && --it->second <= 0) by_source_.erase(it);
  }

  void Refuse(const SessionPtr& s, const Status& why) {
    if (s->done) return;
    s->done = true;
    ++refused_;
    Release(s);
    if (options_.on_refused) options_.on_refused(s->peer, why);
    boost::system::error_code ec;
    s->timer.cancel(ec);
    s->tls.reset();
    s->socket.close(ec);
  }

  void Begin(const SessionPtr& s) {
    boost::system::error_code ec;
    const tcp::endpoint remote = s->socket.remote_endpoint(ec);
    s->peer = ec ? std::string("unknown peer") : Endpoint(remote);
    s->source = ec ? std::string("unknown") : internal::SourceNetwork(remote.address());
    ++pending_;
    const int from_source = ++by_source_[s->source];
    if (pending_ > options_.max_pending_handshakes) {
      Refuse(s, Status::ResourceExhausted("too many handshakes in progress (" +
                                          std::to_string(options_.max_pending_handshakes) + ")"));
      return;
    }
    if (from_source > options_.max_handshakes_per_source) {
      Refuse(s,
             Status::ResourceExhausted("too many handshakes in progress from " + s->source + " (" +
                                       std::to_string(options_.max_handshakes_per_source) + ")"));
      return;
    }
    s->timer.expires_after(options_.handshake_timeout);
    s->timer.async_wait([this, s](const boost::system::error_code& e) {
      if (e) return;
      Refuse(s,
             Status::ResourceExhausted("handshake not done within " +
                                       std::to_string(options_.handshake_timeout.count()) + " ms"));
    });
    s->socket.non_blocking(true, ec);
    if (ec) return Refuse(s, AsioStatus("setting up the connection", ec));
    auto tls = TlsSession::Make(tls_, s->socket.native_handle());
    if (!tls.ok()) return Refuse(s, tls.status());
    s->tls = std::move(*tls);
    Step(s);
  }

  // One step of the server's TLS handshake: send what it produced, then
  // finish, fail, or wait for the socket.
  void Step(const SessionPtr& s) {
    TlsWant want = TlsWant::kNone;
    const Status r = s->tls->Handshake(&want);
    s->out.clear();
    s->tls->TakeOutput(&s->out);
    auto next = [this, s, r, want] {
      if (s->done) return;
      if (r.ok()) return Finish(s);
      if (r.code() == StatusCode::kFailedPrecondition) {
        return Refuse(
            s, Status::FailedPrecondition("wrong secret, or not a ckpt worker of this version (" +
                                          r.message() + ")"));
      }
      if (!r.IsResourceExhausted()) return Refuse(s, r);
      s->socket.async_wait(
          want == TlsWant::kWrite ? tcp::socket::wait_write : tcp::socket::wait_read,
          [this, s](const boost::system::error_code& e) {
            if (s->done) return;
            if (e) return Refuse(s, AsioStatus("during the handshake", e));
            Step(s);
          });
    };
    if (s->out.empty()) return next();
    asio::async_write(s->socket, asio::buffer(s->out),
                      [this, s, next](const boost::system::error_code& e, size_t) {
                        if (s->done) return;
                        if (e) return Refuse(s, AsioStatus("during the handshake", e));
                        next();
                      });
  }

  void Finish(const SessionPtr& s) {
    s->done = true;
    Release(s);
    boost::system::error_code ec;
    s->timer.cancel(ec);
    Pending p;
    p.peer = s->peer;
    p.tls = std::move(s->tls);
    p.fd = s->socket.release(ec);
    if (ec) {
      ++refused_;
      if (options_.on_refused) options_.on_refused(s->peer, AsioStatus("releasing socket", ec));
      return;
    }
    SetSocketOptions(p.fd);
    ++accepted_;
    if (options_.on_accepted) {
      Accepted a;
      a.peer = p.peer;
      a.channel = internal::MakeTcpChannel(p.fd, std::move(p.tls), "worker at " + p.peer,
                                           "tcp:" + p.peer, options_);
      options_.on_accepted(std::move(a));
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        ready_.push_back(std::move(p));
        p.fd = -1;
      }
    }
    if (p.fd >= 0) {
      p.tls.reset();
      ::close(p.fd);
      return;
    }
    cv_.notify_all();
  }

  const std::shared_ptr<TlsContext> tls_;
  const TcpOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;                // listener thread (io_) only, after Bind
  asio::steady_timer backoff_timer_;      // listener thread only
  milliseconds backoff_{0};               // listener thread only
  int pending_ = 0;                       // listener thread only
  std::map<std::string, int> by_source_;  // listener thread only: handshakes per network
  uint16_t port_ = 0;
  std::string address_;
  std::thread thread_;
  std::atomic<uint64_t> accepted_{0}, refused_{0}, accept_errors_{0}, faults_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> ready_;  // GUARDED_BY(mu_)
  bool closed_ = false;        // GUARDED_BY(mu_)
};

}  // namespace

StatusOr<std::unique_ptr<Channel>> TcpChannel::Connect(const std::string& host_port,
                                                       const std::string& secret,
                                                       const TcpOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto hp, base::ParseHostPort(host_port));
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
  CKPT_ASSIGN_OR_RETURN(auto context, TlsContext::Make(TlsRole::kClient, secret));
  const Deadline deadline = Clock::now() + options.handshake_timeout;
  asio::io_context io;
  tcp::socket socket(io);
  boost::system::error_code result = asio::error::timed_out;
  bool finished = false;
  tcp::resolver resolver(io);
  boost::system::error_code ec;
  auto endpoints =
      resolver.resolve(hp.first, std::to_string(hp.second), tcp::resolver::numeric_service, ec);
  if (ec) return AsioStatus("resolving " + host_port, ec);
  asio::async_connect(socket, endpoints,
                      [&](const boost::system::error_code& e, const tcp::endpoint&) {
                        result = e;
                        finished = true;
                      });
  io.run_until(deadline);
  if (!finished) {
    socket.close(ec);
    return Status::Unavailable("connecting to " + host_port + ": timed out");
  }
  if (result) return AsioStatus("connecting to " + host_port, result);
  const int fd = socket.release(ec);
  if (ec) return AsioStatus("connecting to " + host_port, ec);
  SetSocketOptions(fd);
  const std::string peer = "scheduler at " + host_port;
  auto tls = TlsSession::Make(context, fd);
  if (!tls.ok()) {
    ::close(fd);
    return tls.status();
  }
  auto fail = [&](Status s) {
    tls->reset();
    ::close(fd);
    return s;
  };
  std::vector<uint8_t> out;
  while (true) {
    TlsWant want = TlsWant::kNone;
    const Status r = (*tls)->Handshake(&want);
    out.clear();
    (*tls)->TakeOutput(&out);
    size_t written = 0;
    const Status w = WriteAll(fd, {{out.data(), out.size()}}, deadline, NoStop, peer, &written);
    if (r.ok() && w.ok()) break;
    if (r.code() == StatusCode::kFailedPrecondition) {
      return fail(Status::FailedPrecondition(
          "TLS handshake with " + peer +
          " failed (is the secret file the scheduler's?): " + r.message()));
    }
    if (!r.ok() && !r.IsResourceExhausted()) return fail(r.WithPrefix("handshake with " + peer));
    if (!w.ok()) return fail(w.WithPrefix("handshake"));
    const Status waited = WaitFor(fd, want == TlsWant::kWrite ? POLLOUT : POLLIN, deadline, NoStop,
                                  "handshake with " + peer);
    if (!waited.ok()) return fail(waited);
  }
  return internal::MakeTcpChannel(fd, std::move(*tls), peer, "tcp:" + host_port, options);
}

StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host_port,
                                                           const std::string& secret,
                                                           const TcpOptions& options) {
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
  CKPT_ASSIGN_OR_RETURN(auto context, TlsContext::Make(TlsRole::kServer, secret));
  auto l = std::make_unique<TcpListenerImpl>(std::move(context), options);
  CKPT_RETURN_IF_ERROR(l->Bind(host_port));
  return std::unique_ptr<TcpListener>(std::move(l));
}

}  // namespace ckpt::ipc
