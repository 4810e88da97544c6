// Fused training (after HFTA, MLSys 2021): K members of one spec train as one
// wide model. Every state tensor is packed as [K, ...] (member k at index k):
//   conv2d       weight [K, out, in, k, k] -> [K*out, in, k, k], groups = K;
//                activations [B, K*C, H, W], member k's channels at k*C
//   batchnorm2d  weight, bias, running stats [K, C] -> [K*C]; num_batches_tracked [K]
//   flatten      [B, K*C, H, W] -> [K, B, C*H*W]
//   linear       weight [K, out, in], bias [K, out]: baddbmm over [K, B, in]
// Each member gathers its own minibatch; the loss is the sum of the members'
// mean losses, so each member's gradient is the one it would have alone. The
// optimizers hold per-member hyperparameters as [K, 1] tensors.
#include <chrono>
#include <cmath>

#include "model_internal.h"

namespace ckpt::model::internal {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// The same input for each of K members: [B, C, H, W] -> [B, K*C, H, W]
// (member k's channels at k*C), [B, F] -> [K, B, F].
at::Tensor Widen(const at::Tensor& x, int64_t K) {
  if (x.dim() == 4) return x.repeat({1, K, 1, 1});
  return x.unsqueeze(0).expand({K, x.size(0), x.size(1)}).contiguous();
}

at::Tensor ForwardFused(const Context& ctx, const std::vector<at::Tensor>& P, const at::Tensor& x,
                        bool train, const std::vector<MemberTensors*>& members,
                        const std::vector<at::Tensor>* masks = nullptr) {
  ForwardPass pass;
  pass.tensors = &P;
  pass.members = &members;
  pass.train = train;
  pass.masks = masks;
  return ForwardLayers(ctx, pass, x);  // [K, B, outputs]
}

// A [K, 1] float column on the device.
at::Tensor Column(const Context& ctx, const std::vector<double>& v) {
  at::Tensor t = HostTensor(ctx, {static_cast<int64_t>(v.size()), 1}, at::kFloat);
  std::copy(v.begin(), v.end(), t.data_ptr<float>());
  return CopyToDevice(ctx, t);
}

// A [K, 1] bool column on the device.
at::Tensor Mask(const Context& ctx, const std::vector<bool>& v) {
  at::Tensor t = HostTensor(ctx, {static_cast<int64_t>(v.size()), 1}, at::kBool);
  std::copy(v.begin(), v.end(), t.data_ptr<bool>());
  return CopyToDevice(ctx, t);
}

bool All(const std::vector<bool>& v, bool value) {
  for (bool b : v) {
    if (b != value) return false;
  }
  return true;
}

// Per-member hyperparameters as [K, 1] tensors, fixed for the group's interval.
struct FusedHparams {
  at::Tensor neg_lr, weight_decay, momentum, mom_nonzero, nesterov;
  at::Tensor beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decoupled_decay;
  bool any_weight_decay = false;
  bool all_momentum = false, no_momentum = false;
  bool all_nesterov = false, no_nesterov = false;
};

FusedHparams MakeHparams(const Context& ctx, const std::vector<MemberTensors*>& members) {
  FusedHparams f;
  std::vector<double> neg_lr, wd, mom, b1, omb1, b2, omb2, eps, decay;
  std::vector<bool> mom_nz, nest;
  for (const MemberTensors* m : members) {
    const Hyperparameters& h = m->hp;
    neg_lr.push_back(-h.lr);
    wd.push_back(h.weight_decay);
    mom.push_back(h.momentum);
    mom_nz.push_back(h.momentum != 0);
    nest.push_back(h.nesterov);
    b1.push_back(h.beta1);
    omb1.push_back(1 - h.beta1);
    b2.push_back(h.beta2);
    omb2.push_back(1 - h.beta2);
    eps.push_back(h.eps);
    decay.push_back(1 - h.lr * h.weight_decay);
    f.any_weight_decay = f.any_weight_decay || h.weight_decay != 0;
  }
  f.neg_lr = Column(ctx, neg_lr);
  f.weight_decay = Column(ctx, wd);
  f.momentum = Column(ctx, mom);
  f.mom_nonzero = Mask(ctx, mom_nz);
  f.nesterov = Mask(ctx, nest);
  f.beta1 = Column(ctx, b1);
  f.one_minus_beta1 = Column(ctx, omb1);
  f.beta2 = Column(ctx, b2);
  f.one_minus_beta2 = Column(ctx, omb2);
  f.eps = Column(ctx, eps);
  f.decoupled_decay = Column(ctx, decay);
  f.all_momentum = All(mom_nz, true);
  f.no_momentum = All(mom_nz, false);
  f.all_nesterov = All(nest, true);
  f.no_nesterov = All(nest, false);
  return f;
}

void FusedSgdStep(const Context& ctx, const FusedHparams& h, std::vector<at::Tensor>& P,
                  int64_t K) {
  for (const auto& tr : ctx.trainables) {
    at::Tensor p = P[tr.param].view({K, -1});
    at::Tensor g = P[tr.param].grad();
    if (!g.defined()) continue;
    g = g.view({K, -1});
    at::Tensor d = h.any_weight_decay ? at::addcmul(g, p, h.weight_decay) : g;
    at::Tensor update = d;
    if (!h.no_momentum) {
      at::Tensor buf = P[tr.momentum_buffer].view({K, -1});
      if (h.all_momentum) {
        buf.mul_(h.momentum).add_(d);
      } else {
        buf.copy_(at::where(h.mom_nonzero, buf * h.momentum + d, buf));
      }
      if (h.no_nesterov) {
        update = buf;
      } else if (h.all_nesterov) {
        update = at::addcmul(d, buf, h.momentum);
      } else {
        update = at::where(h.nesterov, at::addcmul(d, buf, h.momentum), buf);
      }
      if (!h.all_momentum) update = at::where(h.mom_nonzero, update, d);
    }
    p.addcmul_(update, h.neg_lr);
  }
}

// `neg_step` and `bc2` [K, 1]: -lr / bias_correction1 and
// sqrt(bias_correction2) at each member's next step (StepDraws).
void FusedAdamStep(const Context& ctx, const FusedHparams& h, std::vector<MemberTensors*>& members,
                   std::vector<at::Tensor>& P, const at::Tensor& neg_step, const at::Tensor& bc2) {
  const int64_t K = static_cast<int64_t>(members.size());
  for (MemberTensors* m : members) m->adam_step += 1;
  for (const auto& tr : ctx.trainables) {
    at::Tensor p = P[tr.param].view({K, -1});
    at::Tensor g = P[tr.param].grad();
    if (!g.defined()) continue;
    P[tr.step].add_(1);
    g = g.view({K, -1});
    if (ctx.optimizer == OptimizerKind::kAdamW) {
      p.mul_(h.decoupled_decay);
    } else if (h.any_weight_decay) {
      g = at::addcmul(g, p, h.weight_decay);
    }
    at::Tensor exp_avg = P[tr.exp_avg].view({K, -1});
    at::Tensor exp_avg_sq = P[tr.exp_avg_sq].view({K, -1});
    if (kAdamFirstMomentLerp) {
      exp_avg.lerp_(g, h.one_minus_beta1);
    } else {
      exp_avg.mul_(h.beta1).addcmul_(g, h.one_minus_beta1);
    }
    exp_avg_sq.mul_(h.beta2).addcmul_(g * g, h.one_minus_beta2);
    at::Tensor denom = exp_avg_sq.sqrt().div_(bc2).add_(h.eps);
    p.addcdiv_(exp_avg * neg_step, denom);
  }
}

// ScoreSum per member on the first `count` samples of `split`.
std::vector<double> EvaluateFused(const Context& ctx, const std::vector<at::Tensor>& P,
                                  const std::vector<MemberTensors*>& members,
                                  const DeviceSplit& split, int64_t count) {
  at::NoGradGuard no_grad;
  const int64_t K = static_cast<int64_t>(members.size());
  const int64_t chunk = std::max<int64_t>(1, ctx.options.eval_batch_size / K);
  at::Tensor sum = at::zeros({K}, at::TensorOptions().dtype(at::kDouble).device(ctx.device));
  for (int64_t begin = 0; begin < count; begin += chunk) {
    const int64_t end = std::min(count, begin + chunk);
    at::Tensor x = Normalize(ctx, split.x.slice(0, begin, end));
    at::Tensor y = split.y.slice(0, begin, end);
    at::Tensor out = ForwardFused(ctx, P, Widen(x, K), /*train=*/false, members);
    sum.add_(ScoreSum(ctx, out, y));
  }
  at::Tensor host = CopyToHost(ctx, sum);
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + K);
}

