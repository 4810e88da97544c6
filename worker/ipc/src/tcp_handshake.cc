// The TCP transport's connection setup (ckpt/ipc/tcp_channel.h): the worker's
// TcpChannel::Connect and the scheduler's TcpListener, with the two halves of
// the handshake; Boost.Asio makes the connections (resolve, connect, listen,
// the listener's asynchronous handshakes). Asio errors become a Status here.
// An authenticated socket becomes a channel through MakeTcpChannel (tcp_io.h).
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include "ckpt/ipc/tcp_channel.h"
#include "hmac.h"
#include "payload_checksum.h"
#include "tcp_frame.h"
#include "tcp_io.h"

namespace ckpt::ipc {
namespace {

namespace asio = boost::asio;
using asio::ip::tcp;
using internal::CheckHeader;
using internal::MakeHeader;
using internal::NoStop;
using internal::ReadExact;
using internal::SetSocketOptions;
using internal::WriteAll;
using wire::FrameHeader;

std::string Endpoint(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
}

// One whole handshake frame (sequence 0) of `type` and exactly `size` bytes.
Status ReadHandshakeFrame(int fd, uint16_t type, size_t size, Deadline deadline,
                          const std::string& peer, std::vector<uint8_t>* payload) {
  FrameHeader h;
  CKPT_RETURN_IF_ERROR(ReadExact(fd, &h, sizeof(h), deadline, NoStop, peer, nullptr));
  CKPT_RETURN_IF_ERROR(CheckHeader(h, peer));
  if (h.type != type || h.payload_bytes != size || h.sequence != 0 || h.flags != 0) {
    return Status::Corruption("handshake from " + peer + ": expected frame type " +
                              std::to_string(type) + " of " + std::to_string(size) +
                              " bytes, got type " + std::to_string(h.type) + " of " +
                              std::to_string(h.payload_bytes));
  }
  payload->resize(size);
  CKPT_RETURN_IF_ERROR(ReadExact(fd, payload->data(), size, deadline, NoStop, peer, nullptr));
  if (internal::PayloadXxh3(payload->data(), size) != h.payload_xxh3) {
    return Status::Corruption("handshake from " + peer + ": payload checksum mismatch");
  }
  return Status::OK();
}

Status WriteHandshakeFrame(int fd, uint16_t type, const std::vector<uint8_t>& payload,
                           Deadline deadline, const std::string& peer) {
  FrameHeader h = MakeHeader(type, 0, 0, payload.data(), payload.size(), payload.size(), type, 0);
  std::vector<iovec> iov = {{&h, sizeof(h)},
                            {const_cast<uint8_t*>(payload.data()), payload.size()}};
  size_t written = 0;
  return WriteAll(fd, std::move(iov), deadline, NoStop, peer, &written);
}

StatusOr<internal::Mac> ProofMac(const std::string& secret, const uint8_t* first,
                                 const uint8_t* second, const char* label) {
  std::vector<uint8_t> in(first, first + wire::kNonceBytes);
  in.insert(in.end(), second, second + wire::kNonceBytes);
  in.insert(in.end(), label, label + std::strlen(label));
  return internal::HmacSha256(secret, in.data(), in.size());
}

Status AsioStatus(const std::string& what, const boost::system::error_code& ec) {
  return Status::Unavailable(what + ": " + ec.message());
}

class TcpListenerImpl final : public TcpListener {
 public:
  TcpListenerImpl(std::string secret, TcpOptions options)
      : secret_(std::move(secret)), options_(std::move(options)), acceptor_(io_) {}

  ~TcpListenerImpl() override {
    Close();
    for (auto& a : ready_) ::close(a.fd);
  }

  Status Bind(const std::string& host_port) {
    CKPT_ASSIGN_OR_RETURN(auto hp, ParseHostPort(host_port));
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
    thread_ = std::thread([this] { io_.run(); });
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
    a.channel =
        internal::MakeTcpChannel(p.fd, "worker at " + p.peer, "tcp:" + p.peer, options_.channel);
    return a;
  }

  uint16_t port() const override { return port_; }
  std::string address() const override { return address_; }
  TcpListenerStats Stats() const override { return {accepted_.load(), refused_.load()}; }

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
    std::string peer;
  };

  // One connection being authenticated; lives in its handlers.
  struct Session {
    explicit Session(asio::io_context& io) : socket(io), timer(io) {}
    tcp::socket socket;
    asio::steady_timer timer;
    std::string peer;
    std::vector<uint8_t> out;
    FrameHeader out_header{};
    FrameHeader in_header{};
    std::vector<uint8_t> in;
    uint8_t nonce[wire::kNonceBytes];
    bool done = false;
  };
  using SessionPtr = std::shared_ptr<Session>;

