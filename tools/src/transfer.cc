// export and import: checkpoints out to .safetensors / .pt files and back in.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/format/checkpoint.h"
#include "dataset_stats.h"
#include "pickle_reader.h"
#include "pt_io.h"
#include "session.h"
#include "tensor_math.h"
#include "text_table.h"
#include "tool.h"

namespace ckpt::tool {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr size_t kMaxImportBytes = size_t{1} << 30;
constexpr const char kOptimPrefix[] = "optim.";

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsOptimizerTensor(const std::string& name) { return name.rfind(kOptimPrefix, 0) == 0; }

std::string FormatDouble17(double v) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

// The trainable parameters of a blob, in its order: the model tensors that
// have optimizer slots ("optim.<name>.<slot>").
std::vector<std::string> TrainableNames(const format::CheckpointView& view) {
  std::set<std::string> with_slots;
  for (const auto& t : view.tensors()) {
    if (!IsOptimizerTensor(t.name)) continue;
    std::string rest = t.name.substr(sizeof(kOptimPrefix) - 1);
    size_t dot = rest.rfind('.');
    if (dot != std::string::npos) with_slots.insert(rest.substr(0, dot));
  }
  std::vector<std::string> out;
  for (const auto& t : view.tensors()) {
    if (!IsOptimizerTensor(t.name) && with_slots.count(t.name)) out.push_back(t.name);
  }
  return out;
}

// Slots of the optimizer, in checkpoint order (ckpt/worker/model_spec.h).
std::vector<std::string> OptimizerSlots(const std::string& optimizer) {
  if (optimizer == "sgd") return {"momentum_buffer"};
  if (optimizer == "adam" || optimizer == "adamw") return {"exp_avg", "exp_avg_sq", "step"};
  return {};
}

// ---- export ----

struct ExportContext {
  std::string exp;
  ExperimentSettings settings;
  std::optional<InputNormalization> norm;
  std::string norm_error;
};

StatusOr<ExportContext> LoadExportContext(Session* session, const std::string& exp) {
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session->Reader());
  auto info = s->GetExperiment(exp);
  if (!info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + exp + " not found");
    return info.status();
  }
  ExportContext c;
  c.exp = exp;
  CKPT_ASSIGN_OR_RETURN(c.settings, ReadExperimentSettings(*info));
  auto n = ComputeInputNormalization(c.settings.dataset_path);
  if (n.ok()) {
    c.norm = *n;
  } else {
    c.norm_error = n.status().ToString();
  }
  return c;
}

json ExportMetadata(const ExportContext& c, const store::Manifest& m,
                    const format::CheckpointView& view) {
  json j = {{"experiment", c.exp},
            {"member", m.member},
            {"version", m.version},
            {"model_spec", view.meta().model_spec},
            {"optimizer", view.meta().optimizer},
            {"step", view.meta().step},
            {"hparams", view.meta().hparams},
            {"score", std::isfinite(m.score()) ? json(m.score()) : json(nullptr)},
            {"data_seed", view.meta().data_seed},
            {"data_cursor", view.meta().data_cursor},
            {"dataset", c.settings.dataset}};
  if (c.norm) {
    j["input_mean"] = c.norm->mean;
    j["input_std"] = c.norm->std;
    j["num_classes"] = c.norm->num_classes;
    j["input_shape"] = c.norm->input_shape;
  }
  return j;
}

Status WriteFileAtomically(const std::string& path, const std::string& bytes) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) return Status::IOError("cannot create " + tmp + ": " + std::strerror(errno));
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    f.flush();
    if (!f) return Status::IOError("cannot write " + tmp + ": " + std::strerror(errno));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::OK();
}

