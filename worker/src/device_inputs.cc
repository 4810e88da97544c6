// Host <-> device traffic, counted (TrafficCounters), and the random inputs of
// the training steps drawn ahead of them (StepDraws): the step loop itself
// neither copies nor waits, so the host runs ahead of a GPU.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model_internal.h"

#if defined(CKPT_WITH_CUDA)
#include <c10/cuda/CUDAStream.h>
#endif

namespace ckpt::model::internal {

at::Tensor HostTensor(const Context& ctx, at::IntArrayRef shape, at::ScalarType dtype) {
  return at::empty(shape, at::TensorOptions().dtype(dtype).pinned_memory(ctx.device.is_cuda()));
}

at::Tensor CopyToDevice(const Context& ctx, const at::Tensor& host) {
  ctx.traffic.to_device_copies.fetch_add(1, std::memory_order_relaxed);
  ctx.traffic.to_device_bytes.fetch_add(static_cast<int64_t>(host.nbytes()),
                                        std::memory_order_relaxed);
  if (ctx.device.is_cpu()) return host;
  at::Tensor src = host;
  if (!src.is_contiguous() || !src.is_pinned()) {
    ctx.traffic.staged_copies.fetch_add(1, std::memory_order_relaxed);
    src = HostTensor(ctx, host.sizes(), host.scalar_type());
    src.copy_(host);
  }
  return src.to(ctx.device, /*non_blocking=*/true);
}

at::Tensor CopyToHostAsync(const Context& ctx, const at::Tensor& t) {
  ctx.traffic.to_host_copies.fetch_add(1, std::memory_order_relaxed);
  ctx.traffic.to_host_bytes.fetch_add(static_cast<int64_t>(t.nbytes()), std::memory_order_relaxed);
  if (t.device().is_cpu()) return t.contiguous();
  at::Tensor host = HostTensor(ctx, t.sizes(), t.scalar_type());
  host.copy_(t, /*non_blocking=*/true);
  return host;
}

at::Tensor CopyToHost(const Context& ctx, const at::Tensor& t) {
  at::Tensor host = CopyToHostAsync(ctx, t);
  WaitForDevice(ctx);
  return host;
}

void UseOnThisStream(const Context& ctx, const at::Tensor& t) {
#if defined(CKPT_WITH_CUDA)
  if (ctx.device.is_cuda() && t.defined() && t.is_cuda()) {
    t.record_stream(c10::cuda::getCurrentCUDAStream(ctx.device.index()));
  }
#else
  (void)ctx;
  (void)t;
#endif
}

void WaitForDevice(const Context& ctx) {
  ctx.traffic.waits.fetch_add(1, std::memory_order_relaxed);
#if defined(CKPT_WITH_CUDA)
  if (ctx.device.is_cuda()) c10::cuda::getCurrentCUDAStream(ctx.device.index()).synchronize();
#endif
}

StepDraws::StepDraws(const Context& ctx, const std::vector<MemberTensors*>& members, bool fused,
                     int64_t steps)
    : ctx_(ctx),
      members_(members),
      fused_(fused),
      steps_(steps),
      epoch_cache_(members.size()),
      cached_epoch_(members.size(), -1) {
  const int64_t K = static_cast<int64_t>(members.size());
  const int64_t rows = K * ctx.options.batch_size;
  step_bytes_ = rows * static_cast<int64_t>(sizeof(int64_t)) * (ctx.options.augment.any() ? 4 : 1);
  if (ctx.spec.is_torchscript()) return;  // a TorchScript model draws its own dropout
  const auto& layers = ctx.spec.layers();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].kind != LayerKind::kDropout) continue;
    bool any = false;
    for (const MemberTensors* m : members) any = any || m->hp.dropout.value_or(layers[i].p) > 0;
    if (!any) continue;
    mask_layers_.push_back(i);
    for (const MemberTensors* m : members) mask_p_.push_back(m->hp.dropout.value_or(layers[i].p));
    int64_t numel = rows;
    for (int64_t d : layers[i].output_shape) numel *= d;
    step_bytes_ += numel * static_cast<int64_t>(sizeof(float));
  }
}

void StepDraws::Prepare(int64_t s) {
  if (s >= begin_ && s < end_) return;
  const int64_t fit = std::max<int64_t>(1, kMaxStepDrawBytes / std::max<int64_t>(1, step_bytes_));
  begin_ = s;
  Draw(std::min(fit, steps_ - s));
}

