// The aggregator as a service, against the real daemon process with Workers in this process: metrics and probes,
// job authentication, allowed networks, limits, SIGTERM drain and systemd notifications.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <poll.h>
#include <regex>
#include <sstream>
#include <stop_token>
#include <thread>

#include "protocol/control.h"
#include "protocol/frame.h"
#include "protocol/frame_format.h"
#include "protocol/layout.h"
#include "sparsereduce/worker.h"
#include "tests/integration/metrics_probe.h"
#include "tests/integration/raw_peer.h"
#include "tools/common/subprocess.h"
#include "tools/common/synthetic_tensor.h"
#include "tools/common/temp_dir.h"

namespace sparsereduce::testing {
namespace {

using namespace std::chrono_literals;
namespace http = boost::beast::http;

class Daemon {
 public:
  // `launcher` goes before the daemon's own argv (e.g. a shell that lowers a limit and execs it). With
  // `capture_log`, the daemon's log (its stdout) is read by process()->ReadStdout; the test must read it before
  // the daemon writes more than a pipe holds.
  explicit Daemon(std::vector<std::string> extra = {}, std::vector<std::string> launcher = {},
                  bool capture_log = false) {
    auto dir = tools::TempDir::Create("sr-service-");
    EXPECT_TRUE(dir.ok()) << dir.status().ToString();
    if (!dir.ok()) return;
    temp_dir_.emplace(std::move(*dir));
    dir_ = temp_dir_->path();
    std::vector<std::string> argv = {SPARSEREDUCE_AGGREGATOR_BIN, "--listen",           "127.0.0.1:0",
                                     "--metrics-listen",          "127.0.0.1:0",        "--port-file",
                                     dir_ + "/port",              "--metrics-port-file", dir_ + "/metrics-port",
                                     "--name",                    "svc",                "--log-level",
                                     "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.insert(argv.begin(), launcher.begin(), launcher.end());
    auto p = tools::Subprocess::Spawn(argv, capture_log);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    if (!p.ok()) return;
    process_ = std::move(*p);
    auto port = tools::WaitForFileLine(dir_ + "/port", 10s, process_.get());
    auto metrics_port = tools::WaitForFileLine(dir_ + "/metrics-port", 10s, process_.get());
    EXPECT_TRUE(port.ok() && metrics_port.ok());
    if (port.ok()) address_ = "127.0.0.1:" + *port;
    if (metrics_port.ok()) metrics_port_ = static_cast<uint16_t>(std::stoi(*metrics_port));
  }

  const std::string& address() const { return address_; }
  const std::string& dir() const { return dir_; }
  std::string Metrics() const { return HttpGet(metrics_port_, "/metrics").body; }
  HttpReply Get(const std::string& path) const { return HttpGet(metrics_port_, path); }
  tools::Subprocess* process() { return process_.get(); }
  uint16_t metrics_port() const { return metrics_port_; }

 private:
  std::optional<tools::TempDir> temp_dir_;  // first: removed after the daemon is killed
  std::string dir_;
  std::unique_ptr<tools::Subprocess> process_;
  std::string address_;
  uint16_t metrics_port_ = 0;
};

WorkerOptions Options(const std::string& address, uint64_t job, uint32_t rank, uint32_t world_size,
                      const std::string& secret = "") {
  WorkerOptions o;
  if (!address.empty()) o.aggregators = {address};
  o.job = job;
  o.rank = rank;
  o.world_size = world_size;
  o.secret = secret;
  o.connect_timeout = o.join_timeout = o.collective_timeout = 10s;
  return o;
}

// Runs one collective of `spec` on a job of spec.world ranks, each rank on its own thread; returns per-rank
// errors ("" when the result was bit-exact).
std::vector<std::string> RunJob(const std::string& address, uint64_t job, const tools::SyntheticSpec& spec,
                                const std::string& secret = "") {
  std::vector<std::string> errors(spec.world_size);
  std::vector<std::thread> threads;
  for (uint32_t rank = 0; rank < spec.world_size; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        Worker worker(Options(address, job, rank, spec.world_size, secret));
        std::vector<float> t(spec.elements);
        tools::FillTensor(spec, rank, t);
        worker.allreduce(std::span(t));
        const auto ref = tools::ReferenceSumFloat(spec);
        if (std::memcmp(t.data(), ref.data(), t.size() * sizeof(float)) != 0) errors[rank] = "wrong result";
      } catch (const Error& e) {
        errors[rank] = e.code() + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// Both Workers of a 2-rank job (their constructors wait for each other).
std::pair<std::unique_ptr<Worker>, std::unique_ptr<Worker>> JoinPair(const std::string& address, uint64_t job) {
  auto r1 = std::async(std::launch::async, [&] { return std::make_unique<Worker>(Options(address, job, 1, 2)); });
  auto r0 = std::make_unique<Worker>(Options(address, job, 0, 2));
  return {std::move(r0), r1.get()};
}

// The error a Worker of this job raises while joining alone (world size 1), or "" if it joined.
std::pair<std::string, std::string> JoinError(const std::string& address, uint64_t job, const std::string& secret,
                                              std::chrono::milliseconds connect_timeout = 10s) {
  try {
    WorkerOptions options = Options(address, job, 0, 1, secret);
    options.connect_timeout = connect_timeout;
    Worker worker(options);
    return {"", ""};
  } catch (const Error& e) {
    return {e.code(), e.what()};
  }
}

// A daemon that exits at startup (here: its data-plane or its metrics address is taken) is reported at once, with
// its exit status, not after the wait for its port file times out: the exited child is a zombie until reaped. Its
// log names the address it could not listen on.
TEST(Service, DaemonThatCannotStartIsReportedAtOnce) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor taken(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  const std::string taken_address = "127.0.0.1:" + std::to_string(taken.local_endpoint().port());
  for (const std::string& flag : {std::string("--listen"), std::string("--metrics-listen")}) {
    SCOPED_TRACE(flag + " " + taken_address);
    auto temp_dir = tools::TempDir::Create("sr-svc-early-");
    ASSERT_TRUE(temp_dir.ok()) << temp_dir.status().ToString();
    const std::string dir = temp_dir->path();
    std::vector<std::string> argv = {SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "127.0.0.1:0", "--metrics-listen",
                                     "127.0.0.1:0", "--port-file", dir + "/port", "--log-level", "critical"};
    *(std::find(argv.begin(), argv.end(), flag) + 1) = taken_address;
    auto daemon = tools::Subprocess::Spawn(argv, /*capture_stdout=*/true);
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    const auto start = std::chrono::steady_clock::now();
    auto port = tools::WaitForFileLine(dir + "/port", 60s, daemon->get());
    EXPECT_LT(std::chrono::steady_clock::now() - start, 30s);
    ASSERT_FALSE(port.ok()) << "the daemon started although the address was taken";
    EXPECT_EQ(port.status().code(), StatusCode::kUnavailable) << port.status().ToString();
    // 1, not 2: an address that cannot be bound may be free after a restart (systemd retries exit code 1 only).
    EXPECT_NE(port.status().ToString().find("exit code 1"), std::string::npos) << port.status().ToString();
    Result<std::string> log = (*daemon)->ReadStdout(10s);
    ASSERT_TRUE(log.ok()) << log.status().ToString();
    EXPECT_NE(log->find("cannot listen on " + std::string(flag == "--listen" ? "listen" : "metrics") + " address " +
                       taken_address + ": Address already in use"),
              std::string::npos)
        << *log;
  }
}

// A log pipe whose reader went away (a restarted log shipper, `| tee` ended) does not end the daemon: its next log
// line killed it with SIGPIPE (exit by signal 13, every job lost without SHUTTING_DOWN). systemd ignores SIGPIPE
// for its units; a container's entrypoint or a wrapper does not, so the child here starts with the default.
TEST(Service, ALogPipeWithoutAReaderDoesNotEndTheDaemon) {
  auto temp_dir = tools::TempDir::Create("sr-svc-sigpipe-");
  ASSERT_TRUE(temp_dir.ok()) << temp_dir.status().ToString();
  const std::string port_file = temp_dir->File("port");
  int log[2];
  ASSERT_EQ(pipe(log), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    signal(SIGPIPE, SIG_DFL);
    dup2(log[1], STDOUT_FILENO);
    dup2(log[1], STDERR_FILENO);
    close(log[0]);
    close(log[1]);
    execl(SPARSEREDUCE_AGGREGATOR_BIN, SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "127.0.0.1:0", "--metrics-listen", "",
          "--port-file", port_file.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(log[0]);  // nobody reads the daemon's log
  close(log[1]);
  int status = 0;
  bool exited = false;
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < deadline) {  // until it listens (its log lines go nowhere meanwhile)
    if (waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      break;
    }
    std::ifstream in(port_file);
    std::string line;
    if (std::getline(in, line) && !line.empty()) break;
    std::this_thread::sleep_for(10ms);  // poll interval
  }
  if (!exited) {
    kill(pid, SIGHUP);   // logged (and ignored)
    kill(pid, SIGTERM);  // logged: draining, then exit 0
    for (auto end = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < end;) {
      if (waitpid(pid, &status, WNOHANG) == pid) {
        exited = true;
        break;
      }
      std::this_thread::sleep_for(10ms);  // poll interval
    }
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the daemon did not exit after SIGTERM";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << tools::DescribeExit(status);
}

// A link-local listen address scoped to an interface that does not exist (yet: IPoIB or a VLAN that comes up late)
// exits 1, which systemd's Restart=on-failure retries; it exited 2, as a typo would, and stayed down for good.
TEST(Service, AListenAddressOnAMissingInterfaceIsRetriable) {
  auto daemon = tools::Subprocess::Spawn({SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "[fe80::1%sr-no-such-if]:0",
                                          "--metrics-listen", "", "--log-level", "critical"},
                                         /*capture_stdout=*/true);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  Result<int> status = (*daemon)->Wait(30s);
  ASSERT_TRUE(status.ok()) << "the daemon kept running without its listener";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << tools::DescribeExit(*status);
  Result<std::string> log = (*daemon)->ReadStdout(10s);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_NE(log->find("this host has no interface sr-no-such-if (yet)"), std::string::npos) << *log;
}

// The port files are readable by anyone whatever the daemon's umask (the systemd unit's is 0077): scripts that read
// them need not run as the daemon's user.
TEST(Service, PortFilesAreWorldReadableUnderARestrictiveUmask) {
  auto temp_dir = tools::TempDir::Create("sr-svc-umask-");
  ASSERT_TRUE(temp_dir.ok()) << temp_dir.status().ToString();
  const mode_t old_umask = umask(077);  // inherited by the daemon
  auto daemon = tools::Subprocess::Spawn({SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "127.0.0.1:0", "--metrics-listen",
                                          "127.0.0.1:0", "--port-file", temp_dir->File("port"),
                                          "--metrics-port-file", temp_dir->File("metrics-port"), "--log-level",
                                          "critical"},
                                         false);
  umask(old_umask);
  ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
  ASSERT_TRUE(tools::WaitForFileLine(temp_dir->File("port"), 30s, daemon->get()).ok());
  for (const char* name : {"port", "metrics-port"}) {
    struct stat st {};
    ASSERT_EQ(stat(temp_dir->File(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_mode & 0777, 0644u) << name;
  }
}

// A port file that cannot be written stops the daemon with exit code 2 and says why: whoever asked for the file
// waits for it. The failure went unnoticed and the daemon served on (under systemd, /run/sparsereduce did not
// exist).
TEST(Service, APortFileThatCannotBeWrittenStopsTheDaemon) {
  auto temp_dir = tools::TempDir::Create("sr-svc-portfile-");
  ASSERT_TRUE(temp_dir.ok()) << temp_dir.status().ToString();
  for (const std::string& option : {std::string("--port-file"), std::string("--metrics-port-file")}) {
    auto daemon = tools::Subprocess::Spawn({SPARSEREDUCE_AGGREGATOR_BIN, "--listen", "127.0.0.1:0", "--metrics-listen",
                                            "127.0.0.1:0", option, temp_dir->File("missing/port"), "--log-level",
                                            "critical"},
                                           false);
    ASSERT_TRUE(daemon.ok()) << daemon.status().ToString();
    Result<int> status = (*daemon)->Wait(30s);
    ASSERT_TRUE(status.ok()) << option << ": the daemon kept running without its port file";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 2) << option << ": " << tools::DescribeExit(*status);
  }
}

// Any client can make the daemon refuse connections as fast as it can connect. Each refusal is counted, but the
// log gets at most ServiceContext::kConnectionLogBurst (20) lines of them per 10 s, then one line saying how many
// more there were (LogThrottle): one line per refusal would bury the lines an operator needs, and trip journald's
// rate limit, which then drops all of the daemon's lines. Before, 200 refusals wrote 200 lines.
TEST(Service, RefusedConnectionsCannotFloodTheLog) {
  Daemon daemon({}, {}, /*capture_log=*/true);
  ASSERT_NE(daemon.process(), nullptr);
  constexpr int kConnections = 200;
  const std::vector<std::byte> garbage(64, std::byte{0xff});
  for (int i = 0; i < kConnections; ++i) {
    const int fd = ConnectToLoopback(daemon.address());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(WriteAll(fd, garbage));
    const std::optional<std::string> answer = ReadUntilClosed(fd);  // the refusal, then EOF
    close(fd);
    ASSERT_TRUE(answer) << "connection " << i << " was not closed within 10 s";
    ASSERT_NE(answer->find("bad frame magic"), std::string::npos) << *answer;
  }
  EXPECT_EQ(Sample(daemon.Metrics(), R"(sparsereduce_errors_total\{instance_name="svc",kind="PROTOCOL_VIOLATION"\})"),
            kConnections)
      << "every refusal is counted";
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(daemon.process()->Wait(30s).ok()) << "the daemon did not stop";
  Result<std::string> log = daemon.process()->ReadStdout(10s);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  size_t refusal_lines = 0;
  for (size_t pos = 0; (pos = log->find("rejected before joining", pos)) != std::string::npos; ++pos) ++refusal_lines;
  EXPECT_GE(refusal_lines, 1u) << *log;
  // 20 per window; the loop may straddle one window's end on a slow machine, and then the next window's line
  // reports the refusals held back.
  EXPECT_LE(refusal_lines, 40u) << *log;
  if (refusal_lines > 20) {
    EXPECT_NE(log->find("more messages about connections refused"), std::string::npos) << *log;
  }
}

// Makes the daemon refuse `count` connections (garbage instead of a Hello), each closed by it.
void RefuseConnections(const Daemon& daemon, int count) {
  const std::vector<std::byte> garbage(64, std::byte{0xff});
  for (int i = 0; i < count; ++i) {
    const int fd = ConnectToLoopback(daemon.address());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(WriteAll(fd, garbage));
    ASSERT_TRUE(ReadUntilClosed(fd)) << "connection " << i << " was not closed within 10 s";
    close(fd);
  }
}

constexpr const char* kTenRefusalsHeldBack =
    "10 more messages about connections refused or timed out before joining a job were not logged";

// The line about refusals held back came only with the next refusal let through, which may never come: a burst of
// 30 logged 20 lines and nothing more (the next refusal, 11 s later, brought the line). It comes when the window
// ends, with nothing else happening.
TEST(Service, RefusalsHeldBackAreReportedWhenTheWindowEnds) {
  Daemon daemon({}, {}, /*capture_log=*/true);
  ASSERT_NE(daemon.process(), nullptr);
  const auto start = std::chrono::steady_clock::now();
  RefuseConnections(daemon, 30);
  std::string log;
  const auto deadline = start + 10s + 5s;  // the window (from the first refusal), and a margin
  while (log.find(kTenRefusalsHeldBack) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    (void)daemon.process()->ReadStdout(100ms, [&](std::string_view chunk) { log.append(chunk); });
  }
  EXPECT_NE(log.find(kTenRefusalsHeldBack), std::string::npos) << "not within 15 s:\n" << log;
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(daemon.process()->Wait(30s).ok()) << "the daemon did not stop";
}

// And what is held back when the daemon stops is reported as it stops.
TEST(Service, RefusalsHeldBackAreReportedAtExit) {
  Daemon daemon({}, {}, /*capture_log=*/true);
  ASSERT_NE(daemon.process(), nullptr);
  RefuseConnections(daemon, 30);
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(daemon.process()->Wait(30s).ok()) << "the daemon did not stop";
  Result<std::string> log = daemon.process()->ReadStdout(10s);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_NE(log->find(kTenRefusalsHeldBack), std::string::npos) << *log;
}

// SIGHUP, which operators send daemons to reload them, is ignored with a warning: the daemon serves on. It used to
// end the daemon at once, without a drain, and systemd counts that a clean exit, so it did not restart it.
TEST(Service, SighupIsIgnoredWithAWarning) {
  Daemon daemon({}, {}, /*capture_log=*/true);
  ASSERT_NE(daemon.process(), nullptr);
  daemon.process()->Signal(SIGHUP);
  const tools::SyntheticSpec spec{3000, 256, 0.5, tools::Overlap::kRandom, 2, 11};
  for (const auto& e : RunJob(daemon.address(), 1, spec)) EXPECT_EQ(e, "");
  EXPECT_EQ(daemon.Get("/readyz").status, 200);
  daemon.process()->Signal(SIGTERM);
  Result<int> status = daemon.process()->Wait(30s);
  ASSERT_TRUE(status.ok()) << "the daemon did not stop";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
  Result<std::string> log = daemon.process()->ReadStdout(10s);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_NE(log->find("(SIGHUP) ignored"), std::string::npos) << *log;
}

// A handshake cut off by --handshake-timeout-ms is logged with where it stood, so that an operator (or a failed
// test) sees which side it waited for: the line said only that the handshake was incomplete.
TEST(Service, AHandshakeCutOffByItsDeadlineSaysWhereItStood) {
  Daemon daemon({"--handshake-timeout-ms", "300", "--transports", "tcp,shm"}, {}, /*capture_log=*/true);
  ASSERT_NE(daemon.process(), nullptr);
  // Silent from the start: no Hello.
  const int silent = ConnectToLoopback(daemon.address());
  ASSERT_GE(silent, 0);
  EXPECT_TRUE(ReadUntilClosed(silent).has_value()) << "the daemon did not drop the silent connection";
  close(silent);
  // Takes the shared-memory offer and never presents the token.
  const int taker = ConnectToLoopback(daemon.address());
  ASSERT_GE(taker, 0);
  proto::ControlMessage hello = RawHello(7, 0, 1, 1);
  hello.mutable_hello()->clear_transports();
  hello.mutable_hello()->add_transports("shm2");
  ASSERT_TRUE(SendControl(taker, hello));
  const std::optional<proto::ControlMessage> offer = ReadControlFrame(taker);
  ASSERT_TRUE(offer && offer->has_transport_offer()) << "no shared-memory offer";
  EXPECT_TRUE(ReadUntilClosed(taker).has_value()) << "the daemon did not drop the connection at its deadline";
  close(taker);
  // Presents the token and never receives the descriptors.
  const int hoarder = ConnectToLoopback(daemon.address());
  ASSERT_GE(hoarder, 0);
  hello.mutable_hello()->set_job_id(8);
  ASSERT_TRUE(SendControl(hoarder, hello));
  const std::optional<proto::ControlMessage> second_offer = ReadControlFrame(hoarder);
  ASSERT_TRUE(second_offer && second_offer->has_transport_offer()) << "no shared-memory offer";
  const int unix_socket = ConnectToAbstract(second_offer->transport_offer().shm_socket());
  ASSERT_GE(unix_socket, 0) << std::strerror(errno);
  const std::string& token = second_offer->transport_offer().token();
  ASSERT_EQ(write(unix_socket, token.data(), token.size()), static_cast<ssize_t>(token.size()));
  EXPECT_TRUE(ReadUntilClosed(hoarder).has_value()) << "the daemon did not drop the connection at its deadline";
  close(hoarder);
  // The close comes before the handshake's coroutine has ended and logged its line: a SIGTERM sent at once could
  // find it still running and end it as "the aggregator is stopping". Each of the three is counted as it is logged.
  const std::string deadline_errors = R"(sparsereduce_errors_total\{instance_name="svc",kind="DEADLINE_EXCEEDED"\})";
  EXPECT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), deadline_errors) == 3; })) << daemon.Metrics();
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(daemon.process()->Wait(30s).ok()) << "the daemon did not stop";
  Result<std::string> log = daemon.process()->ReadStdout(10s);
  // Open until the daemon has gone: closed earlier, it drops the descriptors from the daemon's send queue before
  // the daemon looks (a TSan run), and the line says they were received.
  close(unix_socket);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_NE(log->find("no complete handshake within 300 ms (waiting for the Hello)"), std::string::npos) << *log;
  EXPECT_NE(log->find("job 7 rank 0 (127.0.0.1:"), std::string::npos) << *log;
  // The handshake's deadline closes TCP, or the offer's own timer (the same instant) ends the wait first: either
  // way the line says what it waited for.
  EXPECT_TRUE(log->find("no complete handshake within 300 ms (waiting for the worker to present the shared-memory "
                        "token, or to decline on TCP)") != std::string::npos ||
              log->find("no worker took the shm offer in time") != std::string::npos)
      << *log;
  EXPECT_NE(log->find("job 8 rank 0 (127.0.0.1:"), std::string::npos) << *log;
  // Here too either timer may end it.
  EXPECT_TRUE(log->find("no complete handshake within 300 ms (handing the shared-memory segment over: the worker "
                        "had not received the descriptors)") != std::string::npos ||
              log->find("the worker did not acknowledge the shm descriptors in time (the worker had not received "
                        "the descriptors)") != std::string::npos)
      << *log;
}

TEST(Service, MetricsAndProbesDescribeWhatHappened) {
  Daemon daemon;
  // Every error kind is exported from 0 before its first error, so that rate() sees that first one (the series
  // appeared only with it).
  const std::string fresh = daemon.Metrics();
  for (const char* kind : {"PEER_LEFT", "PROTOCOL_VIOLATION", "DEADLINE_EXCEEDED", "UNAUTHENTICATED", "INTERNAL"}) {
    const std::string series = std::string(R"(sparsereduce_errors_total\{instance_name="svc",kind=")") + kind + "\"\\}";
    EXPECT_EQ(Sample(fresh, series), 0) << kind << "\n" << fresh;
  }
  EXPECT_EQ(fresh.find("kind=\"OK\""), std::string::npos) << fresh;
  EXPECT_EQ(daemon.Get("/healthz").status, 200);
  EXPECT_EQ(daemon.Get("/readyz").status, 200);
  EXPECT_EQ(daemon.Get("/nothing").status, 404);
  const tools::SyntheticSpec spec{10000, 256, 0.3, tools::Overlap::kRandom, 2, 99};
  for (const auto& e : RunJob(daemon.address(), 1, spec)) EXPECT_EQ(e, "");

  // The workers may hold their last RESULT before the daemon's job strand has counted the collective (it sends
  // the RESULT, then counts; over shared memory the worker reads it at once): wait until the counts are complete.
  const std::string instance = R"(instance_name="svc")";
  const uint64_t blocks = (spec.elements + 255) / 256;
  auto aggregated_and_skipped = [&](const std::string& metrics) {
    return Sample(metrics, "sparsereduce_blocks_aggregated_total\\{" + instance + "\\}") +
           Sample(metrics, "sparsereduce_blocks_skipped_total\\{" + instance + "\\}");
  };
  std::string m;
  EXPECT_TRUE(Eventually([&] {
    m = daemon.Metrics();
    return aggregated_and_skipped(m) == static_cast<double>(blocks);
  })) << m;
  EXPECT_EQ(Sample(m, "sparsereduce_collectives_total\\{" + instance + ",outcome=\"completed\"\\}"), 1) << m;
  EXPECT_EQ(Sample(m, "sparsereduce_collective_duration_seconds_count\\{" + instance + "\\}"), 1);
  // One aggregator owns all 40 blocks: the union's blocks were aggregated, the others skipped.
  const double aggregated = Sample(m, "sparsereduce_blocks_aggregated_total\\{" + instance + "\\}");
  const double skipped = Sample(m, "sparsereduce_blocks_skipped_total\\{" + instance + "\\}");
  uint64_t union_blocks = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    union_blocks += tools::BlockIsNonzero(spec, 0, b) || tools::BlockIsNonzero(spec, 1, b);
  }
  EXPECT_EQ(aggregated, static_cast<double>(union_blocks));
  EXPECT_DOUBLE_EQ(aggregated + skipped, blocks);
  EXPECT_GT(skipped, 0);
  EXPECT_GT(Sample(m, "sparsereduce_received_bytes_total\\{" + instance + "\\}"), aggregated * 1024);
  EXPECT_GT(Sample(m, "sparsereduce_sent_bytes_total\\{" + instance + "\\}"), 2 * aggregated * 1024);
  // Once the job is gone, nothing stays reserved (on a fresh scrape: the snapshot above may have been taken before
  // the collective's memory was released).
  EXPECT_TRUE(Eventually([&] {
    m = daemon.Metrics();
    return Sample(m, "sparsereduce_connected_workers\\{" + instance + "\\}") == 0 &&
           Sample(m, "sparsereduce_jobs\\{" + instance + "\\}") == 0 &&
           Sample(m, "sparsereduce_memory_reserved_bytes\\{" + instance + "\\}") == 0;
  })) << m;
}

// Workers on the daemon's host send over shared memory, and the daemon sums their CONTRIBUTIONs where they lie in
// the rings: with the default 2 MiB rings nearly all of them (those that wrap around a ring's end are copied).
// With 256 KiB rings, the frames of 8 slots hold back three quarters of a ring again and again and are copied out
// (recalled). The counters show both; the sums stay exact.
TEST(Service, SharedMemoryContributionsAreSummedInPlace) {
  const std::string instance = R"(instance_name="svc")";
  const std::string in_place = "sparsereduce_contributions_in_place_total\\{" + instance + "\\}";
  const std::string recalls = "sparsereduce_ring_recalls_total\\{" + instance + "\\}";
  // 4 ranks, 16384 blocks in frames of 128: 128 data frames per rank (and an announce per slot).
  const tools::SyntheticSpec spec{1 << 22, 256, 1.0, tools::Overlap::kRandom, 4, 7};
  {
    Daemon daemon;
    for (const auto& e : RunJob(daemon.address(), 1, spec)) EXPECT_EQ(e, "");
    const std::string m = daemon.Metrics();
    EXPECT_GT(Sample(m, in_place), 0.8 * 4 * 128) << m;
  }
  {
    Daemon daemon({"--ring-bytes", "262144"});
    for (const auto& e : RunJob(daemon.address(), 2, spec)) EXPECT_EQ(e, "");
    const std::string m = daemon.Metrics();
    EXPECT_GT(Sample(m, in_place), 0) << m;
    EXPECT_GT(Sample(m, recalls), 0) << m;
  }
}

TEST(Service, JobSecretsAuthenticateBothSides) {
  Daemon probe;  // for its directory
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/5") << "s3cret\n";  // as `echo s3cret > 5` writes it
  Daemon daemon({"--job-secrets-dir", secrets});
  const tools::SyntheticSpec spec{3000, 256, 0.5, tools::Overlap::kRandom, 2, 7};

  for (const auto& e : RunJob(daemon.address(), 5, spec, "s3cret")) EXPECT_EQ(e, "");
  auto [code, what] = JoinError(daemon.address(), 5, "wrong");
  EXPECT_EQ(code, "UNAUTHENTICATED");
  EXPECT_NE(what.find("failed to prove it holds the job's secret"), std::string::npos) << what;
  std::tie(code, what) = JoinError(daemon.address(), 5, "");
  EXPECT_EQ(code, "UNAUTHENTICATED");
  EXPECT_NE(what.find("sent no credentials"), std::string::npos) << what;
  // A job without a secret runs unauthenticated, but a worker that expects authentication is refused rather
  // than silently downgraded.
  for (const auto& e : RunJob(daemon.address(), 6, spec)) EXPECT_EQ(e, "");
  std::tie(code, what) = JoinError(daemon.address(), 6, "s3cret");
  EXPECT_EQ(code, "UNAUTHENTICATED");
  EXPECT_NE(what.find("holds none"), std::string::npos) << what;
  // All three refusals are counted, also the wrong secret, where the worker closes on the daemon's proof without
  // an answer (it was logged as an early close and not counted).
  std::string m;
  EXPECT_TRUE(Eventually([&] {
    m = daemon.Metrics();
    return Sample(m, R"(sparsereduce_errors_total\{instance_name="svc",kind="UNAUTHENTICATED"\})") == 3;
  })) << m;
  // An empty secret file is the daemon's misconfiguration, not the worker's: an internal error naming the file
  // (it came as INVALID_ARGUMENT, as if the worker's own arguments were wrong).
  std::ofstream(secrets + "/9") << "\n";
  std::tie(code, what) = JoinError(daemon.address(), 9, "s3cret");
  EXPECT_EQ(code, "INTERNAL") << what;
  EXPECT_NE(what.find(secrets + "/9 is empty"), std::string::npos) << what;
}

// A Hello the daemon refuses ends the job it names while that job forms (its other ranks learn at once that it
// cannot form), but not a job that has a secret: the refused peer never authenticated. Here a stranger names an
// authenticated job, one of whose two ranks has joined, with a rank out of range; the job still forms and runs.
TEST(Service, RefusedUnauthenticatedHelloDoesNotEndAJobWithASecret) {
  Daemon probe;  // for its directory
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/25") << "s3cret\n";
  Daemon daemon({"--job-secrets-dir", secrets});
  auto rank0 = std::async(std::launch::async,
                          [&] { return std::make_unique<Worker>(Options(daemon.address(), 25, 0, 2, "s3cret")); });
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_connected_workers\{instance_name="svc"\})") == 1;
  })) << "rank 0 did not join";

  const int stranger = ConnectToLoopback(daemon.address());
  ASSERT_GE(stranger, 0);
  ASSERT_TRUE(SendControl(stranger, RawHello(25, 7, 2, 1)));
  // The refusal, then EOF: by then the daemon has decided about the job.
  const std::optional<std::string> answer = ReadUntilClosed(stranger);
  close(stranger);
  ASSERT_TRUE(answer) << "the daemon did not close the stranger's connection within 10 s";
  EXPECT_NE(answer->find("rank 7 is out of range"), std::string::npos) << *answer;

  std::unique_ptr<Worker> worker1, worker0;
  ASSERT_NO_THROW(worker1 = std::make_unique<Worker>(Options(daemon.address(), 25, 1, 2, "s3cret")));
  try {
    worker0 = rank0.get();
  } catch (const Error& e) {
    FAIL() << "the stranger's Hello ended the authenticated job: " << e.code() << ": " << e.what();
  }
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto sum1 = std::async(std::launch::async, [&] { worker1->allreduce(std::span(b)); });
  worker0->allreduce(std::span(a));
  sum1.get();
  EXPECT_EQ(a, std::vector<float>(1000, 3.0f));
  EXPECT_EQ(b, std::vector<float>(1000, 3.0f));
}

