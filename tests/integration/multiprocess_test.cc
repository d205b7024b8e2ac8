// Multi-process tests: the real sparsereduce-aggregator binary and real worker processes on 127.0.0.1.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <regex>
#include <sstream>

#include "protocol/frame_format.h"
#include "tests/integration/metrics_probe.h"
#include "tests/integration/raw_peer.h"
#include "tools/common/subprocess.h"
#include "tools/common/temp_dir.h"

namespace sparsereduce::testing {
namespace {

using tools::Subprocess;
using namespace std::chrono_literals;

// A running aggregator daemon on an ephemeral port.
class Aggregator {
 public:
  explicit Aggregator(const std::string& host = "127.0.0.1", std::vector<std::string> extra_args = {}) {
    auto dir = tools::TempDir::Create("sr-it-");
    EXPECT_TRUE(dir.ok()) << dir.status().ToString();
    if (!dir.ok()) return;
    temp_dir_.emplace(std::move(*dir));
    dir_ = temp_dir_->path();
    const bool v6 = host.find(':') != std::string::npos;
    const std::string bracketed = v6 ? "[" + host + "]" : host;
    std::vector<std::string> argv = {SPARSEREDUCE_AGGREGATOR_BIN,
                                     "--listen",
                                     bracketed + ":0",
                                     "--metrics-listen",
                                     "127.0.0.1:0",
                                     "--port-file",
                                     dir_ + "/port",
                                     "--metrics-port-file",
                                     dir_ + "/metrics-port",
                                     "--io-threads",
                                     "2",
                                     "--handshake-timeout-ms",
                                     "2000"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    auto p = Subprocess::Spawn(argv, false);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    process_ = std::move(*p);
    auto port = tools::WaitForFileLine(dir_ + "/port", 10s, process_.get());
    EXPECT_TRUE(port.ok()) << port.status().ToString();
    address_ = bracketed + ":" + (port.ok() ? *port : std::string("0"));
    auto metrics_port = tools::WaitForFileLine(dir_ + "/metrics-port", 10s, process_.get());
    EXPECT_TRUE(metrics_port.ok()) << metrics_port.status().ToString();
    if (metrics_port.ok()) metrics_port_ = static_cast<uint16_t>(std::stoi(*metrics_port));
  }

  // The Prometheus text of its metrics endpoint.
  std::string Metrics() const { return HttpGet(metrics_port_, "/metrics").body; }

  const std::string& address() const { return address_; }
  uint16_t port() const { return static_cast<uint16_t>(std::stoi(address_.substr(address_.rfind(':') + 1))); }
  Subprocess& process() { return *process_; }

  // SIGTERM and wait; returns the waitpid status.
  int Stop() {
    process_->Signal(SIGTERM);
    auto status = process_->Wait(10s);
    EXPECT_TRUE(status.ok()) << "aggregator did not stop within 10 s";
    return status.ok() ? *status : -1;
  }

 private:
  std::optional<tools::TempDir> temp_dir_;  // first: removed after the daemon is killed
  std::string dir_;
  std::string address_;
  uint16_t metrics_port_ = 0;
  std::unique_ptr<Subprocess> process_;
};

struct WorkerResult {
  int exit_code = -1;
  std::vector<std::string> lines;
};

// Starts one test worker; later flags override earlier ones (CLI11 keeps the last).
std::unique_ptr<Subprocess> StartRank(const std::string& aggregators, uint64_t job, uint32_t rank, uint32_t world_size,
                                      const std::vector<std::string>& flags) {
  std::vector<std::string> argv = {SPARSEREDUCE_TEST_WORKER_BIN, "--aggregators", aggregators, "--job",
                                   std::to_string(job), "--rank", std::to_string(rank), "--world-size",
                                   std::to_string(world_size)};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto p = Subprocess::Spawn(argv, true);
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  return p.ok() ? std::move(*p) : nullptr;
}

// Starts `world_size` test workers of one job with the given extra flags (per rank, optional).
std::vector<std::unique_ptr<Subprocess>> StartJob(const std::string& aggregators, uint64_t job,
                                                  uint32_t world_size, const std::vector<std::string>& flags,
                                                  const std::map<uint32_t, std::vector<std::string>>& per_rank = {}) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (uint32_t r = 0; r < world_size; ++r) {
    std::vector<std::string> rank_flags = flags;
    if (auto it = per_rank.find(r); it != per_rank.end())
      rank_flags.insert(rank_flags.end(), it->second.begin(), it->second.end());
    workers.push_back(StartRank(aggregators, job, r, world_size, rank_flags));
  }
  return workers;
}

std::vector<WorkerResult> Finish(std::vector<std::unique_ptr<Subprocess>>& workers) {
  std::vector<WorkerResult> results;
  for (auto& w : workers) {
    WorkerResult r;
    auto out = w->ReadStdout(60s);
    EXPECT_TRUE(out.ok()) << out.status().ToString();
    auto status = w->Wait(10s);
    EXPECT_TRUE(status.ok()) << status.status().ToString();
    if (status.ok() && WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
    std::istringstream lines(out.ok() ? *out : "");
    for (std::string line; std::getline(lines, line);) r.lines.push_back(line);
    results.push_back(std::move(r));
  }
  return results;
}

void ExpectAllOk(const std::vector<WorkerResult>& results, size_t collectives) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << ": "
                                       << (results[r].lines.empty() ? "" : results[r].lines.back());
    EXPECT_EQ(results[r].lines.size(), collectives) << "rank " << r;
    for (const auto& line : results[r].lines) EXPECT_EQ(line.rfind("OK ", 0), 0u) << line;
  }
}

TEST(MultiProcess, FourWorkersConsecutiveCollectives) {
  Aggregator aggregator;
  auto workers = StartJob(aggregator.address(), 1, 4,
                          {"--elements", "200003", "--density", "0.3", "--collectives", "6", "--slots", "4",
                           "--blocks-per-message", "8"});
  ExpectAllOk(Finish(workers), 6);
  const int status = aggregator.Stop();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << tools::DescribeExit(status);
}

TEST(MultiProcess, Int32AndSmallBlocks) {
  Aggregator aggregator;
  auto workers = StartJob(aggregator.address(), 9, 3,
                          {"--dtype", "int32", "--elements", "1001", "--block-size", "7", "--density", "0.5",
                           "--collectives", "4", "--overlap", "disjoint"});
  ExpectAllOk(Finish(workers), 4);
}

TEST(MultiProcess, TwoJobsOnOneDaemonAtOnce) {
  Aggregator aggregator;
  auto job_a =
      StartJob(aggregator.address(), 100, 3, {"--elements", "150000", "--density", "0.2", "--collectives", "5"});
  auto job_b = StartJob(aggregator.address(), 200, 2,
                        {"--elements", "70000", "--density", "0.9", "--collectives", "5", "--overlap", "full"});
  ExpectAllOk(Finish(job_a), 5);
  ExpectAllOk(Finish(job_b), 5);
}

TEST(MultiProcess, Ipv6Loopback) {
  Aggregator aggregator("::1");
  auto workers = StartJob(aggregator.address(), 6, 2, {"--elements", "30000", "--collectives", "2"});
  ExpectAllOk(Finish(workers), 2);
}

TEST(MultiProcess, CollectiveOverTheMemoryLimitIsRejectedOnEveryRank) {
  Aggregator aggregator("127.0.0.1", {"--max-job-memory", "100000", "--max-total-memory", "100000"});
  auto workers = StartJob(aggregator.address(), 4, 2, {"--elements", "50000", "--timeout-ms", "5000"});
  for (const auto& r : Finish(workers)) {
    EXPECT_EQ(r.exit_code, 3);
    ASSERT_FALSE(r.lines.empty());
    EXPECT_NE(r.lines.back().find("ERROR RESOURCE_EXHAUSTED"), std::string::npos) << r.lines.back();
    EXPECT_NE(r.lines.back().find("--max-job-memory of 100000"), std::string::npos) << r.lines.back();
  }
}

TEST(MultiProcess, TwoAggregators) {
  Aggregator first, second;
  auto workers = StartJob(first.address() + "," + second.address(), 5, 3,
                          {"--elements", "300000", "--density", "0.25", "--collectives", "4"});
  ExpectAllOk(Finish(workers), 4);
}

TEST(MultiProcess, SpecMismatchFailsEveryRankNamingTheRanks) {
  Aggregator aggregator;
  auto workers = StartJob(aggregator.address(), 3, 3, {"--elements", "5000", "--timeout-ms", "5000"},
                          {{2, {"--elements", "4999"}}});
  auto results = Finish(workers);
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 3) << "rank " << r;
    ASSERT_FALSE(results[r].lines.empty());
    const std::string& line = results[r].lines.back();
    EXPECT_NE(line.find("ERROR SPEC_MISMATCH"), std::string::npos) << line;
    EXPECT_NE(line.find("count=4999"), std::string::npos) << line;
    EXPECT_NE(line.find("count=5000"), std::string::npos) << line;
    EXPECT_NE(line.find("rank " + std::to_string(r)), std::string::npos) << "error names the reporting rank: " << line;
  }
}

