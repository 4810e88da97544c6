#include "ckpt/scheduler/scheduler.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cctype>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <memory>
#include <mutex>
#include <set>

#include "ckpt/format/checksum.h"
#include "ckpt/ipc/channel.h"
#include "ckpt/scheduler/policy.h"
#include "ckpt/store/store.h"
#include "control_target.h"
#include "control_server.h"
#include "worker_handle.h"

namespace ckpt::scheduler {
namespace {

namespace asio = boost::asio;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class MemberStatus { kIdle, kQueued, kRunning, kDone, kStopped, kFailed };

const char* StatusName(MemberStatus s) {
  switch (s) {
    case MemberStatus::kIdle:
    case MemberStatus::kQueued:
    case MemberStatus::kRunning: return "running";
    case MemberStatus::kDone: return "done";
    case MemberStatus::kStopped: return "stopped";
    case MemberStatus::kFailed: return "failed";
  }
  return "?";
}

struct Member {
  std::string name;
  int index = 0;
  int interval = 0;      // intervals trained
  int last_exploit = 0;  // interval at the last exploit
  double score = std::nan("");  // own score at `interval`
  HParams hparams;
  int64_t version = 0;
  int64_t step = 0;
  int failures = 0;
  double test_acc = -1;
  MemberStatus status = MemberStatus::kIdle;

  bool active() const { return status != MemberStatus::kStopped && status != MemberStatus::kFailed; }
};

struct Pending {
  int member;
  bool eval;
};

enum class Phase { kTraining, kFinalEval, kDone };

struct Experiment {
  ExperimentConfig config;
  std::unique_ptr<Policy> policy;
  std::vector<Member> members;
  std::map<std::string, int> by_name;
  std::deque<Pending> ready;
  Phase phase = Phase::kTraining;
  bool training_closed = false;  // target reached / wall time: no new intervals
  int generation = 0;
  int in_flight = 0;
  int evals_pending = 0;
  int64_t exploits = 0;
  int64_t samples = 0;
  int64_t intervals_this_run = 0;
  Clock::time_point start = Clock::now();
  Clock::time_point first_dispatch{};
  Clock::time_point first_result{};
  Clock::time_point last_result{};
  std::string status = "running";
};

struct WorkerSlot {
  WorkerSpec spec;
  std::unique_ptr<WorkerHandle> handle;
  uint64_t incarnation = 0;
  bool ready = false;
  int capacity = 0;
  int busy = 0;
  int restarts = 0;
  milliseconds backoff{0};
  Clock::time_point started;
  bool given_up = false;
  std::unique_ptr<asio::steady_timer> restart_timer;
  double samples_per_s = 0;
  std::string mode;
  int64_t peak_rss_total = 0;  // over this slot's incarnations
};

std::string MemberName(int i, int population) {
  int width = std::max(3, static_cast<int>(std::to_string(population - 1).size()));
  std::string n = std::to_string(i);
  return "m" + std::string(width - n.size(), '0') + n;
}

std::string FindWorkerBinary(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* env = std::getenv("CKPT_WORKER"); env != nullptr && *env) return env;
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    for (const char* rel : {"ckpt-worker", "../bin/ckpt-worker", "../lib/ckpt/ckpt-worker"}) {
      auto p = self.parent_path() / rel;
      if (access(p.c_str(), X_OK) == 0) return std::filesystem::weakly_canonical(p).string();
    }
  }
  return "ckpt-worker";
}

std::vector<DeviceConfig> ExpandDevices(const std::vector<DeviceConfig>& in) {
  std::vector<DeviceConfig> out;
  for (const auto& d : in) {
    std::vector<std::string> names;
    if (d.device == "auto") {
      std::error_code ec;
      int gpus = 0;
      for (auto& e : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
        (void)e;
        ++gpus;
      }
      if (gpus == 0) names.push_back("cpu");
      for (int g = 0; g < gpus; ++g) names.push_back("cuda:" + std::to_string(g));
    } else {
      names.push_back(d.device);
    }
    for (const auto& n : names) {
      for (int c = 0; c < d.count; ++c) {
        DeviceConfig one = d;
        one.device = n;
        one.count = 1;
        out.push_back(one);
      }
    }
  }
  return out;
}

std::string FormatDuration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  char buf[32];
  if (s < 60) {
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  } else if (s < 3600) {
    std::snprintf(buf, sizeof buf, "%dm%02ds", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%dh%02dm", static_cast<int>(s) / 3600,
                  static_cast<int>(s) % 3600 / 60);
  }
  return buf;
}

