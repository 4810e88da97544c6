// Plain training: one member, its own tensors, the update rules of
// torch.optim (single-tensor path) of the LibTorch version built against, op
// for op, so that a member's trajectory matches PyTorch's bit for bit on the
// same kernels.
#include <cmath>

#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

at::Tensor OptionalTensor(const std::vector<at::Tensor>& t, int index) {
  return index >= 0 ? t[index] : at::Tensor();
}

at::Tensor ForwardSpec(const Context& ctx, const std::vector<at::Tensor>& t, at::Tensor x,
                       bool train, uint64_t data_seed, int64_t step) {
  const auto& layers = ctx.spec.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    const LayerTensors& lt = ctx.layer_tensors[i];
    switch (l.kind) {
      case LayerKind::kConv2d:
        x = at::conv2d(x, t[lt.weight], OptionalTensor(t, lt.bias), {l.stride, l.stride},
                       {l.padding, l.padding});
        break;
      case LayerKind::kLinear:
        x = at::linear(x, t[lt.weight], OptionalTensor(t, lt.bias));
        break;
      case LayerKind::kRelu:
        if (i + 1 < layers.size() && layers[i + 1].kind == LayerKind::kMaxPool2d &&
            FastMaxPool2dApplies(x, layers[i + 1].kernel, layers[i + 1].stride,
                                 layers[i + 1].padding)) {
          // relu then max pool as one pass: the pool of the relu is the relu of the pool.
          x = FastMaxPool2d(x, layers[i + 1].kernel, layers[i + 1].stride, /*relu_first=*/true);
          ++i;
          break;
        }
        x = at::relu(x);
        break;
      case LayerKind::kTanh:
        x = at::tanh(x);
        break;
      case LayerKind::kMaxPool2d:
        if (FastMaxPool2dApplies(x, l.kernel, l.stride, l.padding)) {
          x = FastMaxPool2d(x, l.kernel, l.stride, /*relu_first=*/false);
          break;
        }
        x = at::max_pool2d(x, {l.kernel, l.kernel}, {l.stride, l.stride}, {l.padding, l.padding});
        break;
      case LayerKind::kAvgPool2d:
        x = at::avg_pool2d(x, {l.kernel, l.kernel}, {l.stride, l.stride}, {l.padding, l.padding});
        break;
      case LayerKind::kBatchNorm2d:
        if (train) t[lt.num_batches_tracked].add_(1);
        x = at::batch_norm(x, t[lt.weight], t[lt.bias], t[lt.running_mean], t[lt.running_var],
                           train, l.momentum, l.eps, /*cudnn_enabled=*/true);
        break;
      case LayerKind::kDropout:
        if (train && l.p > 0) x = x * DropoutMask(data_seed, step, i, l.p, x.sizes(), ctx.device);
        break;
      case LayerKind::kFlatten:
        x = x.flatten(1);
        break;
    }
  }
  return x;
}

at::Tensor Forward(const Context& ctx, const MemberState& m, torch::jit::Module* script,
                   const at::Tensor& x, bool train) {
  if (script != nullptr) {
    script->train(train);
    return script->forward({x}).toTensor();
  }
  return ForwardSpec(ctx, m.tensors, x, train, m.data_seed, m.step);
}

// torch.optim.SGD (dampening 0, maximize false); a zero momentum buffer
// behaves as PyTorch's absent one: 0 * momentum + d == d.
void SgdStep(const Context& ctx, MemberState* m) {
  const Hyperparameters& h = m->hp;
  for (const auto& tr : ctx.trainables) {
    at::Tensor& p = m->tensors[tr.param];
    at::Tensor d = p.grad();
    if (!d.defined()) continue;
    if (h.weight_decay != 0) d = d.add(p, h.weight_decay);
    if (h.momentum != 0) {
      at::Tensor& buf = m->tensors[tr.momentum_buffer];
      buf.mul_(h.momentum).add_(d, 1.0);
      d = h.nesterov ? d.add(buf, h.momentum) : buf;
    }
    p.add_(d, -h.lr);
  }
}

