// ExperimentConfig: one experiment, as written in its TOML file.
//
//   name = "fashion-mnist-pbt"
//   seed = 42
//   store = "var"                     # embedded store directory
//   metrics = "127.0.0.1:9464"        # "" = no metrics endpoint
//   [model]      spec = "lenet5"; optimizer = "sgd"
//   [data]       dataset = "fashion-mnist"; path = "..."; batch_size = 64;
//                eval_size = 2000 (0: no validation, every score is NaN);
//                format = "idx" | "safetensors" | "npz" (path: the IDX directory,
//                or the tensor file, mapped and checked completely here:
//                ckpt/format/tensor_dataset.h); val_size = 0; classes = 0;
//                mean = [...]; std = [...]; augment = ["random_crop:4", "hflip"]
//   [task]       loss = "cross_entropy" | "mse"; metric = "accuracy" | "neg_mse" | "r2"
//                (default: those of the data's targets, ckpt/format/task.h)
//   [population] size = 30; steps_per_interval = 200; intervals = 20;
//                target_metric = 0.92 (in the metric's range; unset: none); max_wall_s = 0
//   [search_space.lr] type = "log_uniform"; min = 1e-3; max = 0.3
//                (names: the optimizer's, ckpt/model/hparams.h, and "dropout", every
//                dropout layer's probability, in [0, 1): format::kDropoutHparam)
//   [policy]     kind = "pbt"; mode = "sync"; quantile = 0.2; perturb = [0.8, 1.2];
//                resample_probability = 0.25; ready_intervals = 1; eta = 3;
//                min_intervals = 1; brackets = 0; median_stopping = false;
//                median_grace_intervals = 1; resample = "uniform" | "tpe"
//                (kind: "pbt", "random", "successive_halving", "hyperband",
//                "pb2"; README "Search policies"; "pb2" searches continuous
//                dimensions only, and takes PBT's quantile and ready_intervals)
//   [[devices]]  device = "cpu"; slots = 2; fusion = "auto"; fusion_width = 8;
//                intra_op_threads = 1; count = 1; tf32 = false
//   (model.spec = "torchscript:PATH": the file must exist and be a TorchScript
//    archive; checked here, before anything starts)
//   [supervision] restart_backoff_s = 10; max_restart_backoff_s = 300;
//                healthy_reset_s = 600; max_restarts = 10; max_member_failures = 3;
//                grace_s = 10
//   [workers]    listen = ""; secret_file = ""; local = true
//                (workers on other hosts over TCP: see RemoteWorkersConfig)
//
// Every key is checked: an unknown key, a wrong type or a bad value is an
// InvalidArgument naming the key and its line ("population.size (line 7): must
// be at least 1"). Thread-safety: a value.
#ifndef CKPT_RECORDS_CONFIG_H_
#define CKPT_RECORDS_CONFIG_H_

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ckpt/base/status.h"
#include "ckpt/format/optimizer.h"
#include "ckpt/format/task.h"
#include "ckpt/format/tensor_dataset.h"
#include "ckpt/ipc/fusion_mode.h"

