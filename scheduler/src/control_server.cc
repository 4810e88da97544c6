// ControlServer over Boost.Asio local stream sockets: every socket operation
// is asynchronous on the scheduler's event loop, so no client can hold the
// loop; each connection carries one deadline that is re-armed whenever a
// request has been answered, so a client that stalls mid-line, trickles bytes
// or stops reading its replies is closed after client_idle_timeout.
//
// Boost exceptions stay in this file: every Asio call uses its error_code form
// and the few that can still throw are wrapped.
#include "control_server.h"

#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "ckpt/records/config.h"
#include "control_protocol.h"
#include "log.h"
#include "submit_checks.h"
#include "submit_validator.h"

namespace ckpt::scheduler {
namespace {

namespace asio = boost::asio;
using json = nlohmann::json;
using local = asio::local::stream_protocol;
using Clock = std::chrono::steady_clock;

std::string Errno(int err) { return std::strerror(err); }

bool AllDigits(const std::string& s) {
  if (s.empty() || s.size() > 10) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

std::vector<char> LookupBuffer(int which) {
  const int64_t n = sysconf(which);
  return std::vector<char>(n > 0 ? static_cast<size_t>(n) : size_t{16384});
}

// Every group of the user `uid` in the group database (its primary group and
// the supplementary ones, getgrouplist); empty when the uid has no name.
std::vector<gid_t> GroupsOfUser(uint32_t uid) {
  std::vector<char> buf = LookupBuffer(_SC_GETPW_R_SIZE_MAX);
  passwd pw;
  passwd* found = nullptr;
  int err;
  while ((err = getpwuid_r(uid, &pw, buf.data(), buf.size(), &found)) == ERANGE &&
         buf.size() < (size_t{1} << 24)) {
    buf.resize(buf.size() * 2);
  }
  if (err != 0 || found == nullptr) return {};
  std::vector<gid_t> groups(64);
  int n = static_cast<int>(groups.size());
  while (getgrouplist(pw.pw_name, pw.pw_gid, groups.data(), &n) < 0) {
    if (n <= static_cast<int>(groups.size()) || n > 65536) return {};
    groups.resize(static_cast<size_t>(n));
  }
  groups.resize(static_cast<size_t>(n));
  return groups;
}

// The peers that may connect and the admins, resolved from names once per
// Start/Reconfigure; a peer's supplementary groups are looked up when it
// connects and neither its uid nor its gid is allowed (the group database
// as it is then, so a change to it needs no reload).
struct AllowedPeers {
  std::set<uint32_t> uids;    // allowed users, and members of allowed groups
  std::set<uint32_t> gids;    // allowed groups
  std::set<uint32_t> admins;  // [control] admins (root and the service's user count too)

  bool Allows(uint32_t uid, uint32_t gid) const {
    if (IsAdmin(uid) || uids.count(uid) != 0 || gids.count(gid) != 0) return true;
    if (gids.empty()) return false;
    for (gid_t g : GroupsOfUser(uid)) {
      if (gids.count(static_cast<uint32_t>(g)) != 0) return true;
    }
    return false;
  }
  // May change any experiment and shut the service down.
  bool IsAdmin(uint32_t uid) const {
    return uid == 0 || uid == static_cast<uint32_t>(geteuid()) || admins.count(uid) != 0;
  }
};

StatusOr<uint32_t> UserId(const std::string& name) {
  if (AllDigits(name)) return static_cast<uint32_t>(std::stoul(name));
  std::vector<char> buf = LookupBuffer(_SC_GETPW_R_SIZE_MAX);
  while (true) {
    passwd pw;
    passwd* found = nullptr;
    int err = getpwnam_r(name.c_str(), &pw, buf.data(), buf.size(), &found);
    if (err == ERANGE && buf.size() < (size_t{1} << 24)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (err != 0) return Status::IOError("looking up user '" + name + "': " + Errno(err));
    if (found == nullptr) return Status::NotFound("no user named '" + name + "'");
    return static_cast<uint32_t>(pw.pw_uid);
  }
}

// The group's id and the uids of its listed (supplementary) members.
Status AddGroup(const std::string& name, AllowedPeers* peers) {
  if (AllDigits(name)) {
    peers->gids.insert(static_cast<uint32_t>(std::stoul(name)));
    return Status::OK();
  }
  std::vector<char> buf = LookupBuffer(_SC_GETGR_R_SIZE_MAX);
  std::vector<std::string> members;
  while (true) {
    group gr;
    group* found = nullptr;
    int err = getgrnam_r(name.c_str(), &gr, buf.data(), buf.size(), &found);
    if (err == ERANGE && buf.size() < (size_t{1} << 24)) {
      buf.resize(buf.size() * 2);
      continue;
    }
    if (err != 0) return Status::IOError("looking up group '" + name + "': " + Errno(err));
    if (found == nullptr) return Status::NotFound("no group named '" + name + "'");
    peers->gids.insert(static_cast<uint32_t>(gr.gr_gid));
    for (char** m = gr.gr_mem; m != nullptr && *m != nullptr; ++m) members.emplace_back(*m);
    break;
  }
  for (const auto& m : members) {
    auto uid = UserId(m);
    if (uid.ok()) peers->uids.insert(*uid);
  }
  return Status::OK();
}

StatusOr<AllowedPeers> ResolvePeers(const ControlOptions& options) {
  AllowedPeers peers;
  for (const auto& u : options.allowed_users) {
    auto uid = UserId(u);
    if (!uid.ok()) return uid.status().WithPrefix("allowed_users");
    peers.uids.insert(*uid);
  }
  for (const auto& g : options.allowed_groups) {
    Status s = AddGroup(g, &peers);
    if (!s.ok()) return s.WithPrefix("allowed_groups");
  }
  for (const auto& u : options.admins) {
    auto uid = UserId(u);
    if (!uid.ok()) return uid.status().WithPrefix("admins");
    peers.admins.insert(*uid);
  }
  return peers;
}

bool PeerCredentials(int fd, uint32_t* uid, uint32_t* gid) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) return false;
  *uid = static_cast<uint32_t>(cred.uid);
  *gid = static_cast<uint32_t>(cred.gid);
  return true;
}

// Whether a server answers at `path`: a non-blocking connect, so a full
// backlog reads as alive rather than blocking.
StatusOr<bool> SocketIsLive(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IOError("socket(): " + Errno(errno));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int err = rc == 0 ? 0 : errno;
  close(fd);
  if (rc == 0 || err == EAGAIN || err == EINPROGRESS) return true;
  if (err == ECONNREFUSED || err == ENOENT) return false;
  return Status::IOError("probing control socket " + path + ": " + Errno(err));
}

std::string Str(const json& request, const char* key, const std::string& fallback = "") {
  auto it = request.find(key);
  return it == request.end() ? fallback : it->get<std::string>();
}

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0) return "";
  return name;
}