Status ExportSafetensors(const ExportContext& c, const store::Manifest& m,
                         const format::CheckpointView& view, const std::string& path) {
  format::CheckpointWriter w;
  format::CheckpointMeta meta = view.meta();
  meta.extra["ckpt.export.experiment"] = c.exp;
  meta.extra["ckpt.export.member"] = m.member;
  meta.extra["ckpt.export.version"] = std::to_string(m.version);
  meta.extra["ckpt.dataset"] = c.settings.dataset;
  if (c.norm) {
    meta.extra["ckpt.input_mean"] = FormatDouble17(c.norm->mean);
    meta.extra["ckpt.input_std"] = FormatDouble17(c.norm->std);
    meta.extra["ckpt.num_classes"] = std::to_string(c.norm->num_classes);
    meta.extra["ckpt.input_shape"] = json(c.norm->input_shape).dump();
  }
  w.SetMeta(meta);
  for (const auto& t : view.tensors()) {
    CKPT_RETURN_IF_ERROR(w.AddTensor(t.name, t.dtype, t.shape, t.data, t.nbytes));
  }
  return WriteFileAtomically(path, w.Encode());
}

// A Python float in a .pt: a 0-dim float64 tensor, because the
// weights_only unpickler of torch 1.13 has no opcode for floats (BINFLOAT);
// float(x) gives the number back, and torch.optim takes it as it is.
PyRef FloatValue(double v) {
  std::string data(sizeof(v), '\0');
  std::memcpy(data.data(), &v, sizeof(v));
  return MakeTensor(format::DType::kF64, {}, std::move(data));
}

PyRef TensorValue(const format::TensorView& t) {
  return MakeTensor(t.dtype, t.shape, std::string(reinterpret_cast<const char*>(t.data), t.nbytes));
}

// torch.optim's state_dict layout of the blob's optimizer state.
StatusOr<PyRef> OptimizerValue(const format::CheckpointView& view) {
  const std::string& kind = view.meta().optimizer;
  const auto slots = OptimizerSlots(kind);
  if (slots.empty()) {
    return Status::FailedPrecondition("the checkpoint has no optimizer state (optimizer \"" + kind +
                                      "\")");
  }
  const auto& hp = view.meta().hparams;
  auto get = [&](const char* k, double d) {
    auto it = hp.find(k);
    return it == hp.end() ? d : it->second;
  };
  PyRef state = MakeDict();
  PyRef params = MakeList();
  const auto trainable = TrainableNames(view);
  for (size_t i = 0; i < trainable.size(); ++i) {
    PyRef per = MakeDict();
    for (const auto& slot : slots) {
      const std::string name = kOptimPrefix + trainable[i] + "." + slot;
      const format::TensorView* t = view.Find(name);
      if (t == nullptr) return Status::Corruption("the checkpoint lacks tensor " + name);
      DictSet(per.get(), MakeString(slot), TensorValue(*t));
    }
    DictSet(state.get(), MakeInt(static_cast<int64_t>(i)), per);
    params->items.push_back(MakeInt(static_cast<int64_t>(i)));
  }
  PyRef group = MakeDict();
  DictSet(group.get(), MakeString("lr"), FloatValue(get("lr", kind == "sgd" ? 0.01 : 0.001)));
  if (kind == "sgd") {
    DictSet(group.get(), MakeString("momentum"), FloatValue(get("momentum", 0)));
    DictSet(group.get(), MakeString("dampening"), MakeInt(0));
    DictSet(group.get(), MakeString("weight_decay"), FloatValue(get("weight_decay", 0)));
    DictSet(group.get(), MakeString("nesterov"), MakeBool(get("nesterov", 0) != 0));
  } else {
    PyRef betas = MakeTuple();
    betas->items = {FloatValue(get("beta1", 0.9)), FloatValue(get("beta2", 0.999))};
    DictSet(group.get(), MakeString("betas"), betas);
    DictSet(group.get(), MakeString("eps"), FloatValue(get("eps", 1e-8)));
    DictSet(group.get(), MakeString("weight_decay"),
            FloatValue(get("weight_decay", kind == "adamw" ? 0.01 : 0)));
    DictSet(group.get(), MakeString("amsgrad"), MakeBool(false));
  }
  DictSet(group.get(), MakeString("maximize"), MakeBool(false));
  DictSet(group.get(), MakeString("params"), params);
  PyRef groups = MakeList();
  groups->items.push_back(group);
  PyRef opt = MakeDict();
  DictSet(opt.get(), MakeString("state"), state);
  DictSet(opt.get(), MakeString("param_groups"), groups);
  return opt;
}

