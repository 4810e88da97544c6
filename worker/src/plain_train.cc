// Plain training: one member, its own tensors, the update rules of
// torch.optim (single-tensor path) of the LibTorch version built against, op
// for op, so that a member's trajectory matches PyTorch's bit for bit on the
// same kernels.
#include <cmath>

#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

at::Tensor Forward(const Context& ctx, const MemberTensors& m, torch::jit::Module* script,
                   const at::Tensor& x, bool train,
                   const std::vector<at::Tensor>* masks = nullptr) {
  if (script != nullptr) {
    script->train(train);
    return script->forward({x}).toTensor();
  }
  ForwardPass pass;
  pass.tensors = &m.tensors;
  pass.train = train;
  pass.masks = masks;
  return ForwardLayers(ctx, pass, x);
}

// torch.optim.SGD (dampening 0, maximize false); a zero momentum buffer
// behaves as PyTorch's absent one: 0 * momentum + d == d.
void SgdStep(const Context& ctx, MemberTensors* m) {
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
void AdamStep(const Context& ctx, MemberTensors* m) {
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

StatusOr<torch::jit::Module> BindScript(const Context& ctx, const MemberTensors& m) {
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

Status TrainPlainSteps(const Context& ctx, MemberTensors* m, torch::jit::Module* script,
                       int64_t steps, std::vector<at::Tensor>* losses) {
  const int64_t batch = ctx.options.batch_size;
  const std::vector<MemberTensors*> self = {m};
  StepDraws draws(ctx, self, /*fused=*/false, steps);
  losses->reserve(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    if (ctx.options.cancel != nullptr && ctx.options.cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("member " + m->member + ": training cancelled at step " +
                             std::to_string(m->step));
    }
    draws.Prepare(s);
    at::Tensor x, y;
    GatherBatch(ctx, ctx.train, draws.indices(s), draws.offsets(s), &x, &y);
    const std::vector<at::Tensor> masks = draws.masks(s);
    at::Tensor logits = Forward(ctx, *m, script, x, /*train=*/true, &masks);
    at::Tensor loss = ctx.loss == format::LossKind::kCrossEntropy
                          ? at::cross_entropy_loss(logits, y)
                          : at::mse_loss(logits, y);
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
    // finds the step from `losses`. Not on a GPU, where reading the loss
    // would wait for the device every 32 steps: there it trains on to the
    // interval's end and fails the same.
    if (ctx.device.is_cpu() && (s + 1) % 32 == 0 && !std::isfinite(loss.item<float>())) break;
  }
  for (const auto& tr : ctx.trainables) m->tensors[tr.param].mutable_grad() = at::Tensor();
  return Status::OK();
}

double EvaluatePlain(const Context& ctx, const MemberTensors& m, torch::jit::Module* script,
                     const DeviceSplit& split, int64_t count) {
  at::NoGradGuard no_grad;
  const int64_t chunk = std::max<int64_t>(1, ctx.options.eval_batch_size);
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(ctx.device));
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t end = std::min(count, begin + chunk);
    at::Tensor x = Normalize(ctx, split.x.slice(0, begin, end));
    at::Tensor y = split.y.slice(0, begin, end);
    at::Tensor out = Forward(ctx, m, script, x, /*train=*/false);
    sum.add_(ScoreSum(ctx, out, y));
  }
  if (script != nullptr) script->train(true);
  return CopyToHost(ctx, sum).item<double>();
}

}  // namespace ckpt::model::internal