// The members' tensors stacked into packed [K, ...] tensors, in layout order;
// the trainable ones require a gradient.
std::vector<at::Tensor> PackMembers(const Context& ctx,
                                    const std::vector<MemberTensors*>& members) {
  std::vector<at::Tensor> P(ctx.layout.size());
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> parts(members.size());
  for (size_t i = 0; i < ctx.layout.size(); ++i) {
    for (size_t k = 0; k < members.size(); ++k) parts[k] = members[k]->tensors[i].detach();
    P[i] = at::stack(parts, 0);
    if (ctx.layout[i].trainable) P[i].requires_grad_(true);
  }
  return P;
}

// Points each member's tensors at its slice of the packed tensors.
void UnpackMembers(const Context& ctx, const std::vector<at::Tensor>& P,
                   const std::vector<MemberTensors*>& members) {
  for (size_t i = 0; i < ctx.layout.size(); ++i) {
    at::Tensor packed = P[i].detach();
    for (size_t k = 0; k < members.size(); ++k) {
      members[k]->tensors[i] = packed.select(0, static_cast<int64_t>(k));
    }
  }
}

// Each member's mean loss [K] of the fused output `out` [K, batch, outputs].
at::Tensor PerMemberLoss(const Context& ctx, const at::Tensor& out, const at::Tensor& y, int64_t K,
                         int64_t batch) {
  const int64_t outputs = out.size(2);
  if (ctx.loss == format::LossKind::kCrossEntropy) {
    return at::cross_entropy_loss(out.reshape({K * batch, outputs}), y, c10::nullopt,
                                  at::Reduction::None)
        .view({K, batch})
        .mean(1);
  }
  at::Tensor err = out - y.view({K, batch, -1});
  return (err * err).view({K, -1}).mean(1);
}

}  // namespace

