// Key layout of the store's column families (see ckpt/store/store.h) and the
// id rules that make it unambiguous. RocksDB-free, so tests can use it.
//
//   experiments  exp
//   members      exp 0x00 member
//   checkpoints  exp 0x00 member 0x00 u64be(version)
//   events       exp 0x00 u64be(seq)
//   blobs, refs  BlobId::Bytes() (16 bytes, big-endian)
//
// Ids never contain 0x00, so "exp 0x00" is a prefix owned by exactly one
// experiment and big-endian integers sort numerically.
//
// Thread-safety: pure functions.
#ifndef CKPT_STORE_SRC_KEYS_H_
#define CKPT_STORE_SRC_KEYS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "ckpt/base/status.h"

namespace ckpt::store::keys {

inline constexpr size_t kMaxIdBytes = 128;

// OK for 1..kMaxIdBytes bytes of [A-Za-z0-9._:-]; InvalidArgument naming
// `what` ("experiment id", "member id") otherwise.
Status ValidateId(std::string_view what, std::string_view id);

void PutBE64(std::string* dst, uint64_t v);
uint64_t GetBE64(const char* p);

std::string Experiment(std::string_view exp);
std::string Member(std::string_view exp, std::string_view member);
// Prefix of every members / events / checkpoints key of `exp`.
std::string ExperimentPrefix(std::string_view exp);
std::string Manifest(std::string_view exp, std::string_view member, int64_t version);
// Prefix of every checkpoints key of (exp, member).
std::string ManifestPrefix(std::string_view exp, std::string_view member);
std::string Event(std::string_view exp, uint64_t seq);

// The smallest key greater than every key starting with `prefix`.
// REQUIRES: prefix ends with 0x00 (every prefix above does).
std::string PrefixEnd(std::string_view prefix);

// Splits a members key. False when malformed.
bool ParseMember(std::string_view key, std::string* exp, std::string* member);
// Splits a checkpoints key. False when malformed.
bool ParseManifest(std::string_view key, std::string* exp, std::string* member, int64_t* version);
// Splits an events key. False when malformed.
bool ParseEvent(std::string_view key, std::string* exp, uint64_t* seq);

// refs values: i64 little-endian.
std::string EncodeCount(int64_t n);
bool DecodeCount(std::string_view v, int64_t* n);

}  // namespace ckpt::store::keys

#endif  // CKPT_STORE_SRC_KEYS_H_
