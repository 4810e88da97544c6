// Framing and blocking I/O shared by the TCP transport's channel
// (tcp_channel.cc) and its connection setup (tcp_handshake.cc), private to
// ckpt::ipc: frame headers (tcp_frame.h) made and checked, and reads and
// writes on a non-blocking socket in poll(2) slices that honour a deadline and
// a stop check.
//
// Thread-safety: pure functions; a socket is used by one reader and one
// writer at a time.
#ifndef CKPT_IPC_SRC_TCP_IO_H_
#define CKPT_IPC_SRC_TCP_IO_H_

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/tcp_channel.h"
#include "tcp_frame.h"
#include "tls.h"

namespace ckpt::ipc::internal {

inline constexpr std::chrono::milliseconds kSlice{
    50};  // longest poll between checks of Close and liveness

int64_t NowNs();

// True for the message RecordTypes (kHello..kShutdown).
bool IsMessageType(uint16_t t);

// A header for `payload`, with both checksums filled.
wire::FrameHeader MakeHeader(uint16_t type, uint16_t flags, uint64_t sequence, const void* payload,
                             size_t size, uint64_t message_bytes, uint16_t message_type,
                             uint64_t fragment_offset);

// Checks what can be checked of a header alone (magic, header checksum, frame
// payload limit, reserved fields). Corruption naming `peer` otherwise.
Status CheckHeader(const wire::FrameHeader& h, const std::string& peer);

// TCP_NODELAY, SO_KEEPALIVE and O_NONBLOCK on `fd`.
void SetSocketOptions(int fd);

// Blocking I/O on a non-blocking socket in poll slices. `stop` says why to
// give up early (Close, a dead peer): a non-OK status returned as is.
using StopCheck = std::function<Status()>;

// Writes all of `iov` (modified; bytes already sealed by TLS) or stops at the deadline; `*written`
// counts the bytes the kernel took. ResourceExhausted at the deadline, Unavailable when the
// connection breaks.
Status WriteAll(int fd, std::vector<iovec> iov, Deadline deadline, const StopCheck& stop,
                const std::string& peer, size_t* written);

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT). ResourceExhausted
// naming `what` at the deadline; `stop`'s status when it says stop.
Status WaitFor(int fd, short events, Deadline deadline, const StopCheck& stop,
               const std::string& what);

// Reads exactly `size` decrypted bytes from `tls`. `on_bytes` is told of each
// read. Unavailable naming the peer on EOF or a broken connection; Corruption
// naming it when a TLS record fails authentication; ResourceExhausted at the
// deadline (then the stream is mid-frame: callers treat it as fatal).
Status ReadExact(TlsSession& tls, void* out, size_t size, Deadline deadline, const StopCheck& stop,
                 const std::string& peer, const std::function<void()>& on_bytes);

// A StopCheck that never stops.
Status NoStop();

// A channel over `fd` (connected, non-blocking, its TLS handshake done in
// `tls`), which it owns and closes. `peer` names the other side in errors,
// `name` is name(). Its settings are options.channel, its receive budget and
// first limit options.budget and options.receive_limit.
std::unique_ptr<Channel> MakeTcpChannel(int fd, std::unique_ptr<TlsSession> tls, std::string peer,
                                        std::string name, const TcpOptions& options);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_TCP_IO_H_