PyRef JsonToPy(const json& j) {
  if (j.is_boolean()) return MakeBool(j.get<bool>());
  if (j.is_number_integer()) {
    if (j.is_number_unsigned() && j.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
      return MakeString(std::to_string(j.get<uint64_t>()));
    }
    return MakeInt(j.get<int64_t>());
  }
  if (j.is_number()) return FloatValue(j.get<double>());
  if (j.is_string()) return MakeString(j.get<std::string>());
  if (j.is_array()) {
    PyRef l = MakeList();
    for (const auto& x : j) l->items.push_back(JsonToPy(x));
    return l;
  }
  if (j.is_object()) {
    PyRef d = MakeDict();
    for (auto it = j.begin(); it != j.end(); ++it)
      DictSet(d.get(), MakeString(it.key()), JsonToPy(*it));
    return d;
  }
  return MakeNone();
}

Status ExportPt(const ExportContext& c, const store::Manifest& m,
                const format::CheckpointView& view, const std::string& path, bool optimizer) {
  PyRef model = MakeDict();
  for (const auto& t : view.tensors()) {
    if (!IsOptimizerTensor(t.name)) DictSet(model.get(), MakeString(t.name), TensorValue(t));
  }
  const json meta = ExportMetadata(c, m, view);
  PyRef root = model;
  if (optimizer) {
    CKPT_ASSIGN_OR_RETURN(PyRef opt, OptimizerValue(view));
    root = MakeDict();
    DictSet(root.get(), MakeString("model"), model);
    DictSet(root.get(), MakeString("optimizer"), opt);
    DictSet(root.get(), MakeString("ckpt"), JsonToPy(meta));
  }
  const std::string tmp = path + ".tmp";
  CKPT_RETURN_IF_ERROR(WritePtFile(tmp, *root, {{"ckpt.json", meta.dump(2) + "\n"}}));
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return Status::IOError("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status::OK();
}

StatusOr<json> ExportOne(Session* session, const ExportContext& c, const store::Manifest& m,
                         const std::string& path, bool pt, bool optimizer) {
  const std::string name = c.exp + "/" + VersionName(m.member, m.version);
  if (!m.holds_blob) {
    return Status::FailedPrecondition(name + ": its blob was released by retention");
  }
  CKPT_ASSIGN_OR_RETURN(store::Store * s, session->Reader());
  auto blob = s->ReadBlob(m.blob, /*verify=*/true);
  if (!blob.ok() && blob.status().IsIOError()) {
    CKPT_RETURN_IF_ERROR(session->RefreshReader());
    CKPT_ASSIGN_OR_RETURN(s, session->Reader());
    blob = s->ReadBlob(m.blob, /*verify=*/true);
  }
  if (!blob.ok()) {
    return Status(blob.status().code(), name + ": " + blob.status().message());
  }
  CKPT_ASSIGN_OR_RETURN(format::CheckpointView view,
                        format::ParseCheckpoint(blob->data(), blob->size()));
  if (pt) {
    CKPT_RETURN_IF_ERROR(ExportPt(c, m, view, path, optimizer));
  } else {
    CKPT_RETURN_IF_ERROR(ExportSafetensors(c, m, view, path));
  }
  json j = ExportMetadata(c, m, view);
  j["file"] = path;
  j["format"] = pt ? "pt" : "safetensors";
  return j;
}

Status ReportExports(const ToolOptions& tool, const ExportContext& c, const json& files) {
  if (!c.norm) {
    std::fprintf(tool.err, "ckpt-tool: warning: the export carries no input normalization: %s\n",
                 c.norm_error.c_str());
  }
  if (tool.json) return Print(tool.out, json{{"exports", files}}.dump(2) + "\n");
  std::string out;
  for (const auto& f : files) {
    out += "wrote " + f["file"].get<std::string>() + " (" + f["experiment"].get<std::string>() +
           "/" + f["member"].get<std::string>() + "@" +
           std::to_string(f["version"].get<int64_t>()) + ", step " +
           std::to_string(f["step"].get<int64_t>()) + ", " + f["model_spec"].get<std::string>() +
           ")\n";
  }
  return Print(tool.out, out);
}

}  // namespace

