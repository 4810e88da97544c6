// Byte layout of a ckpt::ipc shared-memory segment, layout version 1.
//
// One segment per worker: POSIX shared memory "/<name>", created by the owner
// (the scheduler, Channel::Create) and opened by the worker (Channel::Open).
// Both sides run on one host, so integers are in the host's byte order (little
// endian on every platform ckpt builds for). Every reference inside the
// segment is an offset from the segment start or a ring position; nothing
// stored here is a pointer, so each process may map the segment anywhere.
//
//   offset 0                ControlBlock                      (kControlBytes reserved)
//   offset 4096             RingHeader: request ring          (scheduler -> worker)
//   offset 4096 + 256       RingHeader: result ring           (worker -> scheduler)
//   offset 8192             request data area, N bytes
//   offset 8192 + N         result data area, N bytes
//   segment size            8192 + 2N;  N = ring_bytes, a power of two in
//                           [kMinRingBytes, kMaxRingBytes]
//
// Control block. The owner writes the geometry and its own Participant, then
// stores `magic` last with release order; an opener loads `magic` with acquire
// order and ignores everything else until it reads kSegmentMagic. A reader
// then demands layout_version == kLayoutVersion (FailedPrecondition otherwise:
// an unknown version is never guessed at), the geometry checksum, and the
// offsets this header computes from ring_bytes (Corruption otherwise).
//
// Participants (owner, worker): `state` goes kSlotEmpty -> kSlotAttaching (the
// side claims the slot with a compare-exchange) -> kSlotAttached (after pid,
// start_time and boot_id are written; release) -> kSlotDetached (clean close;
// release). A peer is dead when its slot says Detached, or its process is gone:
// /proc/PID/stat missing or a zombie, start time (field 22) different, or the
// boot id different. A slot whose heartbeat counter stops moving for the
// heartbeat timeout is treated as dead as well.
//
// Rings: single producer, single consumer. `head` and `tail` are byte
// positions that only grow (2^64 bytes never wrap in practice); a position p
// lives at data offset p & (N - 1). The producer owns head, the consumer owns
// tail; each side keeps its own authoritative copy and only ever stores it, so
// a hostile peer that scribbles over a position word can confuse itself but not
// make the other side read outside the data area.
//
// Records. Every record starts at a position that is a multiple of 64 and
// occupies 64 + RoundUp64(payload_bytes) bytes; a record never straddles the end
// of the data area: when the next one does not fit, the producer first writes a
// padding record (type kPadding) that fills exactly to the end. A producer may
// wrap earlier, at the end of a window of the data area it keeps its records
// in (ring.h): the padding record then starts inside the window and still
// fills exactly to the end, and as the consumer never reads a padding
// payload, the pages past the window are never touched. A payload
// larger than MaxRecordPayload(N) = N/2 - 64 travels as a run of kFragment
// records (flags kFlagFirst on the first, kFlagLast on the last, fragment_offset
// counting payload bytes of the message so far); the consumer delivers it whole.
// A record is published by advancing `head` past it (after the header is
// written): a record the consumer can see is complete.
//
// The consumer is a trust boundary. It copies the 64-byte header once and
// checks, before using any field: magic, header checksum, a known type, known
// flags, payload length against the ring and the published bytes, the record
// ending inside the data area, padding filling exactly to the end, sequence ==
// previous + 1, fragment bookkeeping (same type and total, contiguous offsets,
// total within the configured cap), then the payload's XXH3. A record whose
// header checks out but whose payload or sequence does not is skipped by its
// length; one whose header cannot be trusted makes the consumer drop everything
// published so far and accept the next record's sequence as is. A published
// position that is impossible (behind the consumer, more than N ahead, not a
// multiple of 64) marks the ring broken for good.
#ifndef CKPT_IPC_SRC_LAYOUT_H_
#define CKPT_IPC_SRC_LAYOUT_H_

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace ckpt::ipc::layout {

// A 64- or 32-bit word shared between processes and accessed atomically. It is
// std::atomic in behaviour, written with the __atomic builtins so that the
// structs below stay trivially copyable (std::atomic is not) and the word is
// exactly its plain representation in the segment. Each use names its order.
template <typename T>
struct SharedWord {
  static_assert(std::is_same_v<T, uint64_t> || std::is_same_v<T, uint32_t>);
  T raw;

  T LoadRelaxed() const { return __atomic_load_n(&raw, __ATOMIC_RELAXED); }
  T LoadAcquire() const { return __atomic_load_n(&raw, __ATOMIC_ACQUIRE); }
  T LoadSeqCst() const { return __atomic_load_n(&raw, __ATOMIC_SEQ_CST); }
  void StoreRelaxed(T v) { __atomic_store_n(&raw, v, __ATOMIC_RELAXED); }
  void StoreRelease(T v) { __atomic_store_n(&raw, v, __ATOMIC_RELEASE); }
  void StoreSeqCst(T v) { __atomic_store_n(&raw, v, __ATOMIC_SEQ_CST); }
  T FetchAddRelease(T v) { return __atomic_fetch_add(&raw, v, __ATOMIC_RELEASE); }
  T FetchAddRelaxed(T v) { return __atomic_fetch_add(&raw, v, __ATOMIC_RELAXED); }
  // Strong compare-exchange, acquire-release on success, acquire on failure.
  bool CompareExchange(T* expected, T desired) {
    return __atomic_compare_exchange_n(&raw, expected, desired, /*weak=*/false, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
  }
};
using SharedU64 = SharedWord<uint64_t>;
using SharedU32 = SharedWord<uint32_t>;
static_assert(__atomic_always_lock_free(sizeof(uint64_t), nullptr));
static_assert(__atomic_always_lock_free(sizeof(uint32_t), nullptr));
static_assert(sizeof(SharedU64) == 8 && alignof(SharedU64) == 8);
static_assert(sizeof(SharedU32) == 4 && alignof(SharedU32) == 4);

inline constexpr uint64_t kSegmentMagic = 0x3143504974706b63ull;  // "ckptIPC1"
inline constexpr uint32_t kLayoutVersion = 1;
inline constexpr uint32_t kRecordMagic = 0x52706b63u;  // "ckpR"

inline constexpr uint64_t kAlign = 64;
inline constexpr uint64_t kControlBytes = 4096;
inline constexpr uint64_t kRingHeaderBytes = 256;
inline constexpr uint64_t kRequestRingOffset = kControlBytes;
inline constexpr uint64_t kResultRingOffset = kControlBytes + kRingHeaderBytes;
inline constexpr uint64_t kDataOffset = 8192;
inline constexpr uint64_t kMinRingBytes = 4096;
inline constexpr uint64_t kMaxRingBytes = uint64_t{1} << 40;
// Smallest ring the record logic itself supports (ScanRingImage).
inline constexpr uint64_t kMinRecordRingBytes = 256;

// Participant.state values.
inline constexpr uint32_t kSlotEmpty = 0;
inline constexpr uint32_t kSlotAttaching = 1;
inline constexpr uint32_t kSlotAttached = 2;
inline constexpr uint32_t kSlotDetached = 3;

// One side of the segment: who it is and that it still runs. 64 bytes.
struct Participant {
  // kSlot*. Claimed with CompareExchange (acq_rel), set Attached and Detached
  // with StoreRelease; the other side reads it with LoadAcquire before it reads
  // the identity fields below.
  SharedU32 state;
  uint32_t reserved0;
  // Identity, plain fields written before `state` becomes Attached (published
  // by that release store) and never changed afterwards.
  uint64_t pid;
  uint64_t start_time;  // /proc/PID/stat field 22, clock ticks since boot
  uint8_t boot_id[16];  // /proc/sys/kernel/random/boot_id as 16 bytes
  // Bumped by the side's heartbeat thread every heartbeat interval; relaxed on
  // both sides: only "has it moved" matters, it orders nothing.
  SharedU64 heartbeat;
  uint8_t reserved1[16];
};
static_assert(std::is_trivially_copyable_v<Participant>);
static_assert(std::is_standard_layout_v<Participant>);
static_assert(sizeof(Participant) == 64);
static_assert(offsetof(Participant, pid) == 8 && offsetof(Participant, heartbeat) == 40);

// At segment offset 0.
struct alignas(64) ControlBlock {
  // Line 0: geometry, written by the owner before `magic`, read-only after.
  // Stored with StoreRelease as the owner's last initialising write; openers
  // LoadAcquire it first.
  SharedU64 magic;
  uint32_t layout_version;       // kLayoutVersion
  uint32_t control_bytes;        // kControlBytes
  uint64_t ring_bytes;           // N
  uint64_t segment_bytes;        // kDataOffset + 2N
  uint64_t request_ring_offset;  // RingHeader of the request ring
  uint64_t result_ring_offset;   // RingHeader of the result ring
  uint64_t request_data_offset;  // kDataOffset
  uint64_t result_data_offset;   // kDataOffset + N
  // Line 1.
  uint64_t geometry_xxh3;  // XXH3-64 of bytes [8, 64): the geometry after magic
  uint8_t reserved0[56];
  // Lines 2-3.
  Participant owner;   // the scheduler
  Participant worker;  // the worker
};
static_assert(std::is_trivially_copyable_v<ControlBlock>);
static_assert(std::is_standard_layout_v<ControlBlock>);
static_assert(sizeof(ControlBlock) == 256 && alignof(ControlBlock) == 64);
static_assert(offsetof(ControlBlock, ring_bytes) == 16);
static_assert(offsetof(ControlBlock, geometry_xxh3) == 64);
static_assert(offsetof(ControlBlock, owner) == 128 && offsetof(ControlBlock, worker) == 192);
static_assert(sizeof(ControlBlock) <= kControlBytes);

// The positions and wake words of one ring. The producer's and the consumer's
// words live on separate cache lines.
struct alignas(64) RingHeader {
  // Line 0: written by the producer.
  //
  // Bytes ever published. Producer: StoreSeqCst after the record is written
  // (release semantics for the record bytes, and sequentially consistent with
  // its later LoadSeqCst of consumer_waiting: either it sees the consumer
  // waiting, or the consumer's LoadSeqCst of head sees the new value). Consumer:
  // LoadAcquire (then it may read the records before head), LoadSeqCst right
  // before it sleeps.
  SharedU64 head;
  // Futex word the consumer sleeps on. The producer FetchAddRelease-s it and
  // wakes when consumer_waiting is set; the consumer LoadAcquire-s it before
  // checking for data, so a bump in between makes FUTEX_WAIT return at once.
  SharedU32 head_wake;
  // 1 while the producer sleeps on tail_wake. Producer: StoreSeqCst (1 before
  // re-checking tail, 0 after waking). Consumer: LoadSeqCst after storing tail.
  SharedU32 producer_waiting;
  uint8_t reserved0[48];
  // Line 1: written by the consumer.
  //
  // Bytes ever released. Consumer: StoreSeqCst after it is done with the
  // records before it (release: the producer may overwrite them; seq_cst
  // against producer_waiting as for head). Producer: LoadAcquire, LoadSeqCst
  // before it sleeps.
  SharedU64 tail;
  // Futex word the producer sleeps on; mirror image of head_wake.
  SharedU32 tail_wake;
  // 1 while the consumer sleeps on head_wake; mirror image of producer_waiting.
  SharedU32 consumer_waiting;
  uint8_t reserved1[48];
  // Lines 2-3: copy of the geometry, written at creation, read-only after;
  // for tools reading a dump. The channel itself uses the validated control block.
  uint64_t ring_bytes;   // N
  uint64_t data_offset;  // segment offset of this ring's data area
  uint8_t reserved2[112];
};
static_assert(std::is_trivially_copyable_v<RingHeader>);
static_assert(std::is_standard_layout_v<RingHeader>);
static_assert(sizeof(RingHeader) == kRingHeaderBytes && alignof(RingHeader) == 64);
static_assert(offsetof(RingHeader, tail) == 64 && offsetof(RingHeader, ring_bytes) == 128);
static_assert(kResultRingOffset + kRingHeaderBytes <= kDataOffset);

// RecordHeader.flags bits; only kFragment records carry any.
inline constexpr uint16_t kFlagFirst = 1;
inline constexpr uint16_t kFlagLast = 2;
inline constexpr uint16_t kKnownFlags = kFlagFirst | kFlagLast;

// At every record's start, 64-byte aligned.
struct RecordHeader {
  uint32_t magic;            // kRecordMagic
  uint16_t type;             // RecordType
  uint16_t flags;            // kFlag* for fragments, 0 otherwise
  uint64_t sequence;         // 1 for the ring's first record, +1 per record (padding included)
  uint64_t payload_bytes;    // this record's payload
  uint64_t payload_xxh3;     // XXH3-64 of the payload (0 bytes: XXH3 of nothing)
  uint64_t message_bytes;    // the whole message: payload_bytes unless a fragment
  uint16_t message_type;     // the message's RecordType (== type unless a fragment)
  uint16_t reserved16;       // 0
  uint32_t reserved32;       // 0
  uint64_t fragment_offset;  // payload bytes of the message before this record; 0 unless a fragment
  uint64_t header_xxh3;      // XXH3-64 of bytes [0, 56) of this header
};
static_assert(std::is_trivially_copyable_v<RecordHeader>);
static_assert(std::is_standard_layout_v<RecordHeader>);
static_assert(sizeof(RecordHeader) == kAlign);
static_assert(offsetof(RecordHeader, header_xxh3) == 56);
inline constexpr size_t kRecordHeaderChecked = offsetof(RecordHeader, header_xxh3);

inline constexpr uint64_t RoundUp64(uint64_t n) { return (n + (kAlign - 1)) & ~(kAlign - 1); }
// Largest payload one record carries in a ring of `ring_bytes`: a record of at
// most half the ring plus the padding before it always fits an empty ring.
inline constexpr uint64_t MaxRecordPayload(uint64_t ring_bytes) { return ring_bytes / 2 - kAlign; }
inline constexpr uint64_t SegmentBytes(uint64_t ring_bytes) { return kDataOffset + 2 * ring_bytes; }
inline constexpr uint64_t RequestDataOffset(uint64_t /*ring_bytes*/) { return kDataOffset; }
inline constexpr uint64_t ResultDataOffset(uint64_t ring_bytes) { return kDataOffset + ring_bytes; }

}  // namespace ckpt::ipc::layout

#endif  // CKPT_IPC_SRC_LAYOUT_H_
