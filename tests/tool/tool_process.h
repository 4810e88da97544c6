// A command run by the tool's whole-process tests (tool_test, client_test):
// stdout and stderr to files, stdin from /dev/null, extra environment
// entries on top of this process's, killed on destruction.
#ifndef CKPT_TESTS_TOOL_TOOL_PROCESS_H_
#define CKPT_TESTS_TOOL_TOOL_PROCESS_H_

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

extern char** environ;

namespace ckpt::testing {

struct Result {
  int code = -1;  // exit status; 128 + signal when killed
  std::string out;
  std::string err;
};

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class Process {
 public:
  // argv[0] is looked up in PATH when it has no '/'.
  Process(const std::vector<std::string>& argv, const std::string& log_prefix,
          const std::vector<std::string>& env = {})
      : out_(log_prefix + ".out"), err_(log_prefix + ".err") {
    std::vector<std::string> envs;
    for (char** e = environ; *e != nullptr; ++e) envs.emplace_back(*e);
    for (const auto& e : env) envs.push_back(e);
    pid_ = fork();
    if (pid_ == 0) {
      int o = open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      int r = open(err_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      dup2(o, 1);
      dup2(r, 2);
      int null = open("/dev/null", O_RDONLY);
      dup2(null, 0);
      std::vector<char*> a, ev;
      for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
      a.push_back(nullptr);
      for (const auto& s : envs) ev.push_back(const_cast<char*>(s.c_str()));
      ev.push_back(nullptr);
      execvpe(a[0], a.data(), ev.data());
      _exit(127);
    }
  }
  ~Process() {
    if (pid_ > 0 && !done_) {
      kill(pid_, SIGKILL);
      Wait();
    }
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;

  pid_t pid() const { return pid_; }
  bool Exited() {
    if (done_) return true;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) Finish(st);
    return done_;
  }
  Result Wait() {
    if (!done_) {
      int st = 0;
      while (waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
      }
      Finish(st);
    }
    return Result{code_, Slurp(out_), Slurp(err_)};
  }
  std::string Out() const { return Slurp(out_); }
  std::string Log() const { return Slurp(out_) + Slurp(err_); }

 private:
  void Finish(int st) {
    done_ = true;
    code_ = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  }
  pid_t pid_ = -1;
  bool done_ = false;
  int code_ = -1;
  std::string out_, err_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TOOL_TOOL_PROCESS_H_
