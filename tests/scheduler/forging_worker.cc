// forging_worker: a worker that holds the experiment's secret and lies, for
// forged_result_test. It connects like `ckpt-worker --connect` (TLS, the
// real handshake and record framing), says HELLO, and answers each TRAIN at
// once with a RESULT that does not answer it, one forgery per TRAIN:
//
//   score    val_accuracy 1e308 (would end training through target_metric)
//   samples  samples INT64_MAX (would overflow the experiment's sum)
//   step     the step one past the one asked for
//   loss     train_loss NaN
//   layout   (a TRAIN with a state) the sent state with its first tensor
//            flattened: same bytes, another shape
//   stale    (a TRAIN with a state) the sent state as it came, untrained
//
// The first four are answered to any TRAIN, the last two only to a training
// TRAIN that carries a state (an initialised member has no layout to flatten
// yet; an evaluation's state is not read), a final evaluation gets a score
// forgery. Once every forgery has been sent where the scheduler reads it it
// prints "forged all", then holds every TRAIN that comes and answers none
// until it is dropped or killed (the test kills it once the scheduler has
// logged each refusal: the tasks it holds go back to the queue as a lost
// worker's). A TRAIN that comes while only state forgeries
// remain gets a score forgery again, 200 ms late. The scheduler drops a
// worker after kMaxBadResultsInRow refused RESULTs (worker_pool.h) and reads
// none after them; dropped, it connects again ("reconnecting", 50 ms later,
// at most kMaxReconnects times) and goes on with the forgeries it has not
// sent and those it sent past the kMaxBadResultsInRow-th RESULT of the
// dropped connection, as an attacker would.
//
//   forging_worker HOST:PORT SECRET_FILE results [SLOTS]  (HELLO offering SLOTS,
//                                                          default 1)
//   forging_worker HOST:PORT SECRET_FILE hello SLOTS   (a HELLO offering SLOTS,
//                                                       then wait to be dropped)
//   forging_worker HOST:PORT SECRET_FILE sit SLOTS     (a HELLO offering SLOTS,
//       then take every TRAIN and answer none, printing "got TRAIN task N"
//       for each, until dropped: a hoarder)
//   forging_worker HOST:PORT SECRET_FILE cycle N       (N connections, one
//       after the other, each closed right after its handshake)
//   forging_worker HOST:PORT SECRET_FILE claim TYPE MIB  (a HELLO, then, once
//       the scheduler sent a record (for TYPE "result" a TRAIN), one message
//       of TYPE ("result", "train", "stats", "empty": N empty STATS) of MIB
//       MiB, read from untouched anonymous memory so that this process holds
//       none of it; prints "claim sent" or "claim failed: ..." and exits once
//       dropped)
//
// The dispatcher hands a task to the worker with the most free capacity, so a
// forger that offers more slots than the honest worker is offered every task
// while it is connected (forged_result_test relies on that: the stateful
// forgeries need TRAINs that carry a state, which only exist once the honest
// worker has trained an interval).
//
// Prints one line per forgery sent ("forged score task 3 exp/m1").
#include <sys/mman.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/messages.h"
#include "ckpt/ipc/tcp_channel.h"