Status Export(const ToolOptions& tool, const ExportOptions& options) {
  Session session(tool);
  if (options.output.empty()) return Status::InvalidArgument("export needs -o FILE");
  if (options.top < 0) return Status::InvalidArgument("--top must be at least 1");
  if (options.top > 0) {
    CKPT_ASSIGN_OR_RETURN(std::string exp, ParseExperimentId(options.ref));
    if (options.format != "safetensors" && options.format != "pt") {
      return Status::InvalidArgument("--format must be safetensors or pt");
    }
    CKPT_ASSIGN_OR_RETURN(ExportContext c, LoadExportContext(&session, exp));
    CKPT_ASSIGN_OR_RETURN(store::Store * s, session.Reader());
    CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(exp));
    std::vector<store::MemberHead> ranked;
    for (const auto& h : members) {
      if (h.version > 0) ranked.push_back(h);
    }
    std::stable_sort(ranked.begin(), ranked.end(), [](const auto& a, const auto& b) {
      double x = std::isfinite(a.last_score) ? a.last_score : -INFINITY;
      double y = std::isfinite(b.last_score) ? b.last_score : -INFINITY;
      return x > y;
    });
    if (ranked.empty()) return Status::NotFound("experiment " + exp + " has no trained member");
    if (ranked.size() > static_cast<size_t>(options.top)) ranked.resize(options.top);
    std::error_code ec;
    fs::create_directories(options.output, ec);
    if (ec) return Status::IOError("cannot create " + options.output + ": " + ec.message());
    json files = json::array();
    int rank = 0;
    for (const auto& h : ranked) {
      CKPT_ASSIGN_OR_RETURN(store::Manifest m, s->GetManifest(exp, h.member, h.version));
      const std::string path =
          (fs::path(options.output) /
           (exp + "-" + h.member + "-v" + std::to_string(h.version) + "." + options.format))
              .string();
      CKPT_ASSIGN_OR_RETURN(
          json j, ExportOne(&session, c, m, path, options.format == "pt", options.optimizer));
      j["rank"] = ++rank;
      files.push_back(j);
    }
    return ReportExports(tool, c, files);
  }
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseMemberRef(options.ref));
  const bool pt = EndsWith(options.output, ".pt") || EndsWith(options.output, ".pth");
  if (!pt && !EndsWith(options.output, ".safetensors")) {
    return Status::InvalidArgument("export file " + options.output +
                                   " must end in .safetensors or .pt");
  }
  if (options.optimizer && !pt) {
    return Status::InvalidArgument(
        "--optimizer is for .pt; a .safetensors export always holds the optimizer state");
  }
  CKPT_ASSIGN_OR_RETURN(store::Manifest m, session.ResolveManifest(ref));
  CKPT_ASSIGN_OR_RETURN(ExportContext c, LoadExportContext(&session, ref.exp));
  CKPT_ASSIGN_OR_RETURN(json j, ExportOne(&session, c, m, options.output, pt, options.optimizer));
  return ReportExports(tool, c, json::array({j}));
}

// ---- import ----

namespace {

struct ForeignTensor {
  format::DType dtype = format::DType::kF32;
  std::vector<int64_t> shape;
  std::string data;
};

// A state read from a file, before it is checked against the experiment.
struct ForeignState {
  std::map<std::string, ForeignTensor> tensors;
  std::optional<std::map<std::string, double>> hparams;
  std::optional<int64_t> step;
  std::string model_spec;  // "" when the file does not say
};

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return Status::NotFound(path + ": no such file");
  const auto size = fs::file_size(path, ec);
  if (ec) return Status::IOError(path + ": " + ec.message());
  if (size > kMaxImportBytes) {
    return Status::InvalidArgument(path + " is " + std::to_string(size) +
                                   " bytes, above the 1 GiB accepted");
  }
  std::ifstream f(path, std::ios::binary);
  if (!f) return Status::IOError("cannot open " + path + ": " + std::strerror(errno));
  std::string bytes(static_cast<size_t>(size), '\0');
  f.read(bytes.data(), static_cast<std::streamsize>(size));
  if (!f) return Status::IOError("cannot read " + path);
  return bytes;
}

