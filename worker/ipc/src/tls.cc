// The TLS adapter (tls.h): OpenSSL 3 (1.1.1 at least) with a TLS 1.3
// external PSK. The socket is reached through a small BIO of our own: reads
// recv(2) from the non-blocking socket, writes append to the session's
// output, which the caller sends (so OpenSSL never raises SIGPIPE nor holds a
// record half-sent).
#include "tls.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "hmac.h"
#include "tcp_frame.h"

namespace ckpt::ipc::internal {
namespace {

// The PSK's identity on the wire names the frame protocol's version: a peer
// speaking another one neither offers nor finds this key.
const std::string& PskIdentity() {
  static const std::string id = "ckpt-tcp-v" + std::to_string(wire::kProtocolVersion);
  return id;
}
// What HMAC-SHA256(secret, .) of makes the PSK.
constexpr char kPskLabel[] = "ckpt TLS 1.3 external PSK v2";
// TLS_AES_128_GCM_SHA256: the PSK's suite (its hash, SHA-256, is the one the
// PSK is bound to; the ChaCha20 suite shares it).
constexpr unsigned char kPskSuite[2] = {0x13, 0x01};
// Frames up to this size are sealed as one record (TLS's largest is 16 KiB).
constexpr size_t kSmallRecord = 4096;
// OpenSSL's read buffer with read-ahead on.
constexpr size_t kReadBufferBytes = size_t{256} << 10;
constexpr char kSuites[] = "TLS_AES_128_GCM_SHA256:TLS_CHACHA20_POLY1305_SHA256";

// OpenSSL's reasons on this thread's error queue, emptied.
std::string Reasons() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    const char* r = ERR_reason_error_string(e);
    if (!out.empty()) out += "; ";
    out += r != nullptr ? r : ("error " + std::to_string(e));
  }
  return out.empty() ? "no reason given" : out;
}

// --- the socket BIO -------------------------------------------------------

// The BIO's data: the session's socket and output.
struct BioTarget {
  int fd = -1;
  std::vector<uint8_t> out;
};

int BioWrite(BIO* b, const char* data, int size) {
  auto* t = static_cast<BioTarget*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  const auto* bytes = reinterpret_cast<const uint8_t*>(data);  // memmove, not a loop
  t->out.insert(t->out.end(), bytes, bytes + size);
  return size;
}

int BioRead(BIO* b, char* out, int size) {
  const int fd = static_cast<BioTarget*>(BIO_get_data(b))->fd;
  BIO_clear_retry_flags(b);
  const ssize_t n = ::recv(fd, out, static_cast<size_t>(size), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    BIO_set_retry_read(b);
  }
  return static_cast<int>(n);
}

long BioCtrl(BIO* /*b*/, int cmd, long /*num*/, void* /*ptr*/) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;
}

int BioCreate(BIO* b) {
  BIO_set_init(b, 1);
  return 1;
}

const BIO_METHOD* SocketMethod() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "ckpt socket");
    if (m == nullptr) return m;
    BIO_meth_set_write(m, BioWrite);
    BIO_meth_set_read(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_create(m, BioCreate);
    return m;
  }();
  return method;
}

SSL_SESSION* PskSession(const Mac& psk, const SSL_CIPHER* cipher) {
  SSL_SESSION* s = SSL_SESSION_new();
  if (s == nullptr) return nullptr;
  if (SSL_SESSION_set1_master_key(s, psk.data(), psk.size()) != 1 ||
      SSL_SESSION_set_cipher(s, cipher) != 1 ||
      SSL_SESSION_set_protocol_version(s, TLS1_3_VERSION) != 1) {
    SSL_SESSION_free(s);
    return nullptr;
  }
  return s;
}

}  // namespace

struct TlsContext::Impl {
  SSL_CTX* ctx = nullptr;
  Mac psk{};
  ~Impl() {
    if (ctx != nullptr) SSL_CTX_free(ctx);
  }
};

struct TlsSession::Impl {
  SSL* ssl = nullptr;
  BioTarget target;
  ~Impl() {
    if (ssl != nullptr) SSL_free(ssl);
  }
};

