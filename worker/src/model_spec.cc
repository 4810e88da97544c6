#include "ckpt/model/model_spec.h"

#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <utility>

#include "ckpt/format/model_names.h"

namespace ckpt::model {
namespace {

using json = nlohmann::json;

using format::kTorchScriptPrefix;

constexpr const char* kLenet5 = R"([
  {"type": "conv2d", "in": 1, "out": 6, "kernel": 5, "padding": 2},
  {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "conv2d", "in": 6, "out": 16, "kernel": 5},
  {"type": "relu"},
  {"type": "maxpool2d", "kernel": 2},
  {"type": "flatten"},
  {"type": "linear", "in": 400, "out": 120},
  {"type": "relu"},
  {"type": "linear", "in": 120, "out": 84},
  {"type": "relu"},
  {"type": "linear", "in": 84, "out": 10}
])";

// He et al. 2016, section 4.2: a 3x3 convolution of 16 channels, three
// stages of three basic blocks (16, 32, 64 channels; the first block of the
// second and third stage halves height and width, with a 1x1 convolution and
// BatchNorm as its shortcut), global average pooling and a linear layer.
std::string Resnet20() {
  json layers = json::array();
  layers.push_back(
      {{"type", "conv2d"}, {"out", 16}, {"kernel", 3}, {"padding", 1}, {"bias", false}});
  layers.push_back({{"type", "batchnorm2d"}});
  layers.push_back({{"type", "relu"}});
  int64_t channels = 16;
  for (int64_t width : {16, 32, 64}) {
    for (int block = 0; block < 3; ++block) {
      const bool down = width != channels;
      json body = json::array();
      body.push_back({{"type", "conv2d"},
                      {"out", width},
                      {"kernel", 3},
                      {"stride", down ? 2 : 1},
                      {"padding", 1},
                      {"bias", false}});
      body.push_back({{"type", "batchnorm2d"}});
      body.push_back({{"type", "relu"}});
      body.push_back(
          {{"type", "conv2d"}, {"out", width}, {"kernel", 3}, {"padding", 1}, {"bias", false}});
      body.push_back({{"type", "batchnorm2d"}});
      layers.push_back(
          {{"type", "residual"}, {"layers", body}, {"shortcut", down ? "conv1x1" : "identity"}});
      layers.push_back({{"type", "relu"}});
      channels = width;
    }
  }
  layers.push_back({{"type", "globalavgpool"}});
  layers.push_back({{"type", "linear"}, {"out", 10}});
  return json{{"input", {3, 32, 32}}, {"layers", layers}}.dump();
}

struct KindName {
  LayerKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {LayerKind::kConv2d, "conv2d"},
    {LayerKind::kLinear, "linear"},
    {LayerKind::kRelu, "relu"},
    {LayerKind::kTanh, "tanh"},
    {LayerKind::kMaxPool2d, "maxpool2d"},
    {LayerKind::kAvgPool2d, "avgpool2d"},
    {LayerKind::kBatchNorm2d, "batchnorm2d"},
    {LayerKind::kDropout, "dropout"},
    {LayerKind::kFlatten, "flatten"},
    {LayerKind::kGlobalAvgPool, "globalavgpool"},
    {LayerKind::kResidual, "residual"},
};

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Reads the layer's fields, checking types and the allowed set.
class LayerReader {
 public:
  LayerReader(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Status CheckKnown(std::initializer_list<const char*> allowed) const {
    std::set<std::string> ok = {"type", "name"};
    for (const char* a : allowed) ok.insert(a);
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (ok.count(it.key()) == 0) {
        return Status::InvalidArgument(where_ + ": unknown field \"" + it.key() + "\"");
      }
    }
    return Status::OK();
  }