// A stop requested through WorkerOptions::cancel ends the constructor while it waits for a rank that never comes:
// ABORTED at once, not DEADLINE_EXCEEDED after the 60 s join timeout; the daemon forgets the rank and the job,
// and the job can form afterwards.
TEST(Service, CancelledJoinLeavesTheJobAtOnce) {
  Daemon daemon;
  const std::string connected = R"(sparsereduce_connected_workers\{instance_name="svc"\})";
  const std::string jobs = R"(sparsereduce_jobs\{instance_name="svc"\})";
  std::stop_source stop;
  WorkerOptions options = Options(daemon.address(), 26, 0, 2);
  options.connect_timeout = options.join_timeout = 60s;
  options.cancel = stop.get_token();
  auto rank0 = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  ASSERT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), connected) == 1; })) << "rank 0 did not join";
  stop.request_stop();
  try {
    rank0.get();
    FAIL() << "the job formed without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "ABORTED") << e.what();
    EXPECT_NE(std::string(e.what()).find("job 26 rank 0: the join was cancelled"), std::string::npos) << e.what();
  }
  std::string m;
  EXPECT_TRUE(Eventually([&] {
    m = daemon.Metrics();
    return Sample(m, connected) == 0 && Sample(m, jobs) == 0;
  })) << m;

  // A stop requested before the constructor starts: the link is closed while it resolves the address or
  // connects. A link closed while resolving used to connect anyway and the constructor to wait for the join
  // deadline (about 1 attempt in 20: repeated to catch it).
  std::stop_source stopped;
  stopped.request_stop();
  options.cancel = stopped.get_token();
  for (int i = 0; i < 60; ++i) {
    try {
      Worker worker(options);
      FAIL() << "a cancelled constructor joined";
    } catch (const Error& e) {
      ASSERT_EQ(e.code(), "ABORTED") << e.what();
    }
  }

  // Not a structured binding: clang 14 refuses lambdas that capture one.
  std::pair<std::unique_ptr<Worker>, std::unique_ptr<Worker>> pair = JoinPair(daemon.address(), 26);
  Worker& worker0 = *pair.first;
  Worker& worker1 = *pair.second;
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto sum1 = std::async(std::launch::async, [&] { worker1.allreduce(std::span(b)); });
  worker0.allreduce(std::span(a));
  sum1.get();
  EXPECT_EQ(a, std::vector<float>(1000, 3.0f));
}

