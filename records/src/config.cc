#include "ckpt/records/config.h"

#include <sys/stat.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/base/host_port.h"
#include "ckpt/format/model_names.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/format/regular_file.h"
#include "ckpt/model/model_spec.h"
#include "config_tables.h"
#include "idx_shape.h"
#include "toml_reader.h"
#include "workers_table.h"

namespace ckpt::records {
namespace {

// Shortest text that reads back as `v` ("0.92", "-1e-05").
std::string FormatNumber(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

bool FileExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

Status ParseSearchSpace(const toml::table& space, const std::string& origin,
                        ExperimentConfig* config) {
  TomlTableReader top(space, "search_space", origin);
  for (const auto& [k, v] : space) {
    const std::string name(k.str());
    CKPT_ASSIGN_OR_RETURN(const toml::table* t, top.Table(name));
    TomlTableReader r(*t, "search_space." + name, origin);
    SearchDim dim;
    std::string type;
    CKPT_RETURN_IF_ERROR(r.OneOf("type", {"log_uniform", "uniform", "choice"}, &type));
    if (type.empty()) return r.Error("type", "is required (log_uniform, uniform or choice)");
    if (type == "choice") {
      dim.kind = SearchDim::Kind::kChoice;
      CKPT_RETURN_IF_ERROR(r.Doubles("values", &dim.values));
      if (dim.values.empty()) return r.Error("values", "must list at least one value");
    } else {
      dim.kind = type == "uniform" ? SearchDim::Kind::kUniform : SearchDim::Kind::kLogUniform;
      const double lo = dim.kind == SearchDim::Kind::kLogUniform ? 1e-300 : -1e300;
      if (t->get("min") == nullptr) return r.Error("min", "is required");
      if (t->get("max") == nullptr) return r.Error("max", "is required");
      CKPT_RETURN_IF_ERROR(r.Double("min", lo, 1e300, &dim.min));
      CKPT_RETURN_IF_ERROR(r.Double("max", lo, 1e300, &dim.max));
      if (!(dim.min <= dim.max)) return r.Error("max", "must not be below min");
    }
    CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
    if (name == format::kDropoutHparam) {
      const bool choice = dim.kind == SearchDim::Kind::kChoice;
      for (double p : choice ? dim.values : std::vector<double>{dim.min, dim.max}) {
        if (!format::IsDropoutProbability(p)) {
          return r.Error(choice ? "values" : "min/max",
                         FormatNumber(p) + " is no dropout probability: it must be in [0, 1)");
        }
      }
    }
    config->search_space[name] = dim;
  }
  return Status::OK();
}

// What a tensor file gives a model: a sample's shape ([C, H, W] or [F]) and
// the outputs per sample it must have (classes, or targets per row); 0
// outputs while the file is unchecked.
struct DataShape {
  std::vector<int64_t> sample_shape;
  int64_t outputs = 0;
};

// Maps and checks the tensor file of [data] (ckpt/format/tensor_dataset.h)
// now, so that a bad file stops the run before anything starts.
Status CheckTensorData(TomlTableReader* r, ExperimentConfig* c, DataShape* shape) {
  std::error_code ec;
  const std::filesystem::path abs = std::filesystem::absolute(c->dataset_path, ec);
  if (!ec) c->dataset_path = abs.string();
  auto d = format::TensorDataset::Open(c->TensorData());
  if (!d.ok()) return r->Error("path", d.status().message());
  c->target = (*d)->target();
  shape->sample_shape = (*d)->sample_shape();
  shape->outputs = (*d)->num_outputs();
  if (c->augment.any() && (*d)->sample_shape().size() != 3) {
    return r->Error("augment", "needs [N, C, H, W] images; the file holds [N, F] features");
  }
  return Status::OK();
}

// What can be known of a model spec before the data is read (the worker
// parses it fully at CONFIGURE, and a refusal there ends the experiment): a
// TorchScript file must be readable and be a zip archive (torch.jit.save
// writes one); a layer list must be JSON (CheckModelFitsData parses it
// against the data).
Status CheckModelSpec(TomlTableReader* r, const std::string& spec, bool check_files) {
  if (spec.empty()) return r->Error("spec", "must not be empty");
  // The spec travels to every worker in CONFIGURE, whose JSON is bounded.
  if (spec.size() > kMaxModelSpecBytes) {
    return r->Error("spec", "is " + std::to_string(spec.size()) + " bytes; the limit is " +
                                std::to_string(kMaxModelSpecBytes));
  }
  if (spec.compare(0, format::kTorchScriptPrefix.size(), format::kTorchScriptPrefix) == 0) {
    const std::string path = spec.substr(format::kTorchScriptPrefix.size());
    if (path.empty()) return r->Error("spec", "\"torchscript:\" names no file");
    if (!check_files) return Status::OK();
    // One open, checked on its descriptor: a FIFO, a device or a symbolic
    // link is refused without a read that could block the event loop.
    auto file =
        format::RegularFile::Open(path, format::kMaxTorchScriptFileBytes, "TorchScript file");
    if (!file.ok()) return r->Error("spec", file.status().message());
    auto magic = file->ReadPrefix(4);
    if (!magic.ok()) return r->Error("spec", magic.status().message());
    if (*magic != std::string_view("PK\3\4", 4)) {
      return r->Error("spec", "'" + path +
                                  "' is not a TorchScript archive (torch.jit.save writes a zip "
                                  "file; this one does not start like one)");
    }
    return Status::OK();
  }
  if (format::IsBuiltinModel(spec)) return Status::OK();
  const size_t first = spec.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || (spec[first] != '[' && spec[first] != '{')) {
    return r->Error("spec", "must be a built-in model (" + format::BuiltinModelList() +
                                "), torchscript:PATH or a JSON layer list, not '" +
                                spec.substr(0, 64) + "'");
  }
  return Status::OK();
}

}  // namespace

bool ValidListenAddress(const std::string& a) {
  if (a.empty()) return true;
  const size_t colon = a.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  const std::string port = a.substr(colon + 1);
  if (port.empty() || port.size() > 5) return false;
  for (char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  const int p = std::stoi(port);
  return p >= 1 && p <= 65535;
}

bool ValidDeviceName(const std::string& name, bool allow_auto) {
  if (name == "cpu" || (allow_auto && name == "auto")) return true;
  if (name.compare(0, 5, "cuda:") != 0 || name.size() == 5 || name.size() > 9) return false;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

Status ReadDevices(TomlTableReader* top, const std::string& origin,
                   const std::string& default_device, std::vector<DeviceConfig>* out) {
  const toml::node* devices = top->Use("devices");
  if (devices == nullptr) return Status::OK();
  const toml::array* arr = devices->as_array();
  if (arr == nullptr) return top->Error("devices", "must be an array of tables ([[devices]])");
  for (size_t i = 0; i < arr->size(); ++i) {
    const toml::table* t = (*arr)[i].as_table();
    if (t == nullptr) return top->Error("devices", "entries must be tables");
    TomlTableReader r(*t, "devices[" + std::to_string(i) + "]", origin);
    DeviceConfig d;
    d.device = default_device;
    CKPT_RETURN_IF_ERROR(r.String("device", &d.device));
    if (!ValidDeviceName(d.device, /*allow_auto=*/true)) {
      return r.Error("device", "must be cpu, auto or cuda:N, not '" + d.device + "'");
    }
    CKPT_RETURN_IF_ERROR(r.Int("count", 1, 64, &d.count));
    CKPT_RETURN_IF_ERROR(r.Int("slots", 1, 256, &d.slots));
    CKPT_RETURN_IF_ERROR(r.Enum("fusion", ipc::kFusionModes, &ipc::FusionModeName, &d.fusion));
    CKPT_RETURN_IF_ERROR(r.Int("fusion_width", 1, 1024, &d.fusion_width));
    CKPT_RETURN_IF_ERROR(r.Int("intra_op_threads", 1, 256, &d.intra_op_threads));
    CKPT_RETURN_IF_ERROR(r.Bool("tf32", &d.tf32));
    CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
    out->push_back(d);
  }
  return Status::OK();
}

Status ReadRemoteWorkers(TomlTableReader* r, RemoteWorkersConfig* out) {
  CKPT_RETURN_IF_ERROR(r->String("listen", &out->listen));
  if (!out->listen.empty()) {
    auto hp = base::ParseHostPort(out->listen);
    if (!hp.ok()) return r->Error("listen", hp.status().message());
  }
  CKPT_RETURN_IF_ERROR(r->String("secret_file", &out->secret_file));
  if (!out->listen.empty() && out->secret_file.empty()) {
    return r->Error("secret_file", "is required when listen is set");
  }
  CKPT_RETURN_IF_ERROR(r->Bool("local", &out->local));
  CKPT_RETURN_IF_ERROR(r->Int("max_remote", 1, 4096, &out->max_remote));
  int64_t memory_mib = static_cast<int64_t>(out->remote_memory_bytes >> 20);
  CKPT_RETURN_IF_ERROR(r->Int("remote_memory_mib", 16, int64_t{1} << 20, &memory_mib));
  out->remote_memory_bytes = static_cast<uint64_t>(memory_mib) << 20;
  CKPT_RETURN_IF_ERROR(r->Int("max_remote_slots", 1, 256, &out->max_remote_slots));
  CKPT_RETURN_IF_ERROR(r->Double("task_timeout_factor", 1, 1000, &out->task_timeout_factor));
  CKPT_RETURN_IF_ERROR(r->Seconds("task_timeout_floor_s", 0.1, 86400, &out->task_timeout_floor));
  if (!out->local && out->listen.empty()) {
    return r->Error("local", "false needs listen (no worker could ever train)");
  }
  return Status::OK();
}

Status ReadSupervision(TomlTableReader* r, SupervisionOptions* v) {
  CKPT_RETURN_IF_ERROR(r->Seconds("restart_backoff_s", 0, 86400, &v->restart_backoff));
  CKPT_RETURN_IF_ERROR(r->Seconds("max_restart_backoff_s", 0, 86400, &v->max_restart_backoff));
  if (v->max_restart_backoff < v->restart_backoff) {
    return r->Error("max_restart_backoff_s", "must not be below restart_backoff_s");
  }
  CKPT_RETURN_IF_ERROR(r->Seconds("healthy_reset_s", 0, 86400 * 30.0, &v->healthy_reset));
  CKPT_RETURN_IF_ERROR(r->Int("max_restarts", 0, 1000000, &v->max_restarts));
  CKPT_RETURN_IF_ERROR(r->Int("max_member_failures", 1, 1000000, &v->max_member_failures));
  return Status::OK();
}

const char* PolicyKindName(PolicyKind kind) {
  switch (kind) {
    case PolicyKind::kPbt:
      return "pbt";
    case PolicyKind::kRandom:
      return "random";
    case PolicyKind::kSuccessiveHalving:
      return "successive_halving";
    case PolicyKind::kHyperband:
      return "hyperband";
    case PolicyKind::kPb2:
      return "pb2";
  }
  return "?";
}

int MaxHyperbandBrackets(int intervals, int min_intervals, int eta) {
  if (min_intervals < 1 || eta < 2 || min_intervals > intervals) return 0;
  int n = 1;
  for (int64_t r = min_intervals; r * eta <= intervals; r *= eta) ++n;
  return n;
}

const char* ResampleName(Resample r) { return r == Resample::kTpe ? "tpe" : "uniform"; }

const char* PolicyModeName(PolicyMode mode) {
  return mode == PolicyMode::kAsync ? "async" : "sync";
}

namespace {

// What every part of an experiment file is read with, besides the document.
struct ParseContext {
  const std::string& origin;
  // FileChecks::kCheck: the model and data files are opened and checked now.
  bool check_files;
  // Filled by [data]'s checks, for the model's.
  DataShape* data;
};

// Reads one part of the document (the top-level keys or one table) into *c.
using PartReader = Status (*)(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c);

// Without the file checks a tensor file's targets are not known.
bool TargetKnown(const ParseContext& ctx, const ExperimentConfig& c) {
  return ctx.check_files || c.data_format == format::DatasetFormat::kIdx;
}

Status ReadTopLevelKeys(TomlTableReader* top, const ParseContext& /*ctx*/, ExperimentConfig* c) {
  CKPT_RETURN_IF_ERROR(top->String("name", &c->name));
  if (c->name.empty()) return top->Error("name", "is required");
  if (c->name.size() > kMaxExperimentNameBytes) {
    return top->Error("name", "is " + std::to_string(c->name.size()) + " bytes; the limit is " +
                                  std::to_string(kMaxExperimentNameBytes));
  }
  for (char ch : c->name) {
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_' || ch == '.')) {
      return top->Error("name", "may hold only letters, digits, '-', '_' and '.'");
    }
  }
  int64_t seed = 0;
  CKPT_RETURN_IF_ERROR(top->Int("seed", 0, INT64_MAX, &seed));
  c->seed = static_cast<uint64_t>(seed);
  CKPT_RETURN_IF_ERROR(top->String("store", &c->store));
  CKPT_RETURN_IF_ERROR(top->String("metrics", &c->metrics));
  if (!ValidListenAddress(c->metrics)) {
    return top->Error("metrics",
                      "must be host:port (port 1-65535) or \"\", not '" + c->metrics + "'");
  }
  return Status::OK();
}

Status ReadModelTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* model, top->Table("model"));
  if (model == nullptr) return Status::OK();
  TomlTableReader r(*model, "model", ctx.origin);
  CKPT_RETURN_IF_ERROR(r.String("spec", &c->model_spec));
  CKPT_RETURN_IF_ERROR(CheckModelSpec(&r, c->model_spec, ctx.check_files));
  CKPT_RETURN_IF_ERROR(
      r.Enum("optimizer", format::kOptimizerKinds, &format::OptimizerKindName, &c->optimizer));
  return r.CheckNoUnknownKeys();
}

// The files [data] names, checked against its format: a tensor file is
// opened now; an idx directory must hold the training images, and the keys
// only tensor files take are refused.
Status CheckDataSource(const toml::table& data, TomlTableReader* r, const ParseContext& ctx,
                       ExperimentConfig* c) {
  if (c->data_format != format::DatasetFormat::kIdx) {
    if (data.get("path") == nullptr) return r->Error("format", "needs path = the tensor file");
    if (ctx.check_files) CKPT_RETURN_IF_ERROR(CheckTensorData(r, c, ctx.data));
    return Status::OK();
  }
  if (data.get("val_size") || data.get("classes") || data.get("mean") || data.get("std")) {
    const char* key = data.get("val_size")  ? "val_size"
                      : data.get("classes") ? "classes"
                      : data.get("mean")    ? "mean"
                                            : "std";
    return r->Error(key, "applies to tensor files (format = \"safetensors\" or \"npz\")");
  }
  if (ctx.check_files && !FileExists(c->dataset_path + "/train-images-idx3-ubyte.gz") &&
      !FileExists(c->dataset_path + "/train-images-idx3-ubyte")) {
    return r->Error("path", "no train-images-idx3-ubyte[.gz] in '" + c->dataset_path +
                                "' (install dataset-fashion-mnist or fix the path)");
  }
  return Status::OK();
}

Status ReadDataTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* data, top->Table("data"));
  if (data == nullptr) {
    if (ctx.check_files && !FileExists(c->dataset_path + "/train-images-idx3-ubyte.gz")) {
      return Status::InvalidArgument("data.path (" + ctx.origin + "): default dataset " +
                                     c->dataset_path +
                                     " is missing (install dataset-fashion-mnist)");
    }
    return Status::OK();
  }
  TomlTableReader r(*data, "data", ctx.origin);
  std::string data_format = "idx";
  CKPT_RETURN_IF_ERROR(r.OneOf("format", {"idx", "safetensors", "npz"}, &data_format));
  c->data_format = *format::ParseDatasetFormat(data_format);
  CKPT_RETURN_IF_ERROR(r.OneOf("dataset", {"fashion-mnist", "mnist"}, &c->dataset));
  CKPT_RETURN_IF_ERROR(r.String("path", &c->dataset_path));
  format::TensorDatasetOptions& t = c->tensor_file;
  CKPT_RETURN_IF_ERROR(r.Int("val_size", 0, int64_t{1} << 40, &t.val_size));
  CKPT_RETURN_IF_ERROR(r.Int("classes", 0, int64_t{1} << 24, &t.classes));
  CKPT_RETURN_IF_ERROR(r.Doubles("mean", &t.mean));
  CKPT_RETURN_IF_ERROR(r.Doubles("std", &t.std));
  std::vector<std::string> augment;
  CKPT_RETURN_IF_ERROR(r.Strings("augment", &augment));
  auto parsed_augment = format::ParseAugmentation(augment);
  if (!parsed_augment.ok()) return r.Error("augment", parsed_augment.status().message());
  c->augment = *parsed_augment;
  CKPT_RETURN_IF_ERROR(r.Int("batch_size", 1, 65536, &c->batch_size));
  CKPT_RETURN_IF_ERROR(r.Int("eval_size", 0, 10000, &c->eval_size));
  CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (c->dataset == "mnist" && data->get("path") == nullptr) {
    c->dataset_path = "/usr/share/datasets/mnist";
  }
  return CheckDataSource(*data, &r, ctx, c);
}

