#include "tools/common/subprocess.h"

#include <fcntl.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <thread>
#include <utility>

extern char** environ;

namespace sparsereduce::tools {
namespace {

using Clock = std::chrono::steady_clock;

int RemainingMs(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, INT_MAX));  // poll's int (a day is 8.6e7)
}

}  // namespace

namespace {

// The ends of a pipe; closes those still open.
struct Pipe {
  int read_end = -1;
  int write_end = -1;
  ~Pipe() {
    if (read_end >= 0) close(read_end);
    if (write_end >= 0) close(write_end);
  }
  Status Open() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) return Status(StatusCode::kInternal, std::string("pipe: ") + std::strerror(errno));
    read_end = fds[0];
    write_end = fds[1];
    return Status();
  }
  int Release(int& end) { return std::exchange(end, -1); }
};

}  // namespace

Result<std::unique_ptr<Subprocess>> Subprocess::Spawn(const std::vector<std::string>& argv,
                                                      const SpawnOptions& options) {
  if (argv.empty()) return InvalidArgument("no program to start");
  Pipe out, in;
  // The child reports a failed exec through this pipe (closed by a successful exec), as posix_spawn would.
  Pipe exec_error;
  for (auto [wanted, pipe] :
       {std::pair{options.capture_stdout, &out}, {options.pipe_stdin, &in}, {true, &exec_error}}) {
    if (Status opened = wanted ? pipe->Open() : Status::Ok(); !opened.ok()) return opened;
  }
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t parent = getpid();
  // fork, not posix_spawn: the child must ask for PR_SET_PDEATHSIG before it execs. Between fork and exec the child
  // makes only async-signal-safe calls (the parent may have other threads).
  const pid_t pid = fork();
  if (pid == 0) {
    // Ends with its parent: a tool killed by SIGKILL leaves no ranks or aggregators running. The check after the
    // prctl covers a parent that died before it.
    if (prctl(PR_SET_PDEATHSIG, options.parent_death_signal) != 0 || getppid() != parent) _exit(127);
    if (options.capture_stdout && dup2(out.write_end, STDOUT_FILENO) < 0) _exit(127);
    if (options.pipe_stdin && dup2(in.read_end, STDIN_FILENO) < 0) _exit(127);
    // No signal blocked, whatever the spawning thread blocks (sparsereduce-perf --spawn blocks the stop signals to
    // forward them): a blocked mask survives exec, and the child could not be stopped by them.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    execve(args[0], args.data(), environ);
    const int e = errno;
    [[maybe_unused]] const ssize_t n = write(exec_error.write_end, &e, sizeof e);
    _exit(127);
  }
  const int fork_errno = errno;
  close(exec_error.Release(exec_error.write_end));
  int exec_errno = 0;
  if (pid > 0) {
    ssize_t n;
    do {
      n = read(exec_error.read_end, &exec_errno, sizeof exec_errno);
    } while (n < 0 && errno == EINTR);
    if (n != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;  // EOF: the exec succeeded
  }
  if (pid < 0 || exec_errno != 0) {
    if (pid > 0) waitpid(pid, nullptr, 0);
    return Status(StatusCode::kUnavailable,
                  "cannot start " + argv[0] + ": " + std::strerror(pid < 0 ? fork_errno : exec_errno));
  }
  return std::unique_ptr<Subprocess>(new Subprocess(pid, out.Release(out.read_end), in.Release(in.write_end)));
}

Subprocess::~Subprocess() {
  if (!exit_status_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
  if (stdin_fd_ >= 0) close(stdin_fd_);
}

void Subprocess::Signal(int signal) {
  if (!exit_status_) kill(pid_, signal);
}

void Subprocess::CloseStdin() {
  if (stdin_fd_ >= 0) close(std::exchange(stdin_fd_, -1));
}

Status Subprocess::WriteStdin(std::string_view text) {
  if (stdin_fd_ < 0) return InvalidArgument("stdin is not a pipe");
  // A child that has exited makes the write fail with EPIPE and raise SIGPIPE, which would end this process: block
  // it on this thread for the write and take a pending one away before unblocking.
  sigset_t sigpipe, old_mask;
  sigemptyset(&sigpipe);
  sigaddset(&sigpipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &sigpipe, &old_mask);
  int error = 0;
  while (!text.empty()) {
    const ssize_t n = write(stdin_fd_, text.data(), text.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = errno;
      break;
    }
    text.remove_prefix(static_cast<size_t>(n));
  }
  if (error == EPIPE) {
    const timespec no_wait{0, 0};
    sigtimedwait(&sigpipe, nullptr, &no_wait);
  }
  pthread_sigmask(SIG_SETMASK, &old_mask, nullptr);
  if (error != 0) {
    return Status(StatusCode::kUnavailable,
                  "writing to process " + std::to_string(pid_) + "'s stdin: " + std::strerror(error));
  }
  return Status();
}

Result<std::string> Subprocess::ReadStdout(std::chrono::milliseconds timeout,
                                           const std::function<void(std::string_view)>& on_chunk) {
  if (stdout_fd_ < 0) return InvalidArgument("stdout was not captured");
  const auto deadline = Clock::now() + timeout;
  std::string out;
  char buf[4096];
  while (true) {
    pollfd pfd{stdout_fd_, POLLIN, 0};
    const int ready = poll(&pfd, 1, RemainingMs(deadline));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      return Status(StatusCode::kDeadlineExceeded, "process " + std::to_string(pid_) +
                                                       " did not close its output within " +
                                                       std::to_string(timeout.count()) + " ms");
    }
    const ssize_t n = read(stdout_fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return out;
    if (on_chunk) {
      on_chunk(std::string_view(buf, static_cast<size_t>(n)));
    } else {
      out.append(buf, static_cast<size_t>(n));
    }
  }
}

Result<int> Subprocess::Wait(std::chrono::milliseconds timeout) {
  if (exit_status_) return *exit_status_;
  const auto deadline = Clock::now() + timeout;
  // pidfd: poll on the child's exit instead of sleeping in a loop.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  while (true) {
    int status = 0;
    const pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      if (pidfd >= 0) close(pidfd);
      exit_status_ = status;
      return status;
    }
    if (Clock::now() >= deadline) break;
    if (pidfd >= 0) {
      pollfd pfd{pidfd, POLLIN, 0};
      poll(&pfd, 1, RemainingMs(deadline));
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // kernels without pidfd
    }
  }
  if (pidfd >= 0) close(pidfd);
  return Status(StatusCode::kDeadlineExceeded, "process " + std::to_string(pid_) + " did not exit within " +
                                                   std::to_string(timeout.count()) + " ms");
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* abbrev = sigabbrev_np(sig);  // "KILL" (glibc 2.32); null for a number with no name
    return "killed by signal " + std::to_string(sig) + (abbrev ? std::string(" (SIG") + abbrev + ")" : std::string());
  }
  return "status " + std::to_string(status);
}

Result<std::string> WaitForFileLine(const std::string& path, std::chrono::milliseconds timeout,
                                    Subprocess* must_stay_alive) {
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    std::ifstream in(path);
    std::string line;
    if (in && std::getline(in, line) && !line.empty()) return line;
    if (must_stay_alive) {
      if (Result<int> exited = must_stay_alive->Wait(std::chrono::milliseconds(0)); exited.ok()) {
        return Status(StatusCode::kUnavailable, "process " + std::to_string(must_stay_alive->pid()) + " ended (" +
                                                    DescribeExit(*exited) + ") before writing " + path);
      }
    }
    // The daemon renames the file into place once it listens; there is no event to wait on portably.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status(StatusCode::kDeadlineExceeded, path + " did not appear within " + std::to_string(timeout.count()) +
                                                   " ms");
}

}  // namespace sparsereduce::tools
