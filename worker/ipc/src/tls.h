// The TLS adapter of ckpt::ipc (private): TLS 1.3 over a connected,
// non-blocking TCP socket, keyed by the experiment's secret as an external
// pre-shared key (RFC 8446 section 4.2.11), with an (EC)DHE exchange on top
// (psk_dhe_ke) so that a secret stolen later does not open recorded sessions.
// Both sides prove they hold the key (the client's PSK binder, the server's
// Finished), and every byte after the handshake is encrypted and
// authenticated (AES-128-GCM or ChaCha20-Poly1305), with TLS's record
// sequence numbers refusing replays, reordering and truncation.
//
// OpenSSL is used in tls.cc alone (and in hmac.cc); its failures become a
// Status here. OpenSSL reads the socket itself (non-blocking: a call says when
// it would block, and the caller waits with poll(2) or Asio's reactor), but
// never writes it: what it produces (records, handshake messages, alerts) is
// collected in the session and taken by the caller (Seal, TakeOutput), who
// sends it. So sealing never blocks, a sealed frame is committed whole, and
// the channel keeps its own bookkeeping of what the kernel has taken.
//
// Thread-safety: TlsContext is immutable after Make and shared by its
// sessions. A TlsSession's Read and Seal may be called from two threads at
// once (one reading, one writing): they are serialized inside, each call being
// non-blocking.
#ifndef CKPT_IPC_SRC_TLS_H_
#define CKPT_IPC_SRC_TLS_H_

#include <sys/uio.h>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ckpt/base/status.h"

namespace ckpt::ipc::internal {

// Which way a non-blocking TLS call would block.
enum class TlsWant { kNone, kRead, kWrite };

enum class TlsRole { kClient, kServer };

class TlsContext {
 public:
  // A TLS 1.3-only context for `role` whose only key is derived from
  // `secret` (HMAC-SHA256 of a fixed label: the secret itself is never the
  // key). No certificates, no session tickets, no early data, no
  // renegotiation. Internal when OpenSSL refuses to set it up.
  static StatusOr<std::shared_ptr<TlsContext>> Make(TlsRole role, const std::string& secret);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  struct Impl;

 private:
  explicit TlsContext(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend class TlsSession;
};

class TlsSession {
 public:
  // A session on `fd` (connected, non-blocking; not owned: the caller closes
  // it). Internal when OpenSSL refuses.
  static StatusOr<std::unique_ptr<TlsSession>> Make(std::shared_ptr<TlsContext> context, int fd);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  int fd() const { return fd_; }

  // One step of the handshake. OK when it is done; ResourceExhausted with
  // `*want` set when it must wait for the socket; Unavailable when the
  // connection closed or broke; FailedPrecondition when the handshake failed
  // (the other side holds another secret, or does not speak this protocol),
  // naming OpenSSL's reason.
  Status Handshake(TlsWant* want);

  // Reads up to `size` decrypted bytes: their count (> 0); 0 with `*want` set
  // when it would block. Unavailable when the peer closed the connection or
  // it broke; Corruption when a record fails authentication or the peer
  // breaks the protocol (a changed, replayed, reordered or forged record):
  // the session is unusable from then on.
  StatusOr<size_t> Read(void* out, size_t size, TlsWant* want);

  // Encrypts `parts` (one or more records; a small frame as one) and appends
  // them, after anything the session produced before, to `*out`: the exact
  // bytes to send next. Never blocks. Unavailable when the session is broken.
  Status Seal(const iovec* parts, size_t count, std::vector<uint8_t>* out);

  // Appends to `*out` what the session produced and nobody took yet (the
  // handshake's messages, an alert). Send them before anything else.
  void TakeOutput(std::vector<uint8_t>* out);

  // Which suite and key exchange were agreed, e.g. "TLSv1.3
  // TLS_AES_128_GCM_SHA256" (after the handshake; for logs and tests).
  std::string Describe() const;

  struct Impl;

 private:
  TlsSession(std::shared_ptr<TlsContext> context, std::unique_ptr<Impl> impl, int fd);
  std::shared_ptr<TlsContext> context_;
  std::unique_ptr<Impl> impl_;
  const int fd_;
  std::mutex mu_;  // serializes the OpenSSL calls on impl_
};

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_TLS_H_