// The table from every column of the layout to its lane is A times the columns one aggregator serves: a Hello
// that claims 2^20 aggregators makes it large for a tensor of many small blocks. It counts against
// --max-job-memory like the rest of the collective, so the collective is refused instead of allocated (it was
// not counted: 512 MiB here, and 32 GiB with 2^32 elements under the default limits).
TEST(Service, ColumnTableOfManyAggregatorsCountsAgainstTheJobMemory) {
  Daemon daemon({"--max-job-memory", std::to_string(64 << 20)});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(26, 0, 1, 1u << 20)));
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() =
      SpecToProto(CollectiveSpec{uint64_t{1} << 26, DType::kFloat32, ReduceOp::kSum, 1});
  ASSERT_TRUE(SendControl(fd, begin));
  const std::optional<std::string> answer = ReadUntilClosed(fd);
  close(fd);
  ASSERT_TRUE(answer) << "the daemon did not close the connection within 10 s";
  EXPECT_NE(answer->find("--max-job-memory"), std::string::npos) << *answer;
  EXPECT_NE(answer->find("1048576 aggregators"), std::string::npos) << *answer;
}

// CPU seconds (user + system) a process has used so far, from /proc/PID/stat; -1 if unreadable.
double CpuSeconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t end_of_name = stat.rfind(')');
  if (end_of_name == std::string::npos) return -1;
  std::istringstream fields(stat.substr(end_of_name + 2));
  std::string field;
  double ticks = 0;
  for (int i = 3; i <= 15 && fields >> field; ++i) {
    if (i >= 14) ticks += std::stod(field);  // fields 14 and 15: utime and stime
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// The daemon raises its open-file soft limit to the hard limit (each worker connection needs a descriptor): a
// container or shell often hands it a soft limit of 1024 under a far higher hard one, and it stayed there.
TEST(Service, TheOpenFileLimitIsRaisedToTheHardLimit) {
  Daemon daemon({}, {"/bin/sh", "-c", "ulimit -S -n 64 && ulimit -H -n 4096 && exec \"$@\"", "sh"});
  ASSERT_FALSE(daemon.address().empty());
  std::ifstream limits("/proc/" + std::to_string(daemon.process()->pid()) + "/limits");
  std::string line, found;
  while (std::getline(limits, line)) {
    if (line.rfind("Max open files", 0) == 0) found = line;
  }
  std::istringstream fields(found.substr(std::string("Max open files").size()));
  std::string soft, hard;
  fields >> soft >> hard;
  EXPECT_EQ(soft, "4096") << found;
  EXPECT_EQ(hard, "4096") << found;
}

// Out of file descriptors, a failed accept leaves the connection in the backlog; accepting again at once failed
// again at once, and the daemon spun (800,000 log lines in 2 s). It pauses instead, and serves jobs again once
// descriptors are free.
TEST(Service, OutOfDescriptorsTheListenersPauseInsteadOfSpinning) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes need descriptors of their own (UBSan's type checks failed without them)";
#endif
  Daemon daemon({"--io-threads", "1"}, {"/bin/sh", "-c", "ulimit -n 48 && exec \"$@\"", "sh"});
  ASSERT_FALSE(daemon.address().empty());
  std::vector<int> idle;  // connections that never say Hello: each holds a descriptor until the handshake timeout
  for (int i = 0; i < 64; ++i) {
    const int fd = ConnectToLoopback(daemon.address());
    ASSERT_GE(fd, 0);
    idle.push_back(fd);
  }
  // Seen from outside (its /metrics needs a descriptor too): all 48 are open.
  const int pid = daemon.process()->pid();
  auto open_descriptors = [pid] {
    std::error_code ec;
    auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
    return ec ? 0 : std::distance(it, std::filesystem::directory_iterator());
  };
  ASSERT_TRUE(Eventually([&] { return open_descriptors() >= 48; }))
      << "the daemon did not run out of descriptors: " << open_descriptors() << " open";
  const double before = CpuSeconds(pid);
  std::this_thread::sleep_for(1s);  // the window measured, not a synchronization
  const double used = CpuSeconds(pid) - before;
  EXPECT_LT(used, 0.3) << "the daemon used " << used << " s of CPU in 1 s while out of descriptors";
  for (int fd : idle) close(fd);
  const tools::SyntheticSpec spec{3000, 256, 0.5, tools::Overlap::kRandom, 2, 7};
  for (const auto& e : RunJob(daemon.address(), 27, spec)) EXPECT_EQ(e, "");
}

// A daemon under a limit of 48 open files, with 64 connections that never say Hello holding its descriptors (their
// handshake deadline is far): all 48 open, seen from outside.
class DaemonOutOfDescriptors {
 public:
  explicit DaemonOutOfDescriptors(bool capture_log)
      : daemon_({"--handshake-timeout-ms", "60000"}, {"/bin/sh", "-c", "ulimit -n 48 && exec \"$@\"", "sh"},
                capture_log) {}
  ~DaemonOutOfDescriptors() {
    for (int fd : idle_) close(fd);
  }
  Daemon& daemon() { return daemon_; }
  // False if the daemon did not run out.
  bool Flood() {
    for (int i = 0; i < 64; ++i) {
      const int fd = ConnectToLoopback(daemon_.address());
      if (fd < 0) return false;
      idle_.push_back(fd);
    }
    const std::string fds = "/proc/" + std::to_string(daemon_.process()->pid()) + "/fd";
    return Eventually([&] {
      std::error_code ec;
      auto it = std::filesystem::directory_iterator(fds, ec);
      return !ec && std::distance(it, std::filesystem::directory_iterator()) >= 48;
    });
  }

 private:
  Daemon daemon_;
  std::vector<int> idle_;
};

// The status of a GET, or -1 if it got no answer within 5 s. (Not HttpGet: its deadline holds only for
// asynchronous operations, and it waited for as long as the daemon had no descriptor for it.)
int StatusOf(const Daemon& daemon, const std::string& path) {
  const int fd = ConnectToLoopback(daemon.metrics_port());
  if (fd < 0) return -1;
  const std::string request = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  const bool written = WriteAll(fd, std::as_bytes(std::span(request.data(), request.size())));
  const std::optional<std::string> answer = written ? ReadUntilClosed(fd, 5s) : std::nullopt;
  close(fd);
  if (!answer || answer->rfind("HTTP/1.1 ", 0) != 0 || answer->size() < 12) return -1;
  return std::stoi(answer->substr(9, 3));
}

// Out of descriptors, the metrics endpoint failed its accepts too, so /healthz went unanswered until connections
// were closed (or timed out in their handshake), and the liveness probe restarted the daemon, ending every job. It
// keeps a descriptor in reserve for them: the probes are answered at once, one after the other.
TEST(Service, OutOfDescriptorsTheProbesAreStillAnswered) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes need descriptors of their own";
#endif
  DaemonOutOfDescriptors out(/*capture_log=*/false);
  ASSERT_FALSE(out.daemon().address().empty());
  ASSERT_TRUE(out.Flood()) << "the daemon did not run out of descriptors";
  EXPECT_EQ(StatusOf(out.daemon(), "/healthz"), 200);
  EXPECT_EQ(StatusOf(out.daemon(), "/readyz"), 200);
  EXPECT_EQ(StatusOf(out.daemon(), "/healthz"), 200) << "the reserve was not taken back";
}

