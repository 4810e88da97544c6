// Channel: one side of a worker's shared-memory segment.
//
// The scheduler creates one segment per worker (Channel::Create, the owner)
// and the worker opens it (Channel::Open). The segment holds a control block
// and two single-producer single-consumer rings: the request ring (scheduler
// -> worker) and the result ring (worker -> scheduler). Each side sends on one
// ring and receives on the other. The byte layout is documented in
// worker/ipc/src/layout.h.
//
// Records: a 64-byte header (magic, type, flags, sequence, payload length,
// payload XXH3, header checksum) and the payload, 64-byte aligned. Payloads
// larger than half the ring travel as fragments and are delivered whole.
//
// Thread-safety: a Channel may be used by two threads at once, one sending and
// one receiving; each direction is single-producer, single-consumer.
#ifndef CKPT_IPC_CHANNEL_H_
#define CKPT_IPC_CHANNEL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ckpt/format/status.h"
#include "ckpt/ipc/messages.h"

namespace ckpt::ipc {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline DeadlineIn(std::chrono::milliseconds d) { return Clock::now() + d; }

struct ChannelOptions {
  // Bytes of each ring's data area; rounded up to a power of two.
  // Default: 64 MiB.
  size_t ring_bytes = size_t{64} << 20;
  // A peer whose heartbeat counter has not moved for this long is treated as
  // dead (Unavailable). Default: 10 s.
  std::chrono::milliseconds heartbeat_timeout{10000};
  // How often the channel's own heartbeat thread bumps this side's counter.
  // Default: 100 ms.
  std::chrono::milliseconds heartbeat_interval{100};
};

// A received record. `payload` points into the ring (or, for a record that
// travelled as fragments, into a buffer the channel owns) and stays valid until
// Release() or the next Receive().
struct Received {
  RecordType type = RecordType::kPadding;
  uint64_t sequence = 0;
  const uint8_t* payload = nullptr;
  size_t size = 0;
};

// Space reserved on the send ring for one record's payload; write `size` bytes
// at `data`, then Commit. A reservation not committed is abandoned on destruction.
struct Reservation {
  uint8_t* data = nullptr;
  size_t size = 0;
};

struct ChannelStats {
  uint64_t records_sent = 0;
  uint64_t records_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bad_records = 0;  // rejected as corrupt
  size_t send_ring_used = 0;  // bytes in flight on the send ring
  size_t ring_bytes = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;

  // Creates segment `name` (a POSIX shm name without '/', e.g. "ckpt-1234-w0"),
  // owned by this process. A segment of that name whose owner is dead is
  // removed first; one whose owner is alive gives AlreadyExists naming it.
  static StatusOr<std::unique_ptr<Channel>> Create(const std::string& name,
                                                   const ChannelOptions& options);
  // Opens segment `name` as the worker side. NotFound when absent; Corruption
  // when the control block is invalid; FailedPrecondition on a layout version
  // this build does not know.
  static StatusOr<std::unique_ptr<Channel>> Open(const std::string& name,
                                                 const ChannelOptions& options);
  // Removes segment `name` if present (owner side, at shutdown).
  static Status Remove(const std::string& name);

  // Sends one record. Blocks until there is room or `deadline`; Unavailable
  // naming the peer when it is dead or stopped heart-beating, Aborted on
  // Close(), ResourceExhausted at the deadline.
  virtual Status Send(RecordType type, const void* payload, size_t size, Deadline deadline) = 0;

  // Reserves `size` payload bytes to write in place (zero-copy). Payloads
  // larger than half the ring are staged and sent as fragments on Commit.
  // Errors as Send.
  virtual StatusOr<Reservation> Reserve(RecordType type, size_t size, Deadline deadline) = 0;
  virtual Status Commit(const Reservation& reservation, Deadline deadline) = 0;

  // Receives the next record, validated. Unavailable when the peer is dead,
  // ResourceExhausted at the deadline with nothing to read, Corruption for a
  // rejected record (counted in bad_records; the ring is resynchronised or the
  // channel is marked broken, and later calls say so).
  virtual StatusOr<Received> Receive(Deadline deadline) = 0;
  // Returns the space of the last received record to the producer.
  virtual void Release() = 0;

  // True while the peer's process is alive and heart-beating.
  virtual bool PeerAlive() const = 0;
  // Unblocks every waiting call with Aborted; later calls return Aborted.
  virtual void Close() = 0;

  virtual ChannelStats Stats() const = 0;
  virtual const std::string& name() const = 0;
};

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_CHANNEL_H_