// Mismatched dtype or block size is caught like a mismatched element count, naming both specs.
TEST(MultiProcess, DtypeAndBlockSizeMismatchesFailEveryRank) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--dtype", "int32"}, "dtype=int32"},
      {{"--block-size", "128"}, "block_size=128"},
  };
  for (const auto& [flags, expect] : cases) {
    SCOPED_TRACE(expect);
    Aggregator aggregator;
    auto workers = StartJob(aggregator.address(), 3, 3, {"--elements", "5000", "--timeout-ms", "5000"}, {{1, flags}});
    for (const auto& r : Finish(workers)) {
      EXPECT_EQ(r.exit_code, 3);
      ASSERT_FALSE(r.lines.empty());
      EXPECT_NE(r.lines.back().find("ERROR SPEC_MISMATCH"), std::string::npos) << r.lines.back();
      EXPECT_NE(r.lines.back().find(expect), std::string::npos) << r.lines.back();
      // Rank 1 is named whichever spec arrived first.
      const bool names_rank1 = r.lines.back().find("rank 1 passed") != std::string::npos ||
                               r.lines.back().find("rank(s) 1 passed") != std::string::npos;
      EXPECT_TRUE(names_rank1) << r.lines.back();
      // And where it runs, to find the host.
      EXPECT_NE(r.lines.back().find("rank 1 at 127.0.0.1:"), std::string::npos) << r.lines.back();
    }
  }
}