// Out of descriptors, the data-plane listener fails an accept every 100 ms: it logged each (90 lines in 5 s), naming
// the configured address ("127.0.0.1:0"). They are rate limited like the refusals, and name the bound address. So
// are the metrics endpoint's, once a connection holds its reserve descriptor (they were not: 30 more lines in 3 s).
TEST(Service, OutOfDescriptorsFailedAcceptsAreRateLimitedAndNameTheBoundAddress) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes need descriptors of their own";
#endif
  DaemonOutOfDescriptors out(/*capture_log=*/true);
  Daemon& daemon = out.daemon();
  ASSERT_FALSE(daemon.address().empty());
  ASSERT_TRUE(out.Flood()) << "the daemon did not run out of descriptors";
  // A keep-alive request answered: that connection holds the reserve, and the next one waits in the backlog.
  const int held = ConnectToLoopback(daemon.metrics_port());
  ASSERT_GE(held, 0);
  const std::string request = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  ASSERT_TRUE(WriteAll(held, std::as_bytes(std::span(request.data(), request.size()))));
  pollfd answer{held, POLLIN, 0};
  ASSERT_EQ(poll(&answer, 1, 5000), 1) << "the metrics endpoint did not answer on its reserve descriptor";
  const int waiting = ConnectToLoopback(daemon.metrics_port());
  ASSERT_GE(waiting, 0);
  std::this_thread::sleep_for(3s);  // the window measured (30 failed accepts each), not a synchronization
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(daemon.process()->Wait(30s).ok()) << "the daemon did not stop";
  Result<std::string> log = daemon.process()->ReadStdout(10s);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  size_t lines = 0, naming_it = 0;
  for (size_t pos = 0; (pos = log->find("accept on ", pos)) != std::string::npos; ++pos) {
    ++lines;
    if (log->compare(pos, 10 + daemon.address().size() + 8, "accept on " + daemon.address() + " failed:") == 0) {
      ++naming_it;
    }
  }
  size_t metrics_lines = 0;
  for (size_t pos = 0; (pos = log->find("metrics endpoint: accept failed", pos)) != std::string::npos; ++pos) {
    ++metrics_lines;
  }
  close(held);
  close(waiting);
  EXPECT_GE(lines, 1u) << *log;
  EXPECT_LE(lines + metrics_lines, 20u) << *log;
  EXPECT_EQ(naming_it, lines) << "not every line names " << daemon.address() << ":\n" << *log;
  EXPECT_NE(log->find("more messages about failed accepts were not logged"), std::string::npos) << *log;
}

// One client address may have --max-handshakes-per-address (here 16) connections in their handshake at once: the next
// one gets RESOURCE_EXHAUSTED at once and is closed. Connections that never said Hello used to be taken without
// bound, each holding a descriptor and a session until the handshake timeout, so one host could hold the
// descriptors every other client needs. Places that free up are taken again.
TEST(Service, ConnectionsInTheirHandshakeAreBoundedPerAddress) {
  Daemon daemon({"--max-handshakes-per-address", "16"});
  std::vector<int> silent;
  for (int i = 0; i < 16; ++i) {
    silent.push_back(ConnectToLoopback(daemon.address()));
    ASSERT_GE(silent.back(), 0);
  }
  const int extra = ConnectToLoopback(daemon.address());
  ASSERT_GE(extra, 0);
  const std::optional<RawFrame> frame = ReadFrame(extra);
  ASSERT_TRUE(frame) << "the 17th connection got no Error";
  Result<proto::ControlMessage> message = DecodeControl(frame->payload);
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  ASSERT_TRUE(message->has_error()) << message->DebugString();
  EXPECT_EQ(message->error().code(), proto::RESOURCE_EXHAUSTED) << message->error().message();
  EXPECT_NE(message->error().message().find("127.0.0.1 already has 16 connections in their handshake"),
            std::string::npos)
      << message->error().message();
  EXPECT_TRUE(ReadUntilClosed(extra, 5s)) << "the refused connection was kept open";
  close(extra);
  for (int fd : silent) close(fd);
  EXPECT_TRUE(Eventually([&] { return JoinError(daemon.address(), 60, "").first.empty(); }));
}

// A shared-memory offer costs the daemon its listening Unix socket until a connection presents the token; the
// segment (a memfd and four socket pairs) is made only then. It was made for every Hello listing "shm2", so that
// handshakes that never took their offers held about 11 descriptors each until their deadline (64 of them: 714).
TEST(Service, SharedMemoryOffersNobodyTakesHoldNoSegment) {
  Daemon daemon;
  auto descriptors = [&] {
    return std::distance(
        std::filesystem::directory_iterator("/proc/" + std::to_string(daemon.process()->pid()) + "/fd"),
        std::filesystem::directory_iterator());
  };
  const auto before = descriptors();
  constexpr int kOffers = 8;
  std::vector<int> fds;
  for (int i = 0; i < kOffers; ++i) {
    fds.push_back(ConnectToLoopback(daemon.address()));
    ASSERT_GE(fds.back(), 0);
    proto::ControlMessage hello = RawHello(90 + i, 0, 2, 1);
    hello.mutable_hello()->add_transports("shm2");
    ASSERT_TRUE(SendControl(fds.back(), hello));
    const std::optional<RawFrame> frame = ReadFrame(fds.back());
    ASSERT_TRUE(frame);
    Result<proto::ControlMessage> offer = DecodeControl(frame->payload);
    ASSERT_TRUE(offer.ok() && offer->has_transport_offer()) << (offer.ok() ? offer->DebugString() : "");
  }
  // Each: its TCP connection and the offer's listening socket.
  EXPECT_LE(descriptors() - before, 2 * kOffers);
  for (int fd : fds) close(fd);
}

// The same for connections the job refuses when they join (here JOB_FULL: a Hello for a job that formed already):
// they gave the place back before the job refused them, so a client repeating such Hellos held any number of
// descriptors for their close grace (1500 from one address in 0.15 s, until accept failed for every job with "Too
// many open files").
TEST(Service, ConnectionsTheJobRefusesKeepTheirHandshakePlaceUntilClosed) {
  Daemon daemon({"--max-handshakes-per-address", "16"});
  Worker member(Options(daemon.address(), 83, 0, 1));  // job 83 forms with its only rank
  auto refusal = [&](int fd) {
    EXPECT_TRUE(SendControl(fd, RawHello(83, 0, 1, 1)));
    const std::optional<RawFrame> frame = ReadFrame(fd);
    EXPECT_TRUE(frame) << "no Error";
    Result<proto::ControlMessage> message =
        frame ? DecodeControl(frame->payload) : Result<proto::ControlMessage>(ProtocolError("none"));
    EXPECT_TRUE(message.ok() && message->has_error());
    return message.ok() && message->has_error() ? message->error().code() : proto::ERROR_CODE_UNSPECIFIED;
  };
  std::vector<int> refused;
  for (int i = 0; i < 16; ++i) {
    refused.push_back(ConnectToLoopback(daemon.address()));
    ASSERT_GE(refused.back(), 0);
    ASSERT_EQ(refusal(refused.back()), proto::JOB_FULL);
  }
  const int extra = ConnectToLoopback(daemon.address());
  ASSERT_GE(extra, 0);
  EXPECT_EQ(refusal(extra), proto::RESOURCE_EXHAUSTED) << "the 17th connection reached the job";
  close(extra);
  for (int fd : refused) close(fd);
  EXPECT_TRUE(Eventually([&] { return JoinError(daemon.address(), 84, "").first.empty(); }));
}

// A refused connection keeps its address's handshake place until it is closed: after its Error the daemon waits up
// to 5 s for the client to close, holding the descriptor. It gave the place back as soon as it refused, so a client
// that sent invalid Hellos and kept the connections open held any number of descriptors, 16 (here) at a time.
TEST(Service, RefusedConnectionsKeepTheirHandshakePlaceUntilClosed) {
  Daemon daemon({"--max-handshakes-per-address", "16"});
  std::vector<int> refused;
  for (int i = 0; i < 16; ++i) {
    refused.push_back(ConnectToLoopback(daemon.address()));
    ASSERT_GE(refused.back(), 0);
    ASSERT_TRUE(SendControl(refused.back(), RawHello(80, 5, 2, 1)));  // rank 5 of 2
    const std::optional<RawFrame> frame = ReadFrame(refused.back());
    ASSERT_TRUE(frame);
    ASSERT_TRUE(DecodeControl(frame->payload)->has_error());
  }
  const int extra = ConnectToLoopback(daemon.address());
  ASSERT_GE(extra, 0);
  const std::optional<RawFrame> frame = ReadFrame(extra);
  ASSERT_TRUE(frame) << "the 17th connection got no Error";
  Result<proto::ControlMessage> message = DecodeControl(frame->payload);
  ASSERT_TRUE(message.ok() && message->has_error());
  EXPECT_EQ(message->error().code(), proto::RESOURCE_EXHAUSTED) << message->error().message();
  close(extra);
  for (int fd : refused) close(fd);
  EXPECT_TRUE(Eventually([&] { return JoinError(daemon.address(), 81, "").first.empty(); }));
}

// A Hello over a limit says what sets it: --max-world-size (the refusal named only the number).
TEST(Service, AWorldSizeOverTheLimitNamesTheFlag) {
  Daemon daemon({"--max-world-size", "2"});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(82, 0, 3, 1)));
  const std::optional<RawFrame> frame = ReadFrame(fd);
  close(fd);
  ASSERT_TRUE(frame);
  Result<proto::ControlMessage> message = DecodeControl(frame->payload);
  ASSERT_TRUE(message.ok() && message->has_error());
  EXPECT_EQ(message->error().code(), proto::RESOURCE_EXHAUSTED) << message->error().message();
  EXPECT_NE(message->error().message().find("world_size 3 exceeds this aggregator's limit of 2 (--max-world-size)"),
            std::string::npos)
      << message->error().message();
}

