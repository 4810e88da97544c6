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
                      std::set<std::string>* names, std::vector<LayerSpec>* out);

// One layer being parsed; `where` names it (index and type) in errors.
struct LayerSite {
  const json& obj;
  const LayerReader& reader;
  const std::string& where;
  bool spatial;  // its input is [C, H, W]
  size_t at;     // its index in the output; a residual's layers follow it

  Status NeedSpatial() const {
    if (!spatial) {
      return Status::InvalidArgument(where + ": needs [C, H, W] input but follows the flatten");
    }
    return Status::OK();
  }
};

// What the layers of one ParseLayerList call share.
struct ListState {
  const std::string& name_prefix;
  std::vector<int64_t>* shape;        // the activation shape, transformed by each layer
  std::set<std::string>* names;       // every name taken in the model
  std::vector<LayerSpec>* out;        // the whole model's layers
  std::map<LayerKind, int> counters;  // default names given per kind in this list
};

// Gives `layer` the default name `stem` + its count in the list (after the
// list's prefix) unless the JSON names it, and takes the name.
Status NameLayer(const char* stem, const LayerSite& site, ListState* list, LayerSpec* layer) {
  layer->name = list->name_prefix + stem + std::to_string(++list->counters[layer->kind]);
  CKPT_RETURN_IF_ERROR(site.reader.Name(&layer->name));
  if (!list->names->insert(layer->name).second) {
    return Status::InvalidArgument(site.where + ": duplicate layer name \"" + layer->name + "\"");
  }
  return Status::OK();
}

Status SizeMismatch(const std::string& where, const char* field, int64_t value, int64_t input,
                    const char* unit) {
  return Status::InvalidArgument(where + ": " + field + " = " + std::to_string(value) +
                                 " but the input has " + std::to_string(input) + " " + unit);
}

// [channels, H, W] after `layer`'s window slides over the [C, H, W] `shape`.
StatusOr<std::vector<int64_t>> WindowOutShape(const std::string& where,
                                              const std::vector<int64_t>& shape,
                                              const LayerSpec& layer, int64_t channels) {
  int64_t h = WindowOut(shape[1], layer.kernel, layer.stride, layer.padding);
  int64_t w = WindowOut(shape[2], layer.kernel, layer.stride, layer.padding);
  if (h < 1 || w < 1) {
    return Status::InvalidArgument(where + ": kernel does not fit input " + ShapeString(shape));
  }
  return std::vector<int64_t>{channels, h, w};
}

// Each parser reads its kind's fields into `layer` and transforms the list's
// shape; NameLayer names stateful layers afterwards (ParseLayer).
Status ParseConv2d(const LayerSite& site, ListState* list, LayerSpec* layer) {
  const LayerReader& r = site.reader;
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(r.CheckKnown({"in", "out", "kernel", "stride", "padding", "bias"}));
  CKPT_RETURN_IF_ERROR(site.NeedSpatial());
  layer->in = shape[0];
  CKPT_RETURN_IF_ERROR(r.Int("in", false, 1, &layer->in));
  CKPT_RETURN_IF_ERROR(r.Int("out", true, 1, &layer->out));
  CKPT_RETURN_IF_ERROR(r.Int("kernel", true, 1, &layer->kernel));
  CKPT_RETURN_IF_ERROR(r.Int("stride", false, 1, &layer->stride));
  CKPT_RETURN_IF_ERROR(r.Int("padding", false, 0, &layer->padding));
  CKPT_RETURN_IF_ERROR(r.Bool("bias", &layer->bias));
  if (layer->in != shape[0]) {
    return SizeMismatch(site.where, "in", layer->in, shape[0], "channels");
  }
  CKPT_ASSIGN_OR_RETURN(shape, WindowOutShape(site.where, shape, *layer, layer->out));
  return Status::OK();
}

Status ParseLinear(const LayerSite& site, ListState* list, LayerSpec* layer) {
  const LayerReader& r = site.reader;
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(r.CheckKnown({"in", "out", "bias"}));
  if (site.spatial) {
    return Status::InvalidArgument(site.where + ": needs [F] input; add a flatten before it");
  }
  layer->in = shape[0];
  CKPT_RETURN_IF_ERROR(r.Int("in", false, 1, &layer->in));
  CKPT_RETURN_IF_ERROR(r.Int("out", true, 1, &layer->out));
  CKPT_RETURN_IF_ERROR(r.Bool("bias", &layer->bias));
  if (layer->in != shape[0]) {
    return SizeMismatch(site.where, "in", layer->in, shape[0], "features");
  }
  shape = {layer->out};
  return Status::OK();
}

// maxpool2d and avgpool2d.
Status ParsePool2d(const LayerSite& site, ListState* list, LayerSpec* layer) {
  const LayerReader& r = site.reader;
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(r.CheckKnown({"kernel", "stride", "padding"}));
  CKPT_RETURN_IF_ERROR(site.NeedSpatial());
  CKPT_RETURN_IF_ERROR(r.Int("kernel", true, 1, &layer->kernel));
  layer->stride = layer->kernel;
  CKPT_RETURN_IF_ERROR(r.Int("stride", false, 1, &layer->stride));
  CKPT_RETURN_IF_ERROR(r.Int("padding", false, 0, &layer->padding));
  if (2 * layer->padding > layer->kernel) {
    return Status::InvalidArgument(site.where + ": padding must be at most half the kernel");
  }
  CKPT_ASSIGN_OR_RETURN(shape, WindowOutShape(site.where, shape, *layer, shape[0]));
  return Status::OK();
}

