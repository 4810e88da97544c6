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
// Liveness: each Channel runs a heartbeat thread that bumps this side's counter
// every heartbeat_interval and checks the peer: its process (pid + start time +
// boot id, so a recycled pid is not mistaken for it), its heartbeat, and whether
// it closed. Blocking calls wait on futexes in slices of at most 100 ms, so a
// dead peer turns them into Unavailable within about heartbeat_interval; no call
// waits forever.
//
// Trust: the receiving side validates every record (see layout.h) and never
// reads outside the ring. An in-place payload is checked once, when received; a
// peer that rewrites it afterwards can only confuse the decoders, which check
// their input again.
//
// Thread-safety: a Channel may be used by two threads at once, one sending
// (Send, Reserve, Commit, Abandon) and one receiving (Receive, Release); each
// direction is single-producer, single-consumer. PeerAlive, Close, Stats and
// name may be called from any thread.
#ifndef CKPT_IPC_CHANNEL_H_
#define CKPT_IPC_CHANNEL_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/messages.h"

namespace ckpt::ipc {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

inline Deadline DeadlineIn(std::chrono::milliseconds d) { return Clock::now() + d; }

// Decides, from a message's first frame header and before any byte of it is
// buffered, whether the peer may send a message of `type` claiming `bytes`
// (its whole payload): OK, or why not (the channel's receive side then breaks
// for good, naming the reason). Called on the channel's reader thread; it must
// not block. Used by the TCP channel only (a ring bounds itself).
using ReceiveLimit = std::function<Status(RecordType type, uint64_t bytes)>;

struct ChannelOptions {
  // Bytes of each ring's data area; rounded up to a power of two, at least
  // 4 KiB, at most 1 TiB. Create only: Open takes the segment's.
  // Default: 64 MiB.
  size_t ring_bytes = size_t{64} << 20;
  // A received fragmented message larger than this is rejected as Corruption.
  // Default: 16 GiB.
  uint64_t max_message_bytes = uint64_t{16} << 30;
  // How long a blocking call polls before it sleeps on a futex; trades CPU for
  // latency. Default: 50 us.
  std::chrono::microseconds spin{50};
  // Each side writes its send ring within a window at the start of the ring's
  // data area: this many bytes at first, doubled whenever the record being
  // sent would not fit four times (at most ring_bytes). The shared memory a
  // ring costs is its window, however large ring_bytes is, so a large ring
  // costs only what the records sent through it need. 0: the whole ring from
  // the start. Rounded up to a power of two, at least 4 KiB. Default: 1 MiB.
  size_t min_window_bytes = size_t{1} << 20;
  // Fault in the whole segment at Create rather than on first touch.
  // Default: false.
  bool populate = false;
  // A peer whose heartbeat counter has not moved for this long is treated as
  // dead (Unavailable). Default: 10 s.
  std::chrono::milliseconds heartbeat_timeout{10000};
  // How often the channel's own heartbeat thread bumps this side's counter.
  // Default: 100 ms.
  std::chrono::milliseconds heartbeat_interval{100};
};

// A received record. `payload` points into the ring (or, for a record that
// travelled as fragments, into a buffer the channel owns) and stays valid until
// Release(), the next Receive(), or the Channel's destruction.
struct Received {
  RecordType type = RecordType::kPadding;
  uint64_t sequence = 0;
  const uint8_t* payload = nullptr;
  size_t size = 0;
};

// Space reserved on the send ring for one record's payload; write `size` bytes
// at `data`, then Commit. A reservation not committed is abandoned by Abandon(),
// the next Reserve() or Send(), or the Channel's destruction; nothing of it
// reaches the peer.
struct Reservation {
  uint8_t* data = nullptr;
  size_t size = 0;
};

// One piece of a payload sent in pieces (Channel::SendParts).
struct PayloadPart {
  const void* data = nullptr;
  size_t size = 0;
};

// The bytes of `count` parts together. InvalidArgument naming the part (its
// position and size) when one has bytes but no data.
StatusOr<uint64_t> PayloadPartsSize(const PayloadPart* parts, size_t count);

struct ChannelStats {
  uint64_t records_sent = 0;
  uint64_t records_received = 0;
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  uint64_t bad_records = 0;  // rejected as corrupt
  // Partial fragmented messages dropped because the peer started another
  // (a sender that gave up mid-message, at its deadline or on Close).
  uint64_t dropped_messages = 0;
  size_t send_ring_used = 0;  // bytes in flight on the send ring
  size_t ring_bytes = 0;
  // The part of the send ring's data area in use (ChannelOptions::
  // min_window_bytes): its memory. TCP: ring_bytes.
  size_t send_window_bytes = 0;
};

class Channel {
 public:
  virtual ~Channel() = default;