TEST(Service, AggregatorsAndSecretFromEnvironmentAndDnsNames) {
  Daemon probe;
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/9") << "from-file\n";
  std::ofstream(probe.dir() + "/worker-secret") << "from-file\n";
  Daemon daemon({"--job-secrets-dir", secrets});
  const std::string port = daemon.address().substr(daemon.address().rfind(':') + 1);
  // A DNS name, as StatefulSet pods are addressed, given through the environment with the secret file.
  setenv("SPARSEREDUCE_AGGREGATORS", ("localhost:" + port).c_str(), 1);
  setenv("SPARSEREDUCE_SECRET_FILE", (probe.dir() + "/worker-secret").c_str(), 1);
  std::string error;
  try {
    WorkerOptions options = Options("", 9, 0, 1);
    options.aggregators.clear();
    Worker worker(options);
    std::vector<float> t(600, 2.0f);
    worker.allreduce(std::span(t));
    EXPECT_EQ(t, std::vector<float>(600, 2.0f));
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_EQ(error, "");
  setenv("SPARSEREDUCE_SECRET_FILE", (probe.dir() + "/missing").c_str(), 1);
  auto [code, what] = JoinError("", 9, "");
  EXPECT_EQ(code, "INVALID_ARGUMENT");
  EXPECT_NE(what.find("SPARSEREDUCE_SECRET_FILE"), std::string::npos) << what;
  unsetenv("SPARSEREDUCE_AGGREGATORS");
  unsetenv("SPARSEREDUCE_SECRET_FILE");
}

// A secret given in WorkerOptions drops one trailing newline, as the aggregator's secret files and the worker's
// environment do: a caller that passed a secret file's contents (newline included) could never authenticate.
TEST(Service, AnExplicitSecretDropsOneTrailingNewlineAsSecretFilesDo) {
  Daemon probe;
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/86") << "s3cret\n";
  Daemon daemon({"--job-secrets-dir", secrets});
  auto [code, what] = JoinError(daemon.address(), 86, "s3cret\n");
  EXPECT_EQ(code, "") << what;
  std::tie(code, what) = JoinError(daemon.address(), 86, "s3cret\r\n");
  EXPECT_EQ(code, "") << what;
  std::tie(code, what) = JoinError(daemon.address(), 86, "s3cret\n\n");  // only one newline is dropped
  EXPECT_EQ(code, "UNAUTHENTICATED") << what;
  std::tie(code, what) = JoinError(daemon.address(), 86, "\n");
  EXPECT_EQ(code, "INVALID_ARGUMENT") << what;
  EXPECT_NE(what.find("the job secret from WorkerOptions::secret is empty"), std::string::npos) << what;
}

TEST(Service, RequireAuthRefusesJobsWithoutSecret) {
  Daemon probe;
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  Daemon daemon({"--job-secrets-dir", secrets, "--require-auth"});
  auto [code, what] = JoinError(daemon.address(), 8, "");
  EXPECT_EQ(code, "UNAUTHENTICATED");
  EXPECT_NE(what.find("--require-auth"), std::string::npos) << what;
  // Secrets are read at each handshake: adding one admits the job without a restart.
  std::ofstream(secrets + "/8") << "k";
  std::tie(code, what) = JoinError(daemon.address(), 8, "k");
  EXPECT_EQ(code, "") << what;
}

TEST(Service, AllowedNetworksRefuseOtherClients) {
  {
    Daemon daemon({"--allow-network", "10.0.0.0/8"});
    auto [code, what] = JoinError(daemon.address(), 1, "");
    EXPECT_EQ(code, "PERMISSION_DENIED");
    EXPECT_NE(what.find("127.0.0.1"), std::string::npos) << what;
  }
  Daemon daemon({"--allow-network", "10.0.0.0/8,127.0.0.0/8"});
  EXPECT_EQ(JoinError(daemon.address(), 1, "").first, "");
}

// A job that never forms (here rank 1 of 2 never comes) ends at --formation-timeout-ms with DEADLINE_EXCEEDED
// naming the ranks it waited for, and frees its place. It used to stay until its members closed their
// connections: a peer that said Hello for --max-jobs job ids and stayed connected kept every other job out.
TEST(Service, AJobThatNeverFormsEndsAndFreesItsPlace) {
  Daemon daemon({"--max-jobs", "1", "--formation-timeout-ms", "1000"});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(40, 0, 2, 1)));
  const std::optional<RawFrame> frame = ReadFrame(fd);  // bounded (20 s)
  ASSERT_TRUE(frame) << "no Error for the job that did not form";
  Result<proto::ControlMessage> message = DecodeControl(frame->payload);
  ASSERT_TRUE(message.ok()) << message.status().ToString();
  ASSERT_TRUE(message->has_error()) << message->DebugString();
  EXPECT_EQ(message->error().code(), proto::DEADLINE_EXCEEDED) << message->error().message();
  EXPECT_NE(message->error().message().find("job 40 did not form within 1000 ms"), std::string::npos)
      << message->error().message();
  EXPECT_NE(message->error().message().find("rank(s) 0 (rank 0 at 127.0.0.1:"), std::string::npos)
      << message->error().message();
  EXPECT_NE(message->error().message().find("still waiting for rank(s) 1"), std::string::npos)
      << message->error().message();
  EXPECT_EQ(std::vector<uint32_t>(message->error().ranks().begin(), message->error().ranks().end()),
            std::vector<uint32_t>{1});
  EXPECT_TRUE(ReadUntilClosed(fd)) << "the daemon kept the connection of the job that did not form";
  close(fd);
  // Its place is free: another job forms and runs.
  for (const auto& e : RunJob(daemon.address(), 41, {5000, 256, 0.5, tools::Overlap::kRandom, 2, 3})) {
    EXPECT_EQ(e, "");
  }
}

// The first Error the daemon sends on `fd`, passing by other control frames; nullopt if none comes (bounded).
std::optional<proto::Error> NextError(int fd) {
  while (std::optional<RawFrame> frame = ReadFrame(fd)) {
    Result<proto::ControlMessage> message = DecodeControl(frame->payload);
    if (frame->header.type == FrameType::kControl && message.ok() && message->has_error()) return message->error();
  }
  return std::nullopt;
}

// Ranks that list the aggregators in different orders, or disagree on the job's shape: the JOB_CONFIG_MISMATCH says
// which field differs and what every rank must do (it printed both whole shapes, to be compared by eye).
TEST(Service, AJobConfigMismatchNamesOnlyWhatDiffers) {
  Daemon daemon;
  const int first = ConnectToLoopback(daemon.address());
  ASSERT_GE(first, 0);
  ASSERT_TRUE(SendControl(first, RawHello(43, 0, 2, 2)));  // lists this aggregator first
  ASSERT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), R"(sparsereduce_jobs\{instance_name="svc"\})") == 1; }));
  const int second = ConnectToLoopback(daemon.address());
  ASSERT_GE(second, 0);
  proto::ControlMessage hello = RawHello(43, 1, 2, 2);
  hello.mutable_hello()->set_aggregator_index(1);  // lists it second
  hello.mutable_hello()->set_slots(4);
  ASSERT_TRUE(SendControl(second, hello));
  const std::optional<proto::Error> error = NextError(second);
  close(second);
  close(first);
  ASSERT_TRUE(error.has_value()) << "no Error";
  EXPECT_EQ(error->code(), proto::JOB_CONFIG_MISMATCH);
  const std::string& text = error->message();
  EXPECT_NE(text.find("has slots=4 where rank(s) 0 have slots=8; every rank must use the same values"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("lists this aggregator at position 1 of its aggregator list, rank(s) 0 at position 0: every "
                      "rank must list the same aggregators in the same order"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("world_size"), std::string::npos) << "the fields that agree are left out: " << text;
}

// --max-jobs bounds the jobs served at once: the Hello of one more job is refused with RESOURCE_EXHAUSTED naming
// the job and the flag, and the job already served is not disturbed (it still forms).
TEST(Service, AJobBeyondTheJobLimitIsRefusedNamingItsRankPeerAndTheFlag) {
  Daemon daemon({"--max-jobs", "1"});
  const int first = ConnectToLoopback(daemon.address());
  ASSERT_GE(first, 0);
  ASSERT_TRUE(SendControl(first, RawHello(42, 0, 2, 1)));
  ASSERT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), R"(sparsereduce_jobs\{instance_name="svc"\})") == 1; }));
  const int other = ConnectToLoopback(daemon.address());
  ASSERT_GE(other, 0);
  ASSERT_TRUE(SendControl(other, RawHello(43, 0, 1, 1)));
  const std::optional<proto::Error> error = NextError(other);
  close(other);
  ASSERT_TRUE(error) << "job 43 was not refused";
  EXPECT_EQ(error->code(), proto::RESOURCE_EXHAUSTED) << error->message();
  // Named as every refusal after a Hello is, with the rank and peer (it named only the job).
  EXPECT_NE(error->message().find("job 43 rank 0 (127.0.0.1:"), std::string::npos) << error->message();
  EXPECT_NE(error->message().find("): the aggregator already serves its maximum of 1 jobs (--max-jobs)"),
            std::string::npos)
      << error->message();
  const int second = ConnectToLoopback(daemon.address());
  ASSERT_GE(second, 0);
  ASSERT_TRUE(SendControl(second, RawHello(42, 1, 2, 1)));
  for (int fd : {first, second}) {
    const std::optional<RawFrame> frame = ReadFrame(fd);
    ASSERT_TRUE(frame) << "job 42 did not form";
    Result<proto::ControlMessage> ready = DecodeControl(frame->payload);
    EXPECT_TRUE(ready.ok() && ready->has_job_ready()) << (ready.ok() ? ready->ShortDebugString() : "undecodable");
  }
  close(first);
  close(second);
}

// docs/PROTOCOL.md §3: data of a rank that has not begun the collective (another rank began it) is refused from
// its header, naming the rank and its peer, and the rank that began learns that rank broke the protocol.
TEST(Service, AContributionBeforeItsRanksCollectiveBeginIsRefused) {
  Daemon daemon;
  std::vector<int> fds;
  for (uint32_t rank : {0u, 1u}) {
    fds.push_back(ConnectToLoopback(daemon.address()));
    ASSERT_GE(fds.back(), 0);
    ASSERT_TRUE(SendControl(fds.back(), RawHello(47, rank, 2, 1)));
  }
  for (int fd : fds) {
    const std::optional<RawFrame> ready = ReadFrame(fd);
    ASSERT_TRUE(ready) << "the job did not form";
  }
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto({4096, DType::kFloat32, ReduceOp::kSum, 256});
  ASSERT_TRUE(SendControl(fds[0], begin));
  // Rank 0's CollectiveBegin was handled once the collective's memory is reserved.
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") > 0;
  }));
  std::array<std::byte, kFrameHeaderSize> header{};
  EncodeFrameHeader({FrameType::kContribution, kEntrySize, 0, 47, 1, 1}, header.data());
  ASSERT_TRUE(WriteAll(fds[1], header));
  const std::optional<proto::Error> error = NextError(fds[1]);
  const std::optional<proto::Error> other = NextError(fds[0]);
  for (int fd : fds) close(fd);
  ASSERT_TRUE(error) << "rank 1's data was not refused";
  EXPECT_EQ(error->code(), proto::PROTOCOL_VIOLATION) << error->message();
  EXPECT_NE(error->message().find("job 47 rank 1 (peer 127.0.0.1:"), std::string::npos) << error->message();
  EXPECT_NE(error->message().find("CONTRIBUTION for collective 1 before its CollectiveBegin"), std::string::npos)
      << error->message();
  ASSERT_TRUE(other) << "rank 0 was not told";
  EXPECT_EQ(other->code(), proto::PEER_LEFT) << other->message();
  EXPECT_NE(other->message().find("job 47 aborted because rank 1 (peer 127.0.0.1:"), std::string::npos)
      << other->message();
  EXPECT_NE(other->message().find("broke the protocol"), std::string::npos) << other->message();
}

// A collective that every rank began but that then makes no progress ends at --stall-timeout-ms with
// DEADLINE_EXCEEDED naming the collective and the ranks (and their peers) it still waits for.
TEST(Service, AStalledCollectiveNamesTheRanksItStillWaitsFor) {
  Daemon daemon({"--stall-timeout-ms", "300"});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(44, 0, 1, 1)));
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto({4096, DType::kFloat32, ReduceOp::kSum, 256});
  ASSERT_TRUE(SendControl(fd, begin));  // and never its data
  const auto start = std::chrono::steady_clock::now();
  const std::optional<proto::Error> error = NextError(fd);
  close(fd);
  ASSERT_TRUE(error) << "the stalled collective was not ended";
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
  EXPECT_EQ(error->code(), proto::DEADLINE_EXCEEDED) << error->message();
  EXPECT_EQ(error->seq(), 1u);
  EXPECT_NE(error->message().find("job 44, collective 1 made no progress for 300 ms (--stall-timeout-ms); still "
                                  "waiting for rank(s) 0 (rank 0 at 127.0.0.1:"),
            std::string::npos)
      << error->message();
  EXPECT_EQ(std::vector<uint32_t>(error->ranks().begin(), error->ranks().end()), std::vector<uint32_t>{0});
}

// The HTTP endpoint answers only GET and HEAD: another method gets 405 with the Allow header, not the metrics.
TEST(Service, AnHttpMethodOtherThanGetOrHeadIsRefused) {
  Daemon daemon;
  const int fd = ConnectToLoopback(daemon.metrics_port());
  ASSERT_GE(fd, 0);
  const std::string request = "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  ASSERT_TRUE(WriteAll(fd, std::as_bytes(std::span(request.data(), request.size()))));
  const std::optional<std::string> reply = ReadUntilClosed(fd);
  close(fd);
  ASSERT_TRUE(reply) << "no reply";
  EXPECT_EQ(reply->rfind("HTTP/1.1 405", 0), 0u) << *reply;
  EXPECT_NE(reply->find("Allow: GET, HEAD"), std::string::npos) << *reply;
  EXPECT_EQ(reply->find("sparsereduce_jobs"), std::string::npos) << *reply;
}

// A second SIGTERM during the drain aborts what is left at once (SHUTTING_DOWN to its ranks) and the daemon exits
// 0, instead of waiting out the --drain-timeout-ms of a collective that will not finish.
TEST(Service, ASecondSigtermDuringTheDrainAbortsTheRemainingJobs) {
  Daemon daemon({"--drain-timeout-ms", "600000"});
  ASSERT_NE(daemon.process(), nullptr);
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(45, 0, 1, 1)));
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto({4096, DType::kFloat32, ReduceOp::kSum, 256});
  ASSERT_TRUE(SendControl(fd, begin));  // a collective that never finishes: the drain waits for it
  for (bool accepted = false; !accepted;) {
    const std::optional<RawFrame> frame = ReadFrame(fd);
    ASSERT_TRUE(frame) << "collective 1 was not accepted";
    Result<proto::ControlMessage> message = DecodeControl(frame->payload);
    accepted = message.ok() && message->has_collective_accepted();
  }
  daemon.process()->Signal(SIGTERM);
  ASSERT_TRUE(Eventually([&] { return daemon.Get("/readyz").status == 503; })) << "the drain did not start";
  daemon.process()->Signal(SIGTERM);
  const std::optional<proto::Error> error = NextError(fd);
  close(fd);  // (the daemon waits for the rank to close after its Error, up to a grace period)
  ASSERT_TRUE(error) << "the rank was not told";
  EXPECT_EQ(error->code(), proto::SHUTTING_DOWN) << error->message();
  EXPECT_NE(error->message().find("the aggregator is shutting down: it was signalled again while draining"),
            std::string::npos)
      << error->message();
  Result<int> status = daemon.process()->Wait(10s);
  ASSERT_TRUE(status.ok()) << "the second SIGTERM did not end the drain";
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
}