// A layer list (or built-in model) parsed for the data's sample shape, and
// its output size against the data's classes or targets per sample: the
// worker's own checks at CONFIGURE, made here so that a mismatch is refused
// before a store or an experiment exists. Data the parser cannot read (an
// IDX directory with a missing or malformed file) is left to the worker,
// whose reader names the problem.
Status CheckModelFitsData(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  const bool torchscript =
      c->model_spec.compare(0, format::kTorchScriptPrefix.size(), format::kTorchScriptPrefix) == 0;
  // A TorchScript module's outputs are known once LibTorch loads it.
  if (!ctx.check_files || torchscript) return Status::OK();
  if (c->data_format == format::DatasetFormat::kIdx) {
    auto idx = ReadIdxShape(c->dataset_path);
    if (!idx.ok()) return Status::OK();
    *ctx.data = DataShape{idx->sample_shape, idx->classes};
  }
  if (ctx.data->outputs == 0) return Status::OK();
  auto spec = model::ModelSpec::Parse(c->model_spec, ctx.data->sample_shape);
  std::string what;
  if (!spec.ok()) {
    what = spec.status().message();
  } else if (spec->num_outputs() != ctx.data->outputs) {
    what = "the model's last layer has " + std::to_string(spec->num_outputs()) + " outputs, but " +
           c->dataset_path + " has " + std::to_string(ctx.data->outputs) +
           (c->target == format::TargetKind::kClasses ? " classes" : " targets per sample");
  } else {
    return Status::OK();
  }
  CKPT_ASSIGN_OR_RETURN(const toml::table* model, top->Table("model"));
  if (model == nullptr) {
    return Status::InvalidArgument("model.spec (" + ctx.origin + "): the default, " +
                                   c->model_spec + ": " + what);
  }
  return TomlTableReader(*model, "model", ctx.origin).Error("spec", what);
}