ServiceInfo Service(ControlTarget* target, const ControlOptions& options,
                    Clock::time_point started) {
  ServiceInfo s;
  s.version = protocol::CkptVersion();
  s.host = HostName();
  s.pid = getpid();
  s.uptime_s = std::chrono::duration<double>(Clock::now() - started).count();
  s.store = target->StorePath();
  s.socket = options.socket_path;
  return s;
}

// A NotFound about an experiment that does not exist, with the names that do.
Status WithKnownExperiments(ControlTarget* target, const json& request, Status error) {
  if (!error.IsNotFound() || !request.contains("experiment")) return error;
  const std::string wanted = Str(request, "experiment");
  std::string names;
  for (const auto& s : target->ListExperiments()) {
    if (s.id == wanted) return error;  // the member or version is what is missing
    names += (names.empty() ? "" : ", ") + s.id;
  }
  return Status::NotFound(
      "experiment '" + wanted + "' not found (" +
      (names.empty() ? std::string("the scheduler has no experiments") : "experiments: " + names) +
      ")");
}

// Who may change what: any allowed user may submit, and change the
// experiments it submitted; changing another's experiment, or one with no
// recorded submitter, and shutdown need an admin. Reading is open to all.
Status Authorize(ControlTarget* target, const AllowedPeers& peers, uint32_t uid,
                 const protocol::Request& request) {
  if (!request.mutates || request.verb == "submit" || peers.IsAdmin(uid)) return Status::OK();
  const std::string admins =
      "root, the service's own user (uid " + std::to_string(geteuid()) + ") and [control] admins";
  const std::string who = "permission denied: uid " + std::to_string(uid);
  if (request.verb == "shutdown") {
    return Status::FailedPrecondition(who + " may not shut the service down; only admins may (" +
                                      admins + ")");
  }
  const std::string exp = Str(request.body, "experiment");
  CKPT_ASSIGN_OR_RETURN(std::optional<uint32_t> owner, target->Submitter(exp));
  if (owner && *owner == uid) return Status::OK();
  return Status::FailedPrecondition(
      who + " may not " + request.verb + " experiment '" + exp + "', " +
      (owner ? "submitted by uid " + std::to_string(*owner)
             : std::string("which records no submitter")) +
      "; a user changes only its own experiments, admins any (" + admins + ")");
}

