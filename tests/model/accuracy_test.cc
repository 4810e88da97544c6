// Real data: one LeNet-5 member reaches 0.85 validation accuracy on
// Fashion-MNIST within two epochs, trained in two intervals with its
// checkpoint passed between them as the worker would.
#include <gtest/gtest.h>

#include "ckpt/model/trainer.h"
#include "model_test_util.h"

namespace ckpt::model {
namespace {

TEST(AccuracyTest, Lenet5ReachesEightyFivePercentInTwoEpochs) {
  TrainerOptions o;
  o.model_spec = "lenet5";
  o.optimizer = format::OptimizerKind::kAdam;
  o.batch_size = 64;
  o.eval_size = 10000;
  o.dataset_path = testing::kFashionDir;
  o.intra_op_threads = 1;
  auto trainer = Trainer::Create(o);
  ASSERT_TRUE(trainer.ok()) << trainer.status().ToString();
  const int64_t steps_per_epoch = 50000 / 64;
  std::map<std::string, double> hp = {{"lr", 0.002}};
  MemberOutcome first =
      (*trainer)->TrainPlain(testing::Task("acc", nullptr, 1, steps_per_epoch, hp));
  ASSERT_TRUE(first.ok()) << first.status.ToString();
  std::string state = first.EncodeState();
  MemberTask second_task = testing::Task("acc", &state, 0, steps_per_epoch, hp);
  second_task.eval_test = true;
  MemberOutcome second = (*trainer)->TrainPlain(second_task);
  ASSERT_TRUE(second.ok()) << second.status.ToString();
  std::printf("epoch 1: loss %.4f val %.4f; epoch 2: loss %.4f val %.4f test %.4f (%.1f s)\n",
              first.train_loss, first.val_score, second.train_loss, second.val_score,
              second.test_score, first.compute_s + second.compute_s);
  EXPECT_EQ(second.step, 2 * steps_per_epoch);
  EXPECT_GE(second.val_score, 0.85);
  EXPECT_GE(second.test_score, 0.80);
  EXPECT_LT(second.train_loss, first.train_loss);
}

}  // namespace
}  // namespace ckpt::model
