// Child processes for the demo, the perf tools and the multi-process tests: spawn, read stdout, write stdin, wait
// with a deadline, kill. A Subprocess still running when destroyed is killed (SIGKILL) and reaped. A child gets a
// signal (SIGTERM unless told otherwise) when the thread that spawned it ends (PR_SET_PDEATHSIG), so a tool killed
// outright leaves nothing running: spawn from a thread that outlives the child.
#pragma once

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace sparsereduce::tools {

struct SpawnOptions {
  bool capture_stdout = false;  // the child's stdout is a pipe, read by ReadStdout
  bool pipe_stdin = false;      // the child's stdin is a pipe, written by WriteStdin
  int parent_death_signal = SIGTERM;
};

class Subprocess {
 public:
  // Starts argv[0] (a path) with `argv`.
  static Result<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv, const SpawnOptions& options);
  static Result<std::unique_ptr<Subprocess>> Spawn(const std::vector<std::string>& argv, bool capture_stdout) {
    return Spawn(argv, SpawnOptions{.capture_stdout = capture_stdout});
  }

  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  int pid() const { return pid_; }
  // Reads the child's stdout until EOF or the deadline and returns it; with `on_chunk`, each piece goes there as it
  // arrives instead (and the result is empty).
  Result<std::string> ReadStdout(std::chrono::milliseconds timeout,
                                 const std::function<void(std::string_view)>& on_chunk = {});
  // Waits for the exit; returns the exit status as from waitpid (use WIFEXITED etc.), or DEADLINE_EXCEEDED.
  Result<int> Wait(std::chrono::milliseconds timeout);
  void Signal(int signal);
  // Writes all of `text` to the child's stdin (a pipe: SpawnOptions::pipe_stdin). May be called from another thread
  // than ReadStdout, not at the same time as CloseStdin.
  Status WriteStdin(std::string_view text);
  // Closes the child's stdin: it reads end of input.
  void CloseStdin();

 private:
  Subprocess(int pid, int stdout_fd, int stdin_fd) : pid_(pid), stdout_fd_(stdout_fd), stdin_fd_(stdin_fd) {}

  int pid_;
  int stdout_fd_;
  int stdin_fd_;
  std::optional<int> exit_status_;
};

// Describes a waitpid status: "exit code 3", "killed by signal 9 (SIGKILL)".
std::string DescribeExit(int status);

// Waits until `path` exists and holds a line, or the deadline passes, or `must_stay_alive` exits (it is then
// reaped: an exited child stays a zombie, which kill(pid, 0) would still find). Returns the line.
Result<std::string> WaitForFileLine(const std::string& path, std::chrono::milliseconds timeout,
                                    Subprocess* must_stay_alive = nullptr);

}  // namespace sparsereduce::tools