// "ckpt-" + 10 hex digits (the default instance) + "-w" + worker index.
bool IsDefaultSegmentName(const std::string& name) {
  constexpr size_t kHex = 10;
  if (name.size() < 5 + kHex + 3 || name.compare(0, 5, "ckpt-") != 0) return false;
  for (size_t i = 5; i < 5 + kHex; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  if (name.compare(5 + kHex, 2, "-w") != 0) return false;
  for (size_t i = 5 + kHex + 2; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

class SchedulerImpl : public Scheduler, public ControlTarget {
 public:
  SchedulerImpl(const SchedulerOptions& options, std::unique_ptr<store::Store> store)
      : options_(options), store_(std::move(store)), signals_(io_), sigchld_(io_, SIGCHLD),
        tick_(io_), grace_timer_(io_) {
    if (options_.instance.empty()) {
      std::string abs = std::filesystem::absolute(options_.store_path).lexically_normal().string();
      options_.instance = "ckpt-" + HexU64(Xxh3_64(abs.data(), abs.size())).substr(0, 10);
    }
    options_.worker_binary = FindWorkerBinary(options_.worker_binary);
    progress_tty_ = options_.progress != nullptr && isatty(fileno(options_.progress));
  }

  ~SchedulerImpl() override {
    for (auto& w : workers_) {
      if (w->handle) w->handle->Stop(false, milliseconds(0));
    }
  }

  store::Store* store() override { return store_.get(); }

  Status Submit(const ExperimentConfig& config) override;
  Status Run() override;
  void RequestStop() override {
    asio::post(io_, [this] { BeginStop("stop requested"); });
  }
  StatusOr<ExperimentSummary> Summary(const std::string& exp) override;
  // ControlTarget (event loop thread).
  boost::asio::io_context& io() override { return io_; }
  StatusOr<std::string> SubmitToml(const std::string& toml, const std::string& origin) override;
  std::vector<ExperimentSummary> ListExperiments() override;
  StatusOr<ExperimentSummary> ExperimentStatus(const std::string& exp) override {
    return Summary(exp);
  }
  std::vector<WorkerStatus> DeviceStatus() override;
  Status Pause(const std::string& exp) override;
  Status Resume(const std::string& exp) override;
  Status Stop(const std::string& exp) override;
  StatusOr<int64_t> Restore(const std::string& exp, const std::string& member,
                            int64_t version) override;
  Status Pin(const std::string& exp, const std::string& member, int64_t version) override {
    if (Find(exp) == nullptr) return Status::NotFound("experiment " + exp);
    return store_->Pin(exp, member, version);
  }
  Status Unpin(const std::string& exp, const std::string& member, int64_t version) override {
    if (Find(exp) == nullptr) return Status::NotFound("experiment " + exp);
    return store_->Unpin(exp, member, version);
  }
  void Shutdown(const std::string& why) override { BeginStop(why); }

  int64_t WorkersPeakRssBytes() const override {
    int64_t sum = 0;
    for (const auto& w : workers_) sum += w->peak_rss_total;
    return sum;
  }

 private:
  Status LoadMembers(Experiment* e);
  StatusOr<ipc::Configure> ConfigureFor(const std::string& exp);
  void StartWorker(size_t slot);
  void OnWorkerEvent(size_t slot, uint64_t incarnation, WorkerEvent ev);
  void OnLost(size_t slot, const std::string& reason);
  void ReapChildren();
  void Dispatch();
  void AfterInterval(Experiment* e, Member* m);
  void MaybeAdvance(Experiment* e);
  void ApplyDecisions(Experiment* e, const std::map<std::string, Decision>& decisions);
  void Enqueue(Experiment* e, int member, bool eval, bool front = false);
  void StartFinalEval(Experiment* e);
  void FinishExperiment(Experiment* e);
  void BeginStop(const std::string& why);
  void MaybeFinishStop();
  void ShutdownWorkers(bool graceful);
  void Tick();
  void OnReload();
  void PrintProgress(bool force_line);
  void Log(const std::string& line);
  std::string StateJson(const Member& m) const;
  Experiment* Find(const std::string& id) {
    auto it = experiments_.find(id);
    return it == experiments_.end() ? nullptr : it->second.get();
  }
  bool AllEnded() const {
    for (const auto& [id, e] : experiments_) {
      if (e->phase != Phase::kDone) return false;
    }
    return true;
  }

  SchedulerOptions options_;
  std::unique_ptr<store::Store> store_;
  asio::io_context io_;
  asio::signal_set signals_;
  asio::signal_set sigchld_;
  asio::steady_timer tick_;
  asio::steady_timer grace_timer_;
  std::vector<std::unique_ptr<WorkerSlot>> workers_;
  std::map<std::string, std::unique_ptr<Experiment>> experiments_;
  std::mutex configs_mu_;
  std::map<std::string, ExperimentConfig> configs_;  // GUARDED_BY(configs_mu_)
  std::vector<std::string> order_;
  size_t rr_ = 0;
  uint64_t next_task_ = 1;
  bool stopping_ = false;
  bool finished_ = false;
  Status run_status_;
  bool progress_tty_ = false;
  std::unique_ptr<ControlServer> control_;
  asio::signal_set sighup_{io_};
  Clock::time_point last_line_ = Clock::now() - std::chrono::hours(1);
};

std::string SchedulerImpl::StateJson(const Member& m) const {
  return json{{"interval", m.interval},
              {"last_exploit", m.last_exploit},
              {"score", std::isfinite(m.score) ? m.score : -1.0},
              {"status", StatusName(m.status)},
              {"failures", m.failures}}
      .dump();
}

Status SchedulerImpl::Submit(const ExperimentConfig& config) {
  auto e = std::make_unique<Experiment>();
  e->config = config;
  CKPT_ASSIGN_OR_RETURN(e->policy, Policy::Create(config));
  const std::string& id = config.name;
  if (experiments_.count(id)) return Status::AlreadyExists("experiment " + id + " already submitted");
  auto existing = store_->GetExperiment(id);
  if (existing.ok()) {
    json stored = json::parse(existing->config_json, nullptr, false);
    if (!stored.is_object() || stored.value("toml", "") != config.source) {
      return Status::InvalidArgument("experiment " + id + " exists in store " +
                                     options_.store_path +
                                     " with a different configuration; give it another name or "
                                     "use another store");
    }
    CKPT_RETURN_IF_ERROR(LoadMembers(e.get()));
    if (existing->status == "done" || existing->status == "stopped") {
      e->phase = Phase::kDone;
      e->status = existing->status;
    } else if (existing->status == "paused") {
      e->status = "paused";
      Log("experiment " + id + " is paused");
    } else {
      Log("resuming experiment " + id + " from " + options_.store_path);
    }
  } else if (existing.status().IsNotFound()) {
    CKPT_RETURN_IF_ERROR(store_->CreateExperiment(id, json{{"toml", config.source}}.dump()));
    std::map<std::string, std::map<std::string, double>> hp;
    for (int i = 0; i < config.population; ++i) {
      hp[MemberName(i, config.population)] = SampleInitial(config, i);
    }
    CKPT_RETURN_IF_ERROR(store_->CreateMembers(id, hp));
    CKPT_RETURN_IF_ERROR(LoadMembers(e.get()));
  } else {
    return existing.status();
  }
  if (e->phase != Phase::kDone && e->status == "running") {
    CKPT_RETURN_IF_ERROR(store_->SetExperimentStatus(id, "running"));
  }
  e->start = Clock::now();
  order_.push_back(id);
  {
    std::lock_guard<std::mutex> lock(configs_mu_);
    configs_[id] = config;
  }
  Experiment* raw = e.get();
  experiments_[id] = std::move(e);
  if (raw->phase == Phase::kDone) return Status::OK();
  // Queue what can run now.
  MaybeAdvance(raw);
  return Status::OK();
}

// Derives each member's scheduling state from its head, its state record and
// its head manifest (the state record is written after the commit it follows,
// so the manifest wins when it is newer).
Status SchedulerImpl::LoadMembers(Experiment* e) {
  CKPT_ASSIGN_OR_RETURN(auto heads, store_->ListMembers(e->config.name));
  for (const auto& h : heads) {
    Member m;
    m.name = h.member;
    m.version = h.version;
    m.step = h.step;
    m.hparams = h.hparams;
    m.index = static_cast<int>(e->members.size());
    json st = json::parse(h.state, nullptr, false);
    std::string status = "running";
    if (st.is_object()) {
      m.interval = st.value("interval", 0);
      m.last_exploit = st.value("last_exploit", 0);
      double s = st.value("score", -1.0);
      m.score = s < 0 ? std::nan("") : s;
      m.failures = st.value("failures", 0);
      status = st.value("status", "running");
    }
    if (h.version > 0) {
      CKPT_ASSIGN_OR_RETURN(store::Manifest man, store_->GetManifest(e->config.name, h.member, h.version));
      if (man.reason == store::kReasonTrained) {
        auto it = man.metrics.find("interval");
        int iv = it == man.metrics.end() ? 0 : static_cast<int>(it->second);
        if (iv > m.interval) {
          m.interval = iv;
          m.score = man.score();
        }
      } else if (man.reason == store::kReasonExploit) {
        // An exploit always follows the member's own interval-`interval` result.
        m.last_exploit = m.interval;
      }
    }
    if (status == "stopped") m.status = MemberStatus::kStopped;
    else if (status == "failed") m.status = MemberStatus::kFailed;
    else if (m.interval >= e->config.intervals) m.status = MemberStatus::kDone;
    // Member index from its name keeps seeds stable.
    if (m.name.size() > 1) m.index = std::atoi(m.name.c_str() + 1);
    e->by_name[m.name] = static_cast<int>(e->members.size());
    e->members.push_back(std::move(m));
  }
  // Test accuracies of a finished experiment, from its final_eval event.
  auto events = store_->ListEvents(e->config.name, 0, 1 << 20);
  if (events.ok()) {
    for (const auto& ev : *events) {
      json j = json::parse(ev.json, nullptr, false);
      if (!j.is_object() || j.value("type", "") != "final_eval") continue;
      for (const auto& r : j.value("results", json::array())) {
        auto it = e->by_name.find(r.value("member", ""));
        if (it != e->by_name.end()) e->members[it->second].test_acc = r.value("test_acc", -1.0);
      }
    }
  }
  return Status::OK();
}

StatusOr<ipc::Configure> SchedulerImpl::ConfigureFor(const std::string& exp) {
  // Called from sender threads.
  std::lock_guard<std::mutex> lock(configs_mu_);
  auto it = configs_.find(exp);
  if (it == configs_.end()) return Status::NotFound("experiment " + exp + " is not known");
  const ExperimentConfig& c = it->second;
  ipc::Configure m;
  m.experiment = c.name;
  m.model_spec = c.model_spec;
  m.dataset = c.dataset;
  m.dataset_path = c.dataset_path;
  m.optimizer = c.optimizer;
  m.batch_size = c.batch_size;
  m.eval_size = c.eval_size;
  m.seed = c.seed;
  return m;
}

void SchedulerImpl::Log(const std::string& line) {
  if (options_.progress == nullptr) return;
  if (progress_tty_) std::fputs("\r\033[K", options_.progress);
  std::fprintf(options_.progress, "%s\n", line.c_str());
  std::fflush(options_.progress);
}

void SchedulerImpl::StartWorker(size_t i) {
  WorkerSlot& w = *workers_[i];
  const uint64_t inc = ++w.incarnation;
  auto h = WorkerHandle::Start(
      w.spec, store_.get(), [this](const std::string& exp) { return ConfigureFor(exp); },
      [this, i, inc](WorkerEvent ev) {
        asio::post(io_, [this, i, inc, ev = std::move(ev)]() mutable {
          OnWorkerEvent(i, inc, std::move(ev));
        });
      });
  w.started = Clock::now();
  if (!h.ok()) {
    Log("worker " + std::to_string(i) + " (" + w.spec.device.device + ") failed to start: " +
        h.status().ToString());
    OnLost(i, h.status().ToString());
    return;
  }
  w.handle = std::move(*h);
  w.ready = false;
  w.capacity = 0;
  w.busy = 0;
}

void SchedulerImpl::OnWorkerEvent(size_t i, uint64_t inc, WorkerEvent ev) {
  WorkerSlot& w = *workers_[i];
  const bool current = inc == w.incarnation && w.handle != nullptr;
  if (ev.kind == WorkerEvent::Kind::kLost) {
    if (current) OnLost(i, ev.reason);
    return;
  }
  if (ev.kind == WorkerEvent::Kind::kHello) {
    if (!current) return;
    w.ready = true;
    w.capacity = std::max(1, ev.hello.slots);
    w.mode = ev.hello.mode;
    Dispatch();
    return;
  }
  if (ev.kind == WorkerEvent::Kind::kStats) {
    if (current) {
      w.samples_per_s = ev.stats.samples_per_s;
      w.mode = ev.stats.mode;
    }
    return;
  }
  if (current) w.busy = std::max(0, w.busy - 1);
  Experiment* e = Find(ev.task.exp);
  if (e == nullptr) return;
  e->in_flight--;
  auto mit = e->by_name.find(ev.task.member);
  if (mit == e->by_name.end()) return;
  Member* m = &e->members[mit->second];
  switch (ev.kind) {
    case WorkerEvent::Kind::kCommitted:
      m->status = MemberStatus::kIdle;
      m->interval = ev.task.interval_after;
      m->version = ev.version;
      m->step = ev.result.step;
      m->score = ev.result.val_acc;
      m->failures = 0;
      e->samples += ev.result.samples;
      e->intervals_this_run++;
      e->last_result = Clock::now();
      if (e->first_result == Clock::time_point{}) e->first_result = e->last_result;
      if (options_.kill_point) options_.kill_point("scheduler.committed");
      AfterInterval(e, m);
      break;
    case WorkerEvent::Kind::kEvaluated:
      m->test_acc = ev.result.test_acc;
      if (--e->evals_pending == 0) FinishExperiment(e);
      break;
    case WorkerEvent::Kind::kCommitError:
    case WorkerEvent::Kind::kFailed: {
      const bool moved = ev.kind == WorkerEvent::Kind::kCommitError && ev.code == "Aborted";
      if (!ev.task.eval_only) m->status = MemberStatus::kIdle;
      if (!moved) m->failures++;
      (void)store_->AppendEvent(e->config.name,
                                json{{"type", "failed"},
                                     {"member", m->name},
                                     {"code", ev.code},
                                     {"reason", ev.reason},
                                     {"failures", m->failures}}
                                    .dump());
      Log("member " + m->name + " failed (" + ev.code + "): " + ev.reason);
      if (ev.task.eval_only) {
        // A member that cannot be evaluated keeps its trained state; it is
        // reported without a test accuracy.
        if (m->failures < options_.max_member_failures) {
          Enqueue(e, mit->second, true);
        } else if (--e->evals_pending == 0) {
          FinishExperiment(e);
        }
      } else if (m->failures >= options_.max_member_failures) {
        m->status = MemberStatus::kFailed;
        (void)store_->SetMemberState(e->config.name, m->name, StateJson(*m));
        (void)store_->AppendEvent(e->config.name,
                                  json{{"type", "member_stopped"},
                                       {"member", m->name},
                                       {"why", "failed " + std::to_string(m->failures) +
                                                   " times; last: " + ev.reason},
                                       {"kept_version", m->version}}
                                      .dump());
        Log("member " + m->name + " stopped after " + std::to_string(m->failures) +
            " failures; its last good version " + std::to_string(m->version) + " is kept");
        MaybeAdvance(e);
      } else {
        Enqueue(e, mit->second, false, true);
      }
      break;
    }
    default:
      break;
  }
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  Dispatch();
}

void SchedulerImpl::OnLost(size_t i, const std::string& reason) {
  WorkerSlot& w = *workers_[i];
  std::vector<Task> unfinished;
  if (w.handle) {
    w.peak_rss_total += w.handle->PeakRssBytes();
    w.handle->Stop(false, milliseconds(0));
    unfinished = w.handle->TakeUnfinished();
    w.handle.reset();
  }
  w.ready = false;
  w.busy = 0;
  for (const Task& t : unfinished) {
    Experiment* e = Find(t.exp);
    if (e == nullptr) continue;
    e->in_flight--;
    auto mit = e->by_name.find(t.member);
    if (mit == e->by_name.end()) continue;
    if (!t.eval_only) e->members[mit->second].status = MemberStatus::kIdle;
    Enqueue(e, mit->second, t.eval_only, true);
  }
  Log("worker " + std::to_string(i) + " (" + w.spec.device.device + ") lost: " + reason +
      (unfinished.empty() ? "" : "; " + std::to_string(unfinished.size()) +
                                     " member(s) requeued from their committed heads"));
  for (const auto& id : order_) {
    (void)store_->AppendEvent(id, json{{"type", "worker_lost"},
                                       {"worker", i},
                                       {"device", w.spec.device.device},
                                       {"reason", reason},
                                       {"requeued", unfinished.size()}}
                                      .dump());
  }
  if (stopping_) {
    MaybeFinishStop();
    return;
  }
  // Backoff: reset after a healthy stretch, else double.
  if (Clock::now() - w.started >= options_.healthy_reset) w.backoff = milliseconds(0);
  w.backoff = w.backoff.count() == 0 ? options_.restart_backoff
                                     : std::min(w.backoff * 2, options_.max_restart_backoff);
  if (++w.restarts > options_.max_restarts) {
    w.given_up = true;
    Log("giving up on worker " + std::to_string(i) + " (" + w.spec.device.device + ") after " +
        std::to_string(options_.max_restarts) + " restarts");
    bool any = false;
    for (const auto& o : workers_) any = any || !o->given_up;
    if (!any) {
      run_status_ = Status::Unavailable("every worker was given up on; last: " + reason);
      BeginStop("no workers left");
    }
    return;
  }
  w.restart_timer = std::make_unique<asio::steady_timer>(io_, w.backoff);
  w.restart_timer->async_wait([this, i](const boost::system::error_code& ec) {
    if (!ec && !stopping_) StartWorker(i);
  });
  Dispatch();
}

void SchedulerImpl::ReapChildren() {
  for (size_t i = 0; i < workers_.size(); ++i) {
    WorkerSlot& w = *workers_[i];
    if (!w.handle || w.handle->exited()) continue;
    int status = 0;
    if (waitpid(w.handle->pid(), &status, WNOHANG) == w.handle->pid()) {
      w.handle->MarkExited(status);  // reports kLost through the event path
    }
  }
}

void SchedulerImpl::Enqueue(Experiment* e, int member, bool eval, bool front) {
  Member& m = e->members[member];
  if (!eval) m.status = MemberStatus::kQueued;
  if (front) {
    e->ready.push_front(Pending{member, eval});
  } else {
    e->ready.push_back(Pending{member, eval});
  }
}

// Members in flight per worker slot: one training, one whose state is already
// in the worker and waits for the slot, so that the transfer and the commit of
// one member overlap another's training (null intervals: +20% at 300 members).
constexpr int kInFlightPerSlot = 2;

void SchedulerImpl::Dispatch() {
  if (stopping_) return;
  while (true) {
    WorkerSlot* best = nullptr;
    for (auto& w : workers_) {
      if (!w->handle || !w->ready || w->busy >= kInFlightPerSlot * w->capacity) continue;
      if (best == nullptr || w->capacity - w->busy > best->capacity - best->busy) best = w.get();
    }
    if (best == nullptr) return;
    // Round-robin over experiments with work, so they share slots fairly.
    Experiment* e = nullptr;
    for (size_t k = 0; k < order_.size(); ++k) {
      Experiment* c = experiments_[order_[(rr_ + k) % order_.size()]].get();
      if (!c->ready.empty() && c->status == "running") {
        e = c;
        rr_ = (rr_ + k + 1) % order_.size();
        break;
      }
    }
    if (e == nullptr) return;
    Pending p = e->ready.front();
    e->ready.pop_front();
    Member& m = e->members[p.member];
    Task t;
    t.id = next_task_++;
    t.exp = e->config.name;
    t.member = m.name;
    t.head_version = m.version;
    t.steps = p.eval ? 0 : e->config.steps_per_interval;
    t.hparams = m.hparams;
    t.init_seed = MixSeed(e->config.seed, 0x1A1A, static_cast<uint64_t>(m.index));
    t.eval_only = p.eval;
    t.interval_after = p.eval ? m.interval : m.interval + 1;
    t.last_exploit = m.last_exploit;
    if (!p.eval) m.status = MemberStatus::kRunning;
    if (e->first_dispatch == Clock::time_point{}) e->first_dispatch = Clock::now();
    e->in_flight++;
    best->busy++;
    best->handle->Enqueue(std::move(t));
  }
}

void SchedulerImpl::AfterInterval(Experiment* e, Member* m) {
  const auto& c = e->config;
  if (m->interval >= c.intervals) m->status = MemberStatus::kDone;
  if (c.target_metric > 0 && m->score >= c.target_metric && !e->training_closed) {
    e->training_closed = true;
    Log(c.name + ": " + m->name + " reached the target " + std::to_string(c.target_metric));
  }
  if (c.max_wall_s > 0 && !e->training_closed &&
      std::chrono::duration<double>(Clock::now() - e->start).count() >= c.max_wall_s) {
    e->training_closed = true;
    Log(c.name + ": wall-time limit reached");
  }
  if (!e->policy->synchronous() && !e->training_closed && m->status == MemberStatus::kIdle) {
    std::vector<MemberProgress> all;
    MemberProgress self;
    for (const auto& o : e->members) {
      MemberProgress p{o.name, o.index, o.interval, o.last_exploit, o.score, o.hparams, o.active()};
      if (o.name == m->name) self = p;
      all.push_back(p);
    }
    ApplyDecisions(e, e->policy->Decide(m->interval, {self}, all));
    if (m->status == MemberStatus::kIdle) Enqueue(e, e->by_name[m->name], false);
  }
  MaybeAdvance(e);
}

// Sync: when every active member has finished the generation, decide and queue
// the next. Async: queue idle members. Both: end the experiment when all is done.
void SchedulerImpl::MaybeAdvance(Experiment* e) {
  if (e->phase != Phase::kTraining) return;
  const auto& c = e->config;
  if (!e->training_closed) {
    if (e->policy->synchronous()) {
      int gen = c.intervals;
      bool busy = false;
      for (const auto& m : e->members) {
        if (!m.active()) continue;
        gen = std::min(gen, m.interval);
        busy = busy || m.status == MemberStatus::kRunning || m.status == MemberStatus::kQueued;
      }
      // A member past the generation (only in a resumed run) means its barrier
      // was already applied: deciding it again would rank the laggards against
      // newer scores and exploit them a second time. Finished members count:
      // they are the usual case when a run is killed in its last generation.
      bool behind = false;
      for (const auto& m : e->members) {
        if (m.active() && m.interval > gen) behind = true;
      }
      // Members ahead of the generation (a resumed run) wait; those at it run.
      if (!busy && gen < c.intervals) {
        bool all_at_gen = !behind;
        if (all_at_gen && gen > 0 && gen != e->generation) {
          std::vector<MemberProgress> all, at_gen;
          for (const auto& o : e->members) {
            MemberProgress p{o.name, o.index, o.interval, o.last_exploit, o.score, o.hparams,
                             o.active()};
            all.push_back(p);
            if (o.active() && o.interval == gen) at_gen.push_back(p);
          }
          ApplyDecisions(e, e->policy->Decide(gen, at_gen, all));
        }
        e->generation = gen;
        for (size_t i = 0; i < e->members.size(); ++i) {
          Member& m = e->members[i];
          if (m.active() && m.status == MemberStatus::kIdle && m.interval == gen) {
            Enqueue(e, static_cast<int>(i), false);
          }
        }
      }
    } else {
      for (size_t i = 0; i < e->members.size(); ++i) {
        Member& m = e->members[i];
        if (m.status == MemberStatus::kIdle && m.interval < c.intervals) {
          Enqueue(e, static_cast<int>(i), false);
        }
      }
      int gen = c.intervals;
      for (const auto& m : e->members) {
        if (m.active()) gen = std::min(gen, m.interval);
      }
      e->generation = gen;
    }
  }
  bool open = false;
  for (const auto& m : e->members) {
    if (m.status == MemberStatus::kRunning || m.status == MemberStatus::kQueued) open = true;
    if (!e->training_closed && m.status == MemberStatus::kIdle && m.interval < c.intervals) {
      open = true;
    }
  }
  if (!open && e->in_flight == 0) StartFinalEval(e);
}

void SchedulerImpl::ApplyDecisions(Experiment* e, const std::map<std::string, Decision>& decisions) {
  for (const auto& [name, d] : decisions) {
    Member& m = e->members[e->by_name[name]];
    if (d.kind == Decision::Kind::kExploit) {
      json ev = {{"type", "exploit"}, {"member", name},    {"donor", d.donor},
                 {"interval", m.interval}, {"why", d.why}, {"hparams", d.hparams}};
      auto v = store_->Exploit(e->config.name, name, d.donor, d.hparams, ev.dump());
      if (!v.ok()) {
        Log("exploit " + name + " <- " + d.donor + " failed: " + v.status().ToString());
        continue;
      }
      const Member& donor = e->members[e->by_name[d.donor]];
      m.version = *v;
      m.step = donor.step;
      m.hparams = d.hparams;
      m.last_exploit = m.interval;
      e->exploits++;
      if (options_.kill_point) options_.kill_point("scheduler.exploited");
      (void)store_->SetMemberState(e->config.name, name, StateJson(m));
    } else if (d.kind == Decision::Kind::kStop) {
      m.status = MemberStatus::kStopped;
      (void)store_->SetMemberState(e->config.name, name, StateJson(m));
      (void)store_->AppendEvent(
          e->config.name,
          json{{"type", "member_stopped"}, {"member", name}, {"why", d.why}}.dump());
    }
  }
}

void SchedulerImpl::StartFinalEval(Experiment* e) {
  e->phase = Phase::kFinalEval;
  std::vector<MemberProgress> all;
  for (const auto& o : e->members) {
    if (o.version > 0) {
      all.push_back(MemberProgress{o.name, o.index, o.interval, o.last_exploit, o.score,
                                   o.hparams, o.active()});
    }
  }
  auto ranked = RankByScore(all);
  int n = 0;
  for (const auto* p : ranked) {
    if (n >= options_.final_eval_top) break;
    Enqueue(e, e->by_name[p->member], true);
    ++n;
  }
  e->evals_pending = n;
  if (n == 0) FinishExperiment(e);
  Dispatch();
}

void SchedulerImpl::FinishExperiment(Experiment* e) {
  e->phase = Phase::kDone;
  e->status = "done";
  json results = json::array();
  for (const auto& m : e->members) {
    if (m.test_acc >= 0) {
      results.push_back({{"member", m.name}, {"val_acc", m.score}, {"test_acc", m.test_acc},
                         {"version", m.version}});
    }
  }
  (void)store_->AppendEvent(e->config.name, json{{"type", "final_eval"}, {"results", results}}.dump());
  (void)store_->SetExperimentStatus(e->config.name, "done");
  PrintProgress(true);
  if (AllEnded() && !options_.serve) BeginStop("all experiments ended");
}

void SchedulerImpl::BeginStop(const std::string& why) {
  if (stopping_) return;
  stopping_ = true;
  if (options_.notify) options_.notify("STOPPING=1");
  // No new requests while stopping; the socket goes away with the server.
  if (control_) control_->Close();
  if (why != "all experiments ended") Log("stopping: " + why);
  grace_timer_.expires_after(options_.grace);
  grace_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (ec || finished_) return;
    Log("grace period over: abandoning in-flight intervals (they rerun from committed heads)");
    ShutdownWorkers(false);
  });
  MaybeFinishStop();
}

void SchedulerImpl::MaybeFinishStop() {
  if (finished_) return;
  int in_flight = 0;
  for (const auto& [id, e] : experiments_) in_flight += e->in_flight;
  if (in_flight > 0) return;
  ShutdownWorkers(true);
}

void SchedulerImpl::ShutdownWorkers(bool graceful) {
  if (finished_) return;
  finished_ = true;
  for (auto& w : workers_) {
    if (w->restart_timer) w->restart_timer->cancel();
    if (w->handle) {
      w->peak_rss_total += w->handle->PeakRssBytes();
      w->handle->Stop(graceful, milliseconds(2000));
    }
  }
  tick_.cancel();
  grace_timer_.cancel();
  sighup_.cancel();
  if (control_) control_->Close();
  signals_.cancel();
  sigchld_.cancel();
  (void)store_->Flush();
  io_.stop();
}

void SchedulerImpl::OnReload() {
  if (!options_.reload) {
    Log("SIGHUP: nothing to reload");
    return;
  }
  auto next = options_.reload();
  if (!next.ok()) {
    Log("SIGHUP: reload failed, keeping the current settings: " + next.status().ToString());
    return;
  }
  std::string not_applied;
  if (control_) not_applied = control_->Reconfigure(*next);
  options_.control = *next;
  Log("SIGHUP: reloaded users, groups and limits" +
      (not_applied.empty() ? std::string() : "; not applied: " + not_applied));
}

void SchedulerImpl::Tick() {
  PrintProgress(false);
  tick_.expires_after(milliseconds(1000));
  tick_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Tick();
  });
}

