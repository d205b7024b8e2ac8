// The stop signals of a tool that spawns ranks (sparsereduce-perf --spawn, sparsereduce-gloo-bench --spawn,
// sparsereduce-demo): a SIGINT, SIGTERM or SIGHUP stops the tracked ranks (SIGTERM), so that the run ends as usual
// (rank 0's output ends, the ranks are reaped, the temporary directory removed) and the tool can exit 128 + the
// signal. A rank that has not ended `kill_after` later (stopped, or stuck in the kernel), or at a second stop signal
// (Ctrl-C twice), gets SIGKILL: a stop never waits on a rank's own timeouts. The signals are blocked in the
// constructing thread and waited for on a thread of their own; spawn children with none blocked (tools::Subprocess
// does). SIGUSR1 is blocked too: the destructor wakes the waiter with it. One from outside (kill -USR1) is taken and
// ignored.
#pragma once

#include <signal.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace sparsereduce::tools {

class StopSignals {
 public:
  // `tool` names the tool in the message that says ranks were killed.
  explicit StopSignals(std::string tool, std::chrono::milliseconds kill_after = std::chrono::seconds(10));
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Registers a rank to stop; false (and the rank is stopped) if a signal came already. Call it before the rank is
  // reaped: the rank is then held by a pidfd, so a signal never reaches another process that reuses its pid.
  bool Track(int pid);
  // Stops tracking a rank.
  void Untrack(int pid);
  // The stop signal that came, or 0: also one sent to the process that the waiter thread has not taken yet (a
  // child that the same Ctrl-C ended, as the terminal signals the whole process group, can be seen to have died
  // before the waiter runs).
  int caught() const;

 private:
  struct Rank {
    int pid;
    int pidfd;  // -1 on a kernel without pidfd_open: signalled by pid
  };

  void WaitForSignals();
  // The stop signal that came (waiting at most until `deadline`, if given), SIGUSR1 for the destructor's wake-up,
  // or 0 when the deadline passed.
  int NextSignal(const std::chrono::steady_clock::time_point* deadline) const;
  // caught_, else a stop signal pending for the process. Call with mutex_ held.
  int CaughtOrPending() const;
  // Sends `signal` to the tracked ranks that have not ended; returns how many that was. Call with mutex_ held.
  int SignalRunning(int signal);

  const std::string tool_;
  const std::chrono::milliseconds kill_after_;
  sigset_t set_, previous_;
  mutable std::mutex mutex_;
  std::vector<Rank> ranks_;
  int caught_ = 0;
  std::atomic<bool> stopping_{false};  // set by the destructor before its wake-up
  std::thread waiter_;
};

}  // namespace sparsereduce::tools
