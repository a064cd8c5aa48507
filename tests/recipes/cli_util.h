// Running a recipe binary as a user does, for the tests of what the binaries print and return.
#pragma once

#include <array>
#include <csignal>
#include <cstdio>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

namespace loom::test {

struct CliResult {
  int status;          // the exit code; -1 when the process did not exit normally
  int signal = 0;      // the signal that ended it, if one did
  std::string output;  // stdout and stderr together
};

// Runs `command` through the shell with stderr merged into stdout.
inline CliResult run_cli(const std::string& command) {
  std::string out;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) return {-1, 0, "popen failed"};
  std::array<char, 4096> buf;
  while (std::fgets(buf.data(), buf.size(), p)) out += buf.data();
  int status = pclose(p);
  if (WIFEXITED(status)) return {WEXITSTATUS(status), 0, out};
  return {-1, WIFSIGNALED(status) ? WTERMSIG(status) : 0, out};
}

// A recipe binary running in the background, read line by line, for tests that signal it.
class CliProcess {
 public:
  // Starts `command` (through the shell, exec'd so that pid() is the program's own).
  explicit CliProcess(const std::string& command) {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::dup2(fds[1], 2);
      ::close(fds[0]);
      ::close(fds[1]);
      ::execl("/bin/sh", "sh", "-c", ("exec " + command).c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
  }
  ~CliProcess() {
    if (pid_ > 0 && status_ < -1) {
      ::kill(pid_, SIGKILL);
      wait();
    }
    if (out_) std::fclose(out_);
  }
  CliProcess(const CliProcess&) = delete;
  CliProcess& operator=(const CliProcess&) = delete;

  // Reads lines until one contains `needle` (true) or the output ends (false).
  bool read_until(const std::string& needle) {
    std::array<char, 4096> buf;
    while (out_ && std::fgets(buf.data(), buf.size(), out_)) {
      output_ += buf.data();
      if (std::string(buf.data()).find(needle) != std::string::npos) return true;
    }
    return false;
  }
  void signal(int sig) const { ::kill(pid_, sig); }
  // Reads the rest of the output and returns the exit code (-1 when ended by a signal).
  int wait() {
    read_until("\x01never\x01");
    int status = 0;
    if (pid_ > 0 && status_ < -1 && ::waitpid(pid_, &status, 0) == pid_)
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return status_;
  }
  const std::string& output() const { return output_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
  int status_ = -2;  // -2: not waited for yet
  std::string output_;
};

}  // namespace loom::test