Status ReadTaskTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* task, top->Table("task"));
  if (task == nullptr) return Status::OK();
  TomlTableReader r(*task, "task", ctx.origin);
  std::string loss, metric;
  CKPT_RETURN_IF_ERROR(r.OneOf("loss", {"cross_entropy", "mse"}, &loss));
  CKPT_RETURN_IF_ERROR(r.OneOf("metric", {"accuracy", "neg_mse", "r2"}, &metric));
  CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  const bool target_known = TargetKnown(ctx, *c);
  const std::string holds = c->target == format::TargetKind::kClasses
                                ? "the data's y holds class labels"
                                : "the data's y holds float targets";
  if (!loss.empty()) {
    c->loss = *format::ParseLossKind(loss);
    if (target_known && format::TargetOf(*c->loss) != c->target) {
      return r.Error("loss", "does not fit: " + holds);
    }
  }
  if (!metric.empty()) {
    c->metric = *format::ParseMetricKind(metric);
    if (target_known && format::TargetOf(*c->metric) != c->target) {
      return r.Error("metric", "does not fit: " + holds);
    }
  }
  return Status::OK();
}

Status ReadPopulationTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* pop, top->Table("population"));
  if (pop == nullptr) return top->Error("population", "is required ([population] size = N)");
  TomlTableReader r(*pop, "population", ctx.origin);
  if (pop->get("size") == nullptr) return r.Error("size", "is required");
  CKPT_RETURN_IF_ERROR(r.Int("size", 1, kMaxPopulation, &c->population));
  CKPT_RETURN_IF_ERROR(r.Int("steps_per_interval", 0, int64_t{1} << 40, &c->steps_per_interval));
  CKPT_RETURN_IF_ERROR(r.Int("intervals", 1, 1000000, &c->intervals));
  if (pop->get("target_metric") != nullptr) {
    double target = 0;
    CKPT_RETURN_IF_ERROR(r.Double("target_metric", -1e300, 1, &target));
    std::string range;
    if (TargetKnown(ctx, *c) && !format::InMetricRange(c->Metric(), target, &range)) {
      std::string why = FormatNumber(target);
      why += " is outside ";
      why += range;
      why += ", the range of ";
      why += format::MetricKindName(c->Metric());
      return r.Error("target_metric", why);
    }
    c->target_metric = target;
  }
  CKPT_RETURN_IF_ERROR(r.Double("max_wall_s", 0, 1e9, &c->max_wall_s));
  return r.CheckNoUnknownKeys();
}

