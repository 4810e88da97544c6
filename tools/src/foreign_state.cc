// Import's readers of foreign states (see foreign_state.h).
#include "foreign_state.h"

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "session.h"
#include "tensor_math.h"

namespace ckpt::tool {
namespace {

using json = nlohmann::json;

std::optional<std::map<std::string, double>> ParseHparamsJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  std::map<std::string, double> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_number()) out[it.key()] = it->get<double>();
  }
  return out;
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

}  // namespace

StatusOr<ForeignState> ParseSafetensors(std::string_view bytes, const std::string& path) {
  auto bad = [&](const std::string& why) { return Status::Corruption(path + ": " + why); };
  if (bytes.size() < 8) return bad("too short for a safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  if (n > format::kDefaultMaxHeaderBytes) {
    return bad("header length " + std::to_string(n) + " is above the limit of " +
               std::to_string(format::kDefaultMaxHeaderBytes) + " bytes");
  }
  if (n > bytes.size() - 8) {
    return bad("header length " + std::to_string(n) + " exceeds the file");
  }
  json header = json::parse(bytes.begin() + 8, bytes.begin() + 8 + static_cast<std::ptrdiff_t>(n),
                            nullptr, /*allow_exceptions=*/false);
  if (!header.is_object()) return bad("the header is not a JSON object");
  ForeignState st;
  if (header.contains("__metadata__")) {
    const json& meta = header["__metadata__"];
    if (!meta.is_object()) return bad("__metadata__ is not an object");
    if (meta.contains("ckpt.checksums")) {
      // A ckpt blob: its own checks (tensor and header checksums) apply.
      auto view = format::ParseCheckpoint(bytes.data(), bytes.size());
      if (!view.ok()) return Status::Corruption(path + ": " + view.status().message());
      st.hparams = view->meta().hparams;
      st.step = view->meta().step;
      st.model_spec = view->meta().model_spec;
    } else {
      if (meta.contains("ckpt.hparams") && meta["ckpt.hparams"].is_string()) {
        st.hparams = ParseHparamsJson(meta["ckpt.hparams"].get<std::string>());
      }
      if (meta.contains("ckpt.step") && meta["ckpt.step"].is_string()) {
        const std::string s = meta["ckpt.step"].get<std::string>();
        if (!s.empty() && s.size() < 19 &&
            std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
          st.step = std::stoll(s);
        }
      }
      if (meta.contains("ckpt.model_spec") && meta["ckpt.model_spec"].is_string()) {
        st.model_spec = meta["ckpt.model_spec"].get<std::string>();
      }
    }
  }
  const size_t data_begin = 8 + static_cast<size_t>(n);
  const size_t data_len = bytes.size() - data_begin;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    const std::string& name = it.key();
    const json& t = *it;
    if (!t.is_object() || !t.contains("dtype") || !t["dtype"].is_string() || !t.contains("shape") ||
        !t["shape"].is_array() || !t.contains("data_offsets") || !t["data_offsets"].is_array() ||
        t["data_offsets"].size() != 2) {
      return bad("tensor " + name + ": needs dtype, shape and data_offsets");
    }
    auto dtype = format::ParseDType(t["dtype"].get<std::string>());
    if (!dtype.ok()) return bad("tensor " + name + ": unknown dtype " + t["dtype"].dump());
    ForeignTensor ft;
    ft.dtype = *dtype;
    if (t["shape"].size() > static_cast<size_t>(format::kMaxRank)) {
      return bad("tensor " + name + ": rank above 8");
    }
    uint64_t numel = 1;
    for (const auto& d : t["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) {
        return bad("tensor " + name + ": bad shape " + t["shape"].dump());
      }
      ft.shape.push_back(d.get<int64_t>());
      numel *= d.get<uint64_t>();
      if (numel > (uint64_t{1} << 40)) return bad("tensor " + name + ": shape too large");
    }
    const json& off = t["data_offsets"];
    if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) {
      return bad("tensor " + name + ": bad data_offsets");
    }
    const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
    if (b > e || e > data_len) {
      return bad("tensor " + name + ": data_offsets [" + std::to_string(b) + ", " +
                 std::to_string(e) + "] outside the " + std::to_string(data_len) + " data bytes");
    }
    if (e - b != numel * format::DTypeSize(ft.dtype)) {
      return bad("tensor " + name + ": " + std::to_string(e - b) + " bytes for " +
                 std::string(format::DTypeName(ft.dtype)) + " " + FormatShape(ft.shape));
    }
    ft.data =
        std::string(bytes.substr(data_begin + static_cast<size_t>(b), static_cast<size_t>(e - b)));
    st.tensors.emplace(name, std::move(ft));
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
  if (model->kind != PyValue::Kind::kDict)
    return Status::Corruption(path + ": \"model\" is not a dict");
  ForeignState st;
  for (const auto& [k, v] : model->dict) {
    if (k->kind != PyValue::Kind::kString)
      return Status::Corruption(path + ": a key is not a string");
    CKPT_RETURN_IF_ERROR(AddPyTensor(path, k->s, *v, &st));
  }
  const PyValue* ck = root->Get("ckpt");
  if (ck != nullptr && ck->kind == PyValue::Kind::kDict) {
    if (const PyValue* s = ck->Get("step"); s != nullptr && s->kind == PyValue::Kind::kInt) {
      st.step = s->i;
    }
    if (const PyValue* h = ck->Get("hparams"); h != nullptr && h->kind == PyValue::Kind::kDict) {
      std::map<std::string, double> hp;
      for (const auto& [k, v] : h->dict) {
        auto x = NumberOf(v.get());
        if (k->kind == PyValue::Kind::kString && x) hp[k->s] = *x;
      }
      st.hparams = hp;
    }
    if (const PyValue* m = ck->Get("model_spec");
        m != nullptr && m->kind == PyValue::Kind::kString) {
      st.model_spec = m->s;
    }
  }
  const PyValue* opt = root != nullptr && model != root.get() ? root->Get("optimizer") : nullptr;
  if (opt == nullptr) return st;
  const PyValue* state = opt->Get("state");
  const PyValue* groups = opt->Get("param_groups");
  if (state == nullptr || groups == nullptr || groups->kind != PyValue::Kind::kList ||
      groups->items.empty()) {
    return Status::Corruption(path + ": \"optimizer\" is not a torch.optim state_dict");
  }
  std::vector<int64_t> ids;
  for (const auto& g : groups->items) {
    const PyValue* params = g->Get("params");
    if (params == nullptr || params->kind != PyValue::Kind::kList) {
      return Status::Corruption(path + ": an optimizer param group has no params");
    }
    for (const auto& p : params->items) {
      if (p->kind != PyValue::Kind::kInt)
        return Status::Corruption(path + ": a param id is not an int");
      ids.push_back(p->i);
    }
  }
  if (ids.size() != trainable.size()) {
    return Status::FailedPrecondition(path + ": the optimizer holds " + std::to_string(ids.size()) +
                                      " parameters, the experiment's model " +
                                      std::to_string(trainable.size()));
  }
  const auto slots = format::OptimizerSlots(optimizer);
  for (size_t i = 0; i < ids.size(); ++i) {
    const PyValue* per = nullptr;
    for (const auto& [k, v] : state->dict) {
      if (k->kind == PyValue::Kind::kInt && k->i == ids[i]) per = v.get();
    }
    if (per == nullptr) continue;  // no state yet: zeros, as a fresh optimizer
    for (const auto& slot : slots) {
      const PyValue* t = per->Get(slot);
      const std::string name = kOptimPrefix + trainable[i] + "." + slot;
      if (t == nullptr || t->kind == PyValue::Kind::kNone) continue;
      if (t->kind == PyValue::Kind::kInt || t->kind == PyValue::Kind::kFloat) {
        // torch.optim before 1.12 kept "step" as a Python number.
        float v = static_cast<float>(t->kind == PyValue::Kind::kInt ? t->i : t->f);
        std::string data(sizeof(v), '\0');
        std::memcpy(data.data(), &v, sizeof(v));
        st.tensors[name] = ForeignTensor{format::DType::kF32, {}, data};
        continue;
      }
      CKPT_RETURN_IF_ERROR(AddPyTensor(path, name, *t, &st));
    }
  }
  const PyValue* g0 = groups->items.front().get();
  std::map<std::string, double> hp;
  if (auto v = NumberOf(g0->Get("lr"))) hp["lr"] = *v;
  if (auto v = NumberOf(g0->Get("weight_decay"))) hp["weight_decay"] = *v;
  if (optimizer == format::OptimizerKind::kSgd) {
    if (auto v = NumberOf(g0->Get("momentum"))) hp["momentum"] = *v;
    if (auto v = NumberOf(g0->Get("nesterov"))) hp["nesterov"] = *v;
  } else {
    if (auto v = NumberOf(g0->Get("eps"))) hp["eps"] = *v;
    const PyValue* betas = g0->Get("betas");
    if (betas != nullptr && betas->items.size() == 2) {
      if (auto v = NumberOf(betas->items[0].get())) hp["beta1"] = *v;
      if (auto v = NumberOf(betas->items[1].get())) hp["beta2"] = *v;
    }
  }
  st.hparams = hp;
  return st;
}

}  // namespace ckpt::tool
