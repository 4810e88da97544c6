// Helpers for tests that run ckpt's programs as real processes.
#ifndef CKPT_TESTS_INTEGRATION_PROCESS_UTIL_H_
#define CKPT_TESTS_INTEGRATION_PROCESS_UTIL_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ckpt::testing {

// A loopback TCP port nothing listens on right now (the kernel's pick,
// released at once); 0 when none could be had.
inline int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// A child process with stdout+stderr captured to a file.
class Child {
 public:
  Child(const std::vector<std::string>& args, const std::string& log_path) : log_(log_path) {
    Start(args, nullptr, nullptr);
  }
  // With `env` as the child's whole environment, and `in_child` (when set)
  // called in the child before exec: the child exits 126 when it returns false.
  Child(const std::vector<std::string>& args, const std::string& log_path,
        const std::vector<std::string>& env, const std::function<bool()>& in_child = nullptr)
      : log_(log_path) {
    Start(args, &env, in_child ? &in_child : nullptr);
  }
  ~Child() {
    if (pid_ > 0 && !waited_) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  pid_t pid() const { return pid_; }
  // Waits for exit; returns the wait status.
  int Wait() {
    if (!waited_) {
      waitpid(pid_, &status_, 0);
      waited_ = true;
    }
    return status_;
  }
  // True when it exited within `timeout`.
  bool WaitFor(std::chrono::milliseconds timeout) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      if (waited_) return true;
      if (waitpid(pid_, &status_, WNOHANG) == pid_) {
        waited_ = true;
        return true;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  bool Running() {
    if (waited_) return false;
    if (waitpid(pid_, &status_, WNOHANG) == pid_) {
      waited_ = true;
      return false;
    }
    return true;
  }
  std::string Log() const {
    std::ifstream in(log_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  void Start(const std::vector<std::string>& args, const std::vector<std::string>* env,
             const std::function<bool()>* in_child) {
    std::vector<std::string> a = args, e = env ? *env : std::vector<std::string>();
    std::vector<char*> argv, envp;
    for (auto& s : a) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : e) envp.push_back(s.data());
    envp.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      dup2(fd, 1);
      dup2(fd, 2);
      if (in_child != nullptr && !(*in_child)()) _exit(126);
      if (env != nullptr) {
        execve(argv[0], argv.data(), envp.data());
      } else {
        execv(argv[0], argv.data());
      }
      _exit(127);
    }
  }

  pid_t pid_ = -1;
  int status_ = 0;
  bool waited_ = false;
  std::string log_;
};

// Direct children of `pid`, from /proc/*/stat.
inline std::vector<pid_t> ChildrenOf(pid_t pid) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    pid_t p = std::atoi(e->d_name);
    if (p <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    auto rp = line.rfind(')');
    if (rp == std::string::npos) continue;
    std::istringstream rest(line.substr(rp + 2));
    char state;
    pid_t ppid;
    rest >> state >> ppid;
    if (ppid == pid && state != 'Z') out.push_back(p);
  }
  closedir(d);
  return out;
}

inline std::string TempDir(const std::string& tag) {
  std::string tmpl = (std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") +
                     std::string("/ckpt-") + tag + "-XXXXXX";
  char* p = mkdtemp(tmpl.data());
  return p ? std::string(p) : std::string();
}

inline std::string Env(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_INTEGRATION_PROCESS_UTIL_H_