Status ReadSearchSpaceTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* space, top->Table("search_space"));
  if (space == nullptr) return Status::OK();
  return ParseSearchSpace(*space, ctx.origin, c);
}

Status ReadHparamsTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* fixed, top->Table("hparams"));
  if (fixed == nullptr) return Status::OK();
  TomlTableReader r(*fixed, "hparams", ctx.origin);
  for (const auto& [k, v] : *fixed) {
    double value = 0;
    CKPT_RETURN_IF_ERROR(r.Double(std::string(k.str()), -1e300, 1e300, &value));
    if (k.str() == format::kDropoutHparam && !format::IsDropoutProbability(value)) {
      return r.Error(format::kDropoutHparam,
                     FormatNumber(value) + " is no dropout probability: it must be in [0, 1)");
    }
    c->fixed_hparams[std::string(k.str())] = value;
  }
  return Status::OK();
}

// Every hyperparameter is either searched or fixed, and at least one is given.
Status CheckHparamsSearchedOrFixed(TomlTableReader* top, const ParseContext& ctx,
                                   ExperimentConfig* c) {
  if (c->search_space.empty() && c->fixed_hparams.empty()) {
    return top->Error("search_space", "is empty: give at least one hyperparameter to search");
  }
  for (const auto& [name, dim] : c->search_space) {
    if (c->fixed_hparams.count(name)) {
      return Status::InvalidArgument("hparams." + name + " (" + ctx.origin +
                                     "): also in search_space; keep one");
    }
  }
  return Status::OK();
}