namespace {

using ckpt::Status;
using ckpt::ipc::Channel;
using ckpt::ipc::DeadlineIn;
using std::chrono::milliseconds;

template <typename M>
Status SendMessage(Channel* ch, ckpt::ipc::RecordType type, const M& m) {
  std::vector<uint8_t> buf(ckpt::ipc::EncodedSize(m));
  Status s = ckpt::ipc::Encode(m, buf.data(), buf.size());
  if (!s.ok()) return s;
  return ch->Send(type, buf.data(), buf.size(), DeadlineIn(milliseconds(5000)));
}

// The sent state with its first tensor flattened to one dimension.
std::string Flattened(const ckpt::format::CheckpointView& view, int64_t step) {
  ckpt::format::CheckpointWriter w;
  ckpt::format::CheckpointMeta meta = view.meta();
  meta.step = step;
  w.SetMeta(meta);
  bool first = true;
  for (const auto& t : view.tensors()) {
    std::vector<int64_t> shape = t.shape;
    if (first) shape = {t.numel()};
    first = false;
    if (!w.AddTensor(t.name, t.dtype, shape, t.data, t.nbytes).ok()) std::abort();
  }
  return w.Encode();
}

// Says HELLO offering `slots`. Returns false, said on stderr, if it could
// not be sent.
bool SayHello(Channel* channel, int64_t slots) {
  ckpt::ipc::Hello hello;
  hello.device = "cpu";
  hello.slots = static_cast<int32_t>(slots);
  hello.mode = "plain";
  hello.version = "forging_worker";
  if (Status s = SendMessage(channel, ckpt::ipc::RecordType::kHello, hello); !s.ok()) {
    std::fprintf(stderr, "forging_worker: HELLO: %s\n", s.ToString().c_str());
    return false;
  }
  std::printf("said HELLO with %lld slots\n", static_cast<long long>(slots));
  std::fflush(stdout);
  return true;
}

// The forgery that answers a TRAIN: a score forgery to a final evaluation,
// else the next of `stateful` to a TRAIN with a state, else the next of
// `plain`, else a score forgery again, 200 ms late. `*from`: the list it was
// taken from; nullptr when none.
std::string NextForgery(const ckpt::ipc::Train& train, bool has_state,
                        std::deque<std::string>* plain, std::deque<std::string>* stateful,
                        std::deque<std::string>** from) {
  *from = nullptr;
  std::string forgery;
  if (train.eval_test) {
    // A final evaluation commits no state: only a score can be forged.
    forgery = "score";
  } else if (has_state && !stateful->empty()) {
    forgery = stateful->front();
    stateful->pop_front();
    *from = stateful;
  } else if (!plain->empty()) {
    forgery = plain->front();
    plain->pop_front();
    *from = plain;
  } else {
    forgery = "score";
    std::this_thread::sleep_for(milliseconds(200));
  }
  return forgery;
}

// The RESULT an honest worker could send for `train` from step `start`.
ckpt::ipc::Result HonestResult(const ckpt::ipc::Train& train, int64_t start) {
  ckpt::ipc::Result r;
  r.task_id = train.task_id;
  r.experiment = train.experiment;
  r.member = train.member;
  r.step = start + train.steps;
  r.train_loss = 0.5;
  r.val_score = 0.5;
  r.samples = train.steps * 16;  // the test's batch size
  r.compute_s = 0.01;
  return r;
}

// Makes `*r` the `forgery`. Returns the state to send with it: for "layout"
// `view` (of `sent`, the TRAIN's state) flattened, for "stale" `sent`.
std::string Forge(const std::string& forgery, const std::string& sent,
                  const std::optional<ckpt::StatusOr<ckpt::format::CheckpointView>>& view,
                  ckpt::ipc::Result* r) {
  std::string state(64, '\0');  // read by no rule before the ones forged here
  if (forgery == "score") r->val_score = 1e308;
  if (forgery == "samples") r->samples = std::numeric_limits<int64_t>::max();
  if (forgery == "step") r->step += 1;
  if (forgery == "loss") r->train_loss = std::numeric_limits<double>::quiet_NaN();
  if (forgery == "layout") state = Flattened(**view, r->step);
  if (forgery == "stale") state = sent;
  return state;
}

// Waits until the scheduler closes `channel`, printing each TRAIN it sends
// (never answered).
void SitUntilDropped(Channel* channel) {
  while (true) {
    auto rec = channel->Receive(DeadlineIn(milliseconds(500)));
    if (!rec.ok()) {
      if (rec.status().IsResourceExhausted()) continue;
      std::printf("channel closed: %s\n", rec.status().ToString().c_str());
      std::fflush(stdout);
      return;
    }
    if (rec->type == ckpt::ipc::RecordType::kTrain) {
      auto train = ckpt::ipc::DecodeTrain(rec->payload, rec->size);
      std::printf("got TRAIN task %llu\n",
                  train.ok() ? static_cast<unsigned long long>(train->task_id) : 0ull);
      std::fflush(stdout);
    }
    channel->Release();
  }
}

// The scheduler drops a worker whose RESULTs fail this many times in a row
// (kMaxBadResultsInRow of scheduler/src/worker_pool.h).
constexpr size_t kMaxBadResultsInRow = 3;

// How one connection ended.
enum class Ended { kDone, kDropped, kError };

// Dropped, the forger connects again this many times at most: enough for
// the whole run while the honest worker starts and trains (a connection
// lasts at least two late score forgeries, 400 ms).
constexpr int kMaxReconnects = 300;

// One connection: HELLO, then a forgery per TRAIN from `plain` and `stateful`
// until both are empty (kDone) or the scheduler closes it (kDropped).
Ended Connection(const std::string& addr, const std::string& secret, const std::string& mode,
                 int64_t hello_slots, std::deque<std::string>& plain,
                 std::deque<std::string>& stateful) {
  auto ch = ckpt::ipc::TcpChannel::Connect(addr, secret, ckpt::ipc::TcpOptions{});
  if (!ch.ok()) {
    std::fprintf(stderr, "forging_worker: %s\n", ch.status().ToString().c_str());
    return Ended::kError;
  }
  Channel* channel = ch->get();
  if (!SayHello(channel, hello_slots)) return Ended::kError;
  // Every RESULT sent on this connection, in order, with the list its
  // forgery came from (nullptr: a score forgery again). The scheduler reads
  // them in order and drops the connection at the kMaxBadResultsInRow-th, so
  // the ones past it were never read, however many TRAINs came meanwhile
  // (it has several in flight here): a dropped connection puts their
  // forgeries back, in order, to be sent again.
  std::vector<std::pair<std::deque<std::string>*, std::string>> sent_here;
  const auto put_back = [&] {
    for (size_t i = sent_here.size(); i > kMaxBadResultsInRow; --i) {
      auto& [list, forgery] = sent_here[i - 1];
      if (list != nullptr) list->push_front(forgery);
    }
  };
  while (true) {
    auto rec = channel->Receive(DeadlineIn(milliseconds(500)));
    if (!rec.ok()) {
      if (rec.status().IsResourceExhausted()) continue;  // nothing yet
      std::printf("channel closed: %s\n", rec.status().ToString().c_str());
      if (mode == "hello") return Ended::kDone;
      put_back();
      return Ended::kDropped;
    }
    if (rec->type == ckpt::ipc::RecordType::kShutdown) return Ended::kDone;
    if (rec->type != ckpt::ipc::RecordType::kTrain || mode != "results") continue;
    auto train = ckpt::ipc::DecodeTrain(rec->payload, rec->size);
    if (!train.ok()) std::abort();
    int64_t start = 0;
    std::string sent(reinterpret_cast<const char*>(train->state.data), train->state.size);
    channel->Release();
    std::optional<ckpt::StatusOr<ckpt::format::CheckpointView>> view;
    if (!sent.empty()) {
      view.emplace(ckpt::format::ParseCheckpoint(sent.data(), sent.size()));
      if (!view->ok()) std::abort();
      start = (*view)->meta().step;
    }
    ckpt::ipc::Result r = HonestResult(*train, start);
    std::deque<std::string>* from = nullptr;
    const std::string forgery = NextForgery(*train, !sent.empty(), &plain, &stateful, &from);
    sent_here.emplace_back(from, forgery);
    const std::string state = Forge(forgery, sent, view, &r);
    r.state = ckpt::ipc::ByteSpan{reinterpret_cast<const uint8_t*>(state.data()), state.size()};
    if (Status s = SendMessage(channel, ckpt::ipc::RecordType::kResult, r); !s.ok()) {
      std::printf("RESULT not sent: %s\n", s.ToString().c_str());
      put_back();
      return Ended::kDropped;
    }
    std::printf("forged %s task %llu %s\n", forgery.c_str(),
                static_cast<unsigned long long>(r.task_id), r.member.c_str());
    std::fflush(stdout);
    // Done once every forgery went out among the first RESULTs of its
    // connection, which the scheduler reads; a later one waits for the drop
    // and goes again.
    if (plain.empty() && stateful.empty() && sent_here.size() <= kMaxBadResultsInRow) {
      std::printf("forged all\n");
      std::fflush(stdout);
      // The connection stays until the scheduler has read the last RESULT:
      // closed now, with TRAINs unread here, it would reset, and the
      // scheduler could lose the RESULT it had not read yet. The test kills
      // this process once the scheduler has logged every refusal.
      SitUntilDropped(channel);
      return Ended::kDone;
    }
  }
}

// The hoarder: HELLO offering `slots`, then every TRAIN taken and none answered.
int Sit(const std::string& addr, const std::string& secret, int64_t slots) {
  auto ch = ckpt::ipc::TcpChannel::Connect(addr, secret, ckpt::ipc::TcpOptions{});
  if (!ch.ok()) {
    std::fprintf(stderr, "forging_worker: %s\n", ch.status().ToString().c_str());
    return 2;
  }
  if (!SayHello(ch->get(), slots)) return 2;
  SitUntilDropped(ch->get());
  return 0;
}

// `n` connections, each closed right after its handshake.
int Cycle(const std::string& addr, const std::string& secret, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    auto ch = ckpt::ipc::TcpChannel::Connect(addr, secret, ckpt::ipc::TcpOptions{});
    if (!ch.ok()) {
      std::fprintf(stderr, "forging_worker: %s\n", ch.status().ToString().c_str());
      return 2;
    }
  }
  std::printf("cycled %lld\n", static_cast<long long>(n));
  return 0;
}

