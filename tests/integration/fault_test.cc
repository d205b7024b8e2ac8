// Fault tests: the real sparsereduce-aggregator daemon and real test worker processes on 127.0.0.1, with workers
// and daemons killed (SIGKILL) while collectives are in flight. They check what issue "Failures and bad input"
// promises:
//   - a dead worker: the other workers of its job fail within 2 s with PEER_LEFT naming the dead rank, other jobs
//     on the daemon keep running, and the job can be formed again by new processes;
//   - a dead aggregator: the workers fail within 2 s naming it ("aggregator I (HOST:PORT)"), and once a daemon is
//     back on that port new workers complete collectives;
//   - a failed allreduce leaves the caller's tensor bitwise as it was (the test worker's --verify-restore).
//
// Synchronization is on process output (each child's stdout is read line by line by a thread, lines are
// timestamped as they arrive), on process exit (pidfd) and on pipes; every wait has a deadline. Kill points are
// random: set SPARSEREDUCE_FAULT_SEED to repeat a run (the seed is printed). Detection latencies are printed as
// "[latency]" lines: "raise" is from just before kill() to the moment the worker's allreduce threw (the worker
// prints its CLOCK_MONOTONIC time, comparable across processes), "exit" until the test saw the worker exit.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/test_time.h"
#include "tools/common/subprocess.h"