// HyperBand's brackets must fit the intervals, and each bracket needs a member.
Status CheckHyperband(TomlTableReader* r, const ExperimentConfig& c) {
  const PolicyConfig& p = c.policy;
  const int fit = MaxHyperbandBrackets(c.intervals, p.min_intervals, p.eta);
  if (fit == 0) {
    return r->Error("min_intervals", std::to_string(p.min_intervals) + " is above the " +
                                         std::to_string(c.intervals) +
                                         " intervals: no HyperBand bracket fits");
  }
  if (p.brackets > fit) {
    return r->Error("brackets", std::to_string(p.brackets) + " brackets do not fit " +
                                    std::to_string(c.intervals) +
                                    " intervals with eta = " + std::to_string(p.eta) +
                                    " and min_intervals = " + std::to_string(p.min_intervals) +
                                    ": at most " + std::to_string(fit) +
                                    " (min_intervals * eta^s <= intervals)");
  }
  const int used = p.brackets == 0 ? fit : p.brackets;
  if (c.population < used) {
    return r->Error(p.brackets == 0 ? "kind" : "brackets",
                    std::to_string(used) + " HyperBand brackets need at least " +
                        std::to_string(used) + " members, population.size is " +
                        std::to_string(c.population));
  }
  return Status::OK();
}