// Runs one validated and authorized request (any but submit, which
// Connection::StartSubmit runs) against the scheduler. `shutdown_why` is set
// when the reply must be followed by a graceful stop.
StatusOr<json> Execute(ControlTarget* target, const ServiceInfo& service, const std::string& verb,
                       const json& request, std::string* shutdown_why) {
  json reply = {{"ok", true}};
  if (verb == "list") {
    json list = json::array();
    for (const auto& s : target->ListExperiments()) {
      list.push_back(protocol::SummaryToJson(s, false));
    }
    reply["experiments"] = std::move(list);
  } else if (verb == "status") {
    if (request.contains("experiment")) {
      CKPT_ASSIGN_OR_RETURN(ExperimentSummary s,
                            target->ExperimentStatus(Str(request, "experiment")));
      reply["experiment"] = protocol::SummaryToJson(s, true);
    } else {
      json list = json::array();
      for (const auto& s : target->ListExperiments()) {
        list.push_back(protocol::SummaryToJson(s, true));
      }
      reply["experiments"] = std::move(list);
    }
    json devices = json::array();
    for (const auto& w : target->DeviceStatus()) devices.push_back(protocol::WorkerToJson(w));
    reply["devices"] = std::move(devices);
    reply["service"] = protocol::ServiceToJson(service);
  } else if (verb == "pause") {
    CKPT_RETURN_IF_ERROR(target->Pause(Str(request, "experiment")));
  } else if (verb == "resume") {
    CKPT_RETURN_IF_ERROR(target->Resume(Str(request, "experiment")));
  } else if (verb == "stop") {
    CKPT_RETURN_IF_ERROR(target->Stop(Str(request, "experiment")));
  } else if (verb == "restore") {
    CKPT_ASSIGN_OR_RETURN(int64_t v,
                          target->Restore(Str(request, "experiment"), Str(request, "member"),
                                          request.at("version").get<int64_t>()));
    reply["version"] = v;
  } else if (verb == "pin") {
    CKPT_RETURN_IF_ERROR(target->Pin(Str(request, "experiment"), Str(request, "member"),
                                     request.at("version").get<int64_t>()));
  } else if (verb == "unpin") {
    CKPT_RETURN_IF_ERROR(target->Unpin(Str(request, "experiment"), Str(request, "member"),
                                       request.at("version").get<int64_t>()));
  } else if (verb == "shutdown") {
    *shutdown_why = Str(request, "why", "shutdown requested over the control socket");
  }
  return reply;
}

class Connection;

// Submissions validated at once (SubmitValidator), overrun ones included.
constexpr int kMaxValidations = 2;

