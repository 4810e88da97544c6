// The far end of the transport benchmarks (ckpt-bench ring, transport): a
// process that answers records over a ckpt::ipc::Channel, reading every byte
// it receives, and the helpers both benchmarks send and read with.
//
// Protocol: TRAIN = read and drop; CONFIGURE = end of a batch, answer STATS
// (8 bytes); HELLO = a round trip, answer a RESULT of the same size written in
// place; SHUTDOWN = return 0.
#ifndef CKPT_BENCH_ECHO_PEER_H_
#define CKPT_BENCH_ECHO_PEER_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/ipc/channel.h"

namespace ckpt::bench {

// How long either side waits for the other before giving up.
inline constexpr std::chrono::seconds kPeerWait{60};

// Reads every byte (8 at a time); the result is kept so nothing is elided.
uint64_t ReadAll(const uint8_t* p, size_t n);

// Sends `src` as one record written in place (Reserve, copy, Commit: the
// worker's RESULT).
Status WriteInPlace(ipc::Channel* ch, ipc::RecordType type, const std::vector<uint8_t>& src);

// Answers records on `ch` until SHUTDOWN (0) or an error, printed to stderr
// after `who` (1).
int EchoPeer(ipc::Channel* ch, const char* who);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_ECHO_PEER_H_
