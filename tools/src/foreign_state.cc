// Import's readers of foreign states (see foreign_state.h).
#include "foreign_state.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/format/safetensors.h"
#include "session.h"
#include "tensor_math.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

// The largest dimension, and element count, of a tensor import reads
// (docs/LIMITS.md).
constexpr uint64_t kMaxImportElements = uint64_t{1} << 40;

std::optional<std::map<std::string, double>> ParseHparamsJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  std::map<std::string, double> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_number()) out[it.key()] = it->get<double>();
  }
  return out;
}

// import's words for the faults of a safetensors file that its users know
// (docs/LIMITS.md); nullopt where ckpt::format's words stand.
std::optional<std::string> ImportWording(const format::SafetensorsFault& f) {
  using Kind = format::SafetensorsFault::Kind;
  using std::to_string;
  const std::string tensor = "tensor " + f.name + ": ";
  switch (f.kind) {
    case Kind::kHeaderBeyondFile:
      return "header length " + to_string(f.count) + " exceeds the file";
    case Kind::kHeaderAboveCap:
      return "header length " + to_string(f.count) + " is above the limit of " +
             to_string(f.limit) + " bytes";
    case Kind::kNotObject:
      return std::string("the header is not a JSON object");
    case Kind::kRankAboveMax:
      return tensor + "rank above " + to_string(f.limit);
    case Kind::kDimensionTooLarge:
      return tensor + "bad shape: dimension " + to_string(f.count) + " is above " +
             to_string(f.limit);
    case Kind::kShapeOverflow:
      return tensor + "shape too large";
    case Kind::kOffsetsOutOfBounds:
      return tensor + "data_offsets [" + to_string(f.begin) + ", " + to_string(f.end) +
             "] outside the " + to_string(f.limit) + " data bytes";
    case Kind::kBytesMismatch:
      return tensor + to_string(f.end - f.begin) + " bytes for " +
             std::string(format::DTypeName(f.dtype)) + " " + FormatShape(f.shape);
    default:
      return std::nullopt;
  }
}