// Wrong world size, duplicate rank, rank out of range: the ranks that are waiting when the mistaken Hello arrives
// fail at once with an error naming the rank involved, not at their join timeout. Ranks 0 and 1 are known to
// wait (the daemon counts them as joined) before the mistaken Hello comes: from a worker process, or by hand for
// the rank out of range, which a Worker refuses itself before it connects.
TEST(MultiProcess, JoinMistakesFailWaitingRanksFast) {
  struct Case {
    const char* name;
    std::vector<std::string> mistake;  // rank 2's flags; empty: a Hello for rank 7 sent by hand
    const char* code;
    const char* names;  // a regex: which rank arrives first decides the wording
  };
  const std::vector<Case> cases = {
      {"wrong world size", {"--world-size", "4"}, "JOB_CONFIG_MISMATCH", R"(rank(\(s\))? 2 .*world_size=4)"},
      {"duplicate rank", {"--rank", "1"}, "DUPLICATE_RANK", "rank 1 joined twice"},
      {"rank out of range", {}, "INVALID_ARGUMENT", "rank 7 is out of range"},
  };
  constexpr auto kJoinTimeout = 20s;  // what "fast" is measured against
  const std::vector<std::string> flags = {"--timeout-ms", std::to_string(kJoinTimeout / 1ms)};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Aggregator aggregator;
    std::vector<std::unique_ptr<Subprocess>> waiting;
    for (uint32_t r = 0; r < 2; ++r) waiting.push_back(StartRank(aggregator.address(), 12, r, 3, flags));
    ASSERT_TRUE(Eventually([&] {
      return Sample(aggregator.Metrics(), R"(sparsereduce_connected_workers\{[^}]*\})") == 2;
    })) << aggregator.Metrics();
    const auto start = std::chrono::steady_clock::now();
    std::unique_ptr<Subprocess> late;
    int late_fd = -1;
    if (c.mistake.empty()) {
      late_fd = ConnectToLoopback(aggregator.address());
      ASSERT_GE(late_fd, 0);
      ASSERT_TRUE(SendControl(late_fd, RawHello(12, 7, 3, 1)));
    } else {
      std::vector<std::string> mistaken = flags;
      mistaken.insert(mistaken.end(), c.mistake.begin(), c.mistake.end());
      late = StartRank(aggregator.address(), 12, 2, 3, mistaken);
    }
    for (const auto& r : Finish(waiting)) {
      EXPECT_EQ(r.exit_code, 3);
      ASSERT_FALSE(r.lines.empty());
      const std::string& line = r.lines.back();
      EXPECT_NE(line.find(std::string("ERROR ") + c.code), std::string::npos) << line;
      EXPECT_TRUE(std::regex_search(line, std::regex(c.names))) << line;
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, kJoinTimeout / 2) << "the waiting ranks were not told";
    if (late) {
      late->Signal(SIGKILL);  // whatever it met (a fresh job, or a refusal), it is not what this test checks
      EXPECT_TRUE(late->Wait(10s).ok());
    }
    if (late_fd >= 0) close(late_fd);
  }
}