// PB2's GP explores a box: every searched hyperparameter is continuous, and
// its explore replaces PBT's resampling.
Status CheckPb2(TomlTableReader* top, TomlTableReader* r, const ParseContext& ctx,
                const ExperimentConfig& c) {
  for (const auto& [name, dim] : c.search_space) {
    if (dim.kind != SearchDim::Kind::kChoice) continue;
    const toml::node* space = top->Use("search_space");
    const toml::table* table = space != nullptr ? space->as_table() : nullptr;
    const toml::node* entry = table != nullptr ? table->get(name) : nullptr;
    if (entry == nullptr || entry->as_table() == nullptr) {
      return r->Error("kind",
                      "pb2 explores continuous hyperparameters only; " + name + " is a choice");
    }
    TomlTableReader d(*entry->as_table(), "search_space." + name, ctx.origin);
    return d.Error("type",
                   "is a choice: policy.kind = \"pb2\" explores continuous "
                   "hyperparameters only (uniform, log_uniform)");
  }
  if (c.policy.resample == Resample::kTpe) {
    return r->Error("resample",
                    "does not apply to pb2, whose GP bandit chooses the explored "
                    "hyperparameters");
  }
  return Status::OK();
}

Status ReadPolicyTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* policy, top->Table("policy"));
  if (policy == nullptr) return Status::OK();
  PolicyConfig& p = c->policy;
  TomlTableReader r(*policy, "policy", ctx.origin);
  CKPT_RETURN_IF_ERROR(r.Enum("kind", kPolicyKinds, &PolicyKindName, &p.kind));
  CKPT_RETURN_IF_ERROR(r.Enum("mode", kPolicyModes, &PolicyModeName, &p.mode));
  CKPT_RETURN_IF_ERROR(r.Double("quantile", 0, 0.5, &p.quantile));
  CKPT_RETURN_IF_ERROR(r.Doubles("perturb", &p.perturb));
  for (double f : p.perturb) {
    if (!(f > 0) || !std::isfinite(f)) return r.Error("perturb", "factors must be positive");
  }
  if (p.perturb.empty()) return r.Error("perturb", "must list at least one factor");
  CKPT_RETURN_IF_ERROR(r.Double("resample_probability", 0, 1, &p.resample_probability));
  CKPT_RETURN_IF_ERROR(r.Int("ready_intervals", 1, 1000000, &p.ready_intervals));
  CKPT_RETURN_IF_ERROR(r.Int("eta", 2, 1000, &p.eta));
  CKPT_RETURN_IF_ERROR(r.Int("min_intervals", 1, 1000000, &p.min_intervals));
  CKPT_RETURN_IF_ERROR(r.Int("brackets", 0, 64, &p.brackets));
  CKPT_RETURN_IF_ERROR(r.Bool("median_stopping", &p.median_stopping));
  CKPT_RETURN_IF_ERROR(r.Int("median_grace_intervals", 1, 1000000, &p.median_grace_intervals));
  CKPT_RETURN_IF_ERROR(r.Enum("resample", kResamples, &ResampleName, &p.resample));
  CKPT_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  if (p.kind == PolicyKind::kPb2) CKPT_RETURN_IF_ERROR(CheckPb2(top, &r, ctx, *c));
  if (p.resample == Resample::kTpe && p.kind != PolicyKind::kPbt && p.mode == PolicyMode::kSync) {
    return r.Error("resample", std::string("\"tpe\" proposes a member's hyperparameters when it ") +
                                   "starts, from the results before it; with " +
                                   PolicyKindName(p.kind) +
                                   " in mode = \"sync\" every member starts before any result: "
                                   "use mode = \"async\"");
  }
  if (p.median_stopping && p.kind != PolicyKind::kRandom &&
      p.kind != PolicyKind::kSuccessiveHalving) {
    return r.Error("median_stopping", std::string("applies to random search and ") +
                                          "successive_halving, not " + PolicyKindName(p.kind));
  }
  if (p.kind == PolicyKind::kHyperband) CKPT_RETURN_IF_ERROR(CheckHyperband(&r, *c));
  return Status::OK();
}

