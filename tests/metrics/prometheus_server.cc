#include "prometheus_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "http_get.h"

extern char** environ;

namespace ckpt::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr char kHost[] = "127.0.0.1";

// A port that was free a moment ago: bound, read back, closed. Another
// process may take it before Prometheus does; Start then retries.
StatusOr<int> PickFreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError(std::string("socket: ") + std::strerror(errno));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IOError(std::string("bind 127.0.0.1:0: ") + std::strerror(err));
  }
  ::close(fd);
  return static_cast<int>(ntohs(a.sin_port));
}

std::string ReadTail(const std::string& path, size_t bytes) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string all = ss.str();
  return all.size() > bytes ? all.substr(all.size() - bytes) : all;
}

// Stops `pid`: SIGTERM, then SIGKILL if it is still there after `grace`.
void Stop(pid_t pid, std::chrono::seconds grace) {
  ::kill(pid, SIGTERM);
  const auto deadline = Clock::now() + grace;
  while (Clock::now() < deadline) {
    int status = 0;
    const pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno == ECHILD)) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
}

double ParseSampleValue(const nlohmann::json& pair) {
  // [unix_time, "value"], the value a string so that NaN and Inf survive JSON.
  const std::string v = pair.at(1).get<std::string>();
  if (v == "NaN") return std::nan("");
  if (v == "+Inf") return INFINITY;
  if (v == "-Inf") return -INFINITY;
  return std::strtod(v.c_str(), nullptr);
}

}  // namespace

StatusOr<std::unique_ptr<PrometheusServer>> PrometheusServer::Start(
    const PrometheusServerOptions& options) {
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return Status::NotFound(options.binary + ": not installed");
  }
  if (options.targets.empty()) return Status::InvalidArgument("prometheus: no scrape target");
  const char* tmp = std::getenv("TMPDIR");
  std::string dir_template = std::string(tmp && *tmp ? tmp : "/tmp") + "/ckpt-prometheus-XXXXXX";
  if (::mkdtemp(dir_template.data()) == nullptr) {
    return Status::IOError("mkdtemp " + dir_template + ": " + std::strerror(errno));
  }
  const std::string dir = dir_template;
  const std::string config = dir + "/prometheus.yml";
  const std::string log = dir + "/prometheus.log";
  {
    std::ofstream out(config);
    out << "global:\n"
        << "  scrape_interval: " << options.scrape_interval_s << "s\n"
        << "  scrape_timeout: " << options.scrape_interval_s << "s\n"
        << "  evaluation_interval: " << options.scrape_interval_s << "s\n"
        << "scrape_configs:\n"
        << "  - job_name: " << options.job << "\n"
        << "    static_configs:\n"
        << "      - targets:\n";
    for (const std::string& t : options.targets) out << "          - \"" << t << "\"\n";
    if (!out) {
      std::filesystem::remove_all(dir);
      return Status::IOError("cannot write " + config);
    }
  }

  std::string last_failure;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto port = PickFreePort();
    if (!port.ok()) {
      std::filesystem::remove_all(dir);
      return port.status();
    }
    const std::string listen = std::string(kHost) + ":" + std::to_string(*port);
    std::vector<std::string> args{options.binary, "--config.file=" + config,
                                  "--storage.tsdb.path=" + dir + "/data",
                                  "--web.listen-address=" + listen, "--log.level=info"};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log.c_str(),
                                     O_WRONLY | O_CREAT | O_APPEND, 0644);
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
    pid_t pid = 0;
    const int rc =
        posix_spawn(&pid, options.binary.c_str(), &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      std::filesystem::remove_all(dir);
      return Status::IOError("posix_spawn " + options.binary + ": " + std::strerror(rc));
    }
    const auto deadline = Clock::now() + options.start_timeout;
    bool exited = false;
    while (Clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      auto ready = HttpGet(kHost, *port, "/-/ready", std::chrono::seconds(2));
      if (ready.ok() && ready->status == 200) {
        return std::unique_ptr<PrometheusServer>(new PrometheusServer(options, dir, pid, *port));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!exited) Stop(pid, std::chrono::seconds(5));
    last_failure =
        (exited ? "exited"
                : "not ready after " + std::to_string(options.start_timeout.count()) + " s") +
        " on " + listen + "; log:\n" + ReadTail(log, 4000);
    // A port taken between PickFreePort and the server's bind is worth
    // another try; anything else is not.
    if (!exited || last_failure.find("address already in use") == std::string::npos) break;
  }
  std::filesystem::remove_all(dir);
  return Status::Unavailable("prometheus " + last_failure);
}

