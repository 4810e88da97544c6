// The libcrypto adapter of ckpt::ipc (private): HMAC-SHA256 (the TLS key is
// derived with it, tls.cc) and random bytes (secret files, tcp_secret.cc).
// Its failures become a Status here; the TLS adapter (tls.h) is the other
// file that uses OpenSSL.
//
// Thread-safety: pure functions (OpenSSL 1.1+ is thread-safe without setup).
#ifndef CKPT_IPC_SRC_HMAC_H_
#define CKPT_IPC_SRC_HMAC_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "ckpt/base/status.h"

namespace ckpt::ipc::internal {

inline constexpr size_t kMacBytes = 32;  // SHA-256
using Mac = std::array<uint8_t, kMacBytes>;

// HMAC-SHA256(key, data). Internal when OpenSSL refuses (never expected).
StatusOr<Mac> HmacSha256(const std::string& key, const void* data, size_t size);

// Fills [out, out + size) from OpenSSL's CSPRNG. IOError when it is not seeded.
Status RandomBytes(void* out, size_t size);

}  // namespace ckpt::ipc::internal

#endif  // CKPT_IPC_SRC_HMAC_H_
