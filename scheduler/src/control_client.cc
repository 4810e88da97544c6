// ControlClient over a blocking AF_UNIX stream socket; every wait is a poll()
// bounded by the remaining time of the call. SIGPIPE is never raised
// (MSG_NOSIGNAL): a server that closed the connection reads as an error.
#include "ckpt/scheduler/control_client.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <vector>

#include "control_protocol.h"

namespace ckpt::scheduler {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Errno(int err) { return std::strerror(err); }

Status NoService(const std::string& path, const std::string& why) {
  return Status::Unavailable("no ckpt-scheduler answers at " + path +
                             ": is the service running? `systemctl status ckpt-scheduler` (" + why +
                             ")");
}

// The group owning the socket, else its directory: the one to join.
std::string GroupToJoin(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const auto slash = path.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + (slash == 0));
    if (stat(dir.c_str(), &st) != 0) return "ckpt";
  }
  std::vector<char> buf(16384);
  group gr;
  group* found = nullptr;
  if (getgrgid_r(st.st_gid, &gr, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return std::to_string(st.st_gid);
  }
  return gr.gr_name;
}

Status PermissionDenied(const std::string& path) {
  const std::string g = GroupToJoin(path);
  return Status::FailedPrecondition("permission denied on " + path + ": add yourself to group " +
                                    g + " (`sudo usermod -aG " + g + " $USER`, then log in again)");
}

class ControlClientImpl : public ControlClient {
 public:
  ControlClientImpl(int fd, ControlClientOptions options) : fd_(fd), options_(std::move(options)) {}
  ~ControlClientImpl() override {
    if (fd_ >= 0) close(fd_);
  }

  StatusOr<std::string> CallRaw(const std::string& request_line) override {
    if (fd_ < 0)
      return Status::Unavailable("the connection to " + options_.socket_path + " is closed");
    const auto deadline = Clock::now() + options_.timeout;
    std::string out = request_line;
    if (out.empty() || out.back() != '\n') out += '\n';
    size_t sent = 0;
    while (sent < out.size()) {
      CKPT_RETURN_IF_ERROR(WaitFor(POLLOUT, deadline));
      ssize_t n = send(fd_, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        // The server may have answered (an oversized line) before closing.
        if (errno == EPIPE || errno == ECONNRESET) break;
        return Fail(Status::IOError("sending to " + options_.socket_path + ": " + Errno(errno)));
      }
      sent += static_cast<size_t>(n);
    }
    return ReadLine(deadline);
  }

  StatusOr<std::string> CallChecked(const std::string& request_line) override {
    CKPT_ASSIGN_OR_RETURN(std::string line, CallRaw(request_line));
    CKPT_RETURN_IF_ERROR(Check(line).status());
    return line;
  }

  StatusOr<std::string> Submit(const std::string& toml, const std::string& origin) override {
    json req = {{"verb", "submit"}, {"toml", toml}};
    if (!origin.empty()) req["origin"] = origin;
    CKPT_ASSIGN_OR_RETURN(json reply, Call(req));
    return Field<std::string>(reply, "experiment");
  }