// A job secret the daemon cannot read (here a symbolic link to itself) refuses the Hello with an internal error naming the
// job, rank, peer and the file: the daemon's configuration is at fault, and the job is not admitted without it.
TEST(Service, AnUnreadableJobSecretRefusesTheHelloNamingTheFile) {
  Daemon probe;  // for its directory
  const std::string secrets = probe.dir() + "/secrets";
  ASSERT_TRUE(std::filesystem::create_directory(secrets));
  std::filesystem::create_symlink(secrets + "/46", secrets + "/46");
  Daemon daemon({"--job-secrets-dir", secrets});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(46, 0, 1, 1)));
  const std::optional<proto::Error> error = NextError(fd);
  close(fd);
  ASSERT_TRUE(error) << "the Hello was not refused";
  EXPECT_EQ(error->code(), proto::ERROR_CODE_UNSPECIFIED) << error->message();  // INTERNAL on the wire
  EXPECT_NE(error->message().find("job 46 rank 0 (127.0.0.1:"), std::string::npos) << error->message();
  EXPECT_NE(error->message().find("cannot read the secret of job 46 from " + secrets + "/46"), std::string::npos)
      << error->message();
}

// The metrics endpoint serves at most 64 connections at once. It used to accept every connection and keep each
// until its 10 s request deadline, so one client could hold any number of the daemon's descriptors, which its
// data-plane listeners need too. Then it closed every connection beyond 64 when accepted, so a client holding 64
// idle connections kept the probes out (and a failing liveness probe restarts the daemon). Now a new connection
// beyond 64 closes the one open longest: the probe is answered and the idle connections go, oldest first.
TEST(Service, MetricsEndpointBoundsItsConnectionsAndStillServesAProbe) {
  Daemon daemon;
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    idle.push_back(ConnectToLoopback(daemon.metrics_port()));
    ASSERT_GE(idle.back(), 0);
  }
  // Accepted in the order they connected, so the probe's connection is the 65th.
  EXPECT_EQ(daemon.Get("/healthz").status, 200);
  EXPECT_TRUE(ReadUntilClosed(idle[0], 5s)) << "the longest-open connection was kept past the limit";
  // Two more: whether or not the probe's closed connection still counts, the second of them is past the limit.
  for (int i = 0; i < 2; ++i) {
    idle.push_back(ConnectToLoopback(daemon.metrics_port()));
    ASSERT_GE(idle.back(), 0);
  }
  EXPECT_TRUE(ReadUntilClosed(idle[1], 5s)) << "the second-oldest connection was kept past the limit";
  for (int fd : idle) close(fd);
}

// Collective 1 of a job of two ranks, after which rank 0 (by hand, 4 KiB receive buffer) has read none of its
// RESULTs: it lets rank 1 stream all 256 CONTRIBUTIONs of 64 blocks (window 256) before it announces nothing, so
// that the daemon answers them all at once. Rank 1 reads its RESULTs; rank 0's 16 MiB are far more than the
// kernel's send buffer (at most 4 MiB here) takes, so the daemon keeps most of them queued.
struct UnreadResults {
  int fd = -1;  // rank 0's connection
  std::unique_ptr<Worker> rank1;
  std::vector<float> tensor;
  ~UnreadResults() {
    if (fd >= 0) close(fd);
  }

  void Run(Daemon& daemon, uint64_t job) {
    WorkerOptions options = Options(daemon.address(), job, 1, 2);
    options.transport = "tcp";
    options.slots = 1;
    options.blocks_per_message = 64;
    options.window = 256;
    fd = ConnectToLoopback(daemon.address(), /*receive_buffer=*/4096);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendControl(fd, RawHello(job, 0, 2, 1, options)));
    auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
    rank1 = joined.get();

    const CollectiveSpec spec{256u * 64u * 256u, DType::kFloat32, ReduceOp::kSum, options.block_size};
    proto::ControlMessage begin;
    begin.mutable_collective_begin()->set_seq(1);
    *begin.mutable_collective_begin()->mutable_spec() = SpecToProto(spec);
    ASSERT_TRUE(SendControl(fd, begin));
    tensor.assign(spec.element_count, 1.0f);
    auto first = rank1->allreduce_async(std::span(tensor));
    // Rank 1's announce and 256 CONTRIBUTIONs of 64 blocks (40 + 64 · (24 + 1024) bytes each) have been read.
    ASSERT_TRUE(Eventually([&] {
      return Sample(daemon.Metrics(), R"(sparsereduce_received_bytes_total\{instance_name="svc"\})") >=
             256.0 * (40 + 64 * (24 + 1024));
    })) << daemon.Metrics();
    const JobShape shape{2, 1, options.slots, options.blocks_per_message, options.window};
    const ColumnLayout layout(shape, spec.element_count, spec.block_size, 4);
    std::vector<Entry> announce;
    for (uint32_t k = 0; k < layout.NonEmptyLanes(0, 0); ++k)
      announce.push_back({layout.Column(0, 0, k), kEndOfColumn, 0});
    const ByteBuffer frame = EncodeDataFrame({FrameType::kContribution, 0, 0, job, 1, 0}, announce, {});
    ASSERT_TRUE(WriteAll(fd, std::span(frame.data(), frame.size())));
    ASSERT_EQ(first.wait_for(20s), std::future_status::ready);
    first.get();  // rank 1 has its sums; rank 0's RESULTs wait in the daemon
  }
};

// A member that does not read its RESULTs holds the others back in the begin phase too: there the hold leaves a
// late rank's CollectiveBegin unread, so the collective would wait for it up to --begin-timeout-ms (30 min by
// default) and then blame the rank that is held back. It is aborted at the stall timeout instead, naming the
// member that does not read. Here rank 1 begins collective 2 after UnreadResults, and rank 0 never does.
TEST(Service, AMemberThatDoesNotReadEndsTheBeginPhaseAtTheStallTimeout) {
  Daemon daemon({"--stall-timeout-ms", "2000", "--begin-timeout-ms", "600000"});
  UnreadResults unread;
  ASSERT_NO_FATAL_FAILURE(unread.Run(daemon, 44));
  const auto start = std::chrono::steady_clock::now();
  try {
    unread.rank1->allreduce(std::span(unread.tensor));
    ADD_FAILURE() << "collective 2 completed without rank 0";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "DEADLINE_EXCEEDED") << e.what();
    EXPECT_NE(std::string(e.what()).find("rank(s) 0 do not read their RESULTs"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 30s) << "waited for the begin timeout";
}

// RESULTs that wait in a member's send queue keep their share of --max-total-memory after the collective completed,
// until they are written: they were released at completion, so a member that read nothing (with large K x B, far
// beyond --max-job-memory) held memory nobody accounted for, between collectives for as long as it stayed
// connected. Here rank 0 then reads everything, and the reservation goes.
TEST(Service, QueuedResultsKeepTheirMemoryReservedUntilWritten) {
  Daemon daemon;
  UnreadResults unread;
  ASSERT_NO_FATAL_FAILURE(unread.Run(daemon, 45));
  const std::string reserved = R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})";
  EXPECT_GT(Sample(daemon.Metrics(), reserved), 4 << 20) << "the queued RESULTs hold no reservation";
  std::vector<char> sink(1 << 20);
  EXPECT_TRUE(Eventually([&] {
    while (recv(unread.fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
    }
    return Sample(daemon.Metrics(), reserved) == 0;
  })) << daemon.Metrics();
}

// So do the RESULTs of a collective that fails while they wait: the abort released its reservation at once, and a
// member that read slowly then held them unaccounted until its close grace ended, while other jobs were admitted
// against a budget that read zero (12 such jobs of 113 MB each under a 128 MiB --max-total-memory). Here rank 0
// announces a block of the last row in every column and never sends it nor reads: the rows before are summed, their
// RESULTs queue for rank 0, and the collective stalls.
TEST(Service, QueuedResultsOfAnAbortedCollectiveKeepTheirMemoryReservedUntilWritten) {
  Daemon daemon({"--stall-timeout-ms", "1000"});
  const uint64_t job = 49;
  WorkerOptions options = Options(daemon.address(), job, 1, 2);
  options.transport = "tcp";
  options.slots = 1;
  options.blocks_per_message = 64;
  options.window = 256;
  const int fd = ConnectToLoopback(daemon.address(), /*receive_buffer=*/4096);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(job, 0, 2, 1, options)));
  auto joined = std::async(std::launch::async, [&] { return std::make_unique<Worker>(options); });
  std::unique_ptr<Worker> rank1 = joined.get();

  const CollectiveSpec spec{256u * 64u * 256u, DType::kFloat32, ReduceOp::kSum, options.block_size};
  proto::ControlMessage begin;
  begin.mutable_collective_begin()->set_seq(1);
  *begin.mutable_collective_begin()->mutable_spec() = SpecToProto(spec);
  ASSERT_TRUE(SendControl(fd, begin));
  std::vector<float> tensor(spec.element_count, 1.0f);
  auto collective = rank1->allreduce_async(std::span(tensor));
  const JobShape shape{2, 1, options.slots, options.blocks_per_message, options.window};
  const ColumnLayout layout(shape, spec.element_count, spec.block_size, 4);
  std::vector<Entry> announce;
  for (uint32_t k = 0; k < layout.NonEmptyLanes(0, 0); ++k) {
    const uint64_t column = layout.Column(0, 0, k);
    const uint64_t last_row = (layout.num_blocks() - 1 - column) / layout.num_columns() * layout.num_columns();
    announce.push_back({column, column + last_row, 0});
  }
  const ByteBuffer frame = EncodeDataFrame({FrameType::kContribution, 0, 0, job, 1, 0}, announce, {});
  ASSERT_TRUE(WriteAll(fd, std::span(frame.data(), frame.size())));
  ASSERT_EQ(collective.wait_for(20s), std::future_status::ready) << "the collective did not end at its stall timeout";
  EXPECT_THROW(collective.get(), Error);

  const std::string reserved = R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})";
  EXPECT_GT(Sample(daemon.Metrics(), reserved), 4 << 20) << "the aborted collective's queued RESULTs hold no reservation";
  std::vector<char> sink(1 << 20);
  EXPECT_TRUE(Eventually([&] {
    while (recv(fd, sink.data(), sink.size(), MSG_DONTWAIT) > 0) {
    }
    return Sample(daemon.Metrics(), reserved) == 0;
  })) << daemon.Metrics();
  close(fd);
}

// A rank refused for a frame from its header still gets the RESULTs queued before it and then its Error: the daemon
// keeps reading (and dropping) what the worker sends until it closes (docs/PROTOCOL.md §5). Refusals found from a
// header ended the read loop instead, and when the job's other rank left, the connection was closed with its
// queue unwritten: rank 0 read part of its RESULTs, then a reset, and never learned why.
TEST(Service, ARankRefusedFromAFrameHeaderReadsItsQueuedResultsAndItsError) {
  Daemon daemon;
  UnreadResults unread;
  ASSERT_NO_FATAL_FAILURE(unread.Run(daemon, 50));
  std::array<std::byte, kFrameHeaderSize> header{};
  EncodeFrameHeader({FrameType::kContribution, kEntrySize, 0, 50, 99, 1}, header.data());
  ASSERT_TRUE(WriteAll(unread.fd, header));
  std::optional<proto::Error> error;
  uint64_t results = 0;
  while (std::optional<RawFrame> frame = ReadFrame(unread.fd)) {
    if (frame->header.type == FrameType::kResult) ++results;
    Result<proto::ControlMessage> message = DecodeControl(frame->payload);
    if (frame->header.type == FrameType::kControl && message.ok() && message->has_error()) {
      error = message->error();
      break;
    }
    // Rank 1 leaves while rank 0 is still reading (the daemon reads rank 0's header once its queue has shrunk).
    if (results == 8) unread.rank1.reset();
  }
  ASSERT_TRUE(error) << "no Error after " << results << " RESULTs";
  EXPECT_EQ(error->code(), proto::PROTOCOL_VIOLATION) << error->message();
  EXPECT_NE(error->message().find("CONTRIBUTION for collective 99"), std::string::npos) << error->message();
  EXPECT_EQ(results, 256u + 1) << "the announce reply and 256 RESULTs were queued";
}