// One message of `type` claiming `mib` MiB ("empty": that many thousand empty
// STATS), its bytes read from anonymous memory never written (the zero page),
// so that the claim costs this process nothing.
int Claim(const std::string& addr, const std::string& secret, const std::string& type,
          int64_t mib) {
  ckpt::ipc::TcpOptions options;
  options.channel.max_message_bytes = uint64_t{1} << 40;
  auto ch = ckpt::ipc::TcpChannel::Connect(addr, secret, options);
  if (!ch.ok()) {
    std::fprintf(stderr, "forging_worker: %s\n", ch.status().ToString().c_str());
    return 2;
  }
  Channel* channel = ch->get();
  if (!SayHello(channel, 1)) return 2;
  // The claim waits for the scheduler's first record (a RESULT for a TRAIN,
  // answered as if it were the task's, so that a cap by the task applies):
  // the scheduler sends only once its worker handle has taken the connection
  // on, so the claim meets the handle's limits. Sent at once, it could meet
  // the listener's limit for a connection not yet taken on, and be refused
  // for that instead (HostilePeerTest's memory test failed so under
  // ctest -j2 on a loaded 2-core machine).
  while (true) {
    auto rec = channel->Receive(DeadlineIn(milliseconds(60000)));
    if (!rec.ok()) {
      std::printf("no %s: %s\n", type == "result" ? "TRAIN" : "record",
                  rec.status().ToString().c_str());
      return 1;
    }
    const bool train = rec->type == ckpt::ipc::RecordType::kTrain;
    channel->Release();
    if (train || type != "result") break;
  }
  Status s;
  if (type == "empty") {
    for (int64_t i = 0; i < mib * 1000 && s.ok(); ++i) {
      s = channel->Send(ckpt::ipc::RecordType::kStats, nullptr, 0, DeadlineIn(milliseconds(60000)));
    }
  } else {
    const size_t bytes = static_cast<size_t>(mib) << 20;
    void* zeros = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (zeros == MAP_FAILED) std::abort();
    const auto record = type == "result"  ? ckpt::ipc::RecordType::kResult
                        : type == "stats" ? ckpt::ipc::RecordType::kStats
                                          : ckpt::ipc::RecordType::kTrain;
    s = channel->Send(record, zeros, bytes, DeadlineIn(milliseconds(120000)));
    munmap(zeros, bytes);
  }
  if (s.ok()) {
    std::printf("claim sent\n");
  } else {
    std::printf("claim failed: %s\n", s.ToString().c_str());
  }
  std::fflush(stdout);
  SitUntilDropped(channel);
  return 0;
}

