// StopSignals in a forked child each (the stop signal goes to the whole process, which must be one whose only
// other thread is StopSignals' own), with /bin/sleep as the ranks. A SIGSTOPped rank stands for one that does not
// end on SIGTERM: a stopped process acts on no signal but SIGKILL.
#include "tools/common/stop_signals.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <string>

#include "tools/common/subprocess.h"

namespace sparsereduce::tools {
namespace {

using std::chrono::milliseconds;

struct ChildResult {
  int exit_code = -1;  // the scenario's: 0 when every check in it held, else the number of the failed check
  std::string stderr_text;
};

// Runs `scenario` in a forked child with its stderr captured; the child exits with what `scenario` returns. Bounded:
// the child is killed after 60 s, and the reading ends at 70 s whatever holds the pipe open. The child leads a
// process group of its own, which is killed at the end: its ranks (stopped ones too, which ignore the SIGTERM of
// their parent's death) inherit the pipe and would otherwise keep the read waiting and outlive the test.
ChildResult RunInChild(const std::function<int()>& scenario) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  const pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    alarm(60);
    _exit(scenario());
  }
  setpgid(pid, pid);  // (also here: whichever of the two runs first)
  close(fds[1]);
  ChildResult result;
  char buf[4096];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(70);
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd readable{fds[0], POLLIN, 0};
    if (left.count() <= 0 || poll(&readable, 1, static_cast<int>(left.count())) <= 0) {
      result.stderr_text += "\n[RunInChild: the output did not end within 70 s]";
      break;
    }
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    result.stderr_text.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  kill(-pid, SIGKILL);  // the child, if the alarm did not end it, and everything it left in its group
  int status = 0;
  waitpid(pid, &status, 0);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
  return result;
}

// A rank: /bin/sleep, stopped (SIGSTOP) when it is to outlast SIGTERM.
std::unique_ptr<Subprocess> SleepingRank(bool stopped) {
  auto rank = Subprocess::Spawn({"/bin/sleep", "600"}, /*capture_stdout=*/false);
  if (!rank.ok()) return nullptr;
  if (stopped) {
    kill((*rank)->pid(), SIGSTOP);
    // Stopped once waitid reports it (WSTOPPED, without reaping), so that the SIGTERM surely finds it stopped.
    siginfo_t info{};
    waitid(P_PID, static_cast<id_t>((*rank)->pid()), &info, WSTOPPED | WNOWAIT);
  }
  return std::move(*rank);
}

bool KilledBy(Subprocess& rank, int signal) {
  auto status = rank.Wait(std::chrono::seconds(30));
  return status.ok() && WIFSIGNALED(*status) && WTERMSIG(*status) == signal;
}