void StepDraws::Draw(int64_t n) {
  const Context& ctx = ctx_;
  const int64_t K = static_cast<int64_t>(members_.size());
  const int64_t batch = ctx.options.batch_size, rows = K * batch;
  const format::Augmentation& a = ctx.options.augment;
  at::Tensor idx = HostTensor(ctx, {n, rows}, at::kLong);
  at::Tensor off = a.any() ? HostTensor(ctx, {n, 3, rows, 1}, at::kLong) : at::Tensor();
  int64_t* ip = idx.data_ptr<int64_t>();
  std::vector<int64_t> one;
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t k = 0; k < K; ++k) {
      const MemberTensors* m = members_[k];
      BatchIndices(m->data_seed, m->data_cursor + static_cast<uint64_t>(j * batch), batch,
                   ctx.train.count, &one, &epoch_cache_[k], &cached_epoch_[k]);
      std::memcpy(ip + j * rows + k * batch, one.data(), sizeof(int64_t) * batch);
    }
  }
  if (a.any()) {
    // Per row: row offset, column offset, flip; from SplitMix64 of the
    // member's (data seed, step), drawn in that order row by row.
    const int64_t p = a.crop_padding;
    int64_t* op = off.data_ptr<int64_t>();
    for (int64_t j = 0; j < n; ++j) {
      int64_t* dy = op + j * 3 * rows;
      int64_t* dx = dy + rows;
      int64_t* flip = dx + rows;
      for (int64_t k = 0; k < K; ++k) {
        const MemberTensors* m = members_[k];
        uint64_t s =
            m->data_seed ^ (0xA24BAED4963EE407ull * (static_cast<uint64_t>(m->step + j) + 1));
        for (int64_t r = k * batch; r < (k + 1) * batch; ++r) {
          dy[r] = dx[r] = p;
          flip[r] = 0;
          if (p > 0) {
            dy[r] = static_cast<int64_t>(SplitMix64(&s) % static_cast<uint64_t>(2 * p + 1));
            dx[r] = static_cast<int64_t>(SplitMix64(&s) % static_cast<uint64_t>(2 * p + 1));
          }
          if (a.hflip) flip[r] = static_cast<int64_t>(SplitMix64(&s) & 1);
        }
      }
    }
  }
  mask_chunks_.clear();
  const auto& layers = ctx.spec.layers();
  for (size_t l = 0; l < mask_layers_.size(); ++l) {
    const size_t layer = mask_layers_[l];
    std::vector<int64_t> shape = {n, K, batch};
    shape.insert(shape.end(), layers[layer].output_shape.begin(), layers[layer].output_shape.end());
    at::Tensor masks = HostTensor(ctx, shape, at::kFloat);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < K; ++k) {
        const MemberTensors* m = members_[k];
        DrawDropoutMask(m->data_seed, m->step + j, layer, mask_p_[l * K + k], masks[j][k]);
      }
    }
    mask_chunks_.push_back(CopyToDevice(ctx, masks));
  }
  if (fused_ && ctx.optimizer != OptimizerKind::kSgd) {
    // As torch.optim.Adam computes them, in double, then as float columns.
    at::Tensor adam = HostTensor(ctx, {n, 2, K, 1}, at::kFloat);
    float* fp = adam.data_ptr<float>();
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t k = 0; k < K; ++k) {
        const MemberTensors* m = members_[k];
        const double step = m->adam_step + static_cast<double>(j + 1);
        const double bias_correction1 = 1 - std::pow(m->hp.beta1, step);
        const double bias_correction2 = 1 - std::pow(m->hp.beta2, step);
        fp[(j * 2) * K + k] = static_cast<float>(-(m->hp.lr / bias_correction1));
        fp[(j * 2 + 1) * K + k] = static_cast<float>(std::sqrt(bias_correction2));
      }
    }
    adam_ = CopyToDevice(ctx, adam);
  }
  indices_ = CopyToDevice(ctx, idx);
  offsets_ = a.any() ? CopyToDevice(ctx, off) : at::Tensor();
  end_ = begin_ + n;
}

std::vector<at::Tensor> StepDraws::masks(int64_t s) const {
  std::vector<at::Tensor> out(ctx_.spec.layers().size());
  const int64_t K = static_cast<int64_t>(members_.size());
  for (size_t l = 0; l < mask_layers_.size(); ++l) {
    at::Tensor m = mask_chunks_[l].select(0, s - begin_);  // [K, B, ...]
    if (!fused_) {
      m = m.select(0, 0);
    } else if (m.dim() == 5) {
      // Member k's channels at k * C: [B, K * C, H, W].
      m = m.transpose(0, 1).reshape({m.size(1), K * m.size(2), m.size(3), m.size(4)});
    }
    out[mask_layers_[l]] = m;
  }
  return out;
}

}  // namespace ckpt::model::internal
