// The stop signals of a tool that spawns ranks (sparsereduce-perf --spawn, sparsereduce-gloo-bench --spawn): a
// SIGINT, SIGTERM or SIGHUP stops the tracked ranks (SIGTERM), so that the run ends as usual (rank 0's output ends,
// the ranks are reaped, the temporary directory removed) and the tool can exit 128 + the signal. The signals are
// blocked in the constructing thread and waited for on a thread of their own; spawn children with none blocked
// (tools::Subprocess does).
#pragma once

#include <signal.h>

#include <mutex>
#include <thread>
#include <vector>

namespace sparsereduce::tools {

class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Registers a rank to stop; false (and the rank is stopped) if a signal came already. Call it before the rank is
  // reaped (a reaped pid may be reused).
  bool Track(int pid);
  // Stops tracking a rank about to be reaped.
  void Untrack(int pid);
  // The signal that came, or 0.
  int caught() const;

 private:
  sigset_t set_, previous_;
  mutable std::mutex mutex_;
  std::vector<int> pids_;
  int caught_ = 0;
  std::thread waiter_;
};

}  // namespace sparsereduce::tools
