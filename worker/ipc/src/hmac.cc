#include "hmac.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>

namespace ckpt::ipc::internal {
namespace {

std::string OpenSslError() {
  const unsigned long e = ERR_get_error();
  if (e == 0) return "no OpenSSL error queued";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof(buf));
  return buf;
}

}  // namespace

StatusOr<Mac> HmacSha256(const std::string& key, const void* data, size_t size) {
  if (key.size() > INT_MAX) return Status::InvalidArgument("HMAC key larger than 2 GiB");
  Mac mac{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           static_cast<const unsigned char*>(data), size, mac.data(), &len) == nullptr ||
      len != kMacBytes) {
    return Status::Internal("HMAC-SHA256: " + OpenSslError());
  }
  return mac;
}

Status RandomBytes(void* out, size_t size) {
  if (size > INT_MAX) return Status::InvalidArgument("RandomBytes: more than 2 GiB asked");
  if (RAND_bytes(static_cast<unsigned char*>(out), static_cast<int>(size)) != 1) {
    return Status::IOError("RAND_bytes: " + OpenSslError());
  }
  return Status::OK();
}

}  // namespace ckpt::ipc::internal