  // `*out` keeps its value when the field is absent and !required.
  Status Int(const char* key, bool required, int64_t min, int64_t* out) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) {
      if (required) return Status::InvalidArgument(where_ + ": missing field \"" + key + "\"");
      return Status::OK();
    }
    if (!it->is_number_integer()) {
      return Status::InvalidArgument(where_ + ": field \"" + key + "\" must be an integer");
    }
    int64_t v = it->get<int64_t>();
    if (v < min || v > (int64_t{1} << 31)) {
      return Status::InvalidArgument(where_ + ": field \"" + key + "\" = " + std::to_string(v) +
                                     " out of range");
    }
    *out = v;
    return Status::OK();
  }

  Status Double(const char* key, double min, double max, double* out) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status::OK();
    if (!it->is_number()) {
      return Status::InvalidArgument(where_ + ": field \"" + key + "\" must be a number");
    }
    double v = it->get<double>();
    if (!(v >= min && v <= max)) {
      return Status::InvalidArgument(where_ + ": field \"" + key + "\" out of range");
    }
    *out = v;
    return Status::OK();
  }

  Status Bool(const char* key, bool* out) const {
    auto it = obj_.find(key);
    if (it == obj_.end()) return Status::OK();
    if (!it->is_boolean()) {
      return Status::InvalidArgument(where_ + ": field \"" + key + "\" must be true or false");
    }
    *out = it->get<bool>();
    return Status::OK();
  }

  Status Name(std::string* out) const {
    auto it = obj_.find("name");
    if (it == obj_.end()) return Status::OK();
    if (!it->is_string() || it->get<std::string>().empty()) {
      return Status::InvalidArgument(where_ + ": field \"name\" must be a non-empty string");
    }
    std::string n = it->get<std::string>();
    for (char c : n) {
      bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '.';
      if (!ok) return Status::InvalidArgument(where_ + ": name \"" + n + "\" has a bad character");
    }
    if (n.front() == '.' || n.back() == '.' || n.rfind("optim", 0) == 0) {
      return Status::InvalidArgument(where_ + ": name \"" + n + "\" is not allowed");
    }
    *out = std::move(n);
    return Status::OK();
  }

  const std::string& where() const { return where_; }

 private:
  const json& obj_;
  std::string where_;
};

// Output size of a convolution or pooling window along one dimension; <= 0 when it does not fit.
int64_t WindowOut(int64_t in, int64_t kernel, int64_t stride, int64_t padding) {
  return (in + 2 * padding - kernel) / stride + 1;
}

