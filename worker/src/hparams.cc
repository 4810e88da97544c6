#include "ckpt/model/hparams.h"

#include <cmath>
#include <string>
#include <vector>

namespace ckpt::model {
namespace {

std::vector<std::string> Names(OptimizerKind kind) {
  if (kind == OptimizerKind::kSgd) return {"lr", "momentum", "nesterov", "weight_decay"};
  return {"lr", "beta1", "beta2", "eps", "weight_decay"};
}

Status Apply(OptimizerKind kind, const std::map<std::string, double>& values, const char* source,
             Hyperparameters* h) {
  const std::vector<std::string> names = Names(kind);
  for (const auto& [key, v] : values) {
    if (key == format::kDropoutHparam) {
      if (!format::IsDropoutProbability(v)) {
        return Status::InvalidArgument(std::string(source) +
                                       " hyperparameter \"dropout\" must be in [0, 1)");
      }
      h->dropout = v;
      continue;
    }
    bool known = false;
    for (const auto& n : names) known = known || n == key;
    if (!known) {
      return Status::InvalidArgument(std::string(source) + " hyperparameter \"" + key +
                                     "\" is not used by " + std::string(OptimizerKindName(kind)));
    }
    if (!std::isfinite(v)) {
      return Status::InvalidArgument(std::string(source) + " hyperparameter \"" + key +
                                     "\" is not finite");
    }
    if (key == "lr") {
      h->lr = v;
    } else if (key == "momentum") {
      h->momentum = v;
    } else if (key == "nesterov") {
      if (v != 0 && v != 1) {
        return Status::InvalidArgument(std::string(source) +
                                       " hyperparameter \"nesterov\" must be 0 or 1");
      }
      h->nesterov = v == 1;
    } else if (key == "weight_decay") {
      h->weight_decay = v;
    } else if (key == "beta1") {
      h->beta1 = v;
    } else if (key == "beta2") {
      h->beta2 = v;
    } else if (key == "eps") {
      h->eps = v;
    }
  }
  return Status::OK();
}

}  // namespace

Hyperparameters DefaultHyperparameters(OptimizerKind kind) {
  Hyperparameters h;
  if (kind == OptimizerKind::kSgd) {
    h.lr = 0.01;
  } else {
    h.lr = 0.001;
    h.weight_decay = kind == OptimizerKind::kAdamW ? 0.01 : 0.0;
  }
  return h;
}

StatusOr<Hyperparameters> ResolveHyperparameters(OptimizerKind kind,
                                                 const std::map<std::string, double>& base,
                                                 const std::map<std::string, double>& overrides) {
  Hyperparameters h = DefaultHyperparameters(kind);
  CKPT_RETURN_IF_ERROR(Apply(kind, base, "checkpoint", &h));
  CKPT_RETURN_IF_ERROR(Apply(kind, overrides, "requested", &h));
  auto bad = [](const std::string& what) {
    return Status::InvalidArgument("hyperparameter " + what);
  };
  if (h.lr < 0) return bad("\"lr\" must be >= 0");
  if (h.weight_decay < 0) return bad("\"weight_decay\" must be >= 0");
  if (kind == OptimizerKind::kSgd) {
    if (h.momentum < 0) return bad("\"momentum\" must be >= 0");
    if (h.nesterov && h.momentum <= 0) return bad("\"nesterov\" needs momentum > 0");
  } else {
    if (!(h.beta1 >= 0 && h.beta1 < 1)) return bad("\"beta1\" must be in [0, 1)");
    if (!(h.beta2 >= 0 && h.beta2 < 1)) return bad("\"beta2\" must be in [0, 1)");
    if (h.eps < 0) return bad("\"eps\" must be >= 0");
  }
  return h;
}

std::map<std::string, double> HyperparameterMap(OptimizerKind kind, const Hyperparameters& h) {
  std::map<std::string, double> m;
  if (kind == OptimizerKind::kSgd) {
    m = {{"lr", h.lr},
         {"momentum", h.momentum},
         {"nesterov", h.nesterov ? 1.0 : 0.0},
         {"weight_decay", h.weight_decay}};
  } else {
    m = {{"lr", h.lr},
         {"beta1", h.beta1},
         {"beta2", h.beta2},
         {"eps", h.eps},
         {"weight_decay", h.weight_decay}};
  }
  if (h.dropout) m[format::kDropoutHparam] = *h.dropout;
  return m;
}

}  // namespace ckpt::model