  StatusOr<std::vector<ExperimentSummary>> List() override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "list"}}));
    return Summaries(reply);
  }

  StatusOr<ExperimentSummary> ExperimentStatus(const std::string& experiment) override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "status"}, {"experiment", experiment}}));
    auto it = reply.find("experiment");
    if (it == reply.end()) return Status::Internal("status reply without 'experiment'");
    return protocol::SummaryFromJson(*it);
  }

  StatusOr<std::vector<ExperimentSummary>> AllExperimentStatus() override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "status"}}));
    return Summaries(reply);
  }

  StatusOr<std::vector<WorkerStatus>> Devices() override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "status"}}));
    auto it = reply.find("devices");
    if (it == reply.end() || !it->is_array()) {
      return Status::Internal("status reply without a 'devices' array");
    }
    std::vector<WorkerStatus> out;
    for (const auto& d : *it) {
      CKPT_ASSIGN_OR_RETURN(WorkerStatus w, protocol::WorkerFromJson(d));
      out.push_back(std::move(w));
    }
    return out;
  }

  StatusOr<ServiceStatus> Overview() override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "status"}}));
    ServiceStatus out;
    CKPT_ASSIGN_OR_RETURN(out.experiments, Summaries(reply));
    auto devices = reply.find("devices");
    if (devices == reply.end() || !devices->is_array()) {
      return Status::Internal("status reply without a 'devices' array");
    }
    for (const auto& d : *devices) {
      CKPT_ASSIGN_OR_RETURN(WorkerStatus w, protocol::WorkerFromJson(d));
      out.workers.push_back(std::move(w));
    }
    auto service = reply.find("service");
    if (service == reply.end()) return Status::Internal("status reply without 'service'");
    CKPT_ASSIGN_OR_RETURN(out.service, protocol::ServiceFromJson(*service));
    return out;
  }

  Status Pause(const std::string& experiment) override {
    return Call({{"verb", "pause"}, {"experiment", experiment}}).status();
  }
  Status Resume(const std::string& experiment) override {
    return Call({{"verb", "resume"}, {"experiment", experiment}}).status();
  }
  Status Stop(const std::string& experiment) override {
    return Call({{"verb", "stop"}, {"experiment", experiment}}).status();
  }

  StatusOr<int64_t> Restore(const std::string& experiment, const std::string& member,
                            int64_t version) override {
    CKPT_ASSIGN_OR_RETURN(json reply, Call({{"verb", "restore"},
                                            {"experiment", experiment},
                                            {"member", member},
                                            {"version", version}}));
    return Field<int64_t>(reply, "version");
  }
  Status Pin(const std::string& experiment, const std::string& member, int64_t version) override {
    return Call({{"verb", "pin"},
                 {"experiment", experiment},
                 {"member", member},
                 {"version", version}})
        .status();
  }
  Status Unpin(const std::string& experiment, const std::string& member, int64_t version) override {
    return Call({{"verb", "unpin"},
                 {"experiment", experiment},
                 {"member", member},
                 {"version", version}})
        .status();
  }
  Status Shutdown(const std::string& why) override {
    json req = {{"verb", "shutdown"}};
    if (!why.empty()) req["why"] = why;
    return Call(req).status();
  }

 private:
  // A transport failure leaves the stream at an unknown position: no further
  // call may be made on it.
  Status Fail(Status s) {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    buffer_.clear();
    return s;
  }

  Status WaitFor(short events, Clock::time_point deadline) {
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) {
        return Fail(Status::Aborted("no reply from " + options_.socket_path + " within " +
                                    std::to_string(options_.timeout.count()) + " ms"));
      }
      pollfd p{fd_, events, 0};
      int rc = poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1 << 30)));
      if (rc > 0) return Status::OK();
      if (rc < 0 && errno != EINTR) {
        return Fail(Status::IOError("poll on " + options_.socket_path + ": " + Errno(errno)));
      }
    }
  }

  StatusOr<std::string> ReadLine(Clock::time_point deadline) {
    while (true) {
      const size_t nl = buffer_.find('\n');
      if (nl != std::string::npos) {
        std::string line = buffer_.substr(0, nl);
        buffer_.erase(0, nl + 1);
        return line;
      }
      if (buffer_.size() > options_.max_reply_bytes) {
        return Fail(Status::ResourceExhausted("reply from " + options_.socket_path +
                                              " exceeds max_reply_bytes (" +
                                              std::to_string(options_.max_reply_bytes) + ")"));
      }
      CKPT_RETURN_IF_ERROR(WaitFor(POLLIN, deadline));
      char chunk[65536];
      ssize_t n = recv(fd_, chunk, sizeof chunk, 0);
      if (n < 0) {
        if (errno == EINTR || errno == EAGAIN) continue;
        return Fail(Status::IOError("reading from " + options_.socket_path + ": " + Errno(errno)));
      }
      if (n == 0) {
        return Fail(
            Status::Unavailable("the scheduler closed the connection on " + options_.socket_path));
      }
      buffer_.append(chunk, static_cast<size_t>(n));
    }
  }

  // One request; an "ok": false reply becomes its Status.
  StatusOr<json> Call(const json& request) {
    CKPT_ASSIGN_OR_RETURN(std::string line, CallRaw(protocol::Dump(request)));
    return Check(line);
  }

  // The reply line as JSON; an "ok": false reply becomes its Status.
  StatusOr<json> Check(const std::string& line) {
    json reply = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!reply.is_object()) {
      return Fail(Status::Corruption("reply from " + options_.socket_path +
                                     " is not a JSON object: " + line.substr(0, 200)));
    }
    auto ok = reply.find("ok");
    if (ok == reply.end() || !ok->is_boolean()) {
      return Status::Corruption("reply without a boolean 'ok': " + line.substr(0, 200));
    }
    if (!ok->get<bool>()) return protocol::StatusFromReply(reply);
    return reply;
  }

  template <typename T>
  static StatusOr<T> Field(const json& reply, const char* key) {
    auto it = reply.find(key);
    if (it == reply.end()) return Status::Internal(std::string("reply without '") + key + "'");
    try {
      return it->get<T>();
    } catch (const json::exception& e) {
      return Status::Internal(std::string("reply field '") + key + "': " + e.what());
    }
  }

  static StatusOr<std::vector<ExperimentSummary>> Summaries(const json& reply) {
    auto it = reply.find("experiments");
    if (it == reply.end() || !it->is_array()) {
      return Status::Internal("reply without an 'experiments' array");
    }
    std::vector<ExperimentSummary> out;
    for (const auto& e : *it) {
      CKPT_ASSIGN_OR_RETURN(ExperimentSummary s, protocol::SummaryFromJson(e));
      out.push_back(std::move(s));
    }
    return out;
  }

  int fd_;
  ControlClientOptions options_;
  std::string buffer_;  // bytes received past the last reply line
};

}  // namespace

StatusOr<std::unique_ptr<ControlClient>> ControlClient::Connect(
    const ControlClientOptions& options) {
  const std::string& path = options.socket_path;
  sockaddr_un addr{};
  if (path.empty()) return Status::InvalidArgument("control socket path is empty");
  if (path.size() >= sizeof addr.sun_path) {
    return Status::InvalidArgument("control socket path " + path + " is too long");
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return NoService(path, "no socket there");
    if (errno == EACCES) return PermissionDenied(path);
  }
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket(): " + Errno(errno));
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  // A Unix socket whose listen backlog is full refuses a non-blocking connect
  // with EAGAIN and stays unconnected: try again until the timeout.
  const auto deadline = Clock::now() + options.timeout;
  while (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN && Clock::now() < deadline) {
      poll(nullptr, 0, 10);
      continue;
    }
    close(fd);
    if (err == EAGAIN) {
      return Status::Unavailable("connecting to " + path + ": the scheduler is not accepting");
    }
    if (err == ECONNREFUSED) return NoService(path, "a stale socket: nothing listens on it");
    if (err == ENOENT) return NoService(path, "no socket there");
    if (err == EACCES || err == EPERM) return PermissionDenied(path);
    return Status::IOError("connecting to " + path + ": " + Errno(err));
  }
  return std::unique_ptr<ControlClient>(new ControlClientImpl(fd, options));
}

}  // namespace ckpt::scheduler