void SchedulerImpl::PrintProgress(bool force_line) {
  if (options_.progress == nullptr) return;
  const auto now = Clock::now();
  if (!progress_tty_ && !force_line && now - last_line_ < std::chrono::seconds(10)) return;
  last_line_ = now;
  for (const auto& id : order_) {
    const Experiment& e = *experiments_[id];
    std::vector<double> scores;
    int done = 0, remaining = 0;
    for (const auto& m : e.members) {
      if (std::isfinite(m.score)) scores.push_back(m.score);
      if (m.status == MemberStatus::kDone) ++done;
      if (m.active()) remaining += std::max(0, e.config.intervals - m.interval);
    }
    std::sort(scores.begin(), scores.end());
    const double elapsed = std::chrono::duration<double>(now - e.start).count();
    const double rate = elapsed > 0 ? static_cast<double>(e.samples) / elapsed : 0;
    const double per_interval =
        e.intervals_this_run > 0 ? elapsed / static_cast<double>(e.intervals_this_run) : NAN;
    char line[512];
    std::snprintf(line, sizeof line,
                  "%s: %s interval %d/%d | members done %d/%zu | %.0f samples/s | best %.4f "
                  "median %.4f | exploits %lld | ETA %s",
                  id.c_str(), e.phase == Phase::kDone ? "done" : (e.phase == Phase::kFinalEval ? "final eval" : "training"),
                  e.phase == Phase::kTraining ? e.generation : e.config.intervals,
                  e.config.intervals, done, e.members.size(), rate,
                  scores.empty() ? 0.0 : scores.back(),
                  scores.empty() ? 0.0 : scores[scores.size() / 2],
                  static_cast<long long>(e.exploits),
                  e.phase == Phase::kDone ? "0s" : FormatDuration(per_interval * remaining).c_str());
    if (progress_tty_ && !force_line) {
      std::fprintf(options_.progress, "\r\033[K%s", line);
    } else {
      std::fprintf(options_.progress, "%s%s\n", progress_tty_ ? "\r\033[K" : "", line);
    }
  }
  std::fflush(options_.progress);
}