// A rank that has not ended kill_after after the stop signal gets SIGKILL, and the tool says so. (A stop used to
// wait on such a rank for as long as the tool's own timeout for it.) Ranks that end on SIGTERM: the perf tests.
TEST(StopSignals, ARankStillRunningAfterTheGraceIsKilled) {
  const ChildResult r = RunInChild([] {
    StopSignals signals("test-tool", milliseconds(200));
    auto stuck = SleepingRank(/*stopped=*/true);
    if (!stuck) return 1;
    if (!signals.Track(stuck->pid())) return 2;
    kill(getpid(), SIGTERM);
    if (!KilledBy(*stuck, SIGKILL)) return 3;
    return signals.caught() == SIGTERM ? 0 : 4;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("test-tool: 1 process still running 0.2 s after the stop signal: killed (SIGKILL)"),
            std::string::npos)
      << r.stderr_text;
}

// A second stop signal (Ctrl-C twice) kills what the first did not end, without waiting out the grace (an hour here).
TEST(StopSignals, ASecondStopSignalKillsAtOnce) {
  const ChildResult r = RunInChild([] {
    StopSignals signals("test-tool", std::chrono::hours(1));
    auto stuck = SleepingRank(/*stopped=*/true);
    if (!stuck) return 1;
    if (!signals.Track(stuck->pid())) return 2;
    // Two different signals, so that neither is lost if both are pending at once (a signal pending twice is one).
    kill(getpid(), SIGTERM);
    kill(getpid(), SIGINT);
    if (!KilledBy(*stuck, SIGKILL)) return 3;
    return signals.caught() == SIGTERM || signals.caught() == SIGINT ? 0 : 4;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
  EXPECT_NE(r.stderr_text.find("test-tool: 1 process still running at a second stop signal ("), std::string::npos)
      << r.stderr_text;
}

// A rank tracked after the stop signal is stopped at once, and Track says the run is stopping.
TEST(StopSignals, ARankTrackedAfterTheStopIsStoppedAtOnce) {
  const ChildResult r = RunInChild([] {
    StopSignals signals("test-tool", std::chrono::hours(1));
    kill(getpid(), SIGHUP);
    while (signals.caught() == 0) {
      pollfd none{-1, 0, 0};
      poll(&none, 1, 1);  // the waiter thread takes the signal
    }
    auto late = SleepingRank(/*stopped=*/false);
    if (!late) return 1;
    if (signals.Track(late->pid())) return 2;
    if (!KilledBy(*late, SIGTERM)) return 3;
    return signals.caught() == SIGHUP ? 0 : 4;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

// The signals pending for a process (/proc/PID/status ShdPnd): a stopped process leaves them there.
uint64_t PendingSignals(int pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("ShdPnd:", 0) == 0) return std::stoull(line.substr(7), nullptr, 16);
  }
  return ~uint64_t{0};
}

// Untracked ranks are left alone: a tool reaps a rank only after Untrack, and its pid may be reused by then. Both
// ranks here are stopped, so a SIGTERM sent to the untracked one would stay pending, for the test to see.
TEST(StopSignals, AnUntrackedRankIsNotSignalled) {
  const ChildResult r = RunInChild([] {
    StopSignals signals("test-tool", milliseconds(1));
    auto untracked = SleepingRank(/*stopped=*/true);
    auto stuck = SleepingRank(/*stopped=*/true);
    if (!untracked || !stuck) return 1;
    signals.Track(untracked->pid());
    signals.Track(stuck->pid());
    signals.Untrack(untracked->pid());
    kill(getpid(), SIGTERM);
    if (!KilledBy(*stuck, SIGKILL)) return 2;  // both the SIGTERM and the SIGKILL round are over
    if (PendingSignals(untracked->pid()) != 0) return 3;
    if (untracked->Wait(milliseconds(0)).ok()) return 4;  // it ended: it got the SIGKILL
    return 0;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

// A SIGUSR1 from outside (`kill -USR1 <pid>`) is not the destructor's wake-up: it ended the waiter thread, and the
// SIGTERM after it stayed blocked and pending with nobody to take it (the rank was never stopped; only SIGKILL ended
// the tool). It is ignored now, and the stop signal after it stops the rank.
TEST(StopSignals, ASigusr1FromOutsideDoesNotEndTheWaiting) {
  const ChildResult r = RunInChild([] {
    StopSignals signals("test-tool", std::chrono::hours(1));
    auto rank = SleepingRank(/*stopped=*/false);
    if (!rank) return 1;
    if (!signals.Track(rank->pid())) return 2;
    kill(getpid(), SIGUSR1);  // as from a shell: SI_USER
    // Taken by the waiter before the SIGTERM is sent, as in `kill -USR1 PID; kill -TERM PID`.
    const uint64_t usr1 = uint64_t{1} << (SIGUSR1 - 1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (PendingSignals(getpid()) & usr1) {
      if (std::chrono::steady_clock::now() > deadline) return 3;
      pollfd none{-1, 0, 0};
      poll(&none, 1, 1);
    }
    kill(getpid(), SIGTERM);
    if (!KilledBy(*rank, SIGTERM)) return 4;
    return signals.caught() == SIGTERM ? 0 : 5;
  });
  EXPECT_EQ(r.exit_code, 0) << r.stderr_text;
}

}  // namespace
}  // namespace sparsereduce::tools