// What a safetensors file that is not a ckpt blob says of its state, where
// its __metadata__ holds ckpt's keys.
void ReadCkptMetadata(const std::map<std::string, std::string>& meta, ForeignState* st) {
  if (auto h = meta.find("ckpt.hparams"); h != meta.end()) {
    st->hparams = ParseHparamsJson(h->second);
  }
  if (auto s = meta.find("ckpt.step"); s != meta.end()) {
    const std::string& step = s->second;
    if (!step.empty() && step.size() < 19 &&
        std::all_of(step.begin(), step.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      st->step = std::stoll(step);
    }
  }
  if (auto m = meta.find("ckpt.model_spec"); m != meta.end()) st->model_spec = m->second;
}

Status AddPyTensor(const std::string& path, const std::string& name, const PyValue& v,
                   ForeignState* st) {
  if (v.kind != PyValue::Kind::kTensor) {
    return Status::Corruption(path + ": entry " + name + " is not a tensor");
  }
  ForeignTensor ft;
  ft.dtype = v.dtype;
  ft.shape = v.shape;
  ft.data = v.data;
  st->tensors[name] = std::move(ft);
  return Status::OK();
}

// The float value of a number entry of a dict; nullopt when absent.
std::optional<double> NumberOf(const PyValue* v) {
  if (v == nullptr) return std::nullopt;
  if (v->kind == PyValue::Kind::kFloat) return v->f;
  if (v->kind == PyValue::Kind::kInt) return static_cast<double>(v->i);
  if (v->kind == PyValue::Kind::kBool) return v->b ? 1.0 : 0.0;
  // A one-element tensor (what ckpt's own .pt files hold for floats).
  if (v->kind == PyValue::Kind::kTensor && v->data.size() == format::DTypeSize(v->dtype)) {
    return ElementAsDouble(v->dtype, reinterpret_cast<const uint8_t*>(v->data.data()), 0);
  }
  return std::nullopt;
}

// The model's state_dict: a dict of tensors by name.
Status ReadModel(const PyValue& model, const std::string& path, ForeignState* st) {
  if (model.kind != PyValue::Kind::kDict) {
    return Status::Corruption(path + ": \"model\" is not a dict");
  }
  for (const auto& [k, v] : model.dict) {
    if (k->kind != PyValue::Kind::kString) {
      return Status::Corruption(path + ": a key is not a string");
    }
    CKPT_RETURN_IF_ERROR(AddPyTensor(path, k->s, *v, st));
  }
  return Status::OK();
}

// What the "ckpt" dict ckpt's own .pt files hold says: step, hyperparameters
// and model spec, each where it has the right type.
void ReadCkptDict(const PyValue* ck, ForeignState* st) {
  if (ck == nullptr || ck->kind != PyValue::Kind::kDict) return;
  if (const PyValue* s = ck->Get("step"); s != nullptr && s->kind == PyValue::Kind::kInt) {
    st->step = s->i;
  }
  if (const PyValue* h = ck->Get("hparams"); h != nullptr && h->kind == PyValue::Kind::kDict) {
    std::map<std::string, double> hp;
    for (const auto& [k, v] : h->dict) {
      auto x = NumberOf(v.get());
      if (k->kind == PyValue::Kind::kString && x) hp[k->s] = *x;
    }
    st->hparams = hp;
  }
  if (const PyValue* m = ck->Get("model_spec"); m != nullptr && m->kind == PyValue::Kind::kString) {
    st->model_spec = m->s;
  }
}

// The experiment's side of an optimizer state: its trainable parameters in
// torch.optim's order, and the optimizer that names their slots.
struct OptimizerTarget {
  const std::vector<std::string>& trainable;
  format::OptimizerKind optimizer;
};

// torch.optim's parameter ids, over its param groups in order.
StatusOr<std::vector<int64_t>> ParamIds(const PyValue& groups, const std::string& path) {
  std::vector<int64_t> ids;
  for (const auto& g : groups.items) {
    const PyValue* params = g->Get("params");
    if (params == nullptr || params->kind != PyValue::Kind::kList) {
      return Status::Corruption(path + ": an optimizer param group has no params");
    }
    for (const auto& p : params->items) {
      if (p->kind != PyValue::Kind::kInt) {
        return Status::Corruption(path + ": a param id is not an int");
      }
      ids.push_back(p->i);
    }
  }
  return ids;
}

// The slots of one parameter's state (`per`) as "optim.<param>.<slot>"
// tensors; a slot that is absent or None is left out.
Status AddParamSlots(const PyValue& per, const std::string& param, format::OptimizerKind optimizer,
                     const std::string& path, ForeignState* st) {
  const std::string prefix = kOptimPrefix + param + ".";
  for (const auto& slot : format::OptimizerSlots(optimizer)) {
    const PyValue* t = per.Get(slot);
    const std::string name = prefix + slot;
    if (t == nullptr || t->kind == PyValue::Kind::kNone) continue;
    if (t->kind == PyValue::Kind::kInt || t->kind == PyValue::Kind::kFloat) {
      // torch.optim before 1.12 kept "step" as a Python number.
      float v = static_cast<float>(t->kind == PyValue::Kind::kInt ? t->i : t->f);
      std::string data(sizeof(v), '\0');
      std::memcpy(data.data(), &v, sizeof(v));
      st->tensors[name] = ForeignTensor{format::DType::kF32, {}, data};
      continue;
    }
    CKPT_RETURN_IF_ERROR(AddPyTensor(path, name, *t, st));
  }
  return Status::OK();
}

// A param group's key read as the hyperparameter of that name, and which
// optimizers have it ("betas" is read apart, as beta1 and beta2).
struct GroupKey {
  const char* key;
  bool sgd;
  bool adam;  // and AdamW
};
constexpr GroupKey kGroupKeys[] = {
    {"lr", true, true},        {"weight_decay", true, true}, {"momentum", true, false},
    {"nesterov", true, false}, {"eps", false, true},
};

std::map<std::string, double> GroupHparams(const PyValue& group, format::OptimizerKind optimizer) {
  const bool sgd = optimizer == format::OptimizerKind::kSgd;
  std::map<std::string, double> hp;
  for (const GroupKey& k : kGroupKeys) {
    if (!(sgd ? k.sgd : k.adam)) continue;
    if (auto v = NumberOf(group.Get(k.key))) hp[k.key] = *v;
  }
  const PyValue* betas = sgd ? nullptr : group.Get("betas");
  if (betas != nullptr && betas->items.size() == 2) {
    if (auto v = NumberOf(betas->items[0].get())) hp["beta1"] = *v;
    if (auto v = NumberOf(betas->items[1].get())) hp["beta2"] = *v;
  }
  return hp;
}

// A torch.optim state_dict: its per-parameter slots, mapped to the
// experiment's parameter names, and its first group's hyperparameters.
Status ReadOptimizer(const PyValue& opt, const std::string& path, const OptimizerTarget& target,
                     ForeignState* st) {
  const PyValue* state = opt.Get("state");
  const PyValue* groups = opt.Get("param_groups");
  if (state == nullptr || groups == nullptr || groups->kind != PyValue::Kind::kList ||
      groups->items.empty()) {
    return Status::Corruption(path + ": \"optimizer\" is not a torch.optim state_dict");
  }
  CKPT_ASSIGN_OR_RETURN(const std::vector<int64_t> ids, ParamIds(*groups, path));
  if (ids.size() != target.trainable.size()) {
    return Status::FailedPrecondition(path + ": the optimizer holds " + std::to_string(ids.size()) +
                                      " parameters, the experiment's model " +
                                      std::to_string(target.trainable.size()));
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const PyValue* per = nullptr;
    for (const auto& [k, v] : state->dict) {
      if (k->kind == PyValue::Kind::kInt && k->i == ids[i]) per = v.get();
    }
    if (per == nullptr) continue;  // no state yet: zeros, as a fresh optimizer
    CKPT_RETURN_IF_ERROR(AddParamSlots(*per, target.trainable[i], target.optimizer, path, st));
  }
  st->hparams = GroupHparams(*groups->items.front(), target.optimizer);
  return Status::OK();
}

}  // namespace

