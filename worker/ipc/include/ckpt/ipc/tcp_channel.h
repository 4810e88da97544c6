// TcpChannel: a Channel (ckpt/ipc/channel.h) over one TCP connection, for
// workers on other hosts; TcpListener: the scheduler's side that accepts and
// authenticates them.
//
// Same contract as the shared-memory channel, with these differences:
// - Framing (worker/ipc/src/tcp_frame.h): every frame is a 64-byte header
//   (magic "ckpT", type, flags, sequence, payload length, payload XXH3, message
//   length and type, fragment offset, header XXH3) and the payload. Messages
//   larger than kTcpMaxFramePayload travel as fragments and are delivered whole.
// - Receiving: a reader thread per channel reads and validates frames into a
//   queue bounded by ChannelOptions::ring_bytes (at least one message); when it
//   is full the reader stops reading and the kernel's window pushes back on
//   the sender. Received payloads live in buffers the channel owns, valid
//   until Release(), the next Receive() or the Channel's destruction.
// - Limits: at the first frame header of each message, before any of it is
//   buffered, the channel asks its ReceiveLimit (TcpOptions::receive_limit,
//   SetReceiveLimit) whether the peer may send that type and size, then
//   claims the buffer from its ReceiveBudget (TcpOptions::budget), shared
//   with other channels; a refusal breaks the receive side (Corruption
//   naming it). Each queued message counts kTcpReceivedItemBytes beside its
//   payload, so empty messages fill the queue too.
// - Sending: Send writes straight to the socket, blocking until the kernel has
//   taken the bytes or the deadline. A frame started is always finished: if
//   the deadline falls inside one, its unsent rest (at most one frame) is kept
//   and goes out before anything else; a single-frame message is then as good
//   as sent (OK), a fragmented one returns ResourceExhausted (Commit resumes
//   it; Send, Reserve or Abandon leave the peer to drop the part it got).
//   Reserve stages into a buffer the channel owns; Commit sends it.
// - Liveness: a heartbeat thread sends a HEARTBEAT frame whenever this side
//   sent nothing for heartbeat_interval, and declares the peer dead when its
//   reader, while reading, has received nothing for heartbeat_timeout. A closed
//   or reset connection is seen at once. Either way blocking calls return
//   Unavailable naming the peer address within about 100 ms.
// - A header that fails validation breaks the stream for good (Corruption on
//   every later Receive); a payload whose XXH3 does not match is counted in
//   bad_records, skipped, and reported once as Corruption.
// - Stats: ring_bytes is the receive queue's bound; send_ring_used the bytes
//   the kernel still holds unsent (SIOCOUTQ).
//
// Security (tls.h): every connection is TLS 1.3, keyed by the experiment's
// secret as an external pre-shared key with an ephemeral (EC)DHE exchange on
// top: both ends prove they hold the secret (which never travels), and every
// frame after the handshake, heartbeats included, is encrypted and
// authenticated; a changed, replayed, reordered, dropped-then-resumed or
// injected record fails TLS's authentication, and the connection is dead from
// then on (Corruption, then Unavailable). There is no plaintext mode. A
// recorded session cannot be decrypted later even with the secret (forward
// secrecy). Not protected: that a connection exists, its timing and its sizes;
// and anyone holding the secret file is a worker.
//
// Thread-safety: as Channel. TcpListener: Accept from one thread at a time;
// port(), Stats() and Close() from any thread.
#ifndef CKPT_IPC_TCP_CHANNEL_H_
#define CKPT_IPC_TCP_CHANNEL_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "ckpt/base/status.h"
#include "ckpt/ipc/channel.h"

namespace ckpt::ipc {

// Largest payload of one frame; larger messages are fragmented.
inline constexpr size_t kTcpMaxFramePayload = size_t{1} << 20;
// Room beside a state in the largest record (TRAIN, RESULT): names, figures.
inline constexpr size_t kTcpMessageSlackBytes = size_t{1} << 20;
// The largest message a TCP channel accepts by default: the store's default
// blob limit (StoreOptions::max_blob_bytes, 1 GiB) plus the slack. A longer
// claim breaks the stream before any byte of it is buffered.
inline constexpr size_t kDefaultTcpMaxMessageBytes = (size_t{1} << 30) + kTcpMessageSlackBytes;
// Shortest secret LoadSecretFile accepts.
inline constexpr size_t kMinSecretBytes = 32;

// Reads the experiment's secret from `path`: the file's bytes with trailing
// whitespace removed. FailedPrecondition naming the path and its mode when the
// file is readable or writable by group or others, or not owned by this
// process's user, or shorter than kMinSecretBytes; NotFound when absent;
// IOError when it cannot be read.

StatusOr<std::string> LoadSecretFile(const std::string& path);
// Creates `path` (O_EXCL, mode 0600) holding 32 random bytes as 64 hex digits
// and a newline. AlreadyExists when it exists; IOError when it cannot be made.
Status CreateSecretFile(const std::string& path);

// What each received message costs a ReceiveBudget beside its payload (its
// queue entry and bookkeeping), so that empty messages count too.
inline constexpr uint64_t kTcpReceivedItemBytes = 256;

// Bytes that the receive sides of many TCP channels may hold together: every
// message's buffer is claimed from it at the message's first frame header,
// before anything is allocated (its claimed size plus kTcpReceivedItemBytes),
// and given back when the message is released, dropped or its channel
// destroyed. A claim that does not fit waits, with the reader stopped (TCP's
// window pushes back on the sender), until it fits or the channel's
// heartbeat_timeout has passed; then the channel's receive side breaks
// (Corruption naming the budget), as it does at once for a claim larger than
// the whole budget. Thread-safe; shared by the channels (TcpOptions::budget).
class ReceiveBudget {
 public:
  explicit ReceiveBudget(uint64_t limit_bytes) : limit_(limit_bytes) {}

