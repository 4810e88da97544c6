#include "ckpt/ipc/sha256.h"

#include <openssl/evp.h>

#include <array>

namespace ckpt::ipc {

namespace {

std::string Hex(const unsigned char* digest, unsigned int size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(size_t{2} * size);
  for (unsigned int i = 0; i < size; ++i) {
    out += kHex[digest[i] >> 4];
    out += kHex[digest[i] & 0xF];
  }
  return out;
}

}  // namespace

std::string Sha256Hex(std::string_view bytes) {
  Sha256Hasher h;
  h.Update(bytes);
  return h.FinalHex();
}

// EVP fails only without memory or a SHA-256 provider, both of which would
// break TLS too; the digest is then "", which never matches a real one.
Sha256Hasher::Sha256Hasher() : ctx_(EVP_MD_CTX_new()) {
  failed_ = ctx_ == nullptr ||
            EVP_DigestInit_ex(static_cast<EVP_MD_CTX*>(ctx_), EVP_sha256(), nullptr) != 1;
}

Sha256Hasher::~Sha256Hasher() { EVP_MD_CTX_free(static_cast<EVP_MD_CTX*>(ctx_)); }

void Sha256Hasher::Update(std::string_view bytes) {
  if (failed_ || bytes.empty()) return;
  failed_ = EVP_DigestUpdate(static_cast<EVP_MD_CTX*>(ctx_), bytes.data(), bytes.size()) != 1;
}

std::string Sha256Hasher::FinalHex() {
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int size = 0;
  if (failed_ || EVP_DigestFinal_ex(static_cast<EVP_MD_CTX*>(ctx_), digest.data(), &size) != 1) {
    return "";
  }
  return Hex(digest.data(), size);
}

bool IsSha256Hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

}  // namespace ckpt::ipc