  void AcceptNext() {
    auto s = std::make_shared<Session>(io_);
    acceptor_.async_accept(s->socket, [this, s](const boost::system::error_code& ec) {
      if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) Begin(s);
      AcceptNext();
    });
  }

  void Refuse(const SessionPtr& s, const Status& why) {
    if (s->done) return;
    s->done = true;
    ++refused_;
    --pending_;
    if (options_.on_refused) options_.on_refused(s->peer, why);
    boost::system::error_code ec;
    s->timer.cancel(ec);
    s->socket.close(ec);
  }

  void Begin(const SessionPtr& s) {
    boost::system::error_code ec;
    const tcp::endpoint remote = s->socket.remote_endpoint(ec);
    s->peer = ec ? std::string("unknown peer") : Endpoint(remote);
    ++pending_;
    if (pending_ > options_.max_pending_handshakes) {
      Refuse(s, Status::ResourceExhausted("too many handshakes in progress (" +
                                          std::to_string(options_.max_pending_handshakes) + ")"));
      return;
    }
    s->timer.expires_after(options_.handshake_timeout);
    s->timer.async_wait([this, s](const boost::system::error_code& e) {
      if (e) return;
      Refuse(s,
             Status::ResourceExhausted("handshake not done within " +
                                       std::to_string(options_.handshake_timeout.count()) + " ms"));
    });
    Status r = internal::RandomBytes(s->nonce, sizeof(s->nonce));
    if (!r.ok()) return Refuse(s, r);
    s->out.assign(wire::kChallengeBytes, 0);
    const uint32_t version = wire::kProtocolVersion;
    std::memcpy(s->out.data(), &version, 4);
    std::memcpy(s->out.data() + 8, s->nonce, wire::kNonceBytes);
    s->out_header = MakeHeader(wire::kTypeChallenge, 0, 0, s->out.data(), s->out.size(),
                               s->out.size(), wire::kTypeChallenge, 0);
    std::vector<asio::const_buffer> bufs = {asio::buffer(&s->out_header, sizeof(FrameHeader)),
                                            asio::buffer(s->out)};
    asio::async_write(s->socket, bufs, [this, s](const boost::system::error_code& e, size_t) {
      if (s->done) return;
      if (e) return Refuse(s, AsioStatus("sending the challenge", e));
      asio::async_read(s->socket, asio::buffer(&s->in_header, sizeof(FrameHeader)),
                       [this, s](const boost::system::error_code& e2, size_t) {
                         if (s->done) return;
                         if (e2) return Refuse(s, AsioStatus("reading the proof", e2));
                         OnProofHeader(s);
                       });
    });
  }

  void OnProofHeader(const SessionPtr& s) {
    const FrameHeader& h = s->in_header;
    Status c = CheckHeader(h, s->peer);
    if (c.ok() && (h.type != wire::kTypeProof || h.payload_bytes != wire::kProofBytes ||
                   h.sequence != 0 || h.flags != 0)) {
      c = Status::Corruption("first frame is not a proof (type " + std::to_string(h.type) + ", " +
                             std::to_string(h.payload_bytes) + " bytes)");
    }
    if (!c.ok()) return Refuse(s, c);
    s->in.resize(wire::kProofBytes);
    asio::async_read(s->socket, asio::buffer(s->in),
                     [this, s](const boost::system::error_code& e, size_t) {
                       if (s->done) return;
                       if (e) return Refuse(s, AsioStatus("reading the proof", e));
                       OnProof(s);
                     });
  }