// [[devices]]; without it, one default device.
Status ReadDevicesArray(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_RETURN_IF_ERROR(ReadDevices(top, ctx.origin, "cpu", &c->devices));
  if (c->devices.empty()) c->devices.push_back(DeviceConfig{});
  return Status::OK();
}

Status ReadSupervisionTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* sup, top->Table("supervision"));
  if (sup == nullptr) return Status::OK();
  TomlTableReader r(*sup, "supervision", ctx.origin);
  CKPT_RETURN_IF_ERROR(ReadSupervision(&r, &c->supervision));
  CKPT_RETURN_IF_ERROR(r.Seconds("grace_s", 0, 86400, &c->supervision.grace));
  CKPT_RETURN_IF_ERROR(
      r.Seconds("heartbeat_timeout_s", 0.1, 86400, &c->supervision.heartbeat_timeout));
  return r.CheckNoUnknownKeys();
}

Status ReadWorkersTable(TomlTableReader* top, const ParseContext& ctx, ExperimentConfig* c) {
  CKPT_ASSIGN_OR_RETURN(const toml::table* workers, top->Table("workers"));
  if (workers == nullptr) return Status::OK();
  TomlTableReader r(*workers, "workers", ctx.origin);
  CKPT_RETURN_IF_ERROR(ReadRemoteWorkers(&r, &c->workers));
  return r.CheckNoUnknownKeys();
}

// In this order: a part may depend on those before it ([task] and
// [population] on the data's targets, the hyperparameter check on both tables),
// and the first error found is the one reported.
constexpr PartReader kPartReaders[] = {
    ReadTopLevelKeys,             // name, seed, store, metrics
    ReadModelTable,               // [model]
    ReadDataTable,                // [data]
    ReadTaskTable,                // [task]
    CheckModelFitsData,           // [model] against [data]
    ReadPopulationTable,          // [population]
    ReadSearchSpaceTable,         // [search_space]
    ReadHparamsTable,             // [hparams]
    CheckHparamsSearchedOrFixed,  // [search_space] against [hparams]
    ReadPolicyTable,              // [policy]
    ReadDevicesArray,             // [[devices]]
    ReadSupervisionTable,         // [supervision]
    ReadWorkersTable,             // [workers]
};

}  // namespace

StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& toml_text,
                                                 const std::string& origin, FileChecks files) {
  DataShape data;
  const ParseContext ctx{origin, files == FileChecks::kCheck, &data};
  CKPT_ASSIGN_OR_RETURN(toml::table doc, ParseToml(toml_text, origin));
  ExperimentConfig c;
  c.source = toml_text;
  TomlTableReader top(doc, "", origin);
  for (PartReader read : kPartReaders) CKPT_RETURN_IF_ERROR(read(&top, ctx, &c));
  CKPT_RETURN_IF_ERROR(top.CheckNoUnknownKeys());
  return c;
}

std::string EncodeExperimentRecord(const ExperimentConfig& config) {
  return nlohmann::json{{"toml", config.source}}.dump();
}

StatusOr<std::string> DecodeExperimentToml(std::string_view config_json, const std::string& exp) {
  const auto j = nlohmann::json::parse(config_json.begin(), config_json.end(), nullptr,
                                       /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return Status::Corruption("experiment " + exp + ": its configuration record is not JSON");
  }
  auto toml = j.is_object() ? j.find("toml") : j.end();
  if (!j.is_object() || toml == j.end() || !toml->is_string()) {
    return Status::NotFound("experiment " + exp + " carries no TOML configuration");
  }
  return toml->get<std::string>();
}

StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    if (!FileExists(path)) return Status::NotFound("experiment file " + path + " does not exist");
    return Status::IOError("cannot read experiment file " + path);
  }
  std::string text;
  if (!ReadBoundedToml(in, &text)) return Status::IOError("reading experiment file " + path);
  return ParseExperimentConfig(text, path);
}

Status CheckModelFileAllowed(const std::string& model_spec,
                             const std::vector<std::string>& allowed_dirs,
                             const std::string& origin) {
  namespace fs = std::filesystem;
  if (model_spec.compare(0, format::kTorchScriptPrefix.size(), format::kTorchScriptPrefix) != 0) {
    return Status::OK();
  }
  const std::string path = model_spec.substr(format::kTorchScriptPrefix.size());
  std::string dirs;
  std::vector<fs::path> resolved_dirs;
  for (const auto& d : allowed_dirs) {
    std::error_code ec;
    fs::path r = fs::weakly_canonical(fs::absolute(d, ec), ec);
    if (ec) continue;  // a directory that cannot be resolved admits nothing
    dirs += (dirs.empty() ? "" : ", ") + r.string();
    resolved_dirs.push_back(std::move(r));
  }
  if (dirs.empty()) dirs = "none";
  const std::string refused =
      origin + ": model.spec: the service loads TorchScript files only from allowed_model_dirs [" +
      dirs + "] (its configuration file sets them); ";
  std::error_code ec;
  const fs::path resolved = fs::weakly_canonical(fs::absolute(path, ec), ec);
  if (ec) {
    return Status::InvalidArgument(refused + "'" + path + "' cannot be resolved: " + ec.message());
  }
  if (!fs::path(path).is_absolute()) {
    return Status::InvalidArgument(refused + "'" + path +
                                   "' is a relative path (from the scheduler's directory it "
                                   "resolves to " +
                                   resolved.string() + "); name the file by its absolute path");
  }
  bool inside = false;
  for (const auto& d : resolved_dirs) {
    auto [dit, rit] = std::mismatch(d.begin(), d.end(), resolved.begin(), resolved.end());
    // Inside, not the directory itself; a trailing "" element of "dir/" matches anything.
    if ((dit == d.end() || (std::next(dit) == d.end() && dit->empty())) && rit != resolved.end()) {
      inside = true;
      break;
    }
  }
  if (!inside) {
    return Status::InvalidArgument(refused + "'" + path + "' resolves to " + resolved.string() +
                                   ", which is outside them");
  }
  if (fs::path(path) != resolved) {
    // The worker opens the path as written: a link or ".." in it could be
    // changed to lead elsewhere between this check and that open.
    return Status::InvalidArgument(refused + "'" + path + "' resolves to " + resolved.string() +
                                   " through a symbolic link or \"..\"; name the file by that "
                                   "resolved path");
  }
  return Status::OK();
}

}  // namespace ckpt::records