// torch.optim.Adam / AdamW (amsgrad false, maximize false, not capturable).
void AdamStep(const Context& ctx, MemberState* m) {
  const Hyperparameters& h = m->hp;
  m->adam_step += 1;
  const double step = m->adam_step;
  const double bias_correction1 = 1 - std::pow(h.beta1, step);
  const double bias_correction2 = 1 - std::pow(h.beta2, step);
  const double step_size = h.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);
  for (const auto& tr : ctx.trainables) {
    at::Tensor& p = m->tensors[tr.param];
    at::Tensor grad = p.grad();
    if (!grad.defined()) continue;
    m->tensors[tr.step].add_(1);
    if (ctx.optimizer == OptimizerKind::kAdamW) {
      p.mul_(1 - h.lr * h.weight_decay);
    } else if (h.weight_decay != 0) {
      grad = grad.add(p, h.weight_decay);
    }
    at::Tensor& exp_avg = m->tensors[tr.exp_avg];
    at::Tensor& exp_avg_sq = m->tensors[tr.exp_avg_sq];
    if (kAdamFirstMomentLerp) {
      exp_avg.lerp_(grad, 1 - h.beta1);
    } else {
      exp_avg.mul_(h.beta1).add_(grad, 1 - h.beta1);
    }
    exp_avg_sq.mul_(h.beta2).addcmul_(grad, grad, 1 - h.beta2);
    at::Tensor denom = at::div(exp_avg_sq.sqrt(), bias_correction2_sqrt).add_(h.eps);
    p.addcdiv_(exp_avg, denom, -step_size);
  }
}

// Splits "a.b.c" into the module path and the attribute name.
void SetModuleTensor(torch::jit::Module module, const std::string& name, const at::Tensor& t) {
  size_t start = 0;
  for (;;) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) break;
    module = module.attr(name.substr(start, dot - start)).toModule();
    start = dot + 1;
  }
  module.setattr(name.substr(start), t);
}

}  // namespace

StatusOr<torch::jit::Module> BindScript(const Context& ctx, const MemberState& m) {
  torch::jit::Module clone;
  {
    std::lock_guard<std::mutex> lock(ctx.script_mu);
    clone = ctx.script->clone();
  }
  for (size_t i = 0; i < ctx.model_tensors.size(); ++i) {
    SetModuleTensor(clone, ctx.model_tensors[i].name, m.tensors[i]);
  }
  return clone;
}

Status TrainPlainSteps(const Context& ctx, MemberState* m, torch::jit::Module* script,
                       int64_t steps, std::vector<at::Tensor>* losses) {
  const int64_t batch = ctx.options.batch_size;
  std::vector<int64_t> idx;
  std::vector<int32_t> epoch_cache;
  int64_t cached_epoch = -1;
  losses->reserve(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    if (ctx.options.cancel != nullptr && ctx.options.cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("member " + m->member + ": training cancelled at step " +
                             std::to_string(m->step));
    }
    BatchIndices(m->data_seed, m->data_cursor, batch, ctx.train.count, &idx, &epoch_cache,
                 &cached_epoch);
    at::Tensor x, y;
    GatherBatch(ctx, ctx.train, idx, &x, &y);
    at::Tensor logits = Forward(ctx, *m, script, x, /*train=*/true);
    at::Tensor loss = at::cross_entropy_loss(logits, y);
    for (const auto& tr : ctx.trainables) m->tensors[tr.param].mutable_grad() = at::Tensor();
    loss.backward();
    {
      at::NoGradGuard no_grad;
      if (ctx.optimizer == OptimizerKind::kSgd) {
        SgdStep(ctx, m);
      } else {
        AdamStep(ctx, m);
      }
    }
    losses->push_back(loss.detach());
    m->data_cursor += static_cast<uint64_t>(batch);
    m->step += 1;
    // A member that has gone non-finite is not trained further; the caller
    // finds the step from `losses`.
    if ((s + 1) % 32 == 0 && !std::isfinite(loss.item<float>())) break;
  }
  for (const auto& tr : ctx.trainables) m->tensors[tr.param].mutable_grad() = at::Tensor();
  return Status::OK();
}

int64_t EvaluatePlain(const Context& ctx, const MemberState& m, torch::jit::Module* script,
                      const DeviceSplit& split, int64_t count) {
  at::NoGradGuard no_grad;
  const int64_t chunk = std::max<int64_t>(1, ctx.options.eval_batch_size);
  at::Tensor correct = at::zeros({}, at::TensorOptions().dtype(at::kLong).device(ctx.device));
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t end = std::min(count, begin + chunk);
    at::Tensor x = split.images.slice(0, begin, end).to(at::kFloat).mul_(ctx.scale).add_(ctx.shift);
    at::Tensor y = split.labels.slice(0, begin, end);
    at::Tensor logits = Forward(ctx, m, script, x, /*train=*/false);
    correct.add_(logits.argmax(1).eq(y).sum());
  }
  if (script != nullptr) script->train(true);
  return correct.item<int64_t>();
}

}  // namespace ckpt::model::internal