// Parses the layers of `list` onto `out` in pre-order (a residual block, then
// its body, then its shortcut's layers), transforming `shape`. Stateful
// layers are named `name_prefix` + conv1, fc1, bn1, res1, ... unless named.
Status ParseLayerList(const json& list, const std::string& where_prefix,
                      const std::string& name_prefix, std::vector<int64_t>* shape_io,
                      std::set<std::string>* names, std::vector<LayerSpec>* out) {
  std::vector<int64_t>& shape = *shape_io;
  std::map<LayerKind, int> counters;
  for (size_t i = 0; i < list.size(); ++i) {
    const json& obj = list[i];
    std::string where = where_prefix + std::to_string(i);
    if (!obj.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
    auto type_it = obj.find("type");
    if (type_it == obj.end() || !type_it->is_string()) {
      return Status::InvalidArgument(where + ": missing string field \"type\"");
    }
    std::string type = type_it->get<std::string>();
    LayerSpec layer;
    bool known = false;
    for (const auto& k : kKinds) {
      if (type == k.name) {
        layer.kind = k.kind;
        known = true;
      }
    }
    if (!known) return Status::InvalidArgument(where + ": unknown layer type \"" + type + "\"");
    where += " (" + type + ")";
    LayerReader r(obj, where);
    const bool spatial = shape.size() == 3;
    const size_t at = out->size();
    out->push_back(LayerSpec());  // this layer; a residual's layers follow it
    auto need_spatial = [&]() -> Status {
      if (!spatial) {
        return Status::InvalidArgument(where + ": needs [C, H, W] input but follows the flatten");
      }
      return Status::OK();
    };

    switch (layer.kind) {
      case LayerKind::kConv2d: {
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"in", "out", "kernel", "stride", "padding", "bias"}));
        CKPT_RETURN_IF_ERROR(need_spatial());
        layer.in = shape[0];
        CKPT_RETURN_IF_ERROR(r.Int("in", false, 1, &layer.in));
        CKPT_RETURN_IF_ERROR(r.Int("out", true, 1, &layer.out));
        CKPT_RETURN_IF_ERROR(r.Int("kernel", true, 1, &layer.kernel));
        CKPT_RETURN_IF_ERROR(r.Int("stride", false, 1, &layer.stride));
        CKPT_RETURN_IF_ERROR(r.Int("padding", false, 0, &layer.padding));
        CKPT_RETURN_IF_ERROR(r.Bool("bias", &layer.bias));
        if (layer.in != shape[0]) {
          return Status::InvalidArgument(where + ": in = " + std::to_string(layer.in) +
                                         " but the input has " + std::to_string(shape[0]) +
                                         " channels");
        }
        int64_t h = WindowOut(shape[1], layer.kernel, layer.stride, layer.padding);
        int64_t w = WindowOut(shape[2], layer.kernel, layer.stride, layer.padding);
        if (h < 1 || w < 1) {
          return Status::InvalidArgument(where + ": kernel does not fit input " +
                                         ShapeString(shape));
        }
        shape = {layer.out, h, w};
        break;
      }
      case LayerKind::kLinear: {
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"in", "out", "bias"}));
        if (spatial) {
          return Status::InvalidArgument(where + ": needs [F] input; add a flatten before it");
        }
        layer.in = shape[0];
        CKPT_RETURN_IF_ERROR(r.Int("in", false, 1, &layer.in));
        CKPT_RETURN_IF_ERROR(r.Int("out", true, 1, &layer.out));
        CKPT_RETURN_IF_ERROR(r.Bool("bias", &layer.bias));
        if (layer.in != shape[0]) {
          return Status::InvalidArgument(where + ": in = " + std::to_string(layer.in) +
                                         " but the input has " + std::to_string(shape[0]) +
                                         " features");
        }
        shape = {layer.out};
        break;
      }
      case LayerKind::kMaxPool2d:
      case LayerKind::kAvgPool2d: {
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"kernel", "stride", "padding"}));
        CKPT_RETURN_IF_ERROR(need_spatial());
        CKPT_RETURN_IF_ERROR(r.Int("kernel", true, 1, &layer.kernel));
        layer.stride = layer.kernel;
        CKPT_RETURN_IF_ERROR(r.Int("stride", false, 1, &layer.stride));
        CKPT_RETURN_IF_ERROR(r.Int("padding", false, 0, &layer.padding));
        if (2 * layer.padding > layer.kernel) {
          return Status::InvalidArgument(where + ": padding must be at most half the kernel");
        }
        int64_t h = WindowOut(shape[1], layer.kernel, layer.stride, layer.padding);
        int64_t w = WindowOut(shape[2], layer.kernel, layer.stride, layer.padding);
        if (h < 1 || w < 1) {
          return Status::InvalidArgument(where + ": kernel does not fit input " +
                                         ShapeString(shape));
        }
        shape = {shape[0], h, w};
        break;
      }
      case LayerKind::kBatchNorm2d: {
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"features", "eps", "momentum"}));
        CKPT_RETURN_IF_ERROR(need_spatial());
        layer.in = shape[0];
        CKPT_RETURN_IF_ERROR(r.Int("features", false, 1, &layer.in));
        CKPT_RETURN_IF_ERROR(r.Double("eps", 1e-30, 1.0, &layer.eps));
        CKPT_RETURN_IF_ERROR(r.Double("momentum", 0.0, 1.0, &layer.momentum));
        if (layer.in != shape[0]) {
          return Status::InvalidArgument(where + ": features = " + std::to_string(layer.in) +
                                         " but the input has " + std::to_string(shape[0]) +
                                         " channels");
        }
        layer.out = layer.in;
        break;
      }
      case LayerKind::kDropout:
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"p"}));
        CKPT_RETURN_IF_ERROR(r.Double("p", 0.0, 0.999, &layer.p));
        break;
      case LayerKind::kFlatten:
        CKPT_RETURN_IF_ERROR(r.CheckKnown({}));
        if (!spatial) return Status::InvalidArgument(where + ": the input is already flat");
        shape = {shape[0] * shape[1] * shape[2]};
        break;
      case LayerKind::kRelu:
      case LayerKind::kTanh:
        CKPT_RETURN_IF_ERROR(r.CheckKnown({}));
        break;
      case LayerKind::kGlobalAvgPool:
        CKPT_RETURN_IF_ERROR(r.CheckKnown({}));
        CKPT_RETURN_IF_ERROR(need_spatial());
        shape = {shape[0]};
        break;
      case LayerKind::kResidual: {
        CKPT_RETURN_IF_ERROR(r.CheckKnown({"layers", "shortcut"}));
        auto sub = obj.find("layers");
        if (sub == obj.end() || !sub->is_array() || sub->empty()) {
          return Status::InvalidArgument(where + ": \"layers\" must be a non-empty array");
        }
        layer.name = name_prefix + "res" + std::to_string(++counters[layer.kind]);
        CKPT_RETURN_IF_ERROR(r.Name(&layer.name));
        if (!names->insert(layer.name).second) {
          return Status::InvalidArgument(where + ": duplicate layer name \"" + layer.name + "\"");
        }
        std::string shortcut = "identity";
        auto sc = obj.find("shortcut");
        if (sc != obj.end()) {
          if (!sc->is_string() || (*sc != "identity" && *sc != "conv1x1")) {
            return Status::InvalidArgument(where +
                                           ": \"shortcut\" must be \"identity\" or \"conv1x1\"");
          }
          shortcut = sc->get<std::string>();
        }
        std::vector<int64_t> body_shape = shape;
        CKPT_RETURN_IF_ERROR(
            ParseLayerList(*sub, where + " layer ", layer.name + ".", &body_shape, names, out));
        layer.body = static_cast<int>(out->size() - at - 1);
        if (shortcut == "identity") {
          if (body_shape != shape) {
            return Status::InvalidArgument(where + ": the body maps " + ShapeString(shape) +
                                           " to " + ShapeString(body_shape) +
                                           "; an identity shortcut needs them equal (use "
                                           "\"shortcut\": \"conv1x1\")");
          }
        } else {
          CKPT_RETURN_IF_ERROR(need_spatial());
          if (body_shape.size() != 3) {
            return Status::InvalidArgument(where + ": a conv1x1 shortcut needs a [C, H, W] body");
          }
          // The stride that maps the input's height and width onto the body's.
          int64_t stride = 0;
          for (int64_t s = 1; s <= shape[1] && stride == 0; ++s) {
            if (WindowOut(shape[1], 1, s, 0) == body_shape[1] &&
                WindowOut(shape[2], 1, s, 0) == body_shape[2]) {
              stride = s;
            }
          }
          if (stride == 0) {
            return Status::InvalidArgument(where + ": no 1x1 stride maps " + ShapeString(shape) +
                                           " to the body's " + ShapeString(body_shape));
          }
          json conv = {{"type", "conv2d"},
                       {"out", body_shape[0]},
                       {"kernel", 1},
                       {"stride", stride},
                       {"bias", false}};
          json shortcut_layers = json::array({conv, json{{"type", "batchnorm2d"}}});
          std::vector<int64_t> sc_shape = shape;
          CKPT_RETURN_IF_ERROR(ParseLayerList(shortcut_layers, where + " shortcut layer ",
                                              layer.name + ".shortcut.", &sc_shape, names, out));
          layer.shortcut = static_cast<int>(out->size() - at - 1 - layer.body);
        }
        shape = body_shape;
        break;
      }
    }

    const bool has_state = layer.kind == LayerKind::kConv2d || layer.kind == LayerKind::kLinear ||
                           layer.kind == LayerKind::kBatchNorm2d;
    if (has_state) {
      const char* prefix = layer.kind == LayerKind::kConv2d   ? "conv"
                           : layer.kind == LayerKind::kLinear ? "fc"
                                                              : "bn";
      layer.name = name_prefix + prefix + std::to_string(++counters[layer.kind]);
      CKPT_RETURN_IF_ERROR(r.Name(&layer.name));
      if (!names->insert(layer.name).second) {
        return Status::InvalidArgument(where + ": duplicate layer name \"" + layer.name + "\"");
      }
    } else if (layer.kind != LayerKind::kResidual && obj.contains("name")) {
      return Status::InvalidArgument(where + ": a layer without state takes no name");
    }
    layer.output_shape = shape;
    (*out)[at] = std::move(layer);
  }
  return Status::OK();
}

}  // namespace