Status SchedulerImpl::Run() {
  const auto devices = ExpandDevices(options_.devices);
  if (devices.empty()) return Status::InvalidArgument("no devices configured");
  // Segments left in /dev/shm by schedulers that were killed, of any store:
  // names of the default shape, whose owner is gone.
  auto swept = ipc::Channel::RemoveStale(IsDefaultSegmentName);
  if (!swept.ok()) {
    Log("could not sweep stale shared-memory segments: " + swept.status().ToString());
  } else if (!swept->empty()) {
    std::string names;
    for (const auto& n : *swept) names += (names.empty() ? "" : ", ") + n;
    Log("removed " + std::to_string(swept->size()) +
        " shared-memory segment(s) of schedulers that died: " + names);
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    auto w = std::make_unique<WorkerSlot>();
    w->spec.index = static_cast<int>(i);
    w->spec.device = devices[i];
    w->spec.binary = options_.worker_binary;
    w->spec.segment = options_.instance + "-w" + std::to_string(i);
    w->spec.ring_bytes = options_.ring_bytes;
    w->spec.heartbeat_timeout = options_.heartbeat_timeout;
    workers_.push_back(std::move(w));
  }
  signals_.add(SIGINT);
  signals_.add(SIGTERM);
  std::function<void(const boost::system::error_code&, int)> on_signal =
      [this, &on_signal](const boost::system::error_code& ec, int sig) {
        if (ec) return;
        BeginStop(sig == SIGINT ? "interrupted (Ctrl-C)" : "terminated (SIGTERM)");
        signals_.async_wait(on_signal);
      };
  signals_.async_wait(on_signal);
  std::function<void(const boost::system::error_code&, int)> on_child =
      [this, &on_child](const boost::system::error_code& ec, int) {
        if (ec) return;
        ReapChildren();
        sigchld_.async_wait(on_child);
      };
  sigchld_.async_wait(on_child);
  if (options_.serve) {
    // Every unfinished experiment of the store resumes.
    CKPT_ASSIGN_OR_RETURN(auto stored, store_->ListExperiments());
    for (const auto& x : stored) {
      if (x.status == "done" || x.status == "stopped" || Find(x.id) != nullptr) continue;
      json j = json::parse(x.config_json, nullptr, false);
      auto config = ParseExperimentConfig(j.is_object() ? j.value("toml", "") : "", x.id);
      Status s = config.ok() ? Submit(*config) : config.status();
      if (!s.ok()) Log("cannot resume experiment " + x.id + ": " + s.ToString());
    }
  } else if (AllEnded()) {
    finished_ = true;
    return Status::OK();
  }
  // Declared at function scope: the handler re-arms itself with a reference
  // to it, so it must live as long as io_.run() below.
  std::function<void(const boost::system::error_code&, int)> on_hup =
      [this, &on_hup](const boost::system::error_code& ec, int) {
        if (ec) return;
        OnReload();
        sighup_.async_wait(on_hup);
      };
  if (options_.serve) {
    if (!options_.control.socket_path.empty()) {
      CKPT_ASSIGN_OR_RETURN(control_, ControlServer::Start(this, options_.control));
    }
    sighup_.add(SIGHUP);
    sighup_.async_wait(on_hup);
  }
  for (size_t i = 0; i < workers_.size(); ++i) StartWorker(i);
  if (options_.notify) options_.notify("READY=1");
  Tick();
  io_.run();
  if (progress_tty_) std::fputs("\n", options_.progress);
  for (auto& [id, e] : experiments_) {
    if (e->phase != Phase::kDone) e->status = "stopped";
  }
  return run_status_;
}