namespace ckpt::records {

struct SearchDim {
  enum class Kind { kLogUniform, kUniform, kChoice };
  Kind kind = Kind::kUniform;
  double min = 0;
  double max = 0;
  std::vector<double> values;  // kChoice
};

enum class PolicyKind { kPbt, kRandom, kSuccessiveHalving, kHyperband, kPb2 };
inline constexpr std::array<PolicyKind, 5> kPolicyKinds = {
    PolicyKind::kPbt, PolicyKind::kRandom, PolicyKind::kSuccessiveHalving, PolicyKind::kHyperband,
    PolicyKind::kPb2};
// "pbt", "random", "successive_halving", "hyperband", "pb2".
const char* PolicyKindName(PolicyKind kind);

// kSync: generations (every active member finishes interval g before the
// decisions of g); kAsync: a member is decided on when its own interval ends.
enum class PolicyMode { kSync, kAsync };
inline constexpr std::array<PolicyMode, 2> kPolicyModes = {PolicyMode::kSync, PolicyMode::kAsync};
const char* PolicyModeName(PolicyMode mode);  // "sync", "async"

// Where new and resampled hyperparameters come from: kUniform draws from the
// search space; kTpe proposes by TPE over the results so far (Bergstra et al.
// 2011): a member's first hyperparameters (random search, successive halving,
// HyperBand, async) and PBT's resampled ones.
enum class Resample { kUniform, kTpe };
inline constexpr std::array<Resample, 2> kResamples = {Resample::kUniform, Resample::kTpe};
const char* ResampleName(Resample r);  // "uniform", "tpe"

struct PolicyConfig {
  // Default: PBT.
  PolicyKind kind = PolicyKind::kPbt;
  // Default: synchronous.
  PolicyMode mode = PolicyMode::kSync;
  // PBT: the bottom `quantile` copies from the top `quantile`. Default: 0.2.
  double quantile = 0.2;
  // PBT explore: multiply each hyperparameter by one of these. Default: 0.8, 1.2.
  std::vector<double> perturb = {0.8, 1.2};
  // PBT explore: resample from the search space instead. Default: 0.25.
  double resample_probability = 0.25;
  // PBT: a member is ready for exploit after this many intervals since its
  // last exploit. Default: 1.
  int ready_intervals = 1;
  // Successive halving: keep the top 1/eta at each rung. Default: 3.
  int eta = 3;
  // Successive halving: first rung after this many intervals; HyperBand: the
  // smallest budget (r_min) of its most aggressive bracket. Default: 1.
  int min_intervals = 1;
  // HyperBand: how many of its brackets run, from the most aggressive (s_max)
  // down; 0 = all that fit (MaxHyperbandBrackets). Default: 0.
  int brackets = 0;
  // Random search and successive halving: the median stopping rule (Golovin
  // et al. 2017): a member whose best score up to interval t is below the
  // median of the others' running averages up to t is stopped. Default: false.
  bool median_stopping = false;
  // Median stopping: no member is stopped before this many intervals. Default: 1.
  int median_grace_intervals = 1;
  // Default: kUniform.
  Resample resample = Resample::kUniform;
};

// HyperBand's brackets that fit `intervals` (Li et al. 2018, R = intervals in
// units of `min_intervals`): s_max + 1, with s_max the largest s such that
// min_intervals * eta^s <= intervals; 0 when min_intervals > intervals.
int MaxHyperbandBrackets(int intervals, int min_intervals, int eta);

struct DeviceConfig {
  // "cpu", "cuda:N" or "auto" (every visible GPU, else the CPU). Default: "cpu".
  std::string device = "cpu";
  // Workers for this entry: several "cpu" workers stand in for several GPUs. Default: 1.
  int count = 1;
  // Members trained at once per worker. Default: 2.
  int slots = 2;
  // Default: kAuto.
  ipc::FusionMode fusion = ipc::FusionMode::kAuto;
  // K members per fused group. Default: 8.
  int fusion_width = 8;
  // Intra-op threads per slot. Default: 1.
  int intra_op_threads = 1;
  // On a GPU: float32 convolutions and matrix products may run in TF32
  // (model::TrainerOptions::allow_tf32). Default: false.
  bool tf32 = false;
};

// Bytes of each shared-memory ring (request and result) per worker when
// nothing sets them. A ring holds records up to half its size whole and larger
// ones in fragments. What a ring costs is not its size but its window
// (ipc::ChannelOptions::min_window_bytes): each side writes within the start
// of its send ring, sized to four of the largest records it has sent, so the
// rings of LeNet-5 (0.5 MB states) hold 2 MiB each, and a 64 MiB ring carries
// states up to 16 MB whole, four at a time, when a model has them.
inline constexpr size_t kDefaultRingBytes = size_t{64} << 20;

// How workers and members are supervised: the [supervision] table of an
// experiment file, the [workers] table (and grace_s) of the service file, and
// SchedulerOptions::supervision. One struct for all three.
struct SupervisionOptions {
  // First restart delay of a dead worker, doubling per restart. Default: 10 s.
  std::chrono::milliseconds restart_backoff{10000};
  // Cap of that delay. Default: 300 s. REQUIRES: >= restart_backoff.
  std::chrono::milliseconds max_restart_backoff{300000};
  // Uptime after which a worker's backoff starts again from the first delay. Default: 600 s.
  std::chrono::milliseconds healthy_reset{600000};
  // Restarts of one worker before it is given up on. Default: 10.
  int max_restarts = 10;
  // FAILED intervals in a row before a member is stopped. Default: 3.
  int max_member_failures = 3;
  // On Ctrl-C / SIGTERM, how long in-flight intervals may finish before they
  // are abandoned (they rerun from committed heads). Default: 10 s.
  std::chrono::milliseconds grace{10000};
  // A worker silent this long is declared hung and restarted. Default: 10 s.
  std::chrono::milliseconds heartbeat_timeout{10000};
};

// Workers that connect over TCP (ckpt-worker --connect) besides, or instead
// of, the spawned local ones: the [workers] table of an experiment file and of
// the service file; `ckpt-scheduler run --listen/--secret-file/
// --no-local-workers` override it.
struct RemoteWorkersConfig {
  // "HOST:PORT" to listen on for workers (port 0: an ephemeral one, logged and
  // written to <store>/workers.addr); "" = none. 127.0.0.1 keeps it to this
  // host; a cluster needs an address the compute nodes reach. Default: "".
  std::string listen;
  // The experiment's secret, which connecting workers must prove they hold
  // (mode 0600, owned by this user; created so when absent). Required when
  // listen is set. Default: "".
  std::string secret_file;
  // Spawn the [[devices]] workers on this host (shared memory); false: only
  // connected workers train (REQUIRES: listen). Default: true.
  bool local = true;
  // Connected workers at once; one more is closed at once (logged). In
  // [1, 4096]. Default: 64.
  int max_remote = 64;
  // Bytes that every connected worker's received messages may hold at once,
  // all of them together (ckpt::ipc::ReceiveBudget): at least the largest
  // RESULT (a state plus 1 MiB), or such a RESULT is refused and its worker
  // lost. Key `remote_memory_mib`, in [16, 1048576]. Default: 2 GiB.
  uint64_t remote_memory_bytes = uint64_t{2048} << 20;
  // The most task slots one connected worker is given, whatever its HELLO
  // offers (a HELLO offering more is clamped, logged and counted). In
  // [1, 256]. Default: 64.
  int max_remote_slots = 64;
  // A connected worker's task that has not answered within
  // task_timeout_factor x the median interval seen so far (the training
  // intervals any worker finished, the last 255) plus task_timeout_floor
  // (with none seen yet: task_timeout_floor x (task_timeout_factor + 1)) is
  // overdue: the worker is lost (logged, counted), its intervals go to other
  // workers and their members are charged as for any lost worker. Factor in
  // [1, 1000], default 10; floor (key `task_timeout_floor_s`) in [0.1, 86400],
  // default 60 s.
  double task_timeout_factor = 10;
  std::chrono::milliseconds task_timeout_floor{60000};
};

// Limits of an experiment file (docs/LIMITS.md); past each, parsing fails
// with an InvalidArgument naming the key. The file itself is at most 1 MiB.
// Members per experiment ([population] size): every member's records are
// created when the experiment is submitted.
inline constexpr int kMaxPopulation = 10000;
// Experiment names are store ids (letters, digits, '-', '_', '.').
inline constexpr size_t kMaxExperimentNameBytes = 128;
// model.spec (a name, torchscript:PATH or a JSON layer list): it is sent to
// every worker inside CONFIGURE, whose JSON is at most 1 MiB.
inline constexpr size_t kMaxModelSpecBytes = 65536;

struct ExperimentConfig {
  std::string name;
  uint64_t seed = 0;
  std::string store = "var";
  // Prometheus endpoint of `ckpt-scheduler run`, numeric IPv4 "host:port";
  // "" = none. A busy port costs a warning, not the run. Default: 127.0.0.1:9464.
  std::string metrics = "127.0.0.1:9464";
  std::string model_spec = "lenet5";
  // SHA-256 (hex) of a "torchscript:PATH" model's file as the scheduler read
  // it when the experiment was submitted (records::ModelFileSha256), sent in
  // CONFIGURE so that every worker loads those bytes or refuses. Not parsed:
  // the scheduler sets it; "" for other models.
  std::string model_sha256;
  format::OptimizerKind optimizer = format::OptimizerKind::kSgd;
  std::string dataset = "fashion-mnist";
  std::string dataset_path = "/usr/share/datasets/fashion-mnist";
  // How dataset_path is read (a tensor file's path is made absolute here
  // when the files are checked).
  format::DatasetFormat data_format = format::DatasetFormat::kIdx;
  // A tensor file's val_size, classes, mean and std. Its format and path are
  // data_format and dataset_path, held there alone: TensorData() gives the
  // options whole, as TensorDataset::Open and CONFIGURE take them.
  format::TensorDatasetOptions tensor_file;
  format::TensorDatasetOptions TensorData() const {
    format::TensorDatasetOptions t = tensor_file;
    t.format = data_format;
    t.path = dataset_path;
    return t;
  }
  format::Augmentation augment;
  // The data's target kind (class labels for IDX).
  format::TargetKind target = format::TargetKind::kClasses;
  // [task]; unset = the target's default.
  std::optional<format::LossKind> loss;
  std::optional<format::MetricKind> metric;
  // The metric every score of the experiment is: [task] metric, else the
  // target's default (accuracy for class labels, neg_mse for float targets).
  format::MetricKind Metric() const { return metric.value_or(format::DefaultMetric(target)); }
  int batch_size = 64;
  int eval_size = 2000;
  int population = 0;
  int64_t steps_per_interval = 100;
  int intervals = 10;
  // Training stops when the best validation score reaches it (>=); in the
  // metric's range (accuracy [0, 1], neg_mse <= 0, r2 <= 1). Unset: none.
  std::optional<double> target_metric;
  double max_wall_s = 0;  // 0 = none
  std::map<std::string, SearchDim> search_space;
  std::map<std::string, double> fixed_hparams;  // [hparams] constants
  PolicyConfig policy;
  std::vector<DeviceConfig> devices;
  SupervisionOptions supervision;
  RemoteWorkersConfig workers;
  // The file's text, kept in the store with the experiment.
  std::string source;
};

// Whether parsing also checks the files a configuration names (the IDX
// directory, the tensor file, mapped and validated whole, and a TorchScript
// file) and a layer list or built-in model against the data (the shapes
// through it, and its outputs against the classes or targets per sample, as
// the worker checks them): the scheduler does, before anything starts; a
// reader of a stored configuration (ckpt-tool, perhaps on another host) does
// not.
enum class FileChecks { kCheck, kSkip };

// Parses and validates a TOML document. `origin` names it in errors. With
// FileChecks::kSkip, `target` stays kClasses and [task] is not checked
// against the data.
StatusOr<ExperimentConfig> ParseExperimentConfig(const std::string& toml_text,
                                                 const std::string& origin,
                                                 FileChecks files = FileChecks::kCheck);
// Reads and parses a file; NotFound / IOError naming the path.
StatusOr<ExperimentConfig> LoadExperimentConfig(const std::string& path);

// The service's rule for submitted experiments (ServiceConfig's
// allowed_model_dirs): a "torchscript:PATH" model must name, by an absolute
// path with no symbolic link or ".." in it, a file inside one of
// `allowed_dirs` (each resolved with realpath; a directory named in the list
// may itself be reached through links). The file is not opened here
// (ParseExperimentConfig does that); the path alone is judged, so that a
// worker that later opens the same path (with O_NOFOLLOW) reaches the same
// file unless someone who may write inside an allowed directory changes it.
// OK for any other model spec. InvalidArgument naming `origin`, the file, its
// resolved path and the allowed directories otherwise.
Status CheckModelFileAllowed(const std::string& model_spec,
                             const std::vector<std::string>& allowed_dirs,
                             const std::string& origin);

// The experiment record's configuration (store::ExperimentInfo::config_json):
// {"toml": SOURCE}, the file's text as submitted.
std::string EncodeExperimentRecord(const ExperimentConfig& config);
// The TOML text of a stored configuration; NotFound when it holds none (an
// experiment created by something other than the scheduler), Corruption
// naming `exp` when it is not JSON.
StatusOr<std::string> DecodeExperimentToml(std::string_view config_json, const std::string& exp);

}  // namespace ckpt::records

#endif  // CKPT_RECORDS_CONFIG_H_
