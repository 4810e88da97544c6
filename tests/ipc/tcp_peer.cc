// tcp_peer: the other process of the TCP channel tests. Connects to HOST:PORT
// with the secret in SECRET_FILE, sends one STATS record, prints "ready" on
// stdout and then keeps the connection (heart-beating) until killed.
//
//   tcp_peer HOST:PORT SECRET_FILE
#include <cstdio>
#include <thread>
#include <vector>

#include "ckpt/ipc/messages.h"
#include "ckpt/ipc/tcp_channel.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: tcp_peer HOST:PORT SECRET_FILE\n");
    return 2;
  }
  auto secret = ckpt::ipc::LoadSecretFile(argv[2]);
  if (!secret.ok()) {
    std::fprintf(stderr, "tcp_peer: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  ckpt::ipc::TcpOptions o;
  auto ch = ckpt::ipc::TcpChannel::Connect(argv[1], *secret, o);
  if (!ch.ok()) {
    std::fprintf(stderr, "tcp_peer: %s\n", ch.status().ToString().c_str());
    return 1;
  }
  ckpt::ipc::Stats st;
  st.slots = 1;
  std::vector<uint8_t> buf(ckpt::ipc::EncodedSize(st));
  if (!ckpt::ipc::Encode(st, buf.data(), buf.size()).ok() ||
      !(*ch)
           ->Send(ckpt::ipc::RecordType::kStats, buf.data(), buf.size(),
                  ckpt::ipc::DeadlineIn(std::chrono::seconds(5)))
           .ok()) {
    return 1;
  }
  std::printf("ready\n");
  std::fflush(stdout);
  while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
}