StatusOr<std::string> SchedulerImpl::SubmitToml(const std::string& toml,
                                                const std::string& origin) {
  if (stopping_) return Status::Unavailable("the scheduler is stopping");
  CKPT_ASSIGN_OR_RETURN(ExperimentConfig config, ParseExperimentConfig(toml, origin));
  CKPT_RETURN_IF_ERROR(Submit(config));
  Dispatch();
  return config.name;
}

std::vector<ExperimentSummary> SchedulerImpl::ListExperiments() {
  std::vector<ExperimentSummary> out;
  for (const auto& id : order_) {
    auto s = Summary(id);
    if (s.ok()) out.push_back(std::move(*s));
  }
  return out;
}

std::vector<WorkerStatus> SchedulerImpl::DeviceStatus() {
  std::vector<WorkerStatus> out;
  for (const auto& w : workers_) {
    WorkerStatus s;
    s.index = w->spec.index;
    s.device = w->spec.device.device;
    s.pid = w->handle ? w->handle->pid() : 0;
    s.ready = w->ready;
    s.mode = w->mode;
    s.capacity = w->capacity;
    s.busy = w->busy;
    s.restarts = w->restarts;
    s.given_up = w->given_up;
    s.samples_per_s = w->samples_per_s;
    out.push_back(s);
  }
  return out;
}