namespace {

const Mac& PskOf(SSL* ssl) {
  return static_cast<TlsContext::Impl*>(SSL_CTX_get_app_data(SSL_get_SSL_CTX(ssl)))->psk;
}

// Client: offer the PSK (ownership of *sess passes to OpenSSL).
int UsePsk(SSL* ssl, const EVP_MD* md, const unsigned char** id, size_t* idlen,
           SSL_SESSION** sess) {
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kPskSuite);
  if (cipher == nullptr) return 0;
  if (md != nullptr && md != SSL_CIPHER_get_handshake_digest(cipher)) {
    *id = nullptr;
    *idlen = 0;
    *sess = nullptr;
    return 1;  // no PSK for another hash: the handshake then fails
  }
  SSL_SESSION* s = PskSession(PskOf(ssl), cipher);
  if (s == nullptr) return 0;
  *id = reinterpret_cast<const unsigned char*>(PskIdentity().data());
  *idlen = PskIdentity().size();
  *sess = s;
  return 1;
}

// Server: the PSK for our identity, none for any other.
int FindPsk(SSL* ssl, const unsigned char* identity, size_t identity_len, SSL_SESSION** sess) {
  *sess = nullptr;
  if (identity_len != PskIdentity().size() ||
      std::memcmp(identity, PskIdentity().data(), identity_len) != 0) {
    return 1;
  }
  const SSL_CIPHER* cipher = SSL_CIPHER_find(ssl, kPskSuite);
  if (cipher == nullptr) return 0;
  *sess = PskSession(PskOf(ssl), cipher);
  return *sess != nullptr ? 1 : 0;
}

}  // namespace

TlsContext::TlsContext(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TlsContext::~TlsContext() = default;

StatusOr<std::shared_ptr<TlsContext>> TlsContext::Make(TlsRole role, const std::string& secret) {
  auto impl = std::make_unique<Impl>();
  CKPT_ASSIGN_OR_RETURN(impl->psk, HmacSha256(secret, kPskLabel, sizeof(kPskLabel) - 1));
  ERR_clear_error();
  impl->ctx = SSL_CTX_new(role == TlsRole::kClient ? TLS_client_method() : TLS_server_method());
  if (impl->ctx == nullptr) return Status::Internal("TLS context: " + Reasons());
  SSL_CTX* ctx = impl->ctx;
  const bool ok = SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION) == 1 &&
                  SSL_CTX_set_ciphersuites(ctx, kSuites) == 1 &&
                  SSL_CTX_set_num_tickets(ctx, 0) == 1 && SocketMethod() != nullptr;
  if (!ok) return Status::Internal("TLS context: " + Reasons());
  // No tickets, no resumption but the PSK's, no renegotiation (TLS 1.3 has
  // none), a bare EOF read as a close (the frames carry their own lengths).
  SSL_CTX_set_options(ctx,
                      SSL_OP_NO_TICKET | SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  // Whole records (and more) per recv(2), not a header and a body each.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, kReadBufferBytes);
  if (role == TlsRole::kClient) {
    // A certificate is never accepted: with no trusted roots, a server that
    // ignores the PSK and shows one fails verification.
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    SSL_CTX_set_psk_use_session_callback(ctx, UsePsk);
  } else {
    SSL_CTX_set_psk_find_session_callback(ctx, FindPsk);
  }
  SSL_CTX_set_app_data(ctx, impl.get());
  return std::shared_ptr<TlsContext>(new TlsContext(std::move(impl)));
}

TlsSession::TlsSession(std::shared_ptr<TlsContext> context, std::unique_ptr<Impl> impl, int fd)
    : context_(std::move(context)), impl_(std::move(impl)), fd_(fd) {}
TlsSession::~TlsSession() = default;

StatusOr<std::unique_ptr<TlsSession>> TlsSession::Make(std::shared_ptr<TlsContext> context,
                                                       int fd) {
  ERR_clear_error();
  auto impl = std::make_unique<Impl>();
  impl->ssl = SSL_new(context->impl_->ctx);
  if (impl->ssl == nullptr) return Status::Internal("TLS session: " + Reasons());
  BIO* bio = BIO_new(SocketMethod());
  if (bio == nullptr) return Status::Internal("TLS session: " + Reasons());
  impl->target.fd = fd;
  BIO_set_data(bio, &impl->target);
  SSL_set_bio(impl->ssl, bio, bio);  // the SSL owns the BIO
  if (SSL_is_server(impl->ssl)) {
    SSL_set_accept_state(impl->ssl);
  } else {
    SSL_set_connect_state(impl->ssl);
  }
  return std::unique_ptr<TlsSession>(new TlsSession(std::move(context), std::move(impl), fd));
}

Status TlsSession::Handshake(TlsWant* want) {
  std::lock_guard<std::mutex> lock(mu_);
  *want = TlsWant::kNone;
  ERR_clear_error();
  errno = 0;
  const int r = SSL_do_handshake(impl_->ssl);
  if (r == 1) {
    // The key must be the PSK: with no certificate accepted on either side,
    // anything else has failed already; checked again for certain.
    if (SSL_session_reused(impl_->ssl) != 1) {
      return Status::FailedPrecondition("TLS handshake done without the experiment's key");
    }
    return Status::OK();
  }
  const int e = SSL_get_error(impl_->ssl, r);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      *want = TlsWant::kRead;
      return Status::ResourceExhausted("TLS handshake in progress");
    case SSL_ERROR_WANT_WRITE:
      *want = TlsWant::kWrite;
      return Status::ResourceExhausted("TLS handshake in progress");
    case SSL_ERROR_SSL:
      return Status::FailedPrecondition("TLS handshake failed: " + Reasons());
    default: {
      const int err = errno;
      ERR_clear_error();
      return Status::Unavailable(std::string("connection closed during the TLS handshake") +
                                 (err != 0 ? std::string(": ") + std::strerror(err) : ""));
    }
  }
}

