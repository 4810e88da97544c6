// Helpers shared by the ckpt::model tests: the real Fashion-MNIST loaded once,
// blobs taken apart and rebuilt (to make malformed or non-finite states), and
// tensor comparisons.
#ifndef CKPT_TESTS_MODEL_MODEL_TEST_UTIL_H_
#define CKPT_TESTS_MODEL_MODEL_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "ckpt/format/checkpoint.h"
#include "ckpt/model/dataset.h"
#include "ckpt/model/trainer.h"

namespace ckpt::model::testing {

inline const char* kFashionDir = "/usr/share/datasets/fashion-mnist";

// Loaded on first use and shared by every test of the process.
inline std::shared_ptr<const DatasetSplits> FashionMnist() {
  static std::shared_ptr<const DatasetSplits> data = [] {
    auto d = LoadDataset("fashion-mnist", kFashionDir);
    if (!d.ok()) {
      ADD_FAILURE() << d.status().ToString();
      return std::shared_ptr<const DatasetSplits>();
    }
    return *d;
  }();
  return data;
}

// LeNet-5 with BatchNorm and dropout. Convolutions before BatchNorm carry
// no bias (BatchNorm removes it; its gradient would be rounding noise, which
// Adam amplifies to full-size steps).
inline constexpr const char* kLenet5Bn = R"([
  {"type": "conv2d", "out": 6, "kernel": 5, "padding": 2, "bias": false},
  {"type": "batchnorm2d"},
  {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "conv2d", "out": 16, "kernel": 5, "bias": false},
  {"type": "batchnorm2d"},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "out": 120},
  {"type": "relu"},
  {"type": "dropout", "p": 0.25},
  {"type": "linear", "out": 84},
  {"type": "relu"},
  {"type": "linear", "out": 10}
])";

// The same with smooth activations and average pooling only. Two float
// implementations of a network with kinks (ReLU, max pooling) part ways by
// more than rounding whenever an activation sits within rounding of a kink;
// after BatchNorm (which divides by a small deviation) one such event moves a
// 20-step trajectory by ~1e-4. Comparisons at 1e-5 over 20 steps need a
// smooth network to be meaningful.
// kSmoothBn without BatchNorm, its convolutions with biases.
inline constexpr const char* kSmooth = R"([
  {"type": "conv2d", "out": 6, "kernel": 5, "padding": 2},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "conv2d", "out": 16, "kernel": 5},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "out": 120},
  {"type": "tanh"},
  {"type": "dropout", "p": 0.25},
  {"type": "linear", "out": 84},
  {"type": "tanh"},
  {"type": "linear", "out": 10}
])";

inline constexpr const char* kSmoothBn = R"([
  {"type": "conv2d", "out": 6, "kernel": 5, "padding": 2, "bias": false},
  {"type": "batchnorm2d"},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "conv2d", "out": 16, "kernel": 5, "bias": false},
  {"type": "batchnorm2d"},
  {"type": "tanh"},
  {"type": "avgpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "out": 120},
  {"type": "tanh"},
  {"type": "dropout", "p": 0.25},
  {"type": "linear", "out": 84},
  {"type": "tanh"},
  {"type": "linear", "out": 10}
])";

inline TrainerOptions BaseOptions(const std::string& spec, const std::string& optimizer) {
  TrainerOptions o;
  o.model_spec = spec;
  o.optimizer = *format::ParseOptimizerKind(optimizer);
  o.batch_size = 32;
  o.eval_size = 0;
  o.data = FashionMnist();
  o.intra_op_threads = 1;
  o.seed = 7;
  return o;
}

inline std::unique_ptr<Trainer> MakeTrainer(const TrainerOptions& o) {
  auto t = Trainer::Create(o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

// A blob's tensors, owned.
struct OwnedTensor {
  std::string name;
  format::DType dtype;
  std::vector<int64_t> shape;
  std::string bytes;

  float* f32() { return reinterpret_cast<float*>(bytes.data()); }
  const float* f32() const { return reinterpret_cast<const float*>(bytes.data()); }
  size_t count() const { return bytes.size() / format::DTypeSize(dtype); }
};

struct OwnedBlob {
  format::CheckpointMeta meta;
  std::vector<OwnedTensor> tensors;

  OwnedTensor* Find(const std::string& name) {
    for (auto& t : tensors) {
      if (t.name == name) return &t;
    }
    return nullptr;
  }
};

inline OwnedBlob Decode(const std::string& blob) {
  OwnedBlob out;
  auto view = format::ParseCheckpoint(blob.data(), blob.size());
  EXPECT_TRUE(view.ok()) << view.status().ToString();
  if (!view.ok()) return out;
  out.meta = view->meta();
  for (const auto& t : view->tensors()) {
    out.tensors.push_back(
        {t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes)});
  }
  return out;
}

inline std::string Encode(const OwnedBlob& b) {
  format::CheckpointWriter w;
  w.SetMeta(b.meta);
  for (const auto& t : b.tensors) {
    Status s = w.AddTensor(t.name, t.dtype, t.shape, t.bytes.data(), t.bytes.size());
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return w.Encode();
}

// Largest |a - b| over the tensor divided by the largest |b| (the tensor's
// scale); 0 for two all-zero tensors.
inline double RelativeDiff(const OwnedTensor& a, const OwnedTensor& b) {
  if (a.dtype != format::DType::kF32) return a.bytes == b.bytes ? 0.0 : 1.0;
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.count(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a.f32()[i] - b.f32()[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b.f32()[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

// ||a - b||_2 / ||b||_2 over the tensor; ||a - b||_2 for an all-zero b.
inline double RelativeL2(const OwnedTensor& a, const OwnedTensor& b) {
  if (a.dtype != format::DType::kF32) return a.bytes == b.bytes ? 0.0 : 1.0;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.count(); ++i) {
    const double d = static_cast<double>(a.f32()[i]) - b.f32()[i];
    diff += d * d;
    norm += static_cast<double>(b.f32()[i]) * b.f32()[i];
  }
  return norm == 0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

inline MemberTask Task(const std::string& member, const std::string* state, uint64_t init_seed,
                       int64_t steps, std::map<std::string, double> hparams = {}) {
  MemberTask t;
  t.member = member;
  if (state != nullptr) {
    t.state = reinterpret_cast<const uint8_t*>(state->data());
    t.state_size = state->size();
  }
  t.init_seed = init_seed;
  t.steps = steps;
  t.hparams = std::move(hparams);
  return t;
}

}  // namespace ckpt::model::testing

#endif  // CKPT_TESTS_MODEL_MODEL_TEST_UTIL_H_