Status SchedulerImpl::Pause(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  if (e->phase == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + exp + " has ended (" + e->status + ")");
  }
  CKPT_RETURN_IF_ERROR(store_->SetExperimentStatus(exp, "paused"));
  e->status = "paused";
  (void)store_->AppendEvent(exp, json{{"type", "paused"}}.dump());
  return Status::OK();
}

Status SchedulerImpl::Resume(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  if (e->phase == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + exp + " has ended (" + e->status + ")");
  }
  CKPT_RETURN_IF_ERROR(store_->SetExperimentStatus(exp, "running"));
  e->status = "running";
  (void)store_->AppendEvent(exp, json{{"type", "resumed"}}.dump());
  Dispatch();
  return Status::OK();
}

Status SchedulerImpl::Stop(const std::string& exp) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  if (e->phase == Phase::kDone) {
    return Status::FailedPrecondition("experiment " + exp + " has ended (" + e->status + ")");
  }
  CKPT_RETURN_IF_ERROR(store_->SetExperimentStatus(exp, "stopped"));
  for (const auto& p : e->ready) {
    Member& m = e->members[p.member];
    if (m.status == MemberStatus::kQueued) m.status = MemberStatus::kIdle;
  }
  e->ready.clear();
  e->phase = Phase::kDone;
  e->status = "stopped";
  (void)store_->AppendEvent(exp, json{{"type", "stopped"}}.dump());
  if (AllEnded() && !options_.serve) BeginStop("all experiments ended");
  return Status::OK();
}

