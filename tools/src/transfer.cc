// export and import: checkpoints out to .safetensors / .pt files and back in.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/format/checkpoint.h"
#include "ckpt/logging/logging.h"
#include "dataset_stats.h"
#include "foreign_state.h"
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

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool IsOptimizerTensor(const std::string& name) { return name.rfind(kOptimPrefix, 0) == 0; }

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
  auto n = ComputeInputNormalization(c.settings);
  if (n.ok()) {
    c.norm = *n;
  } else {
    c.norm_error = n.status().ToString();
  }
  return c;
}

// What a user of an export needs to feed the model as ckpt did: per
// channel x' = x * input_scale[c] + input_shift[c] on input_dtype values.
json NormalizationJson(const InputNormalization& n) {
  return {{"input_mean", n.mean},   {"input_std", n.std},           {"input_scale", n.scale},
          {"input_shift", n.shift}, {"input_dtype", n.input_dtype}, {"input_shape", n.input_shape},
          {"target", n.target},     {"num_classes", n.num_classes}, {"num_outputs", n.num_outputs}};
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
  if (c.norm) j.update(NormalizationJson(*c.norm));
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
    // safetensors metadata is strings: a number or list as JSON (nlohmann
    // writes doubles that read back exactly).
    const json norm = NormalizationJson(*c.norm);
    for (auto it = norm.begin(); it != norm.end(); ++it) {
      meta.extra["ckpt." + it.key()] = it->is_string() ? it->get<std::string>() : it->dump();
    }
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
  const auto parsed = format::ParseOptimizerKind(view.meta().optimizer);
  if (!parsed.ok()) {
    return Status::FailedPrecondition("the checkpoint has no optimizer state (optimizer \"" +
                                      view.meta().optimizer + "\")");
  }
  const format::OptimizerKind kind = *parsed;
  const auto slots = format::OptimizerSlots(kind);
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
  DictSet(group.get(), MakeString("lr"),
          FloatValue(get("lr", kind == format::OptimizerKind::kSgd ? 0.01 : 0.001)));
  if (kind == format::OptimizerKind::kSgd) {
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
            FloatValue(get("weight_decay", kind == format::OptimizerKind::kAdamW ? 0.01 : 0)));
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
    logging::Logger().warn("the export carries no input normalization: {}", c.norm_error);
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

StatusOr<ForeignState> ReadSafetensors(const std::string& path) {
  CKPT_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(path));
  return ParseSafetensors(bytes, path);
}

StatusOr<ForeignState> ReadPt(const std::string& path, const std::vector<std::string>& trainable,
                              const std::string& optimizer) {
  CKPT_ASSIGN_OR_RETURN(format::OptimizerKind kind, format::ParseOptimizerKind(optimizer));
  CKPT_ASSIGN_OR_RETURN(PyRef root, ReadPtFile(path, kMaxImportBytes));
  return StateFromPt(root, path, trainable, kind);
}

// The member an import goes to, once the arguments are usable.
StatusOr<MemberRef> ParseImportArgs(const ImportOptions& options) {
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseMemberRef(options.to));
  if (ref.version) {
    return Status::InvalidArgument("import --to names a member (EXPERIMENT/MEMBER), not a version");
  }
  if (options.file.empty()) return Status::InvalidArgument("import needs a FILE");
  std::error_code ec;
  if (!fs::is_regular_file(options.file, ec)) {
    return Status::NotFound(options.file + ": no such file");
  }
  return ref;
}

// The head of the member `ref` names; NotFound naming the experiment or the
// member when there is none.
StatusOr<store::MemberHead> GetImportMember(store::Store* s, const MemberRef& ref) {
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
  return std::move(*head);
}

// The member whose head holds the layout to match: the member's own head,
// else any member's.
StatusOr<std::string> LayoutMember(store::Store* s, const MemberRef& ref,
                                   const store::MemberHead& head) {
  if (head.version > 0) return ref.member;
  CKPT_ASSIGN_OR_RETURN(auto members, s->ListMembers(ref.exp));
  for (const auto& h : members) {
    if (h.version > 0) return h.member;
  }
  return Status::FailedPrecondition("experiment " + ref.exp +
                                    " has no committed state yet to check an import against");
}

// A file's state against the layout it must match; `where` names the
// experiment's model in messages.
struct ImportCheck {
  const format::CheckpointView& layout;
  const ForeignState& state;
  const std::string& file;
  const std::string& where;
};

// The file's tensor `ft` in place of the layout's `rt`: same shape and dtype,
// every element finite.
Status CheckImportedTensor(const ImportCheck& c, const format::TensorView& rt,
                           const ForeignTensor& ft) {
  if (ft.shape != rt.shape) {
    return Status::FailedPrecondition("tensor " + rt.name + ": " + c.file + " has shape " +
                                      FormatShape(ft.shape) + ", " + c.where + " expects " +
                                      FormatShape(rt.shape));
  }
  if (ft.dtype != rt.dtype) {
    return Status::FailedPrecondition("tensor " + rt.name + ": " + c.file + " has dtype " +
                                      std::string(format::DTypeName(ft.dtype)) + ", " + c.where +
                                      " expects " + std::string(format::DTypeName(rt.dtype)));
  }
  const int64_t bad = FirstNonFinite(ft.dtype, reinterpret_cast<const uint8_t*>(ft.data.data()),
                                     static_cast<size_t>(rt.numel()));
  if (bad >= 0) {
    return Status::FailedPrecondition("tensor " + rt.name + " of " + c.file + ": element " +
                                      std::to_string(bad) + " is not finite");
  }
  return Status::OK();
}