Status ParseBatchNorm2d(const LayerSite& site, ListState* list, LayerSpec* layer) {
  const LayerReader& r = site.reader;
  const std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(r.CheckKnown({"features", "eps", "momentum"}));
  CKPT_RETURN_IF_ERROR(site.NeedSpatial());
  layer->in = shape[0];
  CKPT_RETURN_IF_ERROR(r.Int("features", false, 1, &layer->in));
  CKPT_RETURN_IF_ERROR(r.Double("eps", 1e-30, 1.0, &layer->eps));
  CKPT_RETURN_IF_ERROR(r.Double("momentum", 0.0, 1.0, &layer->momentum));
  if (layer->in != shape[0]) {
    return SizeMismatch(site.where, "features", layer->in, shape[0], "channels");
  }
  layer->out = layer->in;
  return Status::OK();
}

Status ParseDropout(const LayerSite& site, ListState* /*list*/, LayerSpec* layer) {
  CKPT_RETURN_IF_ERROR(site.reader.CheckKnown({"p"}));
  return site.reader.Double("p", 0.0, 0.999, &layer->p);
}

Status ParseFlatten(const LayerSite& site, ListState* list, LayerSpec* /*layer*/) {
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(site.reader.CheckKnown({}));
  if (!site.spatial) return Status::InvalidArgument(site.where + ": the input is already flat");
  shape = {shape[0] * shape[1] * shape[2]};
  return Status::OK();
}

// relu and tanh.
Status ParseActivation(const LayerSite& site, ListState* /*list*/, LayerSpec* /*layer*/) {
  return site.reader.CheckKnown({});
}

Status ParseGlobalAvgPool(const LayerSite& site, ListState* list, LayerSpec* /*layer*/) {
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(site.reader.CheckKnown({}));
  CKPT_RETURN_IF_ERROR(site.NeedSpatial());
  shape = {shape[0]};
  return Status::OK();
}

// A residual's "shortcut" field: "identity" (the default) or "conv1x1".
StatusOr<std::string> ReadShortcut(const LayerSite& site) {
  auto sc = site.obj.find("shortcut");
  if (sc == site.obj.end()) return std::string("identity");
  if (!sc->is_string() || (*sc != "identity" && *sc != "conv1x1")) {
    return Status::InvalidArgument(site.where +
                                   ": \"shortcut\" must be \"identity\" or \"conv1x1\"");
  }
  return sc->get<std::string>();
}

// Appends the conv1x1 shortcut of the residual `layer`, whose body maps the
// list's shape to `body_shape`: a 1x1 convolution with the stride that maps
// the input's height and width onto the body's, then a batchnorm2d.
Status ParseConv1x1Shortcut(const LayerSite& site, const std::vector<int64_t>& body_shape,
                            ListState* list, LayerSpec* layer) {
  const std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(site.NeedSpatial());
  if (body_shape.size() != 3) {
    return Status::InvalidArgument(site.where + ": a conv1x1 shortcut needs a [C, H, W] body");
  }
  int64_t stride = 0;
  for (int64_t s = 1; s <= shape[1] && stride == 0; ++s) {
    if (WindowOut(shape[1], 1, s, 0) == body_shape[1] &&
        WindowOut(shape[2], 1, s, 0) == body_shape[2]) {
      stride = s;
    }
  }
  if (stride == 0) {
    return Status::InvalidArgument(site.where + ": no 1x1 stride maps " + ShapeString(shape) +
                                   " to the body's " + ShapeString(body_shape));
  }
  json conv = {{"type", "conv2d"},
               {"out", body_shape[0]},
               {"kernel", 1},
               {"stride", stride},
               {"bias", false}};
  json bn = {{"type", "batchnorm2d"}};
  // "shortcut_names": [conv name, batchnorm2d name], e.g. a PyTorch block's
  // "layer2.0.shortcut.0" / ".1"; default <block>.shortcut.conv1 / .bn1.
  auto names = site.obj.find("shortcut_names");
  if (names != site.obj.end()) {
    if (!names->is_array() || names->size() != 2 || !(*names)[0].is_string() ||
        !(*names)[1].is_string()) {
      return Status::InvalidArgument(site.where +
                                     ": \"shortcut_names\" must be [conv name, batchnorm2d name]");
    }
    conv["name"] = (*names)[0];
    bn["name"] = (*names)[1];
  }
  json shortcut_layers = json::array({conv, bn});
  std::vector<int64_t> sc_shape = shape;
  CKPT_RETURN_IF_ERROR(ParseLayerList(shortcut_layers, site.where + " shortcut layer ",
                                      layer->name + ".shortcut.", &sc_shape, list->names,
                                      list->out));
  layer->shortcut = static_cast<int>(list->out->size() - site.at - 1 - layer->body);
  return Status::OK();
}

