// The bare LibTorch training loop the trainer's throughput is compared with.
#include "ckpt/model/baseline.h"

#include <chrono>

#include "model_internal.h"

namespace ckpt::model {

StatusOr<double> MeasureBareLibTorchLoop(const BaselineOptions& options) {
  const TrainerOptions& o = options.trainer;
  if (o.batch_size < 1 || o.intra_op_threads < 1 || !(options.seconds > 0)) {
    return Status::InvalidArgument("baseline: batch_size, intra_op_threads >= 1, seconds > 0");
  }
  std::shared_ptr<const DatasetSplits> data = o.data;
  if (!data) {
    CKPT_ASSIGN_OR_RETURN(data, LoadDataset(o.dataset, o.dataset_path));
  }
  if (data->sample_shape != std::vector<int64_t>{1, 28, 28} ||
      data->x_dtype != format::DType::kU8 || data->y_dtype != format::DType::kU8) {
    return Status::InvalidArgument("baseline: LeNet-5 needs 1x28x28 U8 images with U8 labels");
  }
  try {
    internal::SetThreadIntraOpThreads(o.intra_op_threads);
    const std::string device = o.device == "cuda" ? "cuda:0" : o.device;
    if (device != "cpu" && device.rfind("cuda:", 0) != 0) {
      return Status::InvalidArgument("baseline: unknown device " + o.device);
    }
    torch::Device dev(device);
    if (dev.is_cuda() && !torch::cuda::is_available()) {
      return Status::Unavailable("baseline: device " + device + " is not available");
    }
    const int64_t n = data->train.count;
    torch::Tensor images =
        torch::from_blob(const_cast<void*>(data->train.x), {n, 1, 28, 28}, torch::kUInt8).to(dev);
    torch::Tensor labels = torch::from_blob(const_cast<void*>(data->train.y), {n}, torch::kUInt8)
                               .to(dev, torch::kLong);

    namespace nn = torch::nn;
    nn::Sequential net(nn::Conv2d(nn::Conv2dOptions(1, 6, 5).padding(2)), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Conv2d(nn::Conv2dOptions(6, 16, 5)), nn::ReLU(),
                       nn::MaxPool2d(2), nn::Flatten(), nn::Linear(400, 120), nn::ReLU(),
                       nn::Linear(120, 84), nn::ReLU(), nn::Linear(84, 10));
    net->to(dev);
    torch::optim::SGD opt(net->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(o.seed);
    torch::Tensor loss;
    auto step = [&] {
      torch::Tensor idx = torch::randint(n, {o.batch_size}, gen, torch::kLong).to(dev);
      torch::Tensor x =
          images.index_select(0, idx).to(torch::kFloat).mul_(data->scale[0]).add_(data->shift[0]);
      torch::Tensor y = labels.index_select(0, idx);
      opt.zero_grad();
      loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      opt.step();
    };
    for (int i = 0; i < options.warmup_steps; ++i) step();
    if (loss.defined()) loss.item<float>();
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(options.seconds);
    int64_t steps = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      step();
      ++steps;
      if (dev.is_cuda() && steps % 50 == 0) loss.item<float>();
    }
    loss.item<float>();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return static_cast<double>(steps * o.batch_size) / elapsed;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    return Status::Internal("baseline: " + msg.substr(0, msg.find('\n')));
  }
}

StatusOr<double> MeasureSgemmFlops(const SgemmOptions& options) {
  if (options.threads < 1 || options.n < 1 || !(options.seconds > 0)) {
    return Status::InvalidArgument("sgemm: threads >= 1, n >= 1, seconds > 0");
  }
  try {
    internal::SetThreadIntraOpThreads(options.threads);
    const std::string device = options.device == "cuda" ? "cuda:0" : options.device;
    if (device != "cpu" && device.rfind("cuda:", 0) != 0) {
      return Status::InvalidArgument("sgemm: unknown device " + options.device);
    }
    torch::Device dev(device);
    if (dev.is_cuda() && !torch::cuda::is_available()) {
      return Status::Unavailable("sgemm: device " + device + " is not available");
    }
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(dev);
    torch::Tensor a = torch::rand({options.n, options.n}, f32);
    torch::Tensor b = torch::rand({options.n, options.n}, f32);
    torch::Tensor c = torch::empty({options.n, options.n}, f32);
    torch::mm_out(c, a, b);
    c.sum().item<float>();  // the warm-up product has finished (on a GPU too)
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + std::chrono::duration<double>(options.seconds);
    int64_t products = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      torch::mm_out(c, a, b);
      ++products;
      if (dev.is_cuda() && products % 8 == 0) c.sum().item<float>();
    }
    c.sum().item<float>();
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double n = static_cast<double>(options.n);
    return 2.0 * n * n * n * static_cast<double>(products) / elapsed;
  } catch (const std::exception& e) {
    std::string msg = e.what();
    return Status::Internal("sgemm: " + msg.substr(0, msg.find('\n')));
  }
}

}  // namespace ckpt::model
