// model_train_helper: continues a member's training in a fresh process, for
// the checkpoint-continuity test.
//
//   model_train_helper IN OUT STEPS SPEC OPTIMIZER BATCH SEED [fused]
//
// Reads the blob IN, trains STEPS steps (one intra-op thread, the
// Fashion-MNIST of /usr/share/datasets), writes the new blob to OUT. With
// "fused", trains through TrainFused (a group of one). Exit 0 on success.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>

#include "ckpt/model/trainer.h"

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s IN OUT STEPS SPEC OPTIMIZER BATCH SEED [fused]\n", argv[0]);
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  std::string blob((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ckpt::model::TrainerOptions o;
  o.model_spec = argv[4];
  auto optimizer = ckpt::format::ParseOptimizerKind(argv[5]);
  if (!optimizer.ok()) {
    std::fprintf(stderr, "train_helper: %s\n", optimizer.status().ToString().c_str());
    return 2;
  }
  o.optimizer = *optimizer;
  o.batch_size = std::atoi(argv[6]);
  o.seed = std::strtoull(argv[7], nullptr, 10);
  o.eval_size = 0;
  o.intra_op_threads = 1;
  auto trainer = ckpt::model::Trainer::Create(o);
  if (!trainer.ok()) {
    std::fprintf(stderr, "%s\n", trainer.status().ToString().c_str());
    return 1;
  }
  ckpt::model::MemberTask task;
  task.member = "helper";
  task.state = reinterpret_cast<const uint8_t*>(blob.data());
  task.state_size = blob.size();
  task.steps = std::atoll(argv[3]);
  const bool fused = argc > 8 && std::string(argv[8]) == "fused";
  ckpt::model::MemberOutcome out =
      fused ? (*trainer)->TrainFused({task}).front() : (*trainer)->TrainPlain(task);
  if (!out.ok()) {
    std::fprintf(stderr, "%s\n", out.status.ToString().c_str());
    return 1;
  }
  std::ofstream(argv[2], std::ios::binary) << out.EncodeState();
  return 0;
}