// Adds every tensor of the layout to `w`, from the file, with its dtype and
// shape; optimizer state all or none (none: zeros, which is what a fresh
// torch.optim starts from). `zeros` holds the zero bytes `w` refers to.
// Returns whether the file held optimizer state.
StatusOr<bool> AddImportedTensors(const ImportCheck& c, format::CheckpointWriter* w,
                                  std::vector<std::string>* zeros) {
  bool any_optim = false;
  for (const auto& [name, t] : c.state.tensors) any_optim = any_optim || IsOptimizerTensor(name);
  for (const auto& [name, t] : c.state.tensors) {
    if (c.layout.Find(name) == nullptr) {
      return Status::FailedPrecondition("tensor " + name + " of " + c.file + " is not part of " +
                                        c.where);
    }
  }
  zeros->reserve(c.layout.tensors().size());
  for (const auto& rt : c.layout.tensors()) {
    auto it = c.state.tensors.find(rt.name);
    if (it == c.state.tensors.end()) {
      if (IsOptimizerTensor(rt.name) && !any_optim) {
        zeros->emplace_back(rt.nbytes, '\0');
        CKPT_RETURN_IF_ERROR(
            w->AddTensor(rt.name, rt.dtype, rt.shape, zeros->back().data(), zeros->back().size()));
        continue;
      }
      return Status::FailedPrecondition(
          "tensor " + rt.name + " (" + std::string(format::DTypeName(rt.dtype)) + " " +
          FormatShape(rt.shape) + ") is missing from " + c.file + "; " + c.where + " needs it");
    }
    const ForeignTensor& ft = it->second;
    CKPT_RETURN_IF_ERROR(CheckImportedTensor(c, rt, ft));
    CKPT_RETURN_IF_ERROR(w->AddTensor(rt.name, ft.dtype, ft.shape, ft.data.data(), ft.data.size()));
  }
  return any_optim;
}

// The imported version's metadata: the layout's, with the member's
// hyperparameters (the names the experiment explores) updated from the file
// where it has them, and the step the file says, else the member's own when
// the layout is the member's (its data seed and cursor stay the member's).
format::CheckpointMeta ImportedMeta(const format::CheckpointMeta& layout_meta,
                                    const store::MemberHead& head, bool own_layout,
                                    const ForeignState& st, const std::string& file) {
  format::CheckpointMeta meta = layout_meta;
  meta.extra.clear();
  meta.extra["ckpt.imported_from"] = fs::path(file).filename().string();
  std::map<std::string, double> hparams = head.hparams.empty() ? layout_meta.hparams : head.hparams;
  if (st.hparams) {
    for (const auto& [k, v] : *st.hparams) {
      if (hparams.count(k)) hparams[k] = v;
    }
  }
  meta.hparams = hparams;
  if (head.version > 0 && own_layout) meta.step = head.step;
  if (st.step) meta.step = *st.step;
  return meta;
}

}  // namespace

Status Import(const ToolOptions& tool, const ImportOptions& options) {
  Session session(tool);
  CKPT_ASSIGN_OR_RETURN(MemberRef ref, ParseImportArgs(options));
  store::StoreOptions so;
  CKPT_ASSIGN_OR_RETURN(std::unique_ptr<store::Store> s, session.OpenWriter(so));
  CKPT_ASSIGN_OR_RETURN(store::MemberHead head, GetImportMember(s.get(), ref));
  CKPT_ASSIGN_OR_RETURN(std::string ref_member, LayoutMember(s.get(), ref, head));
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
  format::CheckpointWriter w;
  std::vector<std::string> zeros;
  CKPT_ASSIGN_OR_RETURN(const bool any_optim,
                        AddImportedTensors({ref_view, st, options.file, where}, &w, &zeros));
  const format::CheckpointMeta meta =
      ImportedMeta(ref_meta, head, ref_member == ref.member, st, options.file);
  w.SetMeta(meta);
  const std::string blob = w.Encode();
  auto version = s->Import(ref.exp, ref.member, blob.data(), blob.size(), meta.hparams);
  if (!version.ok()) {
    return Status(version.status().code(),
                  "import into " + ref.exp + "/" + ref.member + ": " + version.status().message());
  }
  json j = {{"experiment", ref.exp}, {"member", ref.member},
            {"version", *version},   {"file", options.file},
            {"step", meta.step},     {"hparams", meta.hparams},
            {"bytes", blob.size()},  {"optimizer_state", any_optim ? "from file" : "zeroed"}};
  if (tool.json) return Print(tool.out, j.dump(2) + "\n");
  return Print(tool.out, "imported " + options.file + " as " + ref.exp + "/" +
                             VersionName(ref.member, *version) + " (step " +
                             std::to_string(meta.step) + ", " + FormatHparams(meta.hparams) +
                             ", optimizer state " + (any_optim ? "from the file" : "zeroed") +
                             ")\n");
}

}  // namespace ckpt::tool