  // Creates segment `name` (a POSIX shm name without '/', e.g. "ckpt-1234-w0":
  // 1-200 of [A-Za-z0-9._-]), owned by this process. A segment of that name
  // whose owner is dead (or that is not a valid ckpt segment) is removed first;
  // one whose owner is alive, this process included, gives AlreadyExists naming
  // the owner. InvalidArgument for a bad name or options, IOError when the
  // system refuses. To replace a worker: destroy its Channel, Remove, Create.
  static StatusOr<std::unique_ptr<Channel>> Create(const std::string& name,
                                                   const ChannelOptions& options);
  // Opens segment `name` as the worker side. NotFound when absent; Corruption
  // when the control block is invalid; FailedPrecondition on a layout version
  // this build does not know; Unavailable when the owner is dead or still
  // initialising it; AlreadyExists when a live worker holds it;
  // FailedPrecondition when another worker held it before (the owner must
  // recreate the segment: the rings' state is that worker's).
  static StatusOr<std::unique_ptr<Channel>> Open(const std::string& name,
                                                 const ChannelOptions& options);
  // Removes segment `name` if present (owner side, at shutdown).
  static Status Remove(const std::string& name);
  // Removes every segment in `shm_dir` that `select` picks by name and whose
  // owner has died (a SIGKILLed scheduler leaves its segments, up to
  // 2 x ring_bytes each, in /dev/shm). Segments of live owners, half-initialised
  // ones and files that are not ckpt segments are left alone. Returns the names
  // removed; IOError when `shm_dir` cannot be read (none when it is absent).
  static StatusOr<std::vector<std::string>> RemoveStale(
      const std::function<bool(const std::string& name)>& select,
      const std::string& shm_dir = "/dev/shm");

  // Sends one record. Blocks until there is room or `deadline`; Unavailable
  // naming the peer when it is dead, closed or stopped heart-beating, Aborted
  // on Close(), ResourceExhausted at the deadline, InvalidArgument for a type
  // that is not a message (kPadding, kFragment), Corruption when the peer broke
  // the ring's positions. A payload larger than half the ring goes as
  // fragments; if it fails part way, the peer drops the part it got.
  virtual Status Send(RecordType type, const void* payload, size_t size, Deadline deadline) = 0;

  // Sends one record whose payload is `parts[0..count)` one after another
  // (a message's encoded header and the state it carries, say), reading each
  // byte once: copied into the ring and checksummed in the same pass, never
  // staged, however large. `*sent`: payload bytes of this message sent so far,
  // 0 to start. At the deadline a payload larger than half the ring may have
  // gone out in part (ResourceExhausted, *sent past 0): SendParts again with
  // the same parts and *sent resumes it, while Send, Reserve or a SendParts
  // from 0 leave the peer to drop the part it got. InvalidArgument when a part
  // is null but not empty, or *sent is past the payload; otherwise errors as
  // Send.
  virtual Status SendParts(RecordType type, const PayloadPart* parts, size_t count,
                           Deadline deadline, uint64_t* sent) = 0;

  // Reserves `size` payload bytes to write in place (zero-copy): the bytes are
  // in the ring, not yet visible to the peer. Payloads larger than half the
  // ring are staged in a buffer the channel owns and sent as fragments on
  // Commit. Abandons a reservation still pending. Errors as Send.
  virtual StatusOr<Reservation> Reserve(RecordType type, size_t size, Deadline deadline) = 0;
  // Publishes the pending reservation. An in-place one never waits. A staged
  // one goes out as fragments, bounded by `deadline`; on ResourceExhausted it
  // stays pending and Commit again resumes where it stopped (Abandon, Reserve
  // or Send instead leave the peer to drop the part it got). InvalidArgument
  // when `reservation` is not the pending one; otherwise errors as Send.
  virtual Status Commit(const Reservation& reservation, Deadline deadline) = 0;
  // Drops the pending reservation, if any.
  virtual void Abandon() = 0;

  // Receives the next record, validated; releases the previous one first.
  // Records the peer published before it died are still delivered; then
  // Unavailable naming the peer when it is dead, closed or stopped
  // heart-beating. ResourceExhausted at the deadline with nothing to read,
  // Aborted after Close(). Corruption for a rejected record: counted in
  // bad_records and skipped (call again for the next one); or, when the
  // peer's ring position is impossible, the receive side is broken for good
  // and every later call says so.
  virtual StatusOr<Received> Receive(Deadline deadline) = 0;
  // Returns the space of the last received record to the producer. Idempotent.
  virtual void Release() = 0;

  // True while the peer is attached, its process alive and heart-beating, as
  // of the last heartbeat check. False before the worker has opened the segment.
  virtual bool PeerAlive() const = 0;
  // Unblocks every waiting call with Aborted; later calls return Aborted.
  virtual void Close() = 0;

  // Replaces the limit on what the peer may send (ReceiveLimit); null: any
  // message type up to max_message_bytes. Once it returns, the previous
  // limit is no longer called. The shared-memory channel ignores it (its
  // rings bound what a peer can make it hold). Any thread.
  virtual void SetReceiveLimit(const ReceiveLimit& limit) {}

  virtual ChannelStats Stats() const = 0;
  virtual const std::string& name() const = 0;

  // The shared memory records are received in place from (the segment's
  // mapping, for the worker to register with CUDA); {nullptr, 0} for a
  // channel without one (TCP). A payload up to half the ring lies in it, a
  // larger one in a reassembly buffer of the channel's own.
  virtual PayloadPart SharedMemory() const { return {}; }
};

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_CHANNEL_H_