namespace sparsereduce::testing {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The promise under test: the failure reaches the other processes within this (checked on the time the worker's
// allreduce threw; its exit, after restoring and printing, and a sanitizer's exit-time checks may take longer).
// Scaled in sanitizer builds (tests/test_time.h); the promise itself is checked by the uninstrumented runs.
const std::chrono::milliseconds kDetectionBound = TestTime(std::chrono::milliseconds(2000));
// Generous bounds for everything that is not under test (joining, first collectives on a loaded 2-core machine).
constexpr auto kStartupDeadline = 30s;
constexpr auto kFinishDeadline = 30s;

int64_t Ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

struct Line {
  Clock::time_point at;  // when the test read it
  std::string text;
};

bool StartsWith(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

size_t CountPrefix(const std::vector<Line>& lines, const std::string& prefix) {
  return static_cast<size_t>(
      std::count_if(lines.begin(), lines.end(), [&](const Line& l) { return StartsWith(l.text, prefix); }));
}

std::optional<std::string> FindPrefix(const std::vector<Line>& lines, const std::string& prefix) {
  for (const Line& l : lines) {
    if (StartsWith(l.text, prefix)) return l.text;
  }
  return std::nullopt;
}

// A child process (tools::Subprocess) whose stdout is read line by line, by a thread, as it arrives, and whose
// stdin is optionally a pipe. Killed (SIGKILL) and reaped when destroyed; killed with the test too
// (PR_SET_PDEATHSIG SIGKILL), so that a test process killed at ctest's timeout leaves no daemon or busy worker
// behind to load the rest of the run.
class Child {
 public:
  Child(std::string name, const std::vector<std::string>& argv, bool pipe_stdin) : name_(std::move(name)) {
    auto process = tools::Subprocess::Spawn(
        argv, {.capture_stdout = true, .pipe_stdin = pipe_stdin, .parent_death_signal = SIGKILL});
    if (!process.ok()) throw std::runtime_error(process.status().ToString());
    process_ = std::move(*process);
    reader_ = std::thread([this] { ReadLoop(); });
  }

  ~Child() {
    if (!exit_status_) process_->Signal(SIGKILL);
    (void)process_->Wait(kFinishDeadline);
    reader_.join();  // the child is gone, so its stdout reaches EOF
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  const std::string& name() const { return name_; }
  int pid() const { return process_->pid(); }

  std::vector<Line> Lines() const {
    std::lock_guard lock(mutex_);
    return lines_;
  }

  // Waits until `done(lines)` holds, stdout reached EOF, or the deadline. Returns done(lines).
  bool WaitForLines(const std::function<bool(const std::vector<Line>&)>& done, Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    cv_.wait_until(lock, deadline, [&] { return eof_ || done(lines_); });
    return done(lines_);
  }
  bool WaitForEof(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    return cv_.wait_until(lock, deadline, [&] { return eof_; });
  }

  bool WriteStdin(const std::string& text) { return process_->WriteStdin(text).ok(); }

  // Sends `signal`; returns the time just before it was sent.
  Clock::time_point Signal(int signal) {
    const Clock::time_point at = Clock::now();
    if (!exit_status_) process_->Signal(signal);
    return at;
  }

  // Waits for the exit until the deadline; the waitpid status, or nullopt.
  std::optional<int> WaitExit(Clock::time_point deadline) {
    if (exit_status_) return exit_status_;
    const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
    Result<int> exited = process_->Wait(std::chrono::ceil<std::chrono::milliseconds>(left));
    if (!exited.ok()) return std::nullopt;
    exit_seen_at_ = Clock::now();
    exit_status_ = *exited;
    return exit_status_;
  }
  std::optional<Clock::time_point> exit_seen_at() const { return exit_seen_at_; }
  bool Running() { return !WaitExit(Clock::now()); }

  std::string Dump(size_t last = 20) const {
    std::vector<Line> lines = Lines();
    std::ostringstream out;
    out << "--- " << name_ << " (pid " << pid() << ")"
        << (exit_status_ ? ", " + tools::DescribeExit(*exit_status_) : std::string(", running")) << ", " << lines.size()
        << " lines";
    if (lines.size() > last) out << ", last " << last;
    out << "\n";
    for (size_t i = lines.size() > last ? lines.size() - last : 0; i < lines.size(); ++i) {
      out << "  " << lines[i].text << "\n";
    }
    return out.str();
  }

 private:
  void ReadLoop() {
    std::string partial;
    // Reads until EOF: the process closes its stdout only by exiting, and the destructor kills it first.
    (void)process_->ReadStdout(std::chrono::hours(24), [&](std::string_view chunk) {
      const Clock::time_point now = Clock::now();
      partial.append(chunk);
      std::lock_guard lock(mutex_);
      for (size_t pos; (pos = partial.find('\n')) != std::string::npos;) {
        lines_.push_back({now, partial.substr(0, pos)});
        partial.erase(0, pos + 1);
      }
      cv_.notify_all();
    });
    std::lock_guard lock(mutex_);
    if (!partial.empty()) lines_.push_back({Clock::now(), partial});
    eof_ = true;
    cv_.notify_all();
  }

  std::string name_;
  std::unique_ptr<tools::Subprocess> process_;
  std::optional<int> exit_status_;
  std::optional<Clock::time_point> exit_seen_at_;
  std::thread reader_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Line> lines_;
  bool eof_ = false;
};

struct Latency {
  std::string what;
  double raise_ms;
  double exit_ms;
};

// Flags every worker of these tests gets.
const std::vector<std::string> kFaultFlags = {"--verify-restore", "--error-timestamp", "--timeout-ms", "20000"};
// Large collectives, back to back (--same-input: no reference computation between them), so that one is in
// flight most of the time.
const std::vector<std::string> kBusyFlags = {"--elements",    "4194304", "--density",   "0.5",
                                             "--collectives", "1000",    "--same-input"};

class FaultTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { signal(SIGPIPE, SIG_IGN); }  // writing to a dead child's stdin

  FaultTest() {
    uint64_t seed;
    if (const char* env = std::getenv("SPARSEREDUCE_FAULT_SEED")) {
      seed = std::strtoull(env, nullptr, 0);
    } else {
      seed = (uint64_t{std::random_device{}()} << 32) ^ std::random_device{}();
    }
    rng_.seed(seed);
    std::cout << "[seed] " << ::testing::UnitTest::GetInstance()->current_test_info()->name()
              << ": SPARSEREDUCE_FAULT_SEED=" << seed << std::endl;
  }

  void TearDown() override {
    if (HasFailure()) {
      for (const auto& c : children_) std::cout << c->Dump(c->name().rfind("aggregator", 0) == 0 ? 40 : 8);
    }
    if (!latencies_.empty()) {
      std::vector<double> raise;
      for (const Latency& l : latencies_) raise.push_back(l.raise_ms);
      std::sort(raise.begin(), raise.end());
      std::cout << "[latency] " << ::testing::UnitTest::GetInstance()->current_test_info()->name()
                << " summary: " << raise.size() << " failures detected, raise min " << raise.front() << " ms, median "
                << raise[raise.size() / 2] << " ms, max " << raise.back() << " ms; " << failed_in_allreduce_
                << " in allreduce (tensor restored), " << failed_between_calls_ << " between calls" << std::endl;
    }
  }

  Child* Spawn(const std::string& name, const std::vector<std::string>& argv, bool pipe_stdin = false) {
    children_.push_back(std::make_unique<Child>(name, argv, pipe_stdin));
    return children_.back().get();
  }

  // Starts a daemon listening on `listen`; returns it with its port once it logged that it listens, or
  // nullptr if it exited first (e.g. the port is still taken). Fails the test if neither happens in time.
  Child* TryStartAggregator(const std::string& name, const std::string& listen, uint16_t* port) {
    Child* c = Spawn(
        name, {SPARSEREDUCE_AGGREGATOR_BIN, "--listen", listen, "--metrics-listen", "127.0.0.1:0", "--io-threads", "2",
                "--handshake-timeout-ms", "5000"});
    const std::regex listening("listening on .*:([0-9]+)");
    std::optional<std::string> found;
    c->WaitForLines(
        [&](const std::vector<Line>& lines) {
          for (const Line& l : lines) {
            std::smatch m;
            if (std::regex_search(l.text, m, listening)) {
              found = m[1];
              return true;
            }
          }
          return false;
        },
        Clock::now() + kStartupDeadline);
    if (found) {
      *port = static_cast<uint16_t>(std::stoi(*found));
      return c;
    }
    const auto status = c->WaitExit(Clock::now() + 5s);
    EXPECT_TRUE(status.has_value()) << name << " neither listened nor exited\n" << c->Dump();
    std::cout << "[aggregator] " << name << " did not start on " << listen << ":\n" << c->Dump(5);
    return nullptr;
  }

  // A daemon on a fresh port.
  Child* StartAggregator(const std::string& name, uint16_t* port) {
    Child* c = TryStartAggregator(name, "127.0.0.1:0", port);
    EXPECT_NE(c, nullptr);
    return c;
  }

  // A daemon that RestartAggregator will bring back on its port: the port lies below Linux's ephemeral range
  // (32768-60999 by default), so that no connection of a test running meanwhile (ctest -j) can take it as its
  // local port after the kill. A port taken already is skipped.
  Child* StartRestartableAggregator(const std::string& name, uint16_t* port) {
    // Not rng_: its draws (the kill delays) must replay from the printed seed whatever ports were free.
    std::mt19937 ports(std::random_device{}());
    std::uniform_int_distribution<uint16_t> below_ephemeral(20000, 32000);
    for (int attempt = 1; attempt <= 20; ++attempt) {
      const uint16_t wanted = below_ephemeral(ports);
      if (Child* c = TryStartAggregator(name, "127.0.0.1:" + std::to_string(wanted), port)) return c;
    }
    ADD_FAILURE() << name << ": no free port in 20000-32000 after 20 tries";
    return nullptr;
  }

  // A daemon on the port a killed daemon used; retried a few times (bounded) while the port is unavailable.
  Child* RestartAggregator(const std::string& name, uint16_t port) {
    for (int attempt = 1; attempt <= 5; ++attempt) {
      uint16_t bound = 0;
      if (Child* c = TryStartAggregator(name + " attempt " + std::to_string(attempt),
                                        "127.0.0.1:" + std::to_string(port), &bound)) {
        EXPECT_EQ(bound, port);
        if (attempt > 1) std::cout << "[aggregator] restarted on port " << port << " at attempt " << attempt << "\n";
        return c;
      }
      std::this_thread::sleep_for(attempt * 100ms);  // backoff before binding again, not synchronization
    }
    ADD_FAILURE() << "no daemon could listen on port " << port << " again";
    return nullptr;
  }

  std::vector<Child*> StartWorkers(const std::string& tag, const std::string& aggregators, uint64_t job,
                                   uint32_t world_size, std::vector<std::string> flags, bool pipe_stdin = false) {
    flags.insert(flags.end(), kFaultFlags.begin(), kFaultFlags.end());
    std::vector<Child*> workers;
    for (uint32_t r = 0; r < world_size; ++r) {
      std::vector<std::string> argv = {SPARSEREDUCE_TEST_WORKER_BIN, "--aggregators", aggregators,       "--job",
                                       std::to_string(job),          "--rank",        std::to_string(r), "--world-size",
                                       std::to_string(world_size)};
      argv.insert(argv.end(), flags.begin(), flags.end());
      workers.push_back(Spawn(tag + " rank " + std::to_string(r), argv, pipe_stdin));
    }
    return workers;
  }

  // Waits until every worker printed `n` OK lines; fails (and returns false) if one stops or the deadline
  // passes.
  static bool WaitForOks(const std::vector<Child*>& workers, size_t n, Clock::time_point deadline) {
    for (Child* w : workers) {
      if (!w->WaitForLines([n](const std::vector<Line>& l) { return CountPrefix(l, "OK ") >= n; }, deadline)) {
        ADD_FAILURE() << w->name() << " did not print " << n << " OK lines in time\n" << w->Dump();
        return false;
      }
    }
    return true;
  }

  // Checks that workers completed every collective: exit 0, only OK lines (and a final STOPPED with
  // --stop-on-stdin), at least `min_oks` of them.
  static void ExpectCompleted(const std::vector<Child*>& workers, size_t min_oks, Clock::time_point deadline) {
    for (Child* w : workers) {
      const auto status = w->WaitExit(deadline);
      ASSERT_TRUE(status.has_value()) << w->name() << " did not finish in time\n" << w->Dump();
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << w->name() << ": " << tools::DescribeExit(*status) << "\n"
          << w->Dump();
      ASSERT_TRUE(w->WaitForEof(deadline));
      const std::vector<Line> lines = w->Lines();
      EXPECT_GE(CountPrefix(lines, "OK "), min_oks) << w->Dump();
      for (size_t i = 0; i < lines.size(); ++i) {
        const bool ok =
            StartsWith(lines[i].text, "OK ") || (i + 1 == lines.size() && StartsWith(lines[i].text, "STOPPED "));
        EXPECT_TRUE(ok) << w->name() << ": " << lines[i].text;
      }
    }
  }

  // Checks a worker that must fail because of a kill at `killed_at`: its allreduce threw within the detection bound,
  // then it exited with code 3, "ERROR <code> <message>" (`code` and `must_name` are regexes), "RESTORED". Records
  // the latencies.
  void ExpectFailedInTime(Child* w, Clock::time_point killed_at, const std::string& code,
                          const std::string& must_name) {
    const auto status = w->WaitExit(killed_at + kDetectionBound + kFinishDeadline);
    if (!status) {
      ADD_FAILURE() << w->name() << " still running " << Ms(Clock::now() - killed_at) << " ms after the kill\n"
                    << w->Dump();
      return;
    }
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 3) << w->name() << ": " << tools::DescribeExit(*status);
    EXPECT_TRUE(w->WaitForEof(Clock::now() + 5s));
    const std::vector<Line> lines = w->Lines();
    const auto error = FindPrefix(lines, "ERROR ");
    if (!error) {
      ADD_FAILURE() << w->name() << " printed no ERROR line\n" << w->Dump();
      return;
    }
    EXPECT_TRUE(std::regex_search(*error, std::regex("^ERROR " + code + " ")))
        << w->name() << ": expected code " << code << ": " << *error;
    EXPECT_TRUE(std::regex_search(*error, std::regex(must_name)))
        << w->name() << ": the error does not name /" << must_name << "/: " << *error;
    EXPECT_EQ(CountPrefix(lines, "RESTORED"), 1u) << w->name() << ": the tensor was not restored\n" << w->Dump();
    EXPECT_EQ(CountPrefix(lines, "NOT_RESTORED"), 0u) << w->Dump();
    EXPECT_EQ(CountPrefix(lines, "WRONG"), 0u) << w->Dump();
    const auto at = FindPrefix(lines, "ERROR_AT_NS ");
    ASSERT_TRUE(at.has_value()) << w->Dump();
    const double raise_ms = static_cast<double>(std::stoll(at->substr(12)) - Ns(killed_at)) / 1e6;
    const double exit_ms = Ms(*w->exit_seen_at() - killed_at);
    EXPECT_LE(raise_ms, Ms(kDetectionBound)) << w->name();
    latencies_.push_back({w->name(), raise_ms, exit_ms});
    // The library names an error that arrived between two allreduce calls this way; otherwise the failing
    // allreduce was running when the failure reached the worker, and the RESTORED check is meaningful.
    const bool between = error->find("failed earlier") != std::string::npos;
    (between ? failed_between_calls_ : failed_in_allreduce_)++;
    std::cout << "[latency] " << w->name() << ": allreduce raised " << raise_ms << " ms after the kill, exit seen "
              << exit_ms << " ms after; " << (between ? "between calls" : "in allreduce") << " after "
              << CountPrefix(lines, "OK ") << " collectives; " << *error << std::endl;
  }

  std::chrono::milliseconds RandomDelay(int max_ms) {
    return std::chrono::milliseconds(std::uniform_int_distribution<int>(0, max_ms)(rng_));
  }

  // Kills one worker (SIGKILL) after a random delay; returns the time just before the kill.
  Clock::time_point KillAfterRandomDelay(Child* victim, int max_delay_ms) {
    const auto delay = RandomDelay(max_delay_ms);
    std::this_thread::sleep_for(delay);  // randomizes the kill point; not synchronization
    const Clock::time_point at = victim->Signal(SIGKILL);
    const auto status = victim->WaitExit(at + 5s);
    EXPECT_TRUE(status && WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL) << victim->Dump();
    std::cout << "[kill] " << victim->name() << " after a random " << delay.count() << " ms; reaped "
              << (status ? Ms(*victim->exit_seen_at() - at) : -1.0) << " ms after the kill" << std::endl;
    return at;
  }

  std::mt19937_64 rng_;
  std::vector<std::unique_ptr<Child>> children_;  // destroyed (killed) with the fixture
  std::vector<Latency> latencies_;
  int failed_in_allreduce_ = 0, failed_between_calls_ = 0;
};

std::string Address(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }
std::string RegexEscape(const std::string& s) {
  return std::regex_replace(s, std::regex(R"([.^$|()\[\]{}*+?\\])"), R"(\$&)");
}
// Matches an error that names rank `r` of the job ("rank 1 (peer ...", "rank(s) 1 left").
std::string NamesRank(uint32_t r) { return "rank(\\(s\\))? " + std::to_string(r) + "([^0-9]|$)"; }

// Notes whether a PEER_LEFT reached a worker while the aggregator had the collective in progress.
std::string KindOf(const std::string& error) {
  if (error.find("during collective") != std::string::npos) return "in flight";
  if (error.find("broke the protocol") != std::string::npos) return "in flight (mid-frame)";
  if (error.find("left the job") != std::string::npos) return "between collectives";
  return "other";
}

TEST_F(FaultTest, KillWorkerMidCollective) {
  uint16_t port = 0;
  Child* daemon = StartAggregator("aggregator", &port);
  ASSERT_NE(daemon, nullptr);
  const uint64_t kJobA = 100, kJobB = 200;
  auto job_a = StartWorkers("job A", Address(port), kJobA, 3, kBusyFlags);
  // Job B runs back-to-back collectives until told to stop on rank 0's stdin.
  auto job_b =
      StartWorkers("job B", Address(port), kJobB, 2,
                   {"--elements", "300000", "--density", "0.3", "--collectives", "100000", "--stop-on-stdin"}, true);
  ASSERT_TRUE(WaitForOks(job_a, 2, Clock::now() + kStartupDeadline));
  ASSERT_TRUE(WaitForOks(job_b, 1, Clock::now() + kStartupDeadline));

  const Clock::time_point killed_at = KillAfterRandomDelay(job_a[1], 300);
  for (uint32_t r : {0u, 2u}) ExpectFailedInTime(job_a[r], killed_at, "PEER_LEFT", NamesRank(1));
  if (auto e = FindPrefix(job_a[0]->Lines(), "ERROR ")) std::cout << "[kill] kind: " << KindOf(*e) << std::endl;

  // Job B kept running through the abort: more collectives complete after the kill, then it stops cleanly.
  EXPECT_TRUE(job_b[0]->WaitForLines(
      [&](const std::vector<Line>& lines) {
        return std::count_if(lines.begin(), lines.end(),
                             [&](const Line& l) { return l.at > killed_at && StartsWith(l.text, "OK "); }) >= 3;
      },
      Clock::now() + kFinishDeadline))
      << "job B made no progress after job A's abort\n"
      << job_b[0]->Dump();
  ASSERT_TRUE(job_b[0]->WriteStdin("stop\n"));
  ExpectCompleted(job_b, 4, Clock::now() + kFinishDeadline);

  // Job A forms again with new processes and the same job id.
  auto job_a_again = StartWorkers("job A again", Address(port), kJobA, 3,
                                  {"--elements", "4194304", "--density", "0.5", "--collectives", "2"});
  ExpectCompleted(job_a_again, 2, Clock::now() + kFinishDeadline);
  EXPECT_TRUE(daemon->Running()) << daemon->Dump();
}

TEST_F(FaultTest, KillAggregatorMidCollective) {
  uint16_t port = 0;
  Child* daemon = StartRestartableAggregator("aggregator", &port);
  ASSERT_NE(daemon, nullptr);
  const uint64_t kJob = 7;
  auto workers = StartWorkers("job", Address(port), kJob, 3, kBusyFlags);
  ASSERT_TRUE(WaitForOks(workers, 2, Clock::now() + kStartupDeadline));

  const Clock::time_point killed_at = KillAfterRandomDelay(daemon, 300);
  for (Child* w : workers)
    ExpectFailedInTime(w, killed_at, "[A-Z_]+", RegexEscape("aggregator 0 (" + Address(port) + ")"));

  // A daemon back on the same port serves the same job again.
  Child* restarted = RestartAggregator("aggregator (restarted)", port);
  ASSERT_NE(restarted, nullptr);
  auto again = StartWorkers("job again", Address(port), kJob, 3,
                            {"--elements", "4194304", "--density", "0.5", "--collectives", "2"});
  ExpectCompleted(again, 2, Clock::now() + kFinishDeadline);
}

TEST_F(FaultTest, TwoAggregatorsKillOne) {
  uint16_t ports[2] = {0, 0};
  Child* daemons[2] = {StartRestartableAggregator("aggregator 0", &ports[0]),
                       StartRestartableAggregator("aggregator 1", &ports[1])};
  ASSERT_NE(daemons[0], nullptr);
  ASSERT_NE(daemons[1], nullptr);
  const std::string both = Address(ports[0]) + "," + Address(ports[1]);
  const uint64_t kJob = 8;
  auto workers = StartWorkers("job", both, kJob, 3, kBusyFlags);
  ASSERT_TRUE(WaitForOks(workers, 2, Clock::now() + kStartupDeadline));

  const uint32_t victim = std::uniform_int_distribution<uint32_t>(0, 1)(rng_);
  const Clock::time_point killed_at = KillAfterRandomDelay(daemons[victim], 300);
  const std::string name = "aggregator " + std::to_string(victim) + " (" + Address(ports[victim]) + ")";
  for (Child* w : workers) ExpectFailedInTime(w, killed_at, "[A-Z_]+", RegexEscape(name));
  EXPECT_TRUE(daemons[1 - victim]->Running()) << daemons[1 - victim]->Dump();

  // The surviving daemon released the job: with the killed one back, new workers of the same job complete.
  Child* restarted = RestartAggregator("aggregator " + std::to_string(victim) + " (restarted)", ports[victim]);
  ASSERT_NE(restarted, nullptr);
  auto again =
      StartWorkers("job again", both, kJob, 3, {"--elements", "1048576", "--density", "0.5", "--collectives", "3"});
  ExpectCompleted(again, 3, Clock::now() + kFinishDeadline);
}

// The worker kill, repeated at random points (random rank, random delay), reforming the same job each time on one
// daemon.
TEST_F(FaultTest, RepeatedWorkerKills) {
  uint16_t port = 0;
  Child* daemon = StartAggregator("aggregator", &port);
  ASSERT_NE(daemon, nullptr);
  const uint64_t kJob = 300;
  std::map<std::string, int> kinds;
  for (int iteration = 0; iteration < 3; ++iteration) {
    const std::string tag = "iteration " + std::to_string(iteration);
    auto workers = StartWorkers(tag, Address(port), kJob, 3,
                                {"--elements", "1048576", "--density", "0.5", "--collectives", "1000", "--seed",
                                 std::to_string(1 + 1000 * iteration)});
    ASSERT_TRUE(WaitForOks(workers, 2, Clock::now() + kStartupDeadline));
    const uint32_t victim = std::uniform_int_distribution<uint32_t>(0, 2)(rng_);
    const Clock::time_point killed_at = KillAfterRandomDelay(workers[victim], 150);
    for (uint32_t r = 0; r < 3; ++r) {
      if (r != victim) ExpectFailedInTime(workers[r], killed_at, "PEER_LEFT", NamesRank(victim));
    }
    if (auto e = FindPrefix(workers[victim == 0 ? 1 : 0]->Lines(), "ERROR ")) ++kinds[KindOf(*e)];
    if (HasFatalFailure()) return;
  }
  for (const auto& [kind, n] : kinds) std::cout << "[kill] kind " << kind << ": " << n << std::endl;
  auto again = StartWorkers("job again", Address(port), kJob, 3, {"--elements", "1048576", "--collectives", "2"});
  ExpectCompleted(again, 2, Clock::now() + kFinishDeadline);
  EXPECT_TRUE(daemon->Running()) << daemon->Dump();
}

}  // namespace
}  // namespace sparsereduce::testing