  // Takes `bytes`. OK once they fit; ResourceExhausted naming the budget
  // when they never can (above limit()) or when `deadline` passes first;
  // what `stop` returns when it returns non-OK (checked every 100 ms).
  Status Acquire(uint64_t bytes, Deadline deadline, const std::function<Status()>& stop);
  // Gives back `bytes` taken by Acquire.
  void Release(uint64_t bytes);

  uint64_t limit() const { return limit_; }
  uint64_t used() const;
  // The most ever held at once.
  uint64_t peak() const;

 private:
  const uint64_t limit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  uint64_t used_ = 0;  // GUARDED_BY(mu_)
  uint64_t peak_ = 0;  // GUARDED_BY(mu_)
};

// An authenticated connection (its TLS handshake done).
struct Accepted {
  std::unique_ptr<Channel> channel;
  std::string peer;  // "ADDRESS:PORT" of the worker
};

struct TcpOptions {
  TcpOptions() { channel.max_message_bytes = kDefaultTcpMaxMessageBytes; }
  // Record and liveness settings (ring_bytes bounds the receive queue, the
  // message being reassembled included, and at least one message;
  // max_message_bytes, heartbeat_interval and heartbeat_timeout as there;
  // spin and populate are unused). Default: ChannelOptions' defaults, but
  // max_message_bytes = kDefaultTcpMaxMessageBytes.
  ChannelOptions channel;
  // How long the handshake may take after the TCP connection is made. A peer
  // that has not proven itself by then is dropped. Default: 5 s.
  std::chrono::milliseconds handshake_timeout{5000};
  // TcpListener only: connections being authenticated at once; more are
  // closed at once (and refused). Default: 64.
  int max_pending_handshakes = 64;
  // TcpListener only: of those, from one source network at once, an IPv4 /24
  // or an IPv6 /64 (so that one host, or the addresses of one subnet, cannot
  // hold every slot). Default: 8.
  int max_handshakes_per_source = 8;
  // TcpListener only: told of each refused connection (peer "ADDRESS:PORT",
  // why), of each failed accept (peer "(accept)") and of each handler that
  // threw (peer "(listener)"), on the listener's thread; it must not block,
  // and should throttle its logging (a peer can cause one call per
  // connection). Default: none.
  std::function<void(const std::string& peer, const Status& why)> on_refused;
  // The budget every channel made with these options draws its received
  // messages from (ReceiveBudget); null: none beyond each channel's
  // ring_bytes. Default: none.
  std::shared_ptr<ReceiveBudget> budget;
  // What the peer may send (ReceiveLimit), until Channel::SetReceiveLimit
  // replaces it; null: any message type up to max_message_bytes. Default: none.
  ReceiveLimit receive_limit;
  // TcpListener only: when set, each authenticated connection is handed to
  // it, on the listener's thread (it must not block), instead of being queued
  // for Accept. Default: none.
  std::function<void(Accepted accepted)> on_accepted;
};

class TcpChannel {
 public:
  // Connects to `host_port` ("HOST:PORT"; HOST a name or an IPv4/IPv6 address,
  // IPv6 in brackets) and makes the TLS handshake keyed by `secret`, once, within
  // handshake_timeout plus the connection time (bounded by the same).
  // Unavailable when nothing listens there or the connection fails;
  // FailedPrecondition when the TLS handshake fails (the listener holds
  // another secret, or speaks another protocol version); InvalidArgument for a malformed address.
  // The returned channel's name() is "tcp:HOST:PORT".
  static StatusOr<std::unique_ptr<Channel>> Connect(const std::string& host_port,
                                                    const std::string& secret,
                                                    const TcpOptions& options);
};

struct TcpListenerStats {
  uint64_t accepted = 0;       // connections that proved themselves
  uint64_t refused = 0;        // failed TLS handshakes, handshake timeouts, no slot
  uint64_t accept_errors = 0;  // failed accept(2) calls (each followed by a backoff)
  uint64_t faults = 0;         // handlers that threw (the listener went on)
};

// Listens on one address and authenticates connecting workers on its own
// thread (asynchronous TLS handshakes, each with a deadline, at most
// max_pending_handshakes at once and max_handshakes_per_source from one
// network, an IPv4 /24 or an IPv6 /64; no thread per connection; a failed accept backs off up to 1
// s); authenticated ones are queued for Accept, or handed to TcpOptions::on_accepted. A refused
// connection is closed, logged as a warning naming the peer, and counted; it costs nothing else.
class TcpListener {
 public:
  // Binds `host_port` ("HOST:PORT", port 0 = an ephemeral port). InvalidArgument
  // for a malformed address; Unavailable when the address cannot be bound.
  static StatusOr<std::unique_ptr<TcpListener>> Listen(const std::string& host_port,
                                                       const std::string& secret,
                                                       const TcpOptions& options);
  virtual ~TcpListener() = default;

  // The next authenticated connection. ResourceExhausted at the deadline with
  // none; Aborted after Close().
  virtual StatusOr<Accepted> Accept(Deadline deadline) = 0;
  // The bound port (the ephemeral one chosen when 0 was asked).
  virtual uint16_t port() const = 0;
  // "HOST:PORT" as bound.
  virtual std::string address() const = 0;
  virtual TcpListenerStats Stats() const = 0;
  // Stops listening, drops pending handshakes and unblocks Accept. Idempotent.
  virtual void Close() = 0;
};

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_TCP_CHANNEL_H_