StatusOr<int64_t> SchedulerImpl::Restore(const std::string& exp, const std::string& member,
                                         int64_t version) {
  Experiment* e = Find(exp);
  if (e == nullptr) return Status::NotFound("experiment " + exp + " is not known");
  auto it = e->by_name.find(member);
  if (it == e->by_name.end()) {
    return Status::NotFound("member " + member + " of experiment " + exp);
  }
  CKPT_ASSIGN_OR_RETURN(int64_t v, store_->Restore(exp, member, version));
  CKPT_ASSIGN_OR_RETURN(store::MemberHead head, store_->GetMember(exp, member));
  Member& m = e->members[it->second];
  // A task in flight was sent the old head: its commit is refused (the head
  // moved) and the member reruns from this version.
  m.version = v;
  m.hparams = head.hparams;
  m.step = head.step;
  (void)store_->AppendEvent(exp, json{{"type", "restore"},
                                      {"member", member},
                                      {"from_version", version},
                                      {"version", v}}
                                     .dump());
  return v;
}

StatusOr<ExperimentSummary> SchedulerImpl::Summary(const std::string& id) {
  Experiment* e = Find(id);
  if (e == nullptr) return Status::NotFound("experiment " + id + " was not submitted");
  ExperimentSummary s;
  s.id = id;
  s.status = e->status;
  s.population = e->config.population;
  s.intervals = e->config.intervals;
  s.generation = e->generation;
  s.exploits = e->exploits;
  s.train_samples = e->samples;
  s.wall_s = std::chrono::duration<double>(Clock::now() - e->start).count();
  s.member_intervals = e->intervals_this_run;
  if (e->first_dispatch != Clock::time_point{} && e->last_result > e->first_dispatch) {
    s.training_s = std::chrono::duration<double>(e->last_result - e->first_dispatch).count();
    s.first_result_s = std::chrono::duration<double>(e->first_result - e->first_dispatch).count();
  }
  s.store_path = options_.store_path;
  for (const auto& m : e->members) {
    MemberSummary ms;
    ms.member = m.name;
    ms.intervals_done = m.interval;
    ms.status = StatusName(m.status);
    ms.val_acc = std::isfinite(m.score) ? m.score : 0;
    ms.test_acc = m.test_acc;
    ms.version = m.version;
    ms.step = m.step;
    ms.hparams = m.hparams;
    s.members.push_back(ms);
  }
  std::sort(s.members.begin(), s.members.end(), [](const MemberSummary& a, const MemberSummary& b) {
    if (a.val_acc != b.val_acc) return a.val_acc > b.val_acc;
    return a.member < b.member;
  });
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerOptions& options) {
  if (options.store_path.empty()) return Status::InvalidArgument("store path is empty");
  std::error_code ec;
  const auto parent = std::filesystem::absolute(options.store_path).parent_path();
  std::filesystem::create_directories(parent, ec);
  if (ec) {
    return Status::IOError("cannot create " + parent.string() + " for the store: " + ec.message());
  }
  store::StoreOptions so;
  so.path = options.store_path;
  so.sync_interval_commits = options.sync_interval_commits;
  so.kill_point = options.kill_point;
  CKPT_ASSIGN_OR_RETURN(auto store, store::Store::Open(so));
  return std::unique_ptr<Scheduler>(new SchedulerImpl(options, std::move(store)));
}