int Run(const std::string& addr, const std::string& secret_file, const std::string& mode,
        int64_t hello_slots, const std::vector<std::string>& rest) {
  auto secret = ckpt::ipc::LoadSecretFile(secret_file);
  if (!secret.ok()) {
    std::fprintf(stderr, "forging_worker: %s\n", secret.status().ToString().c_str());
    return 2;
  }
  if (mode == "sit") return Sit(addr, *secret, hello_slots);
  if (mode == "cycle") return Cycle(addr, *secret, hello_slots);
  if (mode == "claim") {
    if (rest.size() < 2) return 2;
    return Claim(addr, *secret, rest[0], std::atoll(rest[1].c_str()));
  }
  std::deque<std::string> plain = {"score", "samples", "step", "loss"};
  std::deque<std::string> stateful = {"layout", "stale"};
  for (int connection = 0; connection <= kMaxReconnects; ++connection) {
    if (connection > 0) {
      std::printf("reconnecting\n");
      std::fflush(stdout);
      std::this_thread::sleep_for(milliseconds(50));
    }
    switch (Connection(addr, *secret, mode, hello_slots, plain, stateful)) {
      case Ended::kDone:
        return 0;
      case Ended::kError:
        return 2;
      case Ended::kDropped:
        break;
    }
  }
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr,
                 "usage: forging_worker HOST:PORT SECRET_FILE results|hello|sit|cycle [N]\n"
                 "       forging_worker HOST:PORT SECRET_FILE claim TYPE MIB\n");
    return 2;
  }
  const std::string mode = argv[3];
  const int64_t slots = argc > 4 && mode != "claim" ? std::atoll(argv[4]) : 1;
  return Run(argv[1], argv[2], mode, slots, std::vector<std::string>(argv + 4, argv + argc));
}