// State shared by the server and its connections; connections hold it by
// shared_ptr so a handler that runs after Close never touches freed memory.
// Owned by the event loop thread.
struct Core {
  Core(ControlTarget* t, const ControlOptions& o, AllowedPeers p)
      : target(t),
        options(o),
        peers(std::move(p)),
        acceptor(t->io()),
        retry(t->io()),
        validator(std::make_unique<SubmitValidator>(t->io(), kMaxValidations)) {}

  ControlTarget* target;
  ControlOptions options;
  AllowedPeers peers;
  const Clock::time_point started = Clock::now();
  local::acceptor acceptor;
  asio::steady_timer retry;  // re-accept after an accept error (EMFILE, ...)
  bool closed = false;
  uint64_t next_id = 1;
  std::map<uint64_t, std::weak_ptr<Connection>> connections;
  // Submissions being validated off the loop; ControlServerImpl's destructor
  // resets it, joining their threads.
  std::unique_ptr<SubmitValidator> validator;
};

// Timer cancellation cannot fail on Linux's reactor, but its signature may
// throw; nothing may escape the event loop or a destructor.
void CancelTimer(asio::steady_timer* timer) {
  try {
    timer->cancel();
  } catch (const boost::system::system_error&) {
    // The timer fires later and finds its owner closed.
  }
}

