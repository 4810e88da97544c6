// Per-member optimizer hyperparameters and how a member's map of them is
// resolved. The update rules are those of torch.optim (1.13, single-tensor
// path), so a member's trajectory can be checked against PyTorch:
//
//   sgd    lr (0.01), momentum (0), nesterov (0 | 1), weight_decay (0)
//   adam   lr (0.001), beta1 (0.9), beta2 (0.999), eps (1e-8), weight_decay (0)
//   adamw  as adam, weight_decay (0.01) decoupled: p *= 1 - lr * weight_decay
//
// dampening, amsgrad and maximize are not supported (always 0 / false).
//
// Whatever the optimizer: dropout (format::kDropoutHparam), in [0, 1), every
// dropout layer's probability for this member; unset, each layer's own p.
// LoadMember refuses it for a model without a dropout layer.
//
// Thread-safety: values and pure functions.
#ifndef CKPT_MODEL_HPARAMS_H_
#define CKPT_MODEL_HPARAMS_H_

#include <map>
#include <optional>
#include <string>

#include "ckpt/base/status.h"
#include "ckpt/format/task.h"
#include "ckpt/model/model_spec.h"

namespace ckpt::model {

struct Hyperparameters {
  double lr = 0.01;
  double momentum = 0;
  bool nesterov = false;
  double weight_decay = 0;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::optional<double> dropout;
};

// Defaults of `kind` (the values listed above).
Hyperparameters DefaultHyperparameters(OptimizerKind kind);

// Starts from the defaults of `kind`, applies `base` (typically the
// checkpoint's stored map), then `overrides` (the TRAIN request's map, which is
// authoritative). Returns InvalidArgument naming the key for: a name `kind`
// does not use, a non-finite value, lr / weight_decay / eps / momentum < 0,
// beta1 or beta2 outside [0, 1), nesterov not 0 or 1, nesterov without momentum,
// dropout outside [0, 1).
StatusOr<Hyperparameters> ResolveHyperparameters(OptimizerKind kind,
                                                 const std::map<std::string, double>& base,
                                                 const std::map<std::string, double>& overrides);

// The map stored in a checkpoint ("ckpt.hparams"): exactly the names `kind`
// uses, and dropout when set.
std::map<std::string, double> HyperparameterMap(OptimizerKind kind, const Hyperparameters& h);

}  // namespace ckpt::model

#endif  // CKPT_MODEL_HPARAMS_H_
