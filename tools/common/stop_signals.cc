#include "tools/common/stop_signals.h"

#include <poll.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace sparsereduce::tools {
namespace {

constexpr int kStopSignals[] = {SIGINT, SIGTERM, SIGHUP};

}  // namespace

StopSignals::StopSignals(std::string tool, std::chrono::milliseconds kill_after)
    : tool_(std::move(tool)), kill_after_(kill_after) {
  sigemptyset(&set_);
  for (int sig : kStopSignals) sigaddset(&set_, sig);
  sigaddset(&set_, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set_, &previous_);
  waiter_ = std::thread([this] { WaitForSignals(); });
}

StopSignals::~StopSignals() {
  stopping_ = true;
  pthread_kill(waiter_.native_handle(), SIGUSR1);  // pending for that thread if it already returned: harmless
  waiter_.join();
  // A stop signal still pending belongs to the stop that was handled (or came as the tool ended): unblocked, it
  // would kill the tool and turn its exit code 128 + the signal into a death by the signal.
  // So would a SIGUSR1 from outside that came after the waiter ended: that one is taken in any case.
  sigset_t leftovers;
  sigemptyset(&leftovers);
  sigaddset(&leftovers, SIGUSR1);
  if (caught() != 0) leftovers = set_;
  const timespec now{0, 0};
  while (sigtimedwait(&leftovers, nullptr, &now) > 0) {
  }
  pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  for (const Rank& rank : ranks_) {
    if (rank.pidfd >= 0) close(rank.pidfd);
  }
}

int StopSignals::NextSignal(const std::chrono::steady_clock::time_point* deadline) const {
  while (true) {
    siginfo_t info{};
    int sig = 0;
    if (deadline == nullptr) {
      sig = sigwaitinfo(&set_, &info);
    } else {
      const auto left =
          std::max(*deadline - std::chrono::steady_clock::now(), std::chrono::steady_clock::duration(0));
      const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(left);
      const timespec timeout{
          static_cast<time_t>(seconds.count()),
          static_cast<long>(std::chrono::duration_cast<std::chrono::nanoseconds>(left - seconds).count())};
      sig = sigtimedwait(&set_, &info, &timeout);
      if (sig < 0 && errno == EAGAIN) return 0;
    }
    if (sig <= 0) continue;  // EINTR
    if (sig != SIGUSR1) return sig;
    // The destructor's wake-up is a SIGUSR1 this process sent (pthread_kill; glibc reports its SI_TKILL as SI_USER)
    // once stopping. Any other (kill -USR1 from outside) ended the waiter, and SIGINT, SIGTERM and SIGHUP then
    // stayed blocked with nobody to take them: only SIGKILL ended the tool. It is ignored.
    if (info.si_pid == getpid() && stopping_) return SIGUSR1;
  }
}

void StopSignals::WaitForSignals() {
  const int sig = NextSignal(nullptr);
  if (sig == SIGUSR1) return;  // the destructor's wake-up
  {
    std::lock_guard lock(mutex_);
    caught_ = sig;
    SignalRunning(SIGTERM);
  }
  // What the SIGTERM did not end within kill_after, or when a second stop signal comes, gets SIGKILL.
  const auto deadline = std::chrono::steady_clock::now() + kill_after_;
  const int second = NextSignal(&deadline);
  if (second == SIGUSR1) return;
  std::lock_guard lock(mutex_);
  if (const int killed = SignalRunning(SIGKILL); killed > 0) {
    char when[64];
    if (second) {
      std::snprintf(when, sizeof when, "at a second stop signal (%s)", sigabbrev_np(second));
    } else {
      std::snprintf(when, sizeof when, "%g s after the stop signal", kill_after_.count() / 1000.0);
    }
    std::fprintf(stderr, "%s: %d process%s still running %s: killed (SIGKILL)\n", tool_.c_str(), killed,
                 killed == 1 ? "" : "es", when);
  }
}

int StopSignals::SignalRunning(int signal) {
  int signalled = 0;
  for (const Rank& rank : ranks_) {
    if (rank.pidfd < 0) {
      if (kill(rank.pid, signal) == 0) ++signalled;
      continue;
    }
    pollfd ended{rank.pidfd, POLLIN, 0};  // readable once the process has exited
    if (poll(&ended, 1, 0) == 1) continue;
    if (syscall(SYS_pidfd_send_signal, rank.pidfd, signal, nullptr, 0) == 0) ++signalled;
  }
  return signalled;
}

bool StopSignals::Track(int pid) {
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
  std::lock_guard lock(mutex_);
  ranks_.push_back({pid, pidfd});
  if (CaughtOrPending() == 0) return true;
  SignalRunning(SIGTERM);
  return false;
}

void StopSignals::Untrack(int pid) {
  std::lock_guard lock(mutex_);
  const auto removed = std::remove_if(ranks_.begin(), ranks_.end(), [&](const Rank& rank) {
    if (rank.pid != pid) return false;
    if (rank.pidfd >= 0) close(rank.pidfd);
    return true;
  });
  ranks_.erase(removed, ranks_.end());
}

int StopSignals::caught() const {
  std::lock_guard lock(mutex_);
  return CaughtOrPending();
}

int StopSignals::CaughtOrPending() const {
  if (caught_ != 0) return caught_;
  // Blocked in every thread but while the waiter waits, a stop signal sent to the process stays pending until the
  // waiter takes it, which it is about to do.
  sigset_t pending;
  if (sigpending(&pending) != 0) return 0;
  for (int sig : kStopSignals) {
    if (sigismember(&pending, sig)) return sig;
  }
  return 0;
}

}  // namespace sparsereduce::tools