  void OnProof(const SessionPtr& s) {
    if (internal::PayloadXxh3(s->in.data(), s->in.size()) != s->in_header.payload_xxh3) {
      return Refuse(s, Status::Corruption("proof payload checksum mismatch"));
    }
    const uint8_t* worker_nonce = s->in.data();
    internal::Mac got;
    std::memcpy(got.data(), s->in.data() + wire::kNonceBytes, internal::kMacBytes);
    auto want = ProofMac(secret_, s->nonce, worker_nonce, wire::kWorkerLabel);
    if (!want.ok()) return Refuse(s, want.status());
    if (!internal::MacEqual(got, *want)) {
      return Refuse(s, Status::FailedPrecondition("wrong proof (the worker's secret differs)"));
    }
    auto mine = ProofMac(secret_, worker_nonce, s->nonce, wire::kSchedulerLabel);
    if (!mine.ok()) return Refuse(s, mine.status());
    s->out.assign(mine->begin(), mine->end());
    s->out_header = MakeHeader(wire::kTypeAccept, 0, 0, s->out.data(), s->out.size(), s->out.size(),
                               wire::kTypeAccept, 0);
    std::vector<asio::const_buffer> bufs = {asio::buffer(&s->out_header, sizeof(FrameHeader)),
                                            asio::buffer(s->out)};
    asio::async_write(s->socket, bufs, [this, s](const boost::system::error_code& e, size_t) {
      if (s->done) return;
      if (e) return Refuse(s, AsioStatus("sending the acceptance", e));
      s->done = true;
      --pending_;
      boost::system::error_code ec;
      s->timer.cancel(ec);
      Pending p;
      p.peer = s->peer;
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
        a.channel = internal::MakeTcpChannel(p.fd, "worker at " + p.peer, "tcp:" + p.peer,
                                             options_.channel);
        options_.on_accepted(std::move(a));
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) {
          ::close(p.fd);
          return;
        }
        ready_.push_back(std::move(p));
      }
      cv_.notify_all();
    });
  }

  const std::string secret_;
  const TcpOptions options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;  // listener thread (io_) only, after Bind
  int pending_ = 0;         // listener thread only
  uint16_t port_ = 0;
  std::string address_;
  std::thread thread_;
  std::atomic<uint64_t> accepted_{0}, refused_{0};

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending> ready_;  // GUARDED_BY(mu_)
  bool closed_ = false;        // GUARDED_BY(mu_)
};

}  // namespace

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

StatusOr<std::unique_ptr<Channel>> TcpChannel::Connect(const std::string& host_port,
                                                       const std::string& secret,
                                                       const TcpOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto hp, ParseHostPort(host_port));
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
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
  auto fail = [&](Status s) {
    ::close(fd);
    return s;
  };
  std::vector<uint8_t> challenge;
  Status s = ReadHandshakeFrame(fd, wire::kTypeChallenge, wire::kChallengeBytes, deadline, peer,
                                &challenge);
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  uint32_t version = 0;
  std::memcpy(&version, challenge.data(), 4);
  if (version != wire::kProtocolVersion) {
    return fail(Status::FailedPrecondition(peer + " speaks protocol version " +
                                           std::to_string(version) + ", this worker " +
                                           std::to_string(wire::kProtocolVersion)));
  }
  const uint8_t* server_nonce = challenge.data() + 8;
  std::vector<uint8_t> proof(wire::kProofBytes);
  s = internal::RandomBytes(proof.data(), wire::kNonceBytes);
  if (!s.ok()) return fail(s);
  auto mac = ProofMac(secret, server_nonce, proof.data(), wire::kWorkerLabel);
  if (!mac.ok()) return fail(mac.status());
  std::memcpy(proof.data() + wire::kNonceBytes, mac->data(), internal::kMacBytes);
  s = WriteHandshakeFrame(fd, wire::kTypeProof, proof, deadline, peer);
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  std::vector<uint8_t> accept;
  s = ReadHandshakeFrame(fd, wire::kTypeAccept, wire::kAcceptBytes, deadline, peer, &accept);
  if (s.IsUnavailable()) {
    return fail(Status::FailedPrecondition(
        peer +
        " refused this worker's proof (is the secret file the scheduler's?): " + s.message()));
  }
  if (!s.ok()) return fail(s.WithPrefix("handshake"));
  auto want = ProofMac(secret, proof.data(), server_nonce, wire::kSchedulerLabel);
  if (!want.ok()) return fail(want.status());
  internal::Mac got;
  std::memcpy(got.data(), accept.data(), internal::kMacBytes);
  if (!internal::MacEqual(got, *want)) {
    return fail(Status::FailedPrecondition(
        peer +
        " did not prove it holds the secret (a different scheduler, or a different "
        "secret file)"));
  }
  return internal::MakeTcpChannel(fd, peer, "tcp:" + host_port, options.channel);
}

StatusOr<std::unique_ptr<TcpListener>> TcpListener::Listen(const std::string& host_port,
                                                           const std::string& secret,
                                                           const TcpOptions& options) {
  if (secret.size() < kMinSecretBytes) {
    return Status::InvalidArgument("secret shorter than " + std::to_string(kMinSecretBytes) +
                                   " bytes");
  }
  auto l = std::make_unique<TcpListenerImpl>(secret, options);
  CKPT_RETURN_IF_ERROR(l->Bind(host_port));
  return std::unique_ptr<TcpListener>(std::move(l));
}

}  // namespace ckpt::ipc