StatusOr<size_t> TlsSession::Read(void* out, size_t size, TlsWant* want) {
  std::lock_guard<std::mutex> lock(mu_);
  *want = TlsWant::kNone;
  ERR_clear_error();
  errno = 0;
  size_t n = 0;
  const int r = SSL_read_ex(impl_->ssl, out, size, &n);
  if (r == 1) return n;
  const int e = SSL_get_error(impl_->ssl, r);
  switch (e) {
    case SSL_ERROR_WANT_READ:
      *want = TlsWant::kRead;
      return size_t{0};
    case SSL_ERROR_WANT_WRITE:
      *want = TlsWant::kWrite;
      return size_t{0};
    case SSL_ERROR_ZERO_RETURN:
      return Status::Unavailable("closed the connection");
    case SSL_ERROR_SSL:
      return Status::Corruption("TLS record refused (" + Reasons() + ")");
    default: {
      const int err = errno;
      ERR_clear_error();
      if (err == 0) return Status::Unavailable("closed the connection");
      return Status::Unavailable(std::string("connection lost: ") + std::strerror(err));
    }
  }
}

Status TlsSession::Seal(const iovec* parts, size_t count, std::vector<uint8_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto write = [&](const void* data, size_t size) -> Status {
    if (size == 0) return Status::OK();
    ERR_clear_error();
    size_t n = 0;
    // The BIO never blocks, so a write takes everything or fails for good.
    if (SSL_write_ex(impl_->ssl, data, size, &n) != 1 || n != size) {
      return Status::Unavailable("TLS: " + Reasons());
    }
    return Status::OK();
  };
  size_t total = 0;
  for (size_t i = 0; i < count; ++i) total += parts[i].iov_len;
  // Room for the records (each at most 16 KiB of plaintext + 22 bytes) up
  // front: no reallocation while OpenSSL writes them.
  impl_->target.out.reserve(impl_->target.out.size() + total + (total / 16384 + 2) * 32);
  if (count > 1 && total <= kSmallRecord) {
    // A small frame as one record, not one per part.
    uint8_t joined[kSmallRecord];
    size_t at = 0;
    for (size_t i = 0; i < count; ++i) {
      if (parts[i].iov_len > 0) std::memcpy(joined + at, parts[i].iov_base, parts[i].iov_len);
      at += parts[i].iov_len;
    }
    CKPT_RETURN_IF_ERROR(write(joined, total));
  } else {
    for (size_t i = 0; i < count; ++i) {
      CKPT_RETURN_IF_ERROR(write(parts[i].iov_base, parts[i].iov_len));
    }
  }
  if (out->empty()) {
    out->swap(impl_->target.out);
  } else {
    out->insert(out->end(), impl_->target.out.begin(), impl_->target.out.end());
  }
  impl_->target.out.clear();
  return Status::OK();
}

void TlsSession::TakeOutput(std::vector<uint8_t>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  out->insert(out->end(), impl_->target.out.begin(), impl_->target.out.end());
  impl_->target.out.clear();
}

std::string TlsSession::Describe() const {
  const SSL_CIPHER* c = SSL_get_current_cipher(impl_->ssl);
  return std::string(SSL_get_version(impl_->ssl)) + " " +
         (c != nullptr ? SSL_CIPHER_get_name(c) : "(no cipher)");
}

}  // namespace ckpt::ipc::internal
