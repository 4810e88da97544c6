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
                        bool train, const std::vector<MemberTensors*>& members) {
  ForwardPass pass;
  pass.tensors = &P;
  pass.members = &members;
  pass.train = train;
  return ForwardLayers(ctx, pass, x);  // [K, B, outputs]
}

at::Tensor Column(const std::vector<double>& v, const at::Device& device) {
  std::vector<float> f(v.begin(), v.end());
  at::Tensor t = at::tensor(f, at::kFloat).view({static_cast<int64_t>(f.size()), 1});
  return device.is_cpu() ? t : t.to(device);
}

at::Tensor Mask(const std::vector<bool>& v, const at::Device& device) {
  std::vector<uint8_t> b(v.begin(), v.end());
  at::Tensor t = at::tensor(at::ArrayRef<uint8_t>(b), at::kByte)
                     .to(at::kBool)
                     .view({static_cast<int64_t>(b.size()), 1});
  return device.is_cpu() ? t : t.to(device);
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
  const at::Device& d = ctx.device;
  f.neg_lr = Column(neg_lr, d);
  f.weight_decay = Column(wd, d);
  f.momentum = Column(mom, d);
  f.mom_nonzero = Mask(mom_nz, d);
  f.nesterov = Mask(nest, d);
  f.beta1 = Column(b1, d);
  f.one_minus_beta1 = Column(omb1, d);
  f.beta2 = Column(b2, d);
  f.one_minus_beta2 = Column(omb2, d);
  f.eps = Column(eps, d);
  f.decoupled_decay = Column(decay, d);
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

void FusedAdamStep(const Context& ctx, const FusedHparams& h, std::vector<MemberTensors*>& members,
                   std::vector<at::Tensor>& P) {
  const int64_t K = static_cast<int64_t>(members.size());
  std::vector<double> neg_step_size, bc2_sqrt;
  for (MemberTensors* m : members) {
    m->adam_step += 1;
    const double bias_correction1 = 1 - std::pow(m->hp.beta1, m->adam_step);
    const double bias_correction2 = 1 - std::pow(m->hp.beta2, m->adam_step);
    neg_step_size.push_back(-(m->hp.lr / bias_correction1));
    bc2_sqrt.push_back(std::sqrt(bias_correction2));
  }
  at::Tensor neg_step = Column(neg_step_size, ctx.device);
  at::Tensor bc2 = Column(bc2_sqrt, ctx.device);
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
  at::Tensor host = sum.to(at::kCPU);
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
  std::vector<std::vector<int64_t>> idx(members.size());
  std::vector<std::vector<int32_t>> epoch_cache(members.size());
  std::vector<int64_t> cached_epoch(members.size(), -1);
  std::vector<int64_t> all_idx(static_cast<size_t>(K * batch));
  result->losses.reserve(static_cast<size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    if (ctx.options.cancel != nullptr && ctx.options.cancel->load(std::memory_order_relaxed)) {
      return Status::Aborted("fused group: training cancelled");
    }
    for (size_t k = 0; k < members.size(); ++k) {
      BatchIndices(members[k]->data_seed, members[k]->data_cursor, batch, ctx.train.count, &idx[k],
                   &epoch_cache[k], &cached_epoch[k]);
      std::copy(idx[k].begin(), idx[k].end(), all_idx.begin() + static_cast<int64_t>(k) * batch);
    }
    at::Tensor x, y;
    const std::vector<const MemberTensors*> group(members.begin(), members.end());
    GatherBatch(ctx, ctx.train, all_idx, &x, &y, &group);
    // Member k's rows are [k*batch, (k+1)*batch) of the gather.
    if (x.dim() == 4) {
      const int64_t c = x.size(1), height = x.size(2), width = x.size(3);
      x = x.view({K, batch, c, height, width})
              .transpose(0, 1)
              .reshape({batch, K * c, height, width});
    } else {
      x = x.view({K, batch, x.size(1)});
    }
    at::Tensor out = ForwardFused(ctx, P, x, /*train=*/true, members);  // [K, B, outputs]
    at::Tensor per_member = PerMemberLoss(ctx, out, y, K, batch);
    at::Tensor loss = per_member.sum();
    for (const auto& tr : ctx.trainables) P[tr.param].mutable_grad() = at::Tensor();
    loss.backward();
    {
      at::NoGradGuard no_grad;
      if (ctx.optimizer == OptimizerKind::kSgd) {
        FusedSgdStep(ctx, hp, P, K);
      } else {
        FusedAdamStep(ctx, hp, members, P);
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
  if (!ctx.device.is_cpu() && !result->losses.empty()) result->losses.back().sum().item<float>();
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
