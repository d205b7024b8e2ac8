#include "tools/common/stop_signals.h"

#include <pthread.h>

#include <algorithm>

namespace sparsereduce::tools {

StopSignals::StopSignals() {
  sigemptyset(&set_);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&set_, sig);
  pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  waiter_ = std::thread([this] {
    int sig = 0;
    while (sigwait(&set_, &sig) != 0) {
    }
    if (sig == SIGUSR1) return;  // the destructor's wake-up
    std::lock_guard lock(mutex_);
    caught_ = sig;
    for (int pid : pids_) kill(pid, SIGTERM);
  });
}

StopSignals::~StopSignals() {
  pthread_kill(waiter_.native_handle(), SIGUSR1);  // pending for that thread if it already returned: harmless
  waiter_.join();
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

bool StopSignals::Track(int pid) {
  std::lock_guard lock(mutex_);
  pids_.push_back(pid);
  if (caught_) kill(pid, SIGTERM);
  return caught_ == 0;
}

void StopSignals::Untrack(int pid) {
  std::lock_guard lock(mutex_);
  pids_.erase(std::remove(pids_.begin(), pids_.end(), pid), pids_.end());
}

int StopSignals::caught() const {
  std::lock_guard lock(mutex_);
  return caught_;
}

}  // namespace sparsereduce::tools
