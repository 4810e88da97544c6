// ckpt::model on a CUDA device, checked against itself (fused against
// separate) and against the CPU. Each test skips where no CUDA device can be
// expected (a build without CKPT_WITH_CUDA, or no device visible: see
// cuda_visible.h), naming the reason; where one is visible and cuda:0 cannot
// be used, it fails.
//
// Written and compiled without a GPU: these tests have not run on one yet.
// The tolerances assume cuDNN's default TF32 convolutions on Ampere and later
// (LibTorch's allowTF32CuDNN is true unless changed), which round the
// convolution inputs to 10-bit mantissas; the parameters' relative error
// after a few small SGD steps stays far below 1e-3 even so.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/ipc/channel.h"
#include "cuda_visible.h"
#include "model_test_util.h"

namespace ckpt::model {
namespace {

using testing::Decode;
using testing::OwnedBlob;
using testing::Task;

constexpr const char* kDevice = "cuda:0";

// A trainer on cuda:0, or the reason there is none.
std::unique_ptr<Trainer> GpuTrainer(TrainerOptions o, std::string* why) {
  o.device = kDevice;
  auto t = Trainer::Create(o);
  if (!t.ok()) {
    *why = t.status().ToString();
    return nullptr;
  }
  return std::move(t).value();
}

#define CKPT_GPU_OR_SKIP(trainer, options)                                                         \
  if (const std::string no = ::ckpt::testing::NoCudaDevice(); !no.empty()) GTEST_SKIP() << no;     \
  std::string why_##trainer;                                                                       \
  auto trainer = GpuTrainer(options, &why_##trainer);                                              \
  ASSERT_NE(trainer, nullptr) << "a CUDA device is visible, yet no trainer on " << kDevice << ": " \
                              << why_##trainer

std::map<std::string, double> Hparams(const std::string& optimizer, int i) {
  if (optimizer == "sgd") {
    return {{"lr", 0.02 + 0.01 * i}, {"momentum", 0.5 + 0.1 * i}, {"weight_decay", 1e-4 * i}};
  }
  return {{"lr", 1e-3 * (1 + i)}, {"weight_decay", 1e-4 * i}};
}

// Every tensor of `a` matches `b`: relative L2 within `tolerance` (ten times
// that for optimizer slots, which amplify rounding), metadata exactly.
void ExpectClose(const std::string& a_blob, const std::string& b_blob, double tolerance,
                 const std::string& what) {
  OwnedBlob a = Decode(a_blob), b = Decode(b_blob);
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  EXPECT_EQ(a.meta.step, b.meta.step) << what;
  EXPECT_EQ(a.meta.data_cursor, b.meta.data_cursor) << what;
  for (const auto& t : a.tensors) {
    const auto* u = b.Find(t.name);
    ASSERT_NE(u, nullptr) << what << " " << t.name;
    ASSERT_EQ(t.shape, u->shape) << what << " " << t.name;
    const double tol = t.name.rfind("optim.", 0) == 0 ? 10 * tolerance : tolerance;
    EXPECT_LE(testing::RelativeL2(t, *u), tol) << what << " tensor " << t.name;
  }
}

class GpuFusedTest : public ::testing::TestWithParam<std::string> {};

// K members trained as one wide model on the GPU give the parameters each
// member reaches alone on the GPU, and those it reaches on the CPU.
TEST_P(GpuFusedTest, FusedEqualsSeparateAndTheCpu) {
  const std::string optimizer = GetParam();
  TrainerOptions o = testing::BaseOptions(testing::kSmoothBn, optimizer);
  CKPT_GPU_OR_SKIP(gpu, o);
  auto cpu = testing::MakeTrainer(o);
  ASSERT_NE(cpu, nullptr);

  constexpr int kMembers = 4;
  constexpr int64_t kSteps = 8;
  std::vector<std::string> initial;
  for (int i = 0; i < kMembers; ++i) {
    MemberOutcome fresh = cpu->TrainPlain(Task("m" + std::to_string(i), nullptr, 100 + i, 0));
    ASSERT_TRUE(fresh.ok()) << fresh.status.ToString();
    initial.push_back(fresh.EncodeState());
  }
  std::vector<MemberTask> tasks;
  for (int i = 0; i < kMembers; ++i) {
    tasks.push_back(Task("m" + std::to_string(i), &initial[i], 0, kSteps, Hparams(optimizer, i)));
  }
  std::vector<MemberOutcome> fused = gpu->TrainFused(tasks);
  ASSERT_EQ(fused.size(), tasks.size());
  for (int i = 0; i < kMembers; ++i) {
    ASSERT_TRUE(fused[i].ok()) << fused[i].status.ToString();
    EXPECT_EQ(fused[i].mode, ipc::FusionMode::kFused);
    MemberOutcome alone = gpu->TrainPlain(tasks[i]);
    ASSERT_TRUE(alone.ok()) << alone.status.ToString();
    MemberOutcome on_cpu = cpu->TrainPlain(tasks[i]);
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status.ToString();
    ExpectClose(fused[i].EncodeState(), alone.EncodeState(), 1e-3,
                optimizer + " member " + std::to_string(i) + " fused vs plain (gpu)");
    ExpectClose(alone.EncodeState(), on_cpu.EncodeState(), 1e-3,
                optimizer + " member " + std::to_string(i) + " gpu vs cpu");
    EXPECT_NEAR(fused[i].train_loss, on_cpu.train_loss, 1e-3 * std::max(1.0, on_cpu.train_loss));
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, GpuFusedTest, ::testing::Values("sgd", "adam"));

// A member's blob received in place from a real shared-memory ring whose pages
// are registered with CUDA (Trainer::PinHostMemory) goes to the device and
// back bit for bit (zero steps), and trains on the GPU as on the CPU.
TEST(GpuRingTest, PinnedRingHandoffIsBitExact) {
  TrainerOptions o = testing::BaseOptions("lenet5", "sgd");
  CKPT_GPU_OR_SKIP(gpu, o);
  auto cpu = testing::MakeTrainer(o);
  ASSERT_NE(cpu, nullptr);
  MemberOutcome fresh = cpu->TrainPlain(Task("ring", nullptr, 42, 3, Hparams("sgd", 1)));
  ASSERT_TRUE(fresh.ok()) << fresh.status.ToString();
  const std::string blob = fresh.EncodeState();

  const std::string name = "ckpt-gpu-test-" + std::to_string(::getpid());
  ipc::ChannelOptions co;
  co.ring_bytes = size_t{8} << 20;  // the blob (~0.5 MB) travels in place, not as fragments
  auto owner = ipc::Channel::Create(name, co);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  auto worker = ipc::Channel::Open(name, co);
  ASSERT_TRUE(worker.ok()) << worker.status().ToString();
  ASSERT_TRUE((*owner)
                  ->Send(ipc::RecordType::kTrain, blob.data(), blob.size(),
                         ipc::DeadlineIn(std::chrono::milliseconds(5000)))
                  .ok());
  auto rec = (*worker)->Receive(ipc::DeadlineIn(std::chrono::milliseconds(5000)));
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  ASSERT_EQ(rec->size, blob.size());

  // The pages holding the payload, registered as the worker registers its
  // segment's mapping.
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(rec->payload) & ~(page - 1);
  const uintptr_t end =
      (reinterpret_cast<uintptr_t>(rec->payload) + rec->size + page - 1) & ~(page - 1);
  Status pinned = gpu->PinHostMemory(reinterpret_cast<const void*>(begin), end - begin);
  ASSERT_TRUE(pinned.ok()) << pinned.ToString();

  MemberTask same;
  same.member = "ring";
  same.state = rec->payload;
  same.state_size = rec->size;
  same.steps = 0;
  // As the worker does: from the ring straight to the device, no staging copy.
  MemberTask uploaded = same;
  const int64_t staged = gpu->GetDeviceTraffic().staged_copies;
  uploaded.uploaded = gpu->Upload(same);
  EXPECT_EQ(gpu->GetDeviceTraffic().staged_copies, staged)
      << "a tensor of the pinned ring was staged through another host buffer";
  MemberOutcome back = gpu->TrainPlain(uploaded);
  ASSERT_TRUE(back.ok()) << back.status.ToString();
  const std::string returned = back.EncodeState();
  ASSERT_EQ(returned.size(), blob.size());
  EXPECT_EQ(std::memcmp(returned.data(), blob.data(), blob.size()), 0)
      << "the state changed on its way to the device and back";

  MemberTask train = same;
  train.steps = 5;
  train.hparams = Hparams("sgd", 1);
  MemberOutcome on_gpu = gpu->TrainPlain(train);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status.ToString();
  MemberOutcome on_cpu = cpu->TrainPlain(train);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status.ToString();
  ExpectClose(on_gpu.EncodeState(), on_cpu.EncodeState(), 1e-3, "ring blob trained gpu vs cpu");
  (*worker)->Release();
  gpu.reset();  // unregisters the pages before the segment goes
  worker->reset();
  owner->reset();
  EXPECT_TRUE(ipc::Channel::Remove(name).ok());
}

}  // namespace
}  // namespace ckpt::model