std::optional<std::map<std::string, double>> ParseHparamsJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return std::nullopt;
  std::map<std::string, double> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it->is_number()) out[it.key()] = it->get<double>();
  }
  return out;
}

// A safetensors file from anywhere (Python's safetensors.torch.save_file, or
// a ckpt export): every field checked, nothing trusted.
StatusOr<ForeignState> ReadSafetensors(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  auto bad = [&](const std::string& why) { return Status::Corruption(path + ": " + why); };
  if (bytes.size() < 8) return bad("too short for a safetensors file");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t{static_cast<uint8_t>(bytes[i])} << (8 * i);
  if (n > bytes.size() - 8 || n > format::kDefaultMaxHeaderBytes) {
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
    ft.data = bytes.substr(data_begin + static_cast<size_t>(b), static_cast<size_t>(e - b));
    st.tensors.emplace(name, std::move(ft));
  }
  return st;
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

// A .pt file: a bare state_dict, or {"model"|"state_dict": ..., "optimizer":
// torch.optim state_dict, "ckpt": ...}. `trainable` maps torch.optim's
// parameter indices to names; `optimizer` names its slots.
StatusOr<ForeignState> ReadPt(const std::string& path, const std::vector<std::string>& trainable,
                              const std::string& optimizer) {
  CKPT_ASSIGN_OR_RETURN(PyRef root, ReadPtFile(path, kMaxImportBytes));
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
  const auto slots = OptimizerSlots(optimizer);
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
  if (optimizer == "sgd") {
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

}  // namespace

Status Import(const ToolOptions& tool, const ImportOptions& options) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseMemberRef(options.to));
  if (ref.version) {
    return Status::InvalidArgument("import --to names a member (EXPERIMENT/MEMBER), not a version");
  }
  if (options.file.empty()) return Status::InvalidArgument("import needs a FILE");
  {
    std::error_code ec;
    if (!fs::is_regular_file(options.file, ec)) {
      return Status::NotFound(options.file + ": no such file");
    }
  }
  store::StoreOptions so;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, session.OpenWriter(so));
  auto info = s->GetExperiment(ref.exp);
  if (!info.ok()) {
    if (info.status().IsNotFound()) return Status::NotFound("experiment " + ref.exp + " not found");
    return info.status();
  }
  auto head = s->GetMember(ref.exp, ref.member);
  if (!head.ok()) {
    if (head.status().IsNotFound()) {
      return Status::NotFound("member " + ref.member + " of experiment " + ref.exp + " not found");
    }
    return head.status();
  }
  // The layout to match: the member's own head, else any member's.
  std::string ref_member = head->version > 0 ? ref.member : "";
  if (ref_member.empty()) {
    CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(ref.exp));
    for (const auto& h : members) {
      if (h.version > 0) {
        ref_member = h.member;
        break;
      }
    }
  }
  if (ref_member.empty()) {
    return Status::FailedPrecondition("experiment " + ref.exp +
                                      " has no committed state yet to check an import against");
  }
  CKPT_ASSIGN_OR_RETURN(store::PinnedBlob ref_blob, s->ReadHeadBlob(ref.exp, ref_member));
  CKPT_ASSIGN_OR_RETURN(format::CheckpointView ref_view,
                        format::ParseCheckpoint(ref_blob.data(), ref_blob.size()));
  const format::CheckpointMeta& ref_meta = ref_view.meta();
  const std::string spec = ref_meta.model_spec;

  const bool pt = EndsWith(options.file, ".pt") || EndsWith(options.file, ".pth");
  ForeignState st;
  if (pt) {
    CKPT_ASSIGN_OR_RETURN(st, ReadPt(options.file, TrainableNames(ref_view), ref_meta.optimizer));
  } else {
    CKPT_ASSIGN_OR_RETURN(st, ReadSafetensors(options.file));
  }
  const std::string where =
      "experiment " + ref.exp + " (model " + spec + ", optimizer " + ref_meta.optimizer + ")";
  if (!st.model_spec.empty() && st.model_spec != spec) {
    return Status::FailedPrecondition(options.file + " holds model " + st.model_spec + ", " +
                                      where + " expects " + spec);
  }
  // Every tensor of the layout, with its dtype and shape; optimizer state all
  // or none (none: zeros, which is what a fresh torch.optim starts from).
  bool any_optim = false;
  for (const auto& [name, t] : st.tensors) any_optim = any_optim || IsOptimizerTensor(name);
  for (const auto& [name, t] : st.tensors) {
    if (ref_view.Find(name) == nullptr) {
      return Status::FailedPrecondition("tensor " + name + " of " + options.file +
                                        " is not part of " + where);
    }
  }
  std::vector<std::string> zeros;
  zeros.reserve(ref_view.tensors().size());
  format::CheckpointWriter w;
  for (const auto& rt : ref_view.tensors()) {
    auto it = st.tensors.find(rt.name);
    if (it == st.tensors.end()) {
      if (IsOptimizerTensor(rt.name) && !any_optim) {
        zeros.emplace_back(rt.nbytes, '\0');
        CKPT_RETURN_IF_ERROR(
            w.AddTensor(rt.name, rt.dtype, rt.shape, zeros.back().data(), zeros.back().size()));
        continue;
      }
      return Status::FailedPrecondition(
          "tensor " + rt.name + " (" + std::string(format::DTypeName(rt.dtype)) + " " +
          FormatShape(rt.shape) + ") is missing from " + options.file + "; " + where + " needs it");
    }
    const ForeignTensor& ft = it->second;
    if (ft.shape != rt.shape) {
      return Status::FailedPrecondition("tensor " + rt.name + ": " + options.file + " has shape " +
                                        FormatShape(ft.shape) + ", " + where + " expects " +
                                        FormatShape(rt.shape));
    }
    if (ft.dtype != rt.dtype) {
      return Status::FailedPrecondition("tensor " + rt.name + ": " + options.file + " has dtype " +
                                        std::string(format::DTypeName(ft.dtype)) + ", " + where +
                                        " expects " + std::string(format::DTypeName(rt.dtype)));
    }
    const int64_t bad = FirstNonFinite(ft.dtype, reinterpret_cast<const uint8_t*>(ft.data.data()),
                                       static_cast<size_t>(rt.numel()));
    if (bad >= 0) {
      return Status::FailedPrecondition("tensor " + rt.name + " of " + options.file + ": element " +
                                        std::to_string(bad) + " is not finite");
    }
    CKPT_RETURN_IF_ERROR(w.AddTensor(rt.name, ft.dtype, ft.shape, ft.data.data(), ft.data.size()));
  }
  format::CheckpointMeta meta = ref_meta;
  meta.extra.clear();
  meta.extra["ckpt.imported_from"] = fs::path(options.file).filename().string();
  // The member's hyperparameters (the names the experiment explores), updated
  // from the file where it has them.
  std::map<std::string, double> hparams = head->hparams.empty() ? ref_meta.hparams : head->hparams;
  if (st.hparams) {
    for (const auto& [k, v] : *st.hparams) {
      if (hparams.count(k)) hparams[k] = v;
    }
  }
  meta.hparams = hparams;
  if (head->version > 0 && ref_member == ref.member) {
    meta.step = head->step;  // data seed and cursor stay the member's own
  }
  if (st.step) meta.step = *st.step;
  w.SetMeta(meta);
  const std::string blob = w.Encode();
  auto version = s->Import(ref.exp, ref.member, blob.data(), blob.size(), hparams);
  if (!version.ok()) {
    return Status(version.status().code(),
                  "import into " + ref.exp + "/" + ref.member + ": " + version.status().message());
  }
  json j = {{"experiment", ref.exp}, {"member", ref.member},
            {"version", *version},   {"file", options.file},
            {"step", meta.step},     {"hparams", hparams},
            {"bytes", blob.size()},  {"optimizer_state", any_optim ? "from file" : "zeroed"}};
  if (tool.json) return Print(tool.out, j.dump(2) + "\n");
  return Print(tool.out, "imported " + options.file + " as " + ref.exp + "/" +
                             VersionName(ref.member, *version) + " (step " +
                             std::to_string(meta.step) + ", " + FormatHparams(hparams) +
                             ", optimizer state " + (any_optim ? "from the file" : "zeroed") +
                             ")\n");
}

}  // namespace ckpt::tool