// Garbage on one connection drops that connection only; a job on the same daemon completes.
TEST(MultiProcess, GarbageClientDoesNotDisturbOtherJobs) {
  Aggregator aggregator;
  const int fd = ConnectToLoopback(aggregator.port());
  ASSERT_GE(fd, 0);
  // Exactly one header's worth, so the daemon has read everything when it closes (no RST).
  const char garbage[40] = "GET / HTTP/1.1\r\nHost: example\r\n\r\n";
  ASSERT_EQ(write(fd, garbage, sizeof garbage), static_cast<ssize_t>(sizeof garbage));
  auto workers = StartJob(aggregator.address(), 11, 2, {"--elements", "40000", "--collectives", "3"});
  ExpectAllOk(Finish(workers), 3);
  // The daemon answered the garbage with an Error frame and closed: reading reaches EOF.
  const std::optional<std::string> answer = ReadUntilClosed(fd);
  close(fd);
  ASSERT_TRUE(answer) << "the daemon did not close the garbage connection";
  EXPECT_GT(answer->size(), 40u) << "expected an Error frame before the close";
}

// A connection that never says Hello is dropped after the handshake timeout (2 s here), while a job completes.
TEST(MultiProcess, SlowlorisIsDropped) {
  Aggregator aggregator;
  const int fd = ConnectToLoopback(aggregator.port());
  ASSERT_GE(fd, 0);
  auto workers = StartJob(aggregator.address(), 13, 2, {"--elements", "20000", "--collectives", "2"});
  ExpectAllOk(Finish(workers), 2);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(ReadUntilClosed(fd, 10s), "") << "the daemon should close a silent connection without a word";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 4s);
  close(fd);
}

// A CONTROL header announcing more than the protocol's 64 KiB (by one byte, or 4 GiB) before any Hello is refused
// at once: nothing is allocated or awaited (RELIABILITY.md, bounded memory before a Hello).
TEST(MultiProcess, OversizedLengthPrefixIsRefused) {
  Aggregator aggregator;
  for (const uint32_t length : {kMaxControlPayload + 1, uint32_t{0xFFFFFFFF}}) {
    const int fd = ConnectToLoopback(aggregator.port());
    ASSERT_GE(fd, 0);
    unsigned char header[40] = {'S', 'R', 'D', 'F', 1, 1, 0, 0};  // CONTROL, then the little-endian length
    for (int i = 0; i < 4; ++i) header[8 + i] = static_cast<unsigned char>(length >> (8 * i));
    ASSERT_EQ(write(fd, header, sizeof header), static_cast<ssize_t>(sizeof header));
    const std::optional<std::string> answer = ReadUntilClosed(fd, 5s);
    close(fd);
    ASSERT_TRUE(answer) << "length " << length << ": the daemon did not close the connection within 5 s";
    EXPECT_GT(answer->size(), 40u) << "length " << length << ": expected an Error frame, then the close";
  }
}

TEST(MultiProcess, WorkerFailsWhenNoAggregatorListens) {
  Aggregator aggregator;
  const std::string address = aggregator.address();
  aggregator.Stop();
  auto workers = StartJob(address, 1, 1, {"--timeout-ms", "500"});
  auto results = Finish(workers);
  EXPECT_EQ(results[0].exit_code, 3);
  ASSERT_FALSE(results[0].lines.empty());
  EXPECT_NE(results[0].lines[0].find("aggregator 0 (" + address + ")"), std::string::npos) << results[0].lines[0];
}

}  // namespace
}  // namespace sparsereduce::testing