PrometheusServer::PrometheusServer(PrometheusServerOptions options, std::string dir, pid_t pid,
                                   int port)
    : options_(std::move(options)), dir_(std::move(dir)), pid_(pid), port_(port) {}

PrometheusServer::~PrometheusServer() {
  Stop(pid_, std::chrono::seconds(10));
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

std::string PrometheusServer::LogTail(size_t bytes) const {
  return ReadTail(dir_ + "/prometheus.log", bytes);
}

StatusOr<nlohmann::json> PrometheusServer::Api(const std::string& path_and_query) const {
  const std::string target = "/api/v1/" + path_and_query;
  CKPT_ASSIGN_OR_RETURN(HttpResponse r, HttpGet(kHost, port_, target));
  nlohmann::json body = nlohmann::json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (body.is_discarded() || !body.is_object()) {
    return Status::Corruption("prometheus " + target + ": HTTP " + std::to_string(r.status) +
                              ", not JSON: " + r.body.substr(0, 300));
  }
  if (body.value("status", "") != "success") {
    return Status::InvalidArgument("prometheus " + target + ": " + body.value("errorType", "") +
                                   ": " + body.value("error", r.body.substr(0, 300)));
  }
  return body["data"];
}

StatusOr<std::vector<PromSample>> PrometheusServer::Query(const std::string& promql) const {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json data, Api("query?query=" + UrlEncode(promql)));
  std::vector<PromSample> out;
  const std::string type = data.value("resultType", "");
  const nlohmann::json& result = data["result"];
  if (type == "scalar") {
    out.push_back(PromSample{{}, ParseSampleValue(result)});
    return out;
  }
  if (type != "vector" && type != "matrix") {
    return Status::InvalidArgument("query " + promql + ": result type " + type);
  }
  for (const nlohmann::json& series : result) {
    PromSample s;
    for (const auto& [k, v] : series["metric"].items()) s.labels[k] = v.get<std::string>();
    if (type == "vector") {
      s.value = ParseSampleValue(series["value"]);
    } else {
      const nlohmann::json& values = series["values"];
      if (values.empty()) continue;
      s.value = ParseSampleValue(values.back());
    }
    out.push_back(std::move(s));
  }
  return out;
}

StatusOr<std::vector<std::string>> PrometheusServer::LabelValues(
    const std::string& label, const std::string& selector) const {
  CKPT_ASSIGN_OR_RETURN(nlohmann::json data,
                        Api("label/" + label + "/values?match[]=" + UrlEncode(selector)));
  std::vector<std::string> out;
  for (const nlohmann::json& v : data) out.push_back(v.get<std::string>());
  return out;
}

Status PrometheusServer::WaitForScrapes(int scrapes, std::chrono::seconds deadline) const {
  const auto until = Clock::now() + deadline;
  const std::string job = "{job=\"" + options_.job + "\"}";
  std::string state = "no answer";
  while (Clock::now() < until) {
    auto up = Query("up" + job);
    auto counts = Query("count_over_time(up" + job + "[10m])");
    if (up.ok() && counts.ok()) {
      bool all_up = up->size() == options_.targets.size();
      for (const PromSample& s : *up) all_up = all_up && s.value == 1;
      bool enough = counts->size() == options_.targets.size();
      for (const PromSample& s : *counts) enough = enough && s.value >= scrapes;
      if (all_up && enough) return Status::OK();
      state = "up series " + std::to_string(up->size()) + ", all up " + (all_up ? "yes" : "no");
      for (const PromSample& s : *counts) state += ", scrapes " + std::to_string(s.value);
    } else {
      state = (up.ok() ? counts.status() : up.status()).ToString();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  auto targets = Api("targets");
  return Status::Aborted(
      "prometheus: fewer than " + std::to_string(scrapes) + " scrapes of every target after " +
      std::to_string(deadline.count()) + " s (" + state + "); targets: " +
      (targets.ok() ? targets->dump().substr(0, 2000) : targets.status().ToString()));
}

}  // namespace ckpt::testing