void Log(const std::string& line) { Logger().info("control: {}", line); }

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Core> core, local::socket socket, uint64_t id, uint32_t uid)
      : core_(std::move(core)),
        socket_(std::move(socket)),
        deadline_(core_->target->io()),
        id_(id),
        uid_(uid) {}

  void Start() {
    ArmDeadline();
    Next();
  }

  // Answers once with `error` and closes.
  void Refuse(const Status& error) {
    ArmDeadline();
    Send(protocol::ErrorReply(error), /*close_after=*/true, "");
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    boost::system::error_code ignored;
    CancelTimer(&deadline_);
    socket_.shutdown(local::socket::shutdown_both, ignored);
    socket_.close(ignored);
    core_->connections.erase(id_);
  }

 private:
  void ArmDeadline() {
    deadline_.expires_after(core_->options.client_idle_timeout);
    deadline_.async_wait([self = shared_from_this()](const boost::system::error_code& ec) {
      if (ec || self->closed_) return;
      if (!self->buffer_.empty()) {
        Log("closing a client (uid " + std::to_string(self->uid_) +
            ") that stalled mid-request for " +
            std::to_string(self->core_->options.client_idle_timeout.count()) + " ms");
      }
      self->Close();
    });
  }

  // Answers the next buffered line, or reads more.
  void Next() {
    if (closed_) return;
    const size_t limit = core_->options.max_request_bytes;
    const size_t nl = buffer_.find('\n');
    if (nl == std::string::npos) {
      if (buffer_.size() > limit) {
        Oversized(buffer_.size());
        return;
      }
      Read();
      return;
    }
    std::string line = buffer_.substr(0, nl);
    buffer_.erase(0, nl + 1);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() > limit) {
      Oversized(line.size());
      return;
    }
    Handle(line);
  }

  void Oversized(size_t seen) {
    Log("closing a client (uid " + std::to_string(uid_) + ") that sent a request line of " +
        (buffer_.find('\n') == std::string::npos ? "at least " : "") + std::to_string(seen) +
        " bytes");
    buffer_.clear();
    Send(protocol::ErrorReply(Status::ResourceExhausted(
             "request line of " + std::to_string(seen) + "+ bytes exceeds max_request_bytes (" +
             std::to_string(core_->options.max_request_bytes) + "); closing the connection")),
         /*close_after=*/true, "");
  }

  void Read() {
    socket_.async_read_some(
        asio::buffer(chunk_),
        [self = shared_from_this()](const boost::system::error_code& ec, size_t n) {
          if (self->closed_) return;
          if (ec) {  // EOF or reset: the client is gone
            self->Close();
            return;
          }
          self->buffer_.append(self->chunk_.data(), n);
          self->Next();
        });
  }

  void Handle(const std::string& line) {
    protocol::Request request;
    Status error = protocol::ParseRequest(line, &request);
    std::string shutdown_why;
    json reply;
    if (error.ok()) {
      if (request.mutates) Log("uid " + std::to_string(uid_) + ": " + request.verb);
      error = Authorize(core_->target, core_->peers, uid_, request);
      if (!error.ok()) {
        if (!error.IsNotFound()) Log("refused: " + error.message());
        error = WithKnownExperiments(core_->target, request.body, error);
      }
    }
    if (error.ok() && request.verb == "submit") {
      error = StartSubmit(request);
      if (error.ok()) return;  // answered when the validation ends
    } else if (error.ok()) {
      auto result = Execute(core_->target, Service(core_->target, core_->options, core_->started),
                            request.verb, request.body, &shutdown_why);
      if (result.ok()) {
        reply = std::move(*result);
      } else {
        error = WithKnownExperiments(core_->target, request.body, result.status());
      }
    }
    const json& id = request.id;
    if (!error.ok()) reply = protocol::ErrorReply(error);
    if (!id.is_null()) reply["id"] = id;
    Send(reply, /*close_after=*/false, shutdown_why);
  }

  // Validates a submission off the loop (SubmitValidator), then submits it
  // here. No further request of this connection is read meanwhile (replies
  // stay in order), and the idle deadline waits: the validation's bound
  // replaces it.
  Status StartSubmit(const protocol::Request& request) {
    const std::string toml = request.body.at("toml").get<std::string>();
    const std::string origin = Str(request.body, "origin", "submitted TOML");
    CancelTimer(&deadline_);
    json id = request.id;
    // The callback holds the connection: nothing else does while no read or
    // timer of it is pending.
    Status started = core_->validator->Start(
        core_->options, toml, origin,
        [self = shared_from_this(), id](StatusOr<records::ExperimentConfig> config) {
          self->FinishSubmit(std::move(config), id);
        });
    if (!started.ok()) ArmDeadline();
    return started;
  }

  void FinishSubmit(StatusOr<records::ExperimentConfig> config, const json& id) {
    if (closed_) return;  // the submitter left: nothing is created for it
    json reply = {{"ok", true}};
    Status error = config.status();
    if (error.ok()) {
      auto submitted = core_->target->SubmitConfig(*config, uid_);
      error = submitted.status();
      if (submitted.ok()) reply["experiment"] = *submitted;
    }
    if (!error.ok()) {
      Logger().warn("control: submit refused: {}", error.message());
      reply = protocol::ErrorReply(error);
    }
    if (!id.is_null()) reply["id"] = id;
    Send(reply, /*close_after=*/false, "");
  }

  // Writes one reply line; then closes, stops the scheduler, or goes on.
  void Send(const json& reply, bool close_after, const std::string& shutdown_why) {
    out_ = protocol::Dump(reply);
    out_ += '\n';
    asio::async_write(socket_, asio::buffer(out_),
                      [self = shared_from_this(), close_after, shutdown_why](
                          const boost::system::error_code& ec, size_t) {
                        if (!shutdown_why.empty()) {
                          // The reply went out (or the client left); the stop closes every
                          // connection, this one included.
                          self->Close();
                          self->core_->target->Shutdown(shutdown_why);
                          return;
                        }
                        if (self->closed_) return;
                        if (ec || close_after) {
                          self->Close();
                          return;
                        }
                        self->ArmDeadline();
                        self->Next();
                      });
  }

  std::shared_ptr<Core> core_;
  local::socket socket_;
  asio::steady_timer deadline_;  // idle / stalled-request bound
  uint64_t id_;
  uint32_t uid_;
  bool closed_ = false;
  std::string buffer_;  // received bytes not yet answered
  std::array<char, 16384> chunk_{};
  std::string out_;  // the reply being written
};

void Accept(const std::shared_ptr<Core>& core);

