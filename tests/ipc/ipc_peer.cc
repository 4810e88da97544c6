// ipc_peer: the other process of the ipc tests. It talks to the test over a
// real segment and reports on fd 3 (one line per event); the test writes
// commands to its fd 4.
//
//   ipc_peer MODE NAME [key=value ...]
//     keys: ring (bytes of the ring, for record sizes), seed_out, seed_in,
//           count, hb_ms (heartbeat interval), own (1: create the segment)
//   MODE
//     echo           sends back every record until SHUTDOWN
//     stress         sends `count` records of stream seed_out while receiving
//                    and checking `count` records of stream seed_in
//     produce        sends records of seed_out until killed; "ready" after the first
//     consume        receives and checks records of seed_in until killed; "ready"
//                    after the first
//     die-mid-write  reserves a record, writes half of it, "ready", waits to die
//     hold-read      receives one record and keeps it, "ready", waits to die
//     own            creates the segment, "ready", waits for EOF on fd 4
//     hostile        attaches as the worker by hand and, for each command line on
//                    fd 4, writes one kind of bad (or good) record on the result
//                    ring, then "done"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/channel.h"
#include "futex.h"
#include "ipc_test_util.h"
#include "layout.h"
#include "liveness.h"

namespace ckpt::ipc {
namespace {

using testing::CheckRecord;
using testing::FillPayload;
using testing::RecordSize;
using testing::TypeFor;

std::map<std::string, std::string> g_args;

uint64_t Arg(const std::string& key, uint64_t def) {
  auto it = g_args.find(key);
  return it == g_args.end() ? def : std::strtoull(it->second.c_str(), nullptr, 0);
}

void Report(const std::string& line) {
  std::string l = line + "\n";
  if (::write(3, l.data(), l.size()) < 0) std::_Exit(3);
}

std::string ReadCommand() {
  std::string line;
  char c;
  for (;;) {
    ssize_t n = ::read(4, &c, 1);
    if (n <= 0) return line.empty() ? std::string("<eof>") : line;
    if (c == '\n') return line;
    line += c;
  }
}

[[noreturn]] void Fail(const std::string& what) {
  Report("error " + what);
  std::fprintf(stderr, "ipc_peer: %s\n", what.c_str());
  std::_Exit(1);
}

ChannelOptions Options() {
  ChannelOptions o;
  o.ring_bytes = Arg("ring", 1 << 20);
  o.heartbeat_interval = std::chrono::milliseconds(Arg("hb_ms", 100));
  return o;
}

std::unique_ptr<Channel> OpenOrCreate(const std::string& name) {
  auto ch = Arg("own", 0) ? Channel::Create(name, Options()) : Channel::Open(name, Options());
  if (!ch.ok()) Fail(ch.status().ToString());
  return std::move(*ch);
}

Deadline Far() { return DeadlineIn(std::chrono::seconds(60)); }

Status SendRecord(Channel* ch, uint64_t seed, uint64_t i, uint64_t ring,
                  std::vector<uint8_t>* scratch) {
  return testing::SendRecord(ch, seed, i, ring, scratch, Far());
}

int Echo(const std::string& name) {
  auto ch = OpenOrCreate(name);
  Report("ready");
  std::vector<uint8_t> copy;
  for (;;) {
    auto r = ch->Receive(Far());
    if (!r.ok()) Fail(r.status().ToString());
    if (r->type == RecordType::kShutdown) return 0;
    copy.assign(r->payload, r->payload + r->size);
    ch->Release();
    Status s = ch->Send(r->type, copy.data(), copy.size(), Far());
    if (!s.ok()) Fail(s.ToString());
  }
}

int Stress(const std::string& name) {
  auto ch = OpenOrCreate(name);
  const uint64_t ring = ch->Stats().ring_bytes;
  const uint64_t count = Arg("count", 10000);
  const uint64_t seed_out = Arg("seed_out", 1), seed_in = Arg("seed_in", 2);
  Report("ready");
  std::string send_error;
  std::thread sender([&] {
    std::vector<uint8_t> scratch;
    for (uint64_t i = 0; i < count; ++i) {
      Status s = SendRecord(ch.get(), seed_out, i, ring, &scratch);
      if (!s.ok()) {
        send_error = "send " + std::to_string(i) + ": " + s.ToString();
        return;
      }
    }
  });
  std::vector<uint8_t> scratch;
  std::string recv_error;
  for (uint64_t i = 0; i < count && recv_error.empty(); ++i) {
    auto r = ch->Receive(Far());
    if (!r.ok()) {
      recv_error = "receive " + std::to_string(i) + ": " + r.status().ToString();
      break;
    }
    recv_error = CheckRecord(seed_in, i, ring, r->type, r->payload, r->size, &scratch);
    ch->Release();
  }
  sender.join();
  if (!send_error.empty()) Fail(send_error);
  if (!recv_error.empty()) Fail(recv_error);
  Report("ok " + std::to_string(ch->Stats().bad_records));
  // Stay attached until the test has read everything: it says when.
  ReadCommand();
  return 0;
}

int Produce(const std::string& name) {
  auto ch = OpenOrCreate(name);
  if (Arg("own", 0)) Report("created");
  const uint64_t ring = ch->Stats().ring_bytes;
  const uint64_t seed = Arg("seed_out", 1);
  std::vector<uint8_t> scratch;
  for (uint64_t i = 0;; ++i) {
    Status s = SendRecord(ch.get(), seed, i, ring, &scratch);
    if (!s.ok()) Fail(s.ToString());
    if (i == 0) Report("ready");
  }
}

int Consume(const std::string& name) {
  auto ch = OpenOrCreate(name);
  const uint64_t ring = ch->Stats().ring_bytes;
  const uint64_t seed = Arg("seed_in", 2);
  std::vector<uint8_t> scratch;
  for (uint64_t i = 0;; ++i) {
    auto r = ch->Receive(Far());
    if (!r.ok()) Fail(r.status().ToString());
    std::string err = CheckRecord(seed, i, ring, r->type, r->payload, r->size, &scratch);
    if (!err.empty()) Fail(err);
    ch->Release();
    if (i == 0) Report("ready");
  }
}

int DieMidWrite(const std::string& name) {
  auto ch = OpenOrCreate(name);
  const size_t size = Arg("size", 100000);
  auto r = ch->Reserve(RecordType::kResult, size, Far());
  if (!r.ok()) Fail(r.status().ToString());
  std::memset(r->data, 0xab, r->size / 2);
  Report("ready");
  for (;;) ::pause();
}

int HoldRead(const std::string& name) {
  auto ch = OpenOrCreate(name);
  auto r = ch->Receive(Far());
  if (!r.ok()) Fail(r.status().ToString());
  Report("ready");
  for (;;) ::pause();
}

int Own(const std::string& name) {
  ChannelOptions o = Options();
  auto ch = Channel::Create(name, o);
  if (!ch.ok()) Fail(ch.status().ToString());
  Report("ready");
  ReadCommand();
  return 0;
}

// ---------------------------------------------------------------- hostile

class Hostile {
 public:
  explicit Hostile(const std::string& name) {
    int fd = ::shm_open(("/" + name).c_str(), O_RDWR, 0);
    if (fd < 0) Fail("shm_open " + name);
    struct stat st;
    if (::fstat(fd, &st) != 0) Fail("fstat");
    base_ = static_cast<uint8_t*>(::mmap(nullptr, static_cast<size_t>(st.st_size),
                                         PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ::close(fd);
    if (base_ == MAP_FAILED) Fail("mmap");
    cb_ = reinterpret_cast<layout::ControlBlock*>(base_);
    if (cb_->magic.LoadAcquire() != layout::kSegmentMagic) Fail("not a segment");
    n_ = cb_->ring_bytes;
    ring_ = reinterpret_cast<layout::RingHeader*>(base_ + layout::kResultRingOffset);
    data_ = base_ + layout::ResultDataOffset(n_);
    auto self = internal::SelfIdentity();
    if (!self.ok()) Fail(self.status().ToString());
    cb_->worker.pid = self->pid;
    cb_->worker.start_time = self->start_time;
    std::memcpy(cb_->worker.boot_id, self->boot_id, 16);
    cb_->worker.state.StoreRelease(layout::kSlotAttached);
    beat_ = std::thread([this] {
      while (!stop_.load()) {
        cb_->worker.heartbeat.FetchAddRelaxed(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  ~Hostile() {
    stop_.store(true);
    beat_.join();
  }

  // Writes what `cmd` names (one of kCommands) on the result ring.
  void Run(const std::string& cmd) {
    static const struct {
      const char* name;
      void (Hostile::*write)();
    } kCommands[] = {
        {"good", &Hostile::WriteGood},
        {"garbage", &Hostile::WriteGarbage},
        {"bad_header_sum", &Hostile::BadHeaderSum},
        {"huge_len", &Hostile::HugeLength},
        {"short_publish", &Hostile::ShortPublish},
        {"bad_payload_sum", &Hostile::BadPayloadSum},
        {"seq_jump", &Hostile::SequenceJump},
        {"flip_payload", &Hostile::FlipPayload},
        {"flip_header", &Hostile::FlipHeader},
        {"unknown_type", &Hostile::UnknownType},
        {"bad_flags", &Hostile::BadFlags},
        {"frag_huge_total", &Hostile::FragmentHugeTotal},
        {"frag_gap", &Hostile::FragmentGap},
        {"frag_orphan", &Hostile::FragmentOrphan},
        {"bad_padding", &Hostile::BadPadding},
        {"json_garbage", &Hostile::JsonGarbage},
        {"head_back", &Hostile::HeadBack},
        {"tail_garbage", &Hostile::TailGarbage},
        {"identity", &Hostile::WrongIdentity},
    };
    for (const auto& c : kCommands) {
      if (cmd == c.name) {
        (this->*c.write)();
        return;
      }
    }
    Fail("unknown command " + cmd);
  }

 private:
  // The commands: a good record, or one fault of the result ring the
  // scheduler's reader must catch (a bad record, a moved index, a changed
  // identity).
  void WriteGood() { Good(); }
  void WriteGarbage() {
    uint8_t junk[64];
    for (int i = 0; i < 64; ++i) junk[i] = static_cast<uint8_t>(testing::Mix(i) >> 7);
    junk[0] ^= 0x5a;  // never the record magic
    std::memcpy(At(head_), junk, 64);
    Publish(64);
  }
  void BadHeaderSum() {
    auto h = Header(RecordType::kStats, 8);
    Seal(&h, Text("abcdefgh"));
    h.header_xxh3 ^= 1;
    Write(h, Text("abcdefgh"));
  }
  void HugeLength() {
    auto h = Header(RecordType::kTrain, uint64_t{1} << 60);
    h.header_xxh3 = Xxh3_64(&h, layout::kRecordHeaderChecked);
    std::memcpy(At(head_), &h, 64);
    Publish(128);
  }
  void ShortPublish() {
    std::string body(4096, 'x');
    auto h = Header(RecordType::kTrain, body.size());
    Seal(&h, body);
    std::memcpy(At(head_), &h, 64);
    std::memcpy(At(head_) + 64, body.data(), body.size());
    Publish(128);  // the rest of the record is not published
  }
  void BadPayloadSum() {
    auto h = Header(RecordType::kStats, 5);
    Seal(&h, "hello");
    h.payload_xxh3 ^= 0xff;
    h.header_xxh3 = Xxh3_64(&h, layout::kRecordHeaderChecked);
    Write(h, "hello");
  }
  void SequenceJump() {
    seq_ += 7;
    auto h = Header(RecordType::kStats, 5);
    Seal(&h, "jump!");
    Write(h, "jump!");
  }
  void FlipPayload() {
    const uint64_t at = head_;
    Good("flipped payload");
    At(at)[64 + 3] ^= 0x01;  // after publishing
  }
  void FlipHeader() {
    const uint64_t at = head_;
    Good("flipped header");
    At(at)[16] ^= 0x40;  // payload_bytes, after publishing
  }
  void UnknownType() {
    auto h = Header(static_cast<RecordType>(42), 3);
    Seal(&h, "xyz");
    Write(h, "xyz");
  }
  void BadFlags() {
    auto h = Header(RecordType::kTrain, 3);
    h.flags = 0x80;
    Seal(&h, "xyz");
    Write(h, "xyz");
  }
  void FragmentHugeTotal() {
    auto h = Header(RecordType::kFragment, 100);
    h.flags = layout::kFlagFirst;
    h.message_type = static_cast<uint16_t>(RecordType::kTrain);
    h.message_bytes = uint64_t{1} << 50;
    std::string body(100, 'f');
    Seal(&h, body);
    Write(h, body);
  }
  void FragmentGap() {
    std::string body(400, 'g');
    auto h = Header(RecordType::kFragment, 400);
    h.flags = layout::kFlagFirst;
    h.message_type = static_cast<uint16_t>(RecordType::kTrain);
    h.message_bytes = 1000;
    Seal(&h, body);
    Write(h, body);
    std::string rest(500, 'h');
    h = Header(RecordType::kFragment, 500);
    h.flags = layout::kFlagLast;
    h.message_type = static_cast<uint16_t>(RecordType::kTrain);
    h.message_bytes = 1000;
    h.fragment_offset = 500;  // should be 400
    Seal(&h, rest);
    Write(h, rest);
  }
  void FragmentOrphan() {
    std::string body(300, 'o');
    auto h = Header(RecordType::kFragment, 300);
    h.flags = layout::kFlagLast;
    h.message_type = static_cast<uint16_t>(RecordType::kResult);
    h.message_bytes = 600;
    h.fragment_offset = 300;
    Seal(&h, body);
    Write(h, body);
  }
  void BadPadding() {
    auto h = Header(RecordType::kPadding, 64);
    h.message_type = static_cast<uint16_t>(RecordType::kPadding);
    std::string body(64, '\0');
    Seal(&h, body);
    Write(h, body);
  }
  void JsonGarbage() {
    std::string body("\x05\0\0\0{{{{{", 9);
    auto h = Header(RecordType::kTrain, body.size());
    Seal(&h, body);
    Write(h, body);
  }
  void HeadBack() {
    ring_->head.StoreSeqCst(head_ - 128);
    internal::FutexBumpAndWake(&ring_->head_wake);
  }
  void TailGarbage() {
    auto* request = reinterpret_cast<layout::RingHeader*>(base_ + layout::kRequestRingOffset);
    request->tail.StoreSeqCst(0xdead0);
    internal::FutexBumpAndWake(&request->tail_wake);
  }
  void WrongIdentity() {
    cb_->worker.pid = 1;  // init: alive, but not who attached
  }

  static std::string Text(const char* s) { return s; }

  uint8_t* At(uint64_t pos) { return data_ + (pos & (n_ - 1)); }

  layout::RecordHeader Header(RecordType type, uint64_t payload_bytes) {
    layout::RecordHeader h{};
    h.magic = layout::kRecordMagic;
    h.type = static_cast<uint16_t>(type);
    h.sequence = seq_++;
    h.payload_bytes = payload_bytes;
    h.message_bytes = payload_bytes;
    h.message_type = static_cast<uint16_t>(type);
    return h;
  }
  static void Seal(layout::RecordHeader* h, const std::string& body) {
    h->payload_xxh3 = Xxh3_64(body.data(), body.size());
    h->header_xxh3 = Xxh3_64(h, layout::kRecordHeaderChecked);
  }
  void Write(const layout::RecordHeader& h, const std::string& body) {
    const uint64_t bytes = 64 + layout::RoundUp64(body.size());
    if ((head_ & (n_ - 1)) + bytes > n_) Fail("hostile writes do not wrap");
    std::memcpy(At(head_), &h, 64);
    std::memcpy(At(head_) + 64, body.data(), body.size());
    Publish(bytes);
  }
  void Good(const std::string& label = "") {
    std::string body = label.empty() ? "good " + std::to_string(good_++) : label;
    auto h = Header(RecordType::kStats, body.size());
    Seal(&h, body);
    Write(h, body);
  }
  void Publish(uint64_t bytes) {
    head_ += bytes;
    ring_->head.StoreSeqCst(head_);
    internal::FutexBumpAndWake(&ring_->head_wake);
  }

  uint8_t* base_ = nullptr;
  layout::ControlBlock* cb_ = nullptr;
  layout::RingHeader* ring_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t n_ = 0;
  uint64_t head_ = 0;
  uint64_t seq_ = 1;
  uint64_t good_ = 0;
  std::atomic<bool> stop_{false};
  std::thread beat_;
};

int RunHostile(const std::string& name) {
  Hostile hostile(name);
  Report("ready");
  for (;;) {
    std::string cmd = ReadCommand();
    if (cmd == "<eof>" || cmd == "quit") return 0;
    hostile.Run(cmd);
    Report("done");
  }
}

}  // namespace
}  // namespace ckpt::ipc

int main(int argc, char** argv) {
  using namespace ckpt::ipc;  // NOLINT
  if (argc < 3) {
    std::fprintf(stderr, "usage: ipc_peer MODE NAME [key=value ...]\n");
    return 2;
  }
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos) return 2;
    g_args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  const std::string mode = argv[1], name = argv[2];
  if (mode == "echo") return Echo(name);
  if (mode == "stress") return Stress(name);
  if (mode == "produce") return Produce(name);
  if (mode == "consume") return Consume(name);
  if (mode == "die-mid-write") return DieMidWrite(name);
  if (mode == "hold-read") return HoldRead(name);
  if (mode == "own") return Own(name);
  if (mode == "hostile") return RunHostile(name);
  std::fprintf(stderr, "ipc_peer: unknown mode %s\n", mode.c_str());
  return 2;
}
