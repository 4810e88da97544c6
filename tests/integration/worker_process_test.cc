// A ckpt-worker process driven through a real segment by this test, which
// plays the scheduler: malformed TRAIN records get FAILED with the reason and
// the worker goes on serving the next.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "ckpt/ipc/channel.h"
#include "ckpt/ipc/messages.h"
#include "process_util.h"

namespace ckpt {
namespace {

using std::chrono::milliseconds;

template <typename M>
void SendMsg(ipc::Channel* ch, ipc::RecordType type, const M& m) {
  std::vector<uint8_t> buf(ipc::EncodedSize(m));
  ASSERT_TRUE(ipc::Encode(m, buf.data(), buf.size()).ok());
  ASSERT_TRUE(ch->Send(type, buf.data(), buf.size(), ipc::DeadlineIn(milliseconds(5000))).ok());
}

// Receives until a record of `type` (skipping STATS and HELLO).
ipc::Received Next(ipc::Channel* ch, ipc::RecordType type) {
  for (int i = 0; i < 600; ++i) {
    auto r = ch->Receive(ipc::DeadlineIn(milliseconds(200)));
    if (!r.ok()) {
      EXPECT_TRUE(r.status().IsResourceExhausted()) << r.status().ToString();
      if (!r.status().IsResourceExhausted()) return {};
      continue;
    }
    if (r->type == type) return *r;
    ch->Release();
  }
  ADD_FAILURE() << "no " << ipc::RecordTypeName(type) << " within 120 s";
  return {};
}

TEST(WorkerProcessTest, MalformedTrainGetsFailedAndTheWorkerGoesOn) {
  const std::string name = "ckpt-test-wp-" + std::to_string(getpid());
  ipc::ChannelOptions o;
  o.ring_bytes = size_t{8} << 20;
  auto ch = ipc::Channel::Create(name, o);
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  const std::string dir = testing::TempDir("wp");
  testing::Child worker(
      {CKPT_WORKER_BIN, "--segment", name, "--device", "cpu", "--slots", "1", "--fusion", "plain"},
      dir + "/worker.log");
  ipc::Received hello = Next(ch->get(), ipc::RecordType::kHello);
  ASSERT_NE(hello.payload, nullptr);
  (*ch)->Release();

  ipc::Configure c;
  c.experiment = "e";
  c.batch_size = 16;
  c.eval_size = 100;
  SendMsg(ch->get(), ipc::RecordType::kConfigure, c);

  // 1: a state that is not a checkpoint.
  std::vector<uint8_t> garbage(4096, 0x5a);
  ipc::Train bad;
  bad.task_id = 1;
  bad.experiment = "e";
  bad.member = "m0";
  bad.version = 1;
  bad.steps = 2;
  bad.hparams = {{"lr", 0.01}};
  bad.state = ipc::ByteSpan{garbage.data(), garbage.size()};
  SendMsg(ch->get(), ipc::RecordType::kTrain, bad);
  // 2: an experiment that was never configured.
  ipc::Train unknown = bad;
  unknown.task_id = 2;
  unknown.experiment = "nope";
  unknown.member = "m0";
  unknown.state = ipc::ByteSpan{};
  SendMsg(ch->get(), ipc::RecordType::kTrain, unknown);
  // 3: a hyperparameter SGD does not have.
  ipc::Train bad_hp = unknown;
  bad_hp.task_id = 3;
  bad_hp.experiment = "e";
  bad_hp.member = "m1";
  bad_hp.hparams = {{"lr", 0.01}, {"beta9", 1.0}};
  SendMsg(ch->get(), ipc::RecordType::kTrain, bad_hp);
  // 4: a good one, fresh from a seed.
  ipc::Train good = unknown;
  good.task_id = 4;
  good.experiment = "e";
  good.member = "m2";
  good.init_seed = 7;
  good.hparams = {{"lr", 0.01}};
  SendMsg(ch->get(), ipc::RecordType::kTrain, good);

  std::map<uint64_t, std::string> failed;
  for (int i = 0; i < 3; ++i) {
    ipc::Received r = Next(ch->get(), ipc::RecordType::kFailed);
    ASSERT_NE(r.payload, nullptr);
    auto f = ipc::DecodeFailed(r.payload, r.size);
    ASSERT_TRUE(f.ok());
    failed[f->task_id] = std::string(ipc::FailureCodeName(f->code)) + ": " + f->reason;
    (*ch)->Release();
  }
  ASSERT_EQ(failed.size(), 3u);
  EXPECT_EQ(failed[1].rfind("bad_state", 0), 0u) << failed[1];
  EXPECT_NE(failed[2].find("nope"), std::string::npos) << failed[2];
  EXPECT_EQ(failed[3].rfind("bad_request", 0), 0u) << failed[3];
  EXPECT_NE(failed[3].find("beta9"), std::string::npos) << failed[3];

  ipc::Received r = Next(ch->get(), ipc::RecordType::kResult);
  ASSERT_NE(r.payload, nullptr);
  auto res = ipc::DecodeResult(r.payload, r.size);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  EXPECT_EQ(res->task_id, 4u);
  EXPECT_EQ(res->step, 2);
  EXPECT_GT(res->state.size, 100000u);
  (*ch)->Release();

  ipc::Shutdown s{"test over"};
  SendMsg(ch->get(), ipc::RecordType::kShutdown, s);
  ASSERT_TRUE(worker.WaitFor(milliseconds(10000))) << worker.Log();
  int st = worker.Wait();
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << worker.Log();
  (void)ipc::Channel::Remove(name);
}

}  // namespace
}  // namespace ckpt