void OnAccepted(const std::shared_ptr<Core>& core, const boost::system::error_code& ec,
                local::socket socket) {
  if (core->closed) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // Out of descriptors or a transient error: try again shortly rather than spin.
    Log("accept failed: " + ec.message());
    core->retry.expires_after(std::chrono::milliseconds(100));
    core->retry.async_wait([core](const boost::system::error_code& e) {
      if (!e) Accept(core);
    });
    return;
  }
  uint32_t uid = 0, gid = 0;
  const int fd = socket.native_handle();
  const bool have = core->options.peer_credentials ? core->options.peer_credentials(fd, &uid, &gid)
                                                   : PeerCredentials(fd, &uid, &gid);
  const uint64_t id = core->next_id++;
  const bool full = static_cast<int>(core->connections.size()) >= core->options.max_clients;
  auto conn = std::make_shared<Connection>(core, std::move(socket), id, uid);
  core->connections[id] = conn;
  if (!have) {
    Log("refused a client whose credentials could not be read");
    conn->Refuse(Status::FailedPrecondition(
        "permission denied: the peer's credentials (SO_PEERCRED) could not be read"));
  } else if (!core->peers.Allows(uid, gid)) {
    Log("refused uid " + std::to_string(uid) + " gid " + std::to_string(gid) +
        ": not an allowed user or group");
    const auto& groups = core->options.allowed_groups;
    const std::string fix =
        groups.empty() ? "ask an administrator to add you to [control] allowed_users or "
                         "allowed_groups of the scheduler's configuration"
                       : "add yourself to group " + groups.front() + " (`sudo usermod -aG " +
                             groups.front() + " $USER`, then log in again)";
    conn->Refuse(Status::FailedPrecondition("permission denied: uid " + std::to_string(uid) +
                                            " (gid " + std::to_string(gid) +
                                            ") is not among the scheduler's allowed users or "
                                            "groups: " +
                                            fix));
  } else if (full) {
    conn->Refuse(Status::ResourceExhausted("too many clients: max_clients (" +
                                           std::to_string(core->options.max_clients) +
                                           ") connections are open; try again later"));
  } else {
    conn->Start();
  }
  Accept(core);
}

void Accept(const std::shared_ptr<Core>& core) {
  if (core->closed) return;
  core->acceptor.async_accept([core](const boost::system::error_code& ec, local::socket socket) {
    OnAccepted(core, ec, std::move(socket));
  });
}

class ControlServerImpl : public ControlServer {
 public:
  ControlServerImpl(std::shared_ptr<Core> core, dev_t dev, ino_t ino)
      : core_(std::move(core)), dev_(dev), ino_(ino) {}
  ~ControlServerImpl() override {
    CloseNow();
    core_->validator.reset();  // joins validations still running
  }

  std::string Reconfigure(const ControlOptions& next) override {
    std::vector<std::string> not_applied;
    if (next.socket_path != core_->options.socket_path) {
      not_applied.push_back("socket_path (" + next.socket_path + "): restart to move the socket");
    }
    auto peers = ResolvePeers(next);
    if (peers.ok()) {
      core_->peers = std::move(*peers);
      core_->options.allowed_users = next.allowed_users;
      core_->options.allowed_groups = next.allowed_groups;
      core_->options.admins = next.admins;
    } else {
      not_applied.push_back("allowed users/groups/admins (" + peers.status().message() +
                            "; the previous ones stay)");
    }
    core_->options.max_request_bytes = next.max_request_bytes;
    core_->options.max_clients = next.max_clients;
    core_->options.client_idle_timeout = next.client_idle_timeout;
    core_->options.submit_validation_timeout = next.submit_validation_timeout;
    core_->options.allowed_model_dirs = next.allowed_model_dirs;
    core_->options.allowed_data_dirs = next.allowed_data_dirs;
    if (next.peer_credentials) core_->options.peer_credentials = next.peer_credentials;
    std::string out;
    for (const auto& s : not_applied) out += (out.empty() ? "" : "; ") + s;
    return out;
  }

  void Close() override { CloseNow(); }