Status TrainFusedGroup(const Context& ctx, std::vector<MemberTensors*>& members, int64_t steps,
                       bool eval_val, bool eval_test, FusedResult* result, double* pack_s,
                       double* unpack_s, double* compute_s, double* eval_s) {
  const int64_t K = static_cast<int64_t>(members.size());
  const int64_t batch = ctx.options.batch_size;
  auto start = std::chrono::steady_clock::now();

  std::vector<at::Tensor> P = PackMembers(ctx, members);
  const FusedHparams hp = MakeHparams(ctx, members);
  *pack_s = Seconds(start);

  start = std::chrono::steady_clock::now();
  StepDraws draws(ctx, members, /*fused=*/true, steps);
  result->losses.reserve(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    if (ctx.options.cancel != nullptr && ctx.options.cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("fused group: training cancelled");
    }
    draws.Prepare(s);
    at::Tensor x, y;
    GatherBatch(ctx, ctx.train, draws.indices(s), draws.offsets(s), &x, &y);
    // Member k's rows are [k*batch, (k+1)*batch) of the gather.
    if (x.dim() == 4) {
      const int64_t c = x.size(1), height = x.size(2), width = x.size(3);
      x = x.view({K, batch, c, height, width})
              .transpose(0, 1)
              .reshape({batch, K * c, height, width});
    } else {
      x = x.view({K, batch, x.size(1)});
    }
    const std::vector<at::Tensor> masks = draws.masks(s);
    at::Tensor out = ForwardFused(ctx, P, x, /*train=*/true, members, &masks);  // [K, B, outputs]
    at::Tensor per_member = PerMemberLoss(ctx, out, y, K, batch);
    at::Tensor loss = per_member.sum();
    for (const auto& tr : ctx.trainables) P[tr.param].mutable_grad() = at::Tensor();
    loss.backward();
    {
      at::NoGradGuard no_grad;
      if (ctx.optimizer == OptimizerKind::kSgd) {
        FusedSgdStep(ctx, hp, P, K);
      } else {
        FusedAdamStep(ctx, hp, members, P, draws.adam_neg_step(s), draws.adam_bc2_sqrt(s));
      }
    }
    result->losses.push_back(per_member.detach());
    for (MemberTensors* m : members) {
      m->data_cursor += static_cast<uint64_t>(batch);
      m->step += 1;
    }
  }
  for (const auto& tr : ctx.trainables) P[tr.param].mutable_grad() = at::Tensor();

  // The time is the device's, not the launches': wait for the last step.
  WaitForDevice(ctx);
  const auto eval_start = std::chrono::steady_clock::now();
  const int64_t val_count = std::min<int64_t>(ctx.options.eval_size, ctx.validation.count);
  if (eval_val && val_count > 0)
    result->score_val = EvaluateFused(ctx, P, members, ctx.validation, val_count);
  if (eval_test && ctx.test.count > 0) {
    result->score_test = EvaluateFused(ctx, P, members, ctx.test, ctx.test.count);
  }
  *eval_s = Seconds(eval_start);
  *compute_s = Seconds(start);

  start = std::chrono::steady_clock::now();
  UnpackMembers(ctx, P, members);
  *unpack_s = Seconds(start);
  return Status::OK();
}

}  // namespace ckpt::model::internal
