// SHA-256 of a file's bytes, as CONFIGURE carries it (Configure::model_sha256):
// the scheduler hashes a TorchScript file when an experiment is submitted, and
// every worker, local or remote, refuses a file whose bytes hash otherwise.
// OpenSSL's EVP stays inside src/sha256.cc.
//
// Thread-safety: a pure function.
#ifndef CKPT_IPC_SHA256_H_
#define CKPT_IPC_SHA256_H_

#include <string>
#include <string_view>

namespace ckpt::ipc {

// 64 lowercase hex digits.
std::string Sha256Hex(std::string_view bytes);

// The same over bytes given in pieces (a file read without holding it whole).
// Thread-safety: one thread at a time.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view bytes);
  // The digest of everything given; "" when OpenSSL failed (it never matches
  // a real digest). REQUIRES: called once, last.
  std::string FinalHex();

 private:
  void* ctx_;  // EVP_MD_CTX, kept out of this header
  bool failed_ = false;
};

// Whether `s` is 64 lowercase hex digits.
bool IsSha256Hex(std::string_view s);

}  // namespace ckpt::ipc

#endif  // CKPT_IPC_SHA256_H_