// Those reservations count against the job's own --max-job-memory as well: they did only against
// --max-total-memory, so a member that never read let its job pile one collective's reservation on another (each
// admitted alone), beyond its limit and into the other jobs' share. Here the limit holds one collective and half
// of another's RESULTs: collective 1 runs, and collective 2, with collective 1's RESULTs still queued, is refused.
TEST(Service, QueuedResultsOfEarlierCollectivesCountAgainstTheJobLimit) {
  // What one such collective holds, from a daemon that refuses it: "... up to N bytes on this aggregator (E for
  // ...; R for RESULTs waiting in send queues) ...".
  uint64_t engine = 0, results = 0;
  {
    Daemon probe({"--max-job-memory", "1"});
    WorkerOptions options = Options(probe.address(), 47, 0, 2);  // UnreadResults' shape
    options.slots = 1;
    options.blocks_per_message = 64;
    options.window = 256;
    options.transport = "tcp";
    WorkerOptions other = options;
    other.rank = 1;
    auto second = std::async(std::launch::async, [&] { return std::make_unique<Worker>(other); });
    Worker first(options);
    std::unique_ptr<Worker> rank1 = second.get();
    std::vector<float> t0(256u * 64u * 256u, 1.0f), t1(t0.size(), 1.0f);
    auto one = std::async(std::launch::async, [&] {
      try {
        rank1->allreduce(std::span(t1));
      } catch (const Error&) {
      }
    });
    try {
      first.allreduce(std::span(t0));
      FAIL() << "a limit of 1 byte admitted the collective";
    } catch (const Error& e) {
      std::smatch m;
      const std::string text = e.what();
      ASSERT_TRUE(std::regex_search(text, m, std::regex(R"(up to \d+ bytes on this aggregator \((\d+) for .*; (\d+) for RESULTs waiting)")))
          << text;
      engine = std::stoull(m[1]);
      results = std::stoull(m[2]);
    }
    one.get();
  }
  Daemon daemon({"--max-job-memory", std::to_string(engine + results + results / 2)});
  UnreadResults unread;
  ASSERT_NO_FATAL_FAILURE(unread.Run(daemon, 48));
  try {
    unread.rank1->allreduce(std::span(unread.tensor));
    ADD_FAILURE() << "collective 2 was admitted beside collective 1's queued RESULTs";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "RESOURCE_EXHAUSTED") << e.what();
    EXPECT_NE(std::string(e.what()).find("earlier collectives' RESULTs still queued for members that have not read "
                                         "them hold "),
              std::string::npos)
        << e.what();
  }
}

TEST(Service, TensorLimitRefusesThatJobOnly) {
  Daemon daemon({"--max-tensor-bytes", "40000"});
  std::vector<std::string> big_errors;
  std::thread big([&] { big_errors = RunJob(daemon.address(), 1, {20000, 256, 1.0, tools::Overlap::kRandom, 2, 1}); });
  const auto small_errors = RunJob(daemon.address(), 2, {5000, 256, 0.5, tools::Overlap::kRandom, 2, 2});
  big.join();
  for (const auto& e : small_errors) EXPECT_EQ(e, "");
  for (const auto& e : big_errors) {
    EXPECT_NE(e.find("RESOURCE_EXHAUSTED"), std::string::npos) << e;
    EXPECT_NE(e.find("--max-tensor-bytes"), std::string::npos) << e;
  }
}

// Memory of one collective of 4000 fp32 elements (16 blocks of B = 256, so 16 non-empty columns with the default
// S and K), W = 2 and the default window of 1 (ColumnEngine::MemoryBound, docs/OPERATIONS.md "Sizing"): 2·1·16
// held blocks of (24+1024) frame bytes plus 64 of bookkeeping, 16·(24+1024) for the RESULTs, 2·16·16 of tables,
// 16·8 for the column -> lane table.
constexpr uint64_t kEngineMemoryW2 =
    2ull * 16 * (24 + 1024 + 64) + 16ull * (24 + 1024) + 2ull * 16 * 16 + 16ull * 8;
// Its RESULTs while they wait in send queues (ColumnEngine::ResultMemoryBound): each of the 16 blocks in a frame
// of its own (40 + 24 + block bytes), the announce replies (16 entries of 24, a frame of 40 per slot), four times
// (buffers up to twice their frame, frames up to twice their content). Blocks travel raw (1024 bytes) or, with 3LC's
// ternary results, in 56 (a 4-byte scale and 52 bytes of 5 elements per byte).
constexpr uint64_t ResultMemoryW2(uint64_t block_bytes) {
  return 4 * (16 * (40 + 24 + block_bytes) + 16 * 24 + 8 * 40);
}
constexpr uint64_t kCollectiveMemoryW2 = kEngineMemoryW2 + ResultMemoryW2(1024);

// 3LC's error memory lives as long as the job, one per key (docs/PROTOCOL.md §11.3). A job's keys together stay
// within --max-job-memory, so that one job cannot take all of --max-total-memory by using many keys. Here each
// key holds 16 blocks of 256 floats (16384 bytes) and its entry (256); the limit, a byte short of four keys,
// admits the collective and three keys, not four.
TEST(Service, ErrorMemoryOfAllKeysOfAJobStaysWithinTheJobLimit) {
  constexpr uint64_t kErrorMemoryPerKey = 16ull * 256 * 4 + 256;
  constexpr uint64_t kLimit = 4 * kErrorMemoryPerKey - 1;
  static_assert(kEngineMemoryW2 + ResultMemoryW2(56) <= kLimit, "the 3LC collective itself must fit");
  Daemon daemon({"--max-job-memory", std::to_string(kLimit)});
  auto workers = JoinPair(daemon.address(), 28);  // not a structured binding: the lambda below captures it
  std::unique_ptr<Worker>& r0 = workers.first;
  std::unique_ptr<Worker>& r1 = workers.second;
  AllreduceOptions options;
  options.codec = CodecOptions{};
  options.codec->name = "3lc";
  std::vector<float> t0(4000), t1(4000);
  for (uint64_t key = 1; key <= 4; ++key) {
    std::fill(t0.begin(), t0.end(), 0.5f);
    std::fill(t1.begin(), t1.end(), -0.25f);
    options.key = key;
    auto second = std::async(std::launch::async, [&, options] { r1->allreduce(std::span(t1), options); });
    try {
      r0->allreduce(std::span(t0), options);
      EXPECT_LE(key, 3u) << "a fourth key's error memory was admitted";
    } catch (const Error& e) {
      EXPECT_EQ(key, 4u) << e.what();
      EXPECT_EQ(e.code(), "RESOURCE_EXHAUSTED") << e.what();
      EXPECT_NE(std::string(e.what()).find("other keys already hold 49920 of its --max-job-memory"), std::string::npos)
          << e.what();
    }
    try {
      second.get();
    } catch (const Error&) {
    }
  }
}

// 3LC's error memory also counts against --max-total-memory, which all jobs share: what one job's key holds after
// its collective ended refuses another job's plain collective that would not fit beside it, and another job's 3LC
// collective at its own error memory; it comes back when the job leaves. The limit is a byte short of two keys'
// error memory (16640 bytes each) and one 3LC collective.
TEST(Service, ErrorMemoryOfOneJobCountsAgainstTheTotalLimitUntilTheJobLeaves) {
  constexpr uint64_t kErrorMemoryOfOneKey = 16ull * 256 * 4 + 256;
  constexpr uint64_t kThreeLcCollective = kEngineMemoryW2 + ResultMemoryW2(56);
  constexpr uint64_t kTotalLimit = 2 * kErrorMemoryOfOneKey + kThreeLcCollective - 1;
  const std::string limit = std::to_string(kTotalLimit);
  Daemon daemon({"--max-job-memory", limit, "--max-total-memory", limit});
  const std::string reserved = R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})";
  // One 3LC collective (key 1) of a 2-rank job; the first rank's error code, or "" when it succeeded.
  auto three_lc_pair = [&](std::pair<std::unique_ptr<Worker>, std::unique_ptr<Worker>>& pair) -> std::string {
    AllreduceOptions options;
    options.codec = CodecOptions{};
    options.codec->name = "3lc";
    options.key = 1;
    std::vector<float> t0(4000, 0.5f), t1(4000, -0.25f);
    auto second = std::async(std::launch::async, [&] {
      try {
        pair.second->allreduce(std::span(t1), options);
      } catch (const Error&) {
      }
    });
    std::string error;
    try {
      pair.first->allreduce(std::span(t0), options);
    } catch (const Error& e) {
      error = e.code() + ": " + e.what();
    }
    second.get();
    return error;
  };
  // A plain collective of 12 blocks (94400 bytes: 12 columns instead of the 16 of kCollectiveMemoryW2) fits the
  // limit alone, not beside the error memory.
  const tools::SyntheticSpec spec{12 * 256, 256, 0.5, tools::Overlap::kRandom, 2, 3};
  {
    auto holder = JoinPair(daemon.address(), 30);
    ASSERT_EQ(three_lc_pair(holder), "");
    // The collective's own memory is given back after its last RESULT; the key's error memory stays.
    ASSERT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), reserved) == kErrorMemoryOfOneKey; }))
        << daemon.Metrics();
    for (const auto& e : RunJob(daemon.address(), 31, spec)) {
      EXPECT_NE(e.find("RESOURCE_EXHAUSTED"), std::string::npos) << e;
      EXPECT_NE(e.find("the collective needs 94400 bytes but the aggregator's running collectives already hold 16640 "
                       "of its --max-total-memory"),
                std::string::npos)
          << e;
    }
    auto other = JoinPair(daemon.address(), 32);
    const std::string refused = three_lc_pair(other);
    EXPECT_NE(refused.find("RESOURCE_EXHAUSTED"), std::string::npos) << refused;
    EXPECT_NE(refused.find("3LC error memory for key 1 needs 16640 bytes but the aggregator's jobs already hold"),
              std::string::npos)
        << refused;
  }  // both jobs' Workers leave: job 30's error memory goes with it
  EXPECT_TRUE(Eventually([&] { return Sample(daemon.Metrics(), reserved) == 0; })) << daemon.Metrics();
  for (const auto& e : RunJob(daemon.address(), 33, spec)) EXPECT_EQ(e, "");
  auto after = JoinPair(daemon.address(), 34);
  EXPECT_EQ(three_lc_pair(after), "");
}

// A key whose error memory holds no blocks here (an empty tensor, or none of its blocks on this aggregator) still
// costs its entry, so --max-job-memory bounds the number of keys: keys of 0 bytes grew the daemon's memory without
// bound (35 MB after 162,000 keys, with nothing reserved) and slowed every new key down.
TEST(Service, KeysWithoutBlocksStillCountAgainstTheJobLimit) {
  Daemon daemon({"--max-job-memory", "4096"});
  const int fd = ConnectToLoopback(daemon.address());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(29, 0, 1, 1)));
  const std::optional<RawFrame> ready = ReadFrame(fd);
  ASSERT_TRUE(ready) << "no JobReady";
  std::optional<proto::ControlMessage> error;
  for (uint64_t key = 1; key <= 64 && !error; ++key) {
    CollectiveSpec spec{0, DType::kFloat32, ReduceOp::kSum, 256};
    spec.codec.codec = Codec::kThreeLC;
    spec.codec.key = key;
    proto::ControlMessage begin;
    begin.mutable_collective_begin()->set_seq(key);
    *begin.mutable_collective_begin()->mutable_spec() = SpecToProto(spec);
    ASSERT_TRUE(SendControl(fd, begin));
    const std::optional<RawFrame> reply = ReadFrame(fd);
    ASSERT_TRUE(reply) << "no answer to collective " << key;
    Result<proto::ControlMessage> message = DecodeControl(reply->payload);
    ASSERT_TRUE(message.ok()) << message.status().ToString();
    if (message->has_error()) error = std::move(*message);
  }
  close(fd);
  ASSERT_TRUE(error) << "64 keys without blocks were admitted under a job limit of 4096 bytes";
  EXPECT_EQ(error->error().code(), proto::RESOURCE_EXHAUSTED) << error->error().message();
  EXPECT_NE(error->error().message().find("3LC error memory for key 17 needs 256 bytes but job 29's other keys "
                                          "already hold 4096"),
            std::string::npos)
      << error->error().message();
}

// A member that sends CollectiveBegins between collectives (here of empty tensors, each answered with a
// CollectiveAccepted) and reads none of the answers is not read either once its queue is full: the daemon's memory
// stays bounded. It read on and queued every answer (430 MB of resident memory after 2 million).
TEST(Service, AMemberThatDoesNotReadIsNotReadBetweenCollectives) {
  Daemon daemon;
  const int fd = ConnectToLoopback(daemon.address(), /*receive_buffer=*/4096);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendControl(fd, RawHello(30, 0, 1, 1)));
  ASSERT_TRUE(ReadFrame(fd)) << "no JobReady";
  // Up to 2 million begins (about 110 MB) until the daemon has taken nothing for 2 s.
  constexpr uint64_t kBegins = 2'000'000;
  std::vector<std::byte> batch;
  uint64_t written = 0, seq = 0;
  bool blocked = false;
  while (seq < kBegins && !blocked) {
    batch.clear();
    for (int i = 0; i < 1000; ++i) {
      proto::ControlMessage begin;
      begin.mutable_collective_begin()->set_seq(++seq);
      *begin.mutable_collective_begin()->mutable_spec() = SpecToProto({0, DType::kFloat32, ReduceOp::kSum, 256});
      const ByteBuffer frame = EncodeControl(begin);
      batch.insert(batch.end(), frame.data(), frame.data() + frame.size());
    }
    for (size_t done = 0; done < batch.size();) {
      pollfd p{fd, POLLOUT, 0};
      if (poll(&p, 1, 2000) != 1) {
        blocked = true;
        break;
      }
      const ssize_t n = send(fd, batch.data() + done, batch.size() - done, MSG_DONTWAIT | MSG_NOSIGNAL);
      ASSERT_GT(n, 0) << std::strerror(errno);
      done += static_cast<size_t>(n);
      written += static_cast<uint64_t>(n);
    }
  }
  close(fd);
  EXPECT_TRUE(blocked) << "the daemon took all " << written << " bytes of " << kBegins
                       << " CollectiveBegins whose answers were never read";
  EXPECT_LT(written, 40'000'000u);
}