StatusOr<ForeignState> ParseSafetensors(std::string_view bytes, const std::string& path) {
  format::SafetensorsOptions options;
  options.max_elements = kMaxImportElements;
  options.origin = path;
  format::SafetensorsFault fault;
  auto file = format::ParseSafetensors(bytes.data(), bytes.size(), options, &fault);
  if (!file.ok()) {
    std::optional<std::string> words = ImportWording(fault);
    return words ? Status::Corruption(path + ": " + *words) : file.status();
  }
  ForeignState st;
  if (file->metadata.count("ckpt.checksums") != 0) {
    // A ckpt blob: its own checks (tensor and header checksums) apply.
    auto view = format::ParseCheckpoint(bytes.data(), bytes.size());
    if (!view.ok()) return Status::Corruption(path + ": " + view.status().message());
    st.hparams = view->meta().hparams;
    st.step = view->meta().step;
    st.model_spec = view->meta().model_spec;
  } else {
    ReadCkptMetadata(file->metadata, &st);
  }
  for (const format::TensorView& t : file->tensors) {
    ForeignTensor ft;
    ft.dtype = t.dtype;
    ft.shape = t.shape;
    ft.data.assign(reinterpret_cast<const char*>(t.data), t.nbytes);
    st.tensors.emplace(t.name, std::move(ft));
  }
  return st;
}

StatusOr<ForeignState> StateFromPt(const PyRef& root, const std::string& path,
                                   const std::vector<std::string>& trainable,
                                   format::OptimizerKind optimizer) {
  if (root == nullptr) return Status::Corruption(path + ": holds nothing");
  if (root->kind != PyValue::Kind::kDict) {
    return Status::Corruption(path + ": holds no dict of tensors (save dict(model.state_dict()))");
  }
  const PyValue* model = root->Get("model");
  if (model == nullptr) model = root->Get("state_dict");
  if (model == nullptr) model = root.get();
  ForeignState st;
  CKPT_RETURN_IF_ERROR(ReadModel(*model, path, &st));
  ReadCkptDict(root->Get("ckpt"), &st);
  // A bare state_dict has no optimizer, whatever its keys.
  const PyValue* opt = model != root.get() ? root->Get("optimizer") : nullptr;
  if (opt == nullptr) return st;
  CKPT_RETURN_IF_ERROR(ReadOptimizer(*opt, path, {trainable, optimizer}, &st));
  return st;
}

}  // namespace ckpt::tool