// A residual names itself before its body, whose layers' names it prefixes.
Status ParseResidual(const LayerSite& site, ListState* list, LayerSpec* layer) {
  std::vector<int64_t>& shape = *list->shape;
  CKPT_RETURN_IF_ERROR(site.reader.CheckKnown({"layers", "shortcut", "shortcut_names"}));
  auto sub = site.obj.find("layers");
  if (sub == site.obj.end() || !sub->is_array() || sub->empty()) {
    return Status::InvalidArgument(site.where + ": \"layers\" must be a non-empty array");
  }
  CKPT_RETURN_IF_ERROR(NameLayer("res", site, list, layer));
  CKPT_ASSIGN_OR_RETURN(const std::string shortcut, ReadShortcut(site));
  std::vector<int64_t> body_shape = shape;
  CKPT_RETURN_IF_ERROR(ParseLayerList(*sub, site.where + " layer ", layer->name + ".", &body_shape,
                                      list->names, list->out));
  layer->body = static_cast<int>(list->out->size() - site.at - 1);
  if (shortcut == "identity") {
    if (site.obj.contains("shortcut_names")) {
      return Status::InvalidArgument(site.where +
                                     ": an identity shortcut takes no \"shortcut_names\"");
    }
    if (body_shape != shape) {
      return Status::InvalidArgument(site.where + ": the body maps " + ShapeString(shape) + " to " +
                                     ShapeString(body_shape) +
                                     "; an identity shortcut needs them equal (use "
                                     "\"shortcut\": \"conv1x1\")");
    }
  } else {
    CKPT_RETURN_IF_ERROR(ParseConv1x1Shortcut(site, body_shape, list, layer));
  }
  shape = body_shape;
  return Status::OK();
}

using LayerParser = Status (*)(const LayerSite& site, ListState* list, LayerSpec* layer);

struct KindEntry {
  LayerKind kind;
  const char* name;
  LayerParser parse;
  // A stateful layer's default-name stem (conv1, fc1, bn1); nullptr for a
  // layer without state, or a residual (which names itself).
  const char* state_stem;
};
constexpr KindEntry kKinds[] = {
    {LayerKind::kConv2d, "conv2d", ParseConv2d, "conv"},
    {LayerKind::kLinear, "linear", ParseLinear, "fc"},
    {LayerKind::kRelu, "relu", ParseActivation, nullptr},
    {LayerKind::kTanh, "tanh", ParseActivation, nullptr},
    {LayerKind::kMaxPool2d, "maxpool2d", ParsePool2d, nullptr},
    {LayerKind::kAvgPool2d, "avgpool2d", ParsePool2d, nullptr},
    {LayerKind::kBatchNorm2d, "batchnorm2d", ParseBatchNorm2d, "bn"},
    {LayerKind::kDropout, "dropout", ParseDropout, nullptr},
    {LayerKind::kFlatten, "flatten", ParseFlatten, nullptr},
    {LayerKind::kGlobalAvgPool, "globalavgpool", ParseGlobalAvgPool, nullptr},
    {LayerKind::kResidual, "residual", ParseResidual, nullptr},
};

// Parses the list's layer `obj` (index `where`) onto list->out.
Status ParseLayer(const json& obj, std::string where, ListState* list) {
  if (!obj.is_object()) return Status::InvalidArgument(where + ": not a JSON object");
  auto type_it = obj.find("type");
  if (type_it == obj.end() || !type_it->is_string()) {
    return Status::InvalidArgument(where + ": missing string field \"type\"");
  }
  std::string type = type_it->get<std::string>();
  const KindEntry* entry = nullptr;
  for (const auto& k : kKinds) {
    if (type == k.name) entry = &k;
  }
  if (entry == nullptr) {
    return Status::InvalidArgument(where + ": unknown layer type \"" + type + "\"");
  }
  where += " (" + type + ")";
  LayerReader r(obj, where);
  LayerSpec layer;
  layer.kind = entry->kind;
  const LayerSite site{obj, r, where, list->shape->size() == 3, list->out->size()};
  list->out->push_back(LayerSpec());
  CKPT_RETURN_IF_ERROR(entry->parse(site, list, &layer));
  if (entry->state_stem != nullptr) {
    CKPT_RETURN_IF_ERROR(NameLayer(entry->state_stem, site, list, &layer));
  } else if (layer.kind != LayerKind::kResidual && obj.contains("name")) {
    return Status::InvalidArgument(where + ": a layer without state takes no name");
  }
  layer.output_shape = *list->shape;
  (*list->out)[site.at] = std::move(layer);
  return Status::OK();
}

Status ParseLayerList(const json& list, const std::string& where_prefix,
                      const std::string& name_prefix, std::vector<int64_t>* shape_io,
                      std::set<std::string>* names, std::vector<LayerSpec>* out) {
  ListState state{name_prefix, shape_io, names, out, {}};
  for (size_t i = 0; i < list.size(); ++i) {
    CKPT_RETURN_IF_ERROR(ParseLayer(list[i], where_prefix + std::to_string(i), &state));
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
