// The OpenSSL adapter of ckpt::ipc (private): HMAC-SHA256, random bytes and a
// constant-time comparison for the TCP transport's challenge-response
// handshake (tcp_channel.cc). OpenSSL is used in hmac.cc alone; its failures
// become a Status here.
//
// Thread-safety: pure functions (OpenSSL 1.1+ is thread-safe without setup).
#ifndef CKPT_IPC_SRC_HMAC_H_
#define CKPT_IPC_SRC_HMAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/format/status.h"

namespace ckpt::ipc::internal {

inline constexpr size_t kMacBytes = 32;  // SHA-256
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256(key, data). Internal when OpenSSL refuses (never expected).
StatusOr<Mac> HmacSha256(const std::string& key, const void* data, size_t size);

// Fills [out, out + size) from OpenSSL's CSPRNG. IOError when it is not seeded.
Status RandomBytes(void* out, size_t size);

// True when the two MACs are equal; takes the same time whatever they hold.
bool MacEqual(const Mac& a, const Mac& b);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_HMAC_H_