std::string_view LayerKindName(LayerKind kind) {
  for (const auto& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

int64_t TensorSpec::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

StatusOr<ModelSpec> ModelSpec::Parse(std::string_view text, std::vector<int64_t> input_shape) {
  ModelSpec spec;
  spec.text_ = std::string(text);
  if (text.substr(0, kTorchScriptPrefix.size()) == kTorchScriptPrefix) {
    spec.torchscript_path_ = std::string(text.substr(kTorchScriptPrefix.size()));
    if (spec.torchscript_path_.empty()) {
      return Status::InvalidArgument("model spec \"torchscript:\" names no file");
    }
    spec.input_shape_ = std::move(input_shape);
    return spec;
  }

  std::string_view source = text;
  const std::string resnet20 = text == format::kResnet20Model ? Resnet20() : std::string();
  if (text == format::kLenet5Model) source = kLenet5;
  if (text == format::kResnet20Model) source = resnet20;
  json doc = json::parse(source.begin(), source.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    return Status::InvalidArgument("model spec is neither a known name (" +
                                   format::BuiltinModelList() + ") nor valid JSON");
  }
  const json* layers = &doc;
  if (doc.is_object()) {
    for (auto it = doc.begin(); it != doc.end(); ++it) {
      if (it.key() != "layers" && it.key() != "input") {
        return Status::InvalidArgument("model spec: unknown field \"" + it.key() + "\"");
      }
    }
    auto in = doc.find("input");
    if (in != doc.end()) {
      if (!in->is_array() || (in->size() != 3 && in->size() != 1)) {
        return Status::InvalidArgument(
            "model spec: \"input\" must be [channels, height, width] or [features]");
      }
      input_shape.clear();
      for (const auto& d : *in) {
        if (!d.is_number_integer() || d.get<int64_t>() < 1 || d.get<int64_t>() > 65536) {
          return Status::InvalidArgument("model spec: \"input\" dimensions must be integers >= 1");
        }
        input_shape.push_back(d.get<int64_t>());
      }
    }
    auto l = doc.find("layers");
    if (l == doc.end()) return Status::InvalidArgument("model spec: missing \"layers\"");
    layers = &*l;
  }
  if (!layers->is_array() || layers->empty()) {
    return Status::InvalidArgument("model spec: layers must be a non-empty JSON array");
  }
  if (input_shape.size() != 3 && input_shape.size() != 1) {
    return Status::InvalidArgument(
        "model spec: input shape must be [channels, height, width] or [features]");
  }
  spec.input_shape_ = input_shape;

  std::vector<int64_t> shape = input_shape;  // [C, H, W] or [F]
  std::set<std::string> names;
  CKPT_RETURN_IF_ERROR(
      ParseLayerList(*layers, "model spec layer ", "", &shape, &names, &spec.layers_));
  if (shape.size() != 1) {
    return Status::InvalidArgument("model spec: the output is " + ShapeString(shape) +
                                   "; it must be flat (end with linear layers)");
  }
  spec.num_outputs_ = shape[0];
  return spec;
}

bool ModelSpec::has_dropout() const {
  for (const auto& l : layers_) {
    if (l.kind == LayerKind::kDropout && l.p > 0) return true;
  }
  return false;
}

namespace {

// Multiply-adds of one sample through a conv2d or linear layer; 0 otherwise.
int64_t MultiplyAdds(const LayerSpec& l) {
  switch (l.kind) {
    case LayerKind::kConv2d: {
      // output_shape: [out, H, W]; each output element sums in x k x k products.
      int64_t outputs = 1;
      for (int64_t d : l.output_shape) outputs *= d;
      return outputs * l.in * l.kernel * l.kernel;
    }
    case LayerKind::kLinear:
      return l.in * l.out;
    default:
      return 0;
  }
}

}  // namespace

int64_t ModelSpec::ForwardFlopsPerSample() const {
  int64_t macs = 0;
  for (const auto& l : layers_) macs += MultiplyAdds(l);
  return 2 * macs;
}

int64_t ModelSpec::TrainingFlopsPerSample() const {
  int64_t macs = 0;
  bool first = true;
  for (const auto& l : layers_) {
    const int64_t m = MultiplyAdds(l);
    if (m == 0) continue;
    // Forward and weight gradient: m each. Input gradient: m, except for the
    // layer that reads the data (nothing upstream needs it).
    macs += first ? 2 * m : 3 * m;
    first = false;
  }
  return 2 * macs;
}

std::vector<TensorSpec> ModelSpec::ModelTensors() const {
  std::vector<TensorSpec> out;
  using format::DType;
  for (const auto& l : layers_) {
    switch (l.kind) {
      case LayerKind::kConv2d:
        out.push_back({l.name + ".weight", DType::kF32, {l.out, l.in, l.kernel, l.kernel}, true});
        if (l.bias) out.push_back({l.name + ".bias", DType::kF32, {l.out}, true});
        break;
      case LayerKind::kLinear:
        out.push_back({l.name + ".weight", DType::kF32, {l.out, l.in}, true});
        if (l.bias) out.push_back({l.name + ".bias", DType::kF32, {l.out}, true});
        break;
      case LayerKind::kBatchNorm2d:
        out.push_back({l.name + ".weight", DType::kF32, {l.in}, true});
        out.push_back({l.name + ".bias", DType::kF32, {l.in}, true});
        out.push_back({l.name + ".running_mean", DType::kF32, {l.in}, false});
        out.push_back({l.name + ".running_var", DType::kF32, {l.in}, false});
        out.push_back({l.name + ".num_batches_tracked", DType::kI64, {}, false});
        break;
      default:
        break;
    }
  }
  return out;
}

std::vector<TensorSpec> StateLayout(const std::vector<TensorSpec>& model, OptimizerKind optimizer) {
  std::vector<TensorSpec> out = model;
  for (const auto& t : model) {
    if (!t.trainable) continue;
    for (const auto& slot : OptimizerSlots(optimizer)) {
      if (slot == "step") {
        out.push_back({"optim." + t.name + ".step", format::DType::kF32, {}, false});
      } else {
        out.push_back({"optim." + t.name + "." + slot, format::DType::kF32, t.shape, false});
      }
    }
  }
  return out;
}

}  // namespace ckpt::model