TEST(Service, TotalMemoryBudgetIsSharedAcrossJobs) {
  Daemon daemon({"--max-job-memory", std::to_string(kCollectiveMemoryW2), "--max-total-memory",
                 std::to_string(kCollectiveMemoryW2 + 1000)});
  const tools::SyntheticSpec spec{4000, 256, 0.5, tools::Overlap::kRandom, 2, 3};
  // Job 1 rank 0 starts a collective that waits for rank 1 and holds its memory meanwhile.
  auto [r0, r1] = JoinPair(daemon.address(), 1);
  std::vector<float> t0(spec.elements), t1(spec.elements);
  tools::FillTensor(spec, 0, t0);
  tools::FillTensor(spec, 1, t1);
  std::future<void> first = r0->allreduce_async(std::span(t0));
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") ==
           kCollectiveMemoryW2;
  }));
  // Job 2's collective does not fit beside it.
  const auto refused = RunJob(daemon.address(), 2, spec);
  for (const auto& e : refused) {
    EXPECT_NE(e.find("RESOURCE_EXHAUSTED"), std::string::npos) << e;
    EXPECT_NE(e.find("--max-total-memory"), std::string::npos) << e;
  }
  // Job 1 is unaffected and completes; then the memory is free again.
  r1->allreduce(std::span(t1));
  first.get();
  const auto ref = tools::ReferenceSumFloat(spec);
  EXPECT_EQ(std::memcmp(t0.data(), ref.data(), t0.size() * 4), 0);
  EXPECT_EQ(std::memcmp(t1.data(), ref.data(), t1.size() * 4), 0);
  // The job's strand gives the memory back just after it sent the last RESULT, which the workers may already hold.
  EXPECT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") == 0;
  }));
  for (const auto& e : RunJob(daemon.address(), 3, spec)) EXPECT_EQ(e, "");
}

// How many connections to the listening socket on 127.0.0.1:`port` the kernel completed that the daemon has not
// accepted yet (/proc/net/tcp: a listening socket's rx_queue is its accept queue), or -1 if there is none.
int AcceptQueue(uint16_t port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues;
    fields >> slot >> local >> remote >> state >> queues;
    if (state != "0A" || std::stoul(local.substr(local.find(':') + 1), nullptr, 16) != port) continue;  // LISTEN
    return std::stoi(queues.substr(queues.find(':') + 1), nullptr, 16);
  }
  return -1;
}

TEST(Service, SigtermDrainsRunningCollectiveThenExitsZero) {
  Daemon daemon({"--drain-timeout-ms", "20000"});
  const tools::SyntheticSpec spec{4000, 256, 0.5, tools::Overlap::kRandom, 2, 4};
  auto [r0, r1] = JoinPair(daemon.address(), 1);
  std::vector<float> t0(spec.elements), t1(spec.elements);
  tools::FillTensor(spec, 0, t0);
  tools::FillTensor(spec, 1, t1);
  std::future<void> first = r0->allreduce_async(std::span(t0));
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") > 0;
  }));
  // A connection the daemon accepts before the drain (not only the kernel: closing the listener resets what is still
  // in its accept queue), whose Hello comes after. From here on nothing returns early: the collective in flight
  // writes into t0 until it ends.
  const int late = ConnectToLoopback(daemon.address());
  EXPECT_GE(late, 0);
  const auto port = static_cast<uint16_t>(std::stoi(daemon.address().substr(daemon.address().rfind(':') + 1)));
  EXPECT_TRUE(Eventually([&] { return AcceptQueue(port) == 0; })) << "the daemon did not accept the connection";
  daemon.process()->Signal(SIGTERM);
  EXPECT_TRUE(Eventually([&] { return daemon.Get("/readyz").status == 503; }));
  // A new job is not admitted while draining (the listener is closed).
  EXPECT_EQ(JoinError(daemon.address(), 2, "", 300ms).first, "UNAVAILABLE");
  // Nor a Hello for the draining job (docs/PROTOCOL.md §5): SHUTTING_DOWN, which it got as JOB_FULL.
  EXPECT_TRUE(SendControl(late, RawHello(1, 0, 2, 1)));
  const std::optional<RawFrame> refusal = ReadFrame(late);
  close(late);
  const Result<proto::ControlMessage> refused =
      refusal ? DecodeControl(refusal->payload) : Result<proto::ControlMessage>(ProtocolError("no answer"));
  EXPECT_TRUE(refused.ok() && refused->has_error()) << refused.status().ToString();
  if (refused.ok()) {
    EXPECT_EQ(refused->error().code(), proto::SHUTTING_DOWN) << refused->error().message();
  }
  // The running collective still completes, bit-exact.
  r1->allreduce(std::span(t1));
  first.get();
  const auto ref = tools::ReferenceSumFloat(spec);
  EXPECT_EQ(std::memcmp(t0.data(), ref.data(), t0.size() * 4), 0);
  auto status = daemon.process()->Wait(10s);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
  try {
    r0->allreduce(std::span(t0));
    ADD_FAILURE() << "a collective after the drain succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "SHUTTING_DOWN") << e.what();
  }
}

// SIGTERM ends the connections that belong to no job: one in the middle of its handshake (here: it got its
// AuthChallenge and never answers) and an idle keep-alive connection to the metrics endpoint. They used to keep the
// drained daemon running, the first until the handshake timeout (10 s), the second until its request deadline
// (10 s), renewed by every request, so a scraper polling faster than that kept the daemon from ever exiting.
TEST(Service, SigtermEndsHandshakesAndHttpConnections) {
  Daemon probe;  // for its directory
  const std::string secrets = probe.dir() + "/secrets";
  std::filesystem::create_directories(secrets);
  std::ofstream(secrets + "/9") << "s3cret\n";
  Daemon daemon({"--job-secrets-dir", secrets});
  const int silent = ConnectToLoopback(daemon.address());
  ASSERT_GE(silent, 0);
  proto::ControlMessage hello = RawHello(9, 0, 2, 1);
  hello.mutable_hello()->set_auth_nonce(std::string(32, 'n'));
  ASSERT_TRUE(SendControl(silent, hello));
  const std::optional<RawFrame> challenge = ReadFrame(silent);  // the handshake is under way
  ASSERT_TRUE(challenge);
  ASSERT_TRUE(DecodeControl(challenge->payload)->has_auth_challenge());
  // And one refused, which the daemon would give 5 s to close.
  const int refused = ConnectToLoopback(daemon.address());
  ASSERT_GE(refused, 0);
  ASSERT_TRUE(SendControl(refused, RawHello(10, 5, 2, 1)));  // rank 5 of 2
  const std::optional<RawFrame> refusal = ReadFrame(refused);
  ASSERT_TRUE(refusal);
  ASSERT_TRUE(DecodeControl(refusal->payload)->has_error());

  boost::asio::io_context io;
  boost::beast::tcp_stream http_stream(io);
  http_stream.expires_after(5s);
  http_stream.connect({boost::asio::ip::make_address("127.0.0.1"), daemon.metrics_port()});
  http::request<http::empty_body> request(http::verb::get, "/healthz", 11);
  request.set(http::field::host, "127.0.0.1");
  request.keep_alive(true);
  http::write(http_stream, request);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  http::read(http_stream, buffer, response);
  ASSERT_EQ(response.result_int(), 200u);
  ASSERT_TRUE(response.keep_alive());

  const auto start = std::chrono::steady_clock::now();
  daemon.process()->Signal(SIGTERM);
  auto status = daemon.process()->Wait(5s);
  ASSERT_TRUE(status.ok()) << "the daemon did not exit within 5 s of SIGTERM: " << status.status().ToString();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(ReadUntilClosed(silent, 1s));
  close(silent);
  close(refused);
}

TEST(Service, DrainDeadlineEndsStuckCollective) {
  Daemon daemon({"--drain-timeout-ms", "300"});
  auto [r0, r1] = JoinPair(daemon.address(), 1);
  std::vector<float> t0(1000, 1.0f);
  std::future<void> stuck = r0->allreduce_async(std::span(t0));  // rank 1 never joins in
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") > 0;
  }));
  daemon.process()->Signal(SIGTERM);
  auto status = daemon.process()->Wait(10s);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
  try {
    stuck.get();
    ADD_FAILURE() << "the stuck collective succeeded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "SHUTTING_DOWN") << e.what();
  }
  EXPECT_EQ(t0, std::vector<float>(1000, 1.0f));  // restored
}

// A rank may start a collective long after the others (rank 0 writing a checkpoint): the wait for it is bounded by
// --begin-timeout-ms, not by the stall timeout, which only applies once every rank has started. With the stall
// timeout alone, rank 0's collective was aborted 500 ms after it began.
TEST(Service, ARankLateToTheCollectiveIsWaitedForBeyondTheStallTimeout) {
  Daemon daemon({"--stall-timeout-ms", "500", "--begin-timeout-ms", "60000"});
  auto [r0, r1] = JoinPair(daemon.address(), 2);
  const tools::SyntheticSpec spec{5000, 256, 0.5, tools::Overlap::kRandom, 2, 11};
  std::vector<float> t0(spec.elements), t1(spec.elements);
  tools::FillTensor(spec, 0, t0);
  tools::FillTensor(spec, 1, t1);
  std::future<void> early = r0->allreduce_async(std::span(t0));
  ASSERT_TRUE(Eventually([&] {
    return Sample(daemon.Metrics(), R"(sparsereduce_memory_reserved_bytes\{instance_name="svc"\})") > 0;
  }));
  std::this_thread::sleep_for(1500ms);  // the scenario: rank 1 comes three stall timeouts later
  r1->allreduce(std::span(t1));
  early.get();
  const auto reference = tools::ReferenceSumFloat(spec);
  EXPECT_EQ(std::memcmp(t0.data(), reference.data(), t0.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(t1.data(), reference.data(), t1.size() * sizeof(float)), 0);
}

// A rank that never starts the collective ends it at --begin-timeout-ms, naming the rank, its peer and the option.
TEST(Service, ARankThatNeverStartsTheCollectiveEndsItAtTheBeginTimeout) {
  Daemon daemon({"--begin-timeout-ms", "300"});
  auto [r0, r1] = JoinPair(daemon.address(), 3);
  std::vector<float> t0(1000, 1.0f);
  try {
    r0->allreduce(std::span(t0));
    ADD_FAILURE() << "the collective ran without rank 1";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), "DEADLINE_EXCEEDED") << e.what();
    EXPECT_TRUE(
        std::regex_search(std::string(e.what()),
                          std::regex(R"(collective 1: rank\(s\) 1 \(rank 1 at 127\.0\.0\.1:[0-9]+\) did not start it )"
                                     R"(within 300 ms of its last progress \(--begin-timeout-ms\))")))
        << e.what();
  }
  EXPECT_EQ(t0, std::vector<float>(1000, 1.0f));  // restored
}

// A NOTIFY_SOCKET of our own, as systemd would pass it.
class NotifySocket {
 public:
  NotifySocket() {
    path_ = std::filesystem::temp_directory_path() / ("sr-notify-" + std::to_string(getpid()));
    std::filesystem::remove(path_);
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof addr.sun_path - 1);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);
  }
  ~NotifySocket() {
    close(fd_);
    std::filesystem::remove(path_);
  }
  const std::string& path() const { return path_; }
  // Waits for a datagram containing `state` (e.g. "READY=1"); collects everything received meanwhile.
  bool WaitFor(const std::string& state, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return false;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) continue;
      received_ += std::string(buf, n) + "|";
      if (std::string(buf, n).find(state) != std::string::npos) return true;
    }
  }
  const std::string& received() const { return received_; }

 private:
  std::string path_;
  int fd_ = -1;
  std::string received_;
};

TEST(Service, SystemdNotifyReadyWatchdogStopping) {
  NotifySocket notify;
  setenv("NOTIFY_SOCKET", notify.path().c_str(), 1);
  setenv("WATCHDOG_USEC", "200000", 1);  // ping every 100 ms
  Daemon daemon;
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_TRUE(notify.WaitFor("READY=1", 10s)) << notify.received();
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 10s)) << notify.received();
  EXPECT_TRUE(notify.WaitFor("WATCHDOG=1", 10s)) << notify.received();
  daemon.process()->Signal(SIGTERM);
  EXPECT_TRUE(notify.WaitFor("STOPPING=1", 10s)) << notify.received();
  auto status = daemon.process()->Wait(10s);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << tools::DescribeExit(*status);
}

}  // namespace
}  // namespace sparsereduce::testing