 private:
  void CloseNow() {
    if (core_->closed) return;
    core_->closed = true;
    boost::system::error_code ignored;
    CancelTimer(&core_->retry);
    core_->acceptor.close(ignored);
    std::vector<std::shared_ptr<Connection>> open;
    for (auto& [id, weak] : core_->connections) {
      if (auto c = weak.lock()) open.push_back(std::move(c));
    }
    for (auto& c : open) c->Close();
    core_->connections.clear();
    // Only the socket this server bound: a file that replaced it is another's.
    struct stat st;
    const std::string& path = core_->options.socket_path;
    if (lstat(path.c_str(), &st) == 0 && st.st_dev == dev_ && st.st_ino == ino_) {
      unlink(path.c_str());
    }
  }

  std::shared_ptr<Core> core_;
  dev_t dev_;
  ino_t ino_;
};

Status PrepareDirectory(const std::filesystem::path& dir) {
  std::error_code ec;
  if (dir.empty()) return Status::OK();
  if (std::filesystem::exists(dir, ec)) {
    if (!std::filesystem::is_directory(dir, ec)) {
      return Status::FailedPrecondition("runtime directory " + dir.string() +
                                        " exists and is not a directory");
    }
    return Status::OK();
  }
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return Status::IOError("creating runtime directory " + dir.string() + ": " + ec.message());
  if (chmod(dir.c_str(), 0750) != 0) {
    return Status::IOError("chmod 0750 " + dir.string() + ": " + Errno(errno));
  }
  return Status::OK();
}

}  // namespace

StatusOr<std::unique_ptr<ControlServer>> ControlServer::Start(ControlTarget* target,
                                                              const ControlOptions& options) {
  const std::string& path = options.socket_path;
  if (path.empty()) return Status::InvalidArgument("control socket path is empty");
  if (path.size() >= sizeof(sockaddr_un{}.sun_path)) {
    return Status::InvalidArgument("control socket path " + path + " is " +
                                   std::to_string(path.size()) + " bytes; the limit is " +
                                   std::to_string(sizeof(sockaddr_un{}.sun_path) - 1));
  }
  if (options.max_clients < 1) return Status::InvalidArgument("max_clients must be at least 1");
  if (options.max_request_bytes < 2) {
    return Status::InvalidArgument("max_request_bytes must be at least 2");
  }
  CKPT_ASSIGN_OR_RETURN(AllowedPeers peers, ResolvePeers(options));
  CKPT_RETURN_IF_ERROR(PrepareDirectory(std::filesystem::path(path).parent_path()));

  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::FailedPrecondition("control socket path " + path +
                                        " exists and is not a socket; remove it or choose "
                                        "another path");
    }
    CKPT_ASSIGN_OR_RETURN(bool live, SocketIsLive(path));
    if (live) {
      return Status::AlreadyExists("control socket " + path +
                                   " is served by a running scheduler; it is left in place");
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::IOError("removing stale control socket " + path + ": " + Errno(errno));
    }
  }

  auto core = std::make_shared<Core>(target, options, std::move(peers));
  boost::system::error_code ec;
  try {
    const local::endpoint endpoint(path);
    core->acceptor.open(endpoint.protocol(), ec);
    if (!ec) core->acceptor.bind(endpoint, ec);
    if (!ec) core->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  } catch (const boost::system::system_error& e) {
    ec = e.code();
  }
  if (ec) {
    boost::system::error_code ignored;
    core->acceptor.close(ignored);
    return Status::IOError("binding control socket " + path + ": " + ec.message());
  }
  if (chmod(path.c_str(), 0660) != 0 || lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    boost::system::error_code ignored;
    core->acceptor.close(ignored);
    unlink(path.c_str());
    return Status::IOError("setting up control socket " + path + ": " + Errno(err));
  }
  Accept(core);
  return std::unique_ptr<ControlServer>(new ControlServerImpl(core, st.st_dev, st.st_ino));
}

}  // namespace ckpt::scheduler
