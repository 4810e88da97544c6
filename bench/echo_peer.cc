#include "echo_peer.h"

#include <cstdio>
#include <cstring>

namespace ckpt::bench {
namespace {

volatile uint64_t g_echo_sink;

}  // namespace

uint64_t ReadAll(const uint8_t* p, size_t n) {
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    acc ^= w;
  }
  for (; i < n; ++i) acc += p[i];
  return acc;
}

Status WriteInPlace(ipc::Channel* ch, ipc::RecordType type, const std::vector<uint8_t>& src) {
  CKPT_ASSIGN_OR_RETURN(ipc::Reservation r,
                        ch->Reserve(type, src.size(), ipc::DeadlineIn(kPeerWait)));
  std::memcpy(r.data, src.data(), src.size());
  return ch->Commit(r, ipc::DeadlineIn(kPeerWait));
}

int EchoPeer(ipc::Channel* ch, const char* who) {
  using ipc::RecordType;
  std::vector<uint8_t> reply;
  uint64_t acc = 0;
  for (;;) {
    auto r = ch->Receive(ipc::DeadlineIn(kPeerWait));
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", who, r.status().ToString().c_str());
      return 1;
    }
    const RecordType type = r->type;
    const size_t size = r->size;
    acc ^= ReadAll(r->payload, size);
    ch->Release();
    Status s;
    if (type == RecordType::kShutdown) break;
    if (type == RecordType::kConfigure) {
      s = ch->Send(RecordType::kStats, &acc, sizeof(acc), ipc::DeadlineIn(kPeerWait));
    } else if (type == RecordType::kHello) {
      if (reply.size() != size) reply.assign(size, 0x5a);
      s = WriteInPlace(ch, RecordType::kResult, reply);
    }
    if (!s.ok()) {
      std::fprintf(stderr, "%s: %s\n", who, s.ToString().c_str());
      return 1;
    }
  }
  g_echo_sink = acc;
  return 0;
}

}  // namespace ckpt::bench