void ApplySupervision(const SupervisionConfig& s, SchedulerOptions* o) {
  auto ms = [](double seconds) { return milliseconds(static_cast<int64_t>(seconds * 1000)); };
  o->restart_backoff = ms(s.restart_backoff_s);
  o->max_restart_backoff = ms(s.max_restart_backoff_s);
  o->healthy_reset = ms(s.healthy_reset_s);
  o->max_restarts = s.max_restarts;
  o->max_member_failures = s.max_member_failures;
  o->grace = ms(s.grace_s);
}

void PrintSummary(const ExperimentSummary& s, FILE* out) {
  std::fprintf(out, "\nexperiment %s: %s, %d members, %d intervals, %lld exploits\n", s.id.c_str(),
               s.status.c_str(), s.population, s.intervals, static_cast<long long>(s.exploits));
  std::fprintf(out, "%-8s %-8s %9s %9s %8s  %s\n", "member", "status", "val_acc", "test_acc",
               "version", "hyperparameters");
  int shown = 0;
  for (const auto& m : s.members) {
    if (shown++ >= 10) break;
    std::string hp;
    for (const auto& [k, v] : m.hparams) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%s%s=%.4g", hp.empty() ? "" : " ", k.c_str(), v);
      hp += buf;
    }
    char test[16] = "-";
    if (m.test_acc >= 0) std::snprintf(test, sizeof test, "%.4f", m.test_acc);
    std::fprintf(out, "%-8s %-8s %9.4f %9s %8lld  %s\n", m.member.c_str(), m.status.c_str(),
                 m.val_acc, test, static_cast<long long>(m.version), hp.c_str());
  }
  std::fprintf(out, "store: %s (run the same command again to see this table)\n",
               s.store_path.c_str());
}

StatusOr<std::function<void(std::string_view)>> KillPointFromEnvironment() {
  const char* spec = std::getenv("CKPT_KILL_AT");
  if (spec == nullptr || *spec == '\0') return std::function<void(std::string_view)>();
  const std::string text = spec;
  const size_t colon = text.rfind(':');
  char* end = nullptr;
  const long n = colon == std::string::npos ? 0 : std::strtol(text.c_str() + colon + 1, &end, 10);
  if (colon == std::string::npos || colon == 0 || n <= 0 || end == nullptr || *end != '\0') {
    return Status::InvalidArgument("CKPT_KILL_AT=" + text + " is not POINT:N (N >= 1)");
  }
  auto hits = std::make_shared<std::atomic<long>>(0);
  return std::function<void(std::string_view)>(
      [point = text.substr(0, colon), n, hits](std::string_view p) {
        if (p == point && hits->fetch_add(1) + 1 == n) raise(SIGKILL);
      });
}

}  // namespace ckpt::scheduler
