// sparsereduce-perf and sparsereduce-bw run as the user runs them: options that cannot work are usage errors (exit
// code 2, a message naming the option) before anything connects, and the table says when a check proves little.
#include <gtest/gtest.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <future>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tools/common/local_cluster.h"
#include "tools/common/subprocess.h"
#include "tools/common/temp_dir.h"

namespace sparsereduce::tools {
namespace {

struct Outcome {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // stdout and stderr
};

// Runs `binary` with `args`; stderr goes to the same pipe as stdout.
Outcome RunTool(const std::string& binary, const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", binary};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = Subprocess::Spawn(argv, /*capture_stdout=*/true);
  EXPECT_TRUE(child.ok()) << child.status().ToString();
  if (!child.ok()) return {};
  Outcome outcome;
  auto out = (*child)->ReadStdout(std::chrono::seconds(60));
  if (out.ok()) outcome.output = *out;
  auto status = (*child)->Wait(std::chrono::seconds(60));
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  if (status.ok() && WIFEXITED(*status)) outcome.exit_code = WEXITSTATUS(*status);
  return outcome;
}

// An address nobody answers on, and a short timeout: a run that gets past the options fails with exit code 1.
std::vector<std::string> PerfArgs(std::vector<std::string> args) {
  for (const char* a : {"--aggregators", "127.0.0.1:9", "--timeout-ms", "300"}) args.push_back(a);
  return args;
}

void ExpectUsageError(const std::string& binary, const std::vector<std::string>& args, const std::string& says) {
  std::string joined;
  for (const std::string& a : args) joined += " " + a;
  const Outcome o = RunTool(binary, args);
  EXPECT_EQ(o.exit_code, 2) << joined << "\n" << o.output;
  EXPECT_NE(o.output.find(says), std::string::npos) << joined << "\n" << o.output;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

TEST(PerfOptions, SizesBelowOneElementAreUsageErrors) {
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "0", "-e", "4K"}), "-b 0");  // looped forever
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "3", "-e", "4K"}), "at least one element");
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "17179869184G", "-e", "17179869184G"}), "64 bits");
}

TEST(PerfOptions, ZeroIterationsIsAUsageError) {
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "4K", "-e", "4K", "-n", "0"}), "-n must be at least 1");
}

TEST(PerfOptions, BlockSizeZeroIsAUsageError) {
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "4K", "-e", "4K", "--block-size", "0"}), "block size 0");
}

TEST(PerfOptions, DensityOutsideZeroToOneIsAUsageError) {
  for (const char* density : {"--density=1.5", "--density=-0.5", "--density=inf", "--density=nan"}) {
    ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-b", "4K", "-e", "4K", density}), "density");
  }
}

std::vector<std::string> SpawnArgs(const std::string& ranks, std::vector<std::string> args) {
  for (const std::string& a : {std::string("--spawn"), ranks, std::string("--aggregator-bin"),
                               std::string(SPARSEREDUCE_AGGREGATOR_BIN), std::string("-b"), std::string("4K"),
                               std::string("-e"), std::string("4K"), std::string("-n"), std::string("1"),
                               std::string("-w"), std::string("0"), std::string("--transport"), std::string("tcp")}) {
    args.push_back(a);
  }
  return args;
}

TEST(PerfCheck, SaysThatOneRankProvesNothing) {
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("1", {"-c", "1"}));
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("# check: with 1 rank"), std::string::npos) << o.output;
}

TEST(PerfCheck, SaysThatAnAllZeroReferenceProvesNothing) {
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"-c", "1", "--density", "0"}));
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("# check: at 4096 bytes every block is zero"), std::string::npos) << o.output;
  const Outcome dense = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"-c", "1"}));
  EXPECT_EQ(dense.exit_code, 0) << dense.output;
  EXPECT_EQ(dense.output.find("# check:"), std::string::npos) << dense.output;
}

// Disjoint overlap gives each of W ranks at most 1/W of the blocks: the table and the JSON show that, not --density.
TEST(PerfCheck, ReportsTheDensityTheTensorsHave) {
  auto dir = TempDir::Create("sr-perf-options-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"--overlap", "disjoint", "--density", "1", "--json",
                                                               dir->File("r.json")}));
  EXPECT_EQ(o.exit_code, 0) << o.output;
  EXPECT_NE(o.output.find("density 0.5, overlap disjoint"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("# density 1 requested"), std::string::npos) << o.output;
  const std::string json = ReadFile(dir->File("r.json"));
  EXPECT_NE(json.find("\"density\":0.5,\"requested_density\":1,"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"density\":1,"), std::string::npos) << json;
}

// A run stopped part-way (here by --run-timeout-ms; Ctrl-C and a failed rank likewise) leaves the rows it measured
// in the --json file, marked incomplete: rank 0 rewrites the file after every row. It left the file empty, since
// rank 0 wrote it only at the end and was stopped first. The JSON also records the TCP send buffer in effect (the
// environment's here), not the flag's 0.
TEST(PerfCheck, AStoppedRunLeavesItsRowsInTheJson) {
  auto dir = TempDir::Create("sr-perf-options-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  ::setenv("SPARSEREDUCE_TCP_SEND_BUFFER", "32768", 1);
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN,
                            {"--spawn", "2", "--aggregator-bin", SPARSEREDUCE_AGGREGATOR_BIN, "--transport", "tcp", "-b",
                             "4K", "-e", "1G", "-n", "20", "-w", "1", "-c", "0", "--run-timeout-ms", "3000", "--json",
                             dir->File("r.json")});
  ::unsetenv("SPARSEREDUCE_TCP_SEND_BUFFER");
  EXPECT_EQ(o.exit_code, 1) << o.output;  // a sweep up to 1 GiB, 20 iterations each, does not end in 3 s
  const std::string json = ReadFile(dir->File("r.json"));
  EXPECT_NE(json.find("\"complete\":false,\"results\":[{\"size\":4096,"), std::string::npos) << json;
  EXPECT_TRUE(json.ends_with("}]}\n")) << json;
  EXPECT_NE(json.find("\"tcp_send_buffer\":32768,"), std::string::npos) << json;
  EXPECT_NE(o.output.find("# tcp send buffer 32768 bytes per aggregator connection"), std::string::npos) << o.output;
}

// The table says N/A where a lossy codec is not checked bit for bit; the JSON must not say 0.
TEST(PerfCheck, JsonHasNoWrongCountWhereNothingWasChecked) {
  auto dir = TempDir::Create("sr-perf-options-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const Outcome lossy = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"-c", "1", "--codec", "fp16", "--json",
                                                                   dir->File("fp16.json")}));
  EXPECT_EQ(lossy.exit_code, 0) << lossy.output;
  EXPECT_NE(ReadFile(dir->File("fp16.json")).find("\"wrong\":null"), std::string::npos)
      << ReadFile(dir->File("fp16.json"));
  const Outcome exact = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"-c", "1", "--json", dir->File("none.json")}));
  EXPECT_EQ(exact.exit_code, 0) << exact.output;
  EXPECT_NE(ReadFile(dir->File("none.json")).find("\"wrong\":0"), std::string::npos)
      << ReadFile(dir->File("none.json"));
}

// --spawn -1 was read by sscanf("%u") as 4294967295 ranks and started thousands of processes; "2x" was taken as 2.
TEST(PerfOptions, SpawnCountsOutOfRangeOrNotNumbersAreUsageErrors) {
  for (const char* bad : {"-1", "2x", "4,-1", "4,0", "0", "5000", "4,257", "", "4,"}) {
    ExpectUsageError(SPARSEREDUCE_PERF_BIN, {"--spawn", bad, "-b", "4K", "-e", "4K"},
                     std::string("--spawn ") + bad + ": takes W or W,A, with 1 <= W <= 4096");
  }
}

// --spawn gives each rank its own --aggregators, --rank and --world-size: the user's were appended to them (and
// the ranks failed with a CLI11 message, or ran against both aggregator lists until the timeout).
TEST(PerfOptions, SpawnWithARanksOwnOptionsIsAUsageError) {
  for (const char* option : {"--world-size", "--rank", "--aggregators"}) {
    const std::string value = std::string(option) == "--aggregators" ? "127.0.0.1:9" : "1";
    ExpectUsageError(SPARSEREDUCE_PERF_BIN, {"--spawn", "2", option, value, "-b", "4K", "-e", "4K"}, "excludes");
  }
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"--overlap", "sideways"}), "--overlap");  // CLI11's own: 2 too
}

TEST(PerfOptions, ACodecOnInt32TensorsIsAUsageError) {
  // The worker sends int32 exactly whatever the codec: the run said "codec topk" and measured no codec.
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-d", "int32", "--codec", "topk"}),
                   "--codec topk compresses float tensors only");
}

// -c takes 0 or 1, as the help says; 5 ran as 1.
TEST(PerfOptions, CheckOtherThanZeroOrOneIsAUsageError) {
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"-c", "5"}), "--check: Value 5 not in range 0 to 1");
}

TEST(PerfOptions, ZeroTimeoutIsAUsageError) {
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, {"--aggregators", "127.0.0.1:9", "--timeout-ms", "0"},
                   "--timeout-ms must be at least 1");
}

// A --json file that cannot be written failed silently after the run (exit 0, no file); it fails at once.
TEST(PerfOptions, AJsonFileThatCannotBeWrittenFailsBeforeTheRun) {
  const auto start = std::chrono::steady_clock::now();
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"--json", "/nonexistent/dir/r.json"}),
                   "--json /nonexistent/dir/r.json: cannot open for writing");
  ExpectUsageError(SPARSEREDUCE_PERF_BIN, PerfArgs({"--json", "/nonexistent/dir/r.json"}),
                   "--json /nonexistent/dir/r.json: cannot open for writing");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

// A step factor below 2 rounds two steps down to one size: each size is run once (4, 6 -> 4, 9 -> 8, 13.5 -> 12).
TEST(PerfCheck, AFactorBelowTwoRunsEachSizeOnce) {
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, {"--spawn", "2", "--aggregator-bin", SPARSEREDUCE_AGGREGATOR_BIN,
                                                    "-b", "4", "-e", "16", "-f", "1.5", "-n", "1", "-w", "0"});
  EXPECT_EQ(o.exit_code, 0) << o.output;
  std::vector<std::string> sizes;
  std::istringstream lines(o.output);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string size, count, type;
    if (line.empty() || line[0] == '#' || !(fields >> size >> count >> type) || type != "float") continue;
    sizes.push_back(size);
  }
  EXPECT_EQ(sizes, (std::vector<std::string>{"4", "8", "12"})) << o.output;
}

// The density column is the fraction of blocks rank 0's tensor has nonzero, not --density: with full overlap every
// rank has the same blocks, so it equals the union, which 16 blocks at 10 % cannot make 0.1.
TEST(PerfCheck, TheDensityColumnIsMeasured) {
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, SpawnArgs("2", {"--overlap", "full", "--density", "0.1"}));
  EXPECT_EQ(o.exit_code, 0) << o.output;
  std::istringstream lines(o.output);
  bool found = false;
  for (std::string line; std::getline(lines, line);) {
    std::istringstream fields(line);
    std::string size, count, type, redop, time, algbw, busbw, wrong, density, union_density;
    if (!(fields >> size >> count >> type >> redop >> time >> algbw >> busbw >> wrong >> density >> union_density) ||
        size != "4096") {
      continue;
    }
    found = true;
    EXPECT_EQ(density, union_density) << o.output;
    EXPECT_NE(density, "0.1000") << o.output;  // 4 blocks: 0, 0.25, 0.5, ...
  }
  EXPECT_TRUE(found) << o.output;
}

// #wrong is the exact sum over the ranks: it was capped at 524287 per rank (an int32 allreduce of the counts).
// Rank 1 uses another seed, so every element of the 1M-element sum differs from both ranks' references.
TEST(PerfCheck, TheWrongCountIsNotCapped) {
  auto cluster = LocalAggregators::Start(SPARSEREDUCE_AGGREGATOR_BIN, 1);
  ASSERT_TRUE(cluster.ok()) << cluster.status().ToString();
  auto rank = [&](int r, const std::string& seed) {
    return RunTool(SPARSEREDUCE_PERF_BIN, {"--aggregators", (*cluster)->AddressList(), "--rank", std::to_string(r),
                                           "--world-size", "2", "-b", "4M", "-e", "4M", "-n", "1", "-w", "0",
                                           "--seed", seed, "--timeout-ms", "30000"});
  };
  auto rank1 = std::async(std::launch::async, rank, 1, "2");
  const Outcome rank0 = rank(0, "1");
  EXPECT_EQ(rank0.exit_code, 3) << rank0.output;  // 3: wrong results
  EXPECT_NE(rank0.output.find(" 2097152 "), std::string::npos) << rank0.output;
  EXPECT_EQ(rank1.get().exit_code, 3);
  EXPECT_TRUE((*cluster)->Stop());
}

// The processes this test started and left: with the test a subreaper, whatever its children leave behind becomes
// its child. Kills and reaps them, and returns how many there were.
int ReapLeftovers() {
  int found = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren == std::string::npos) continue;
    std::istringstream fields(line.substr(paren + 2));
    std::string state;
    int parent = 0;
    fields >> state >> parent;
    if (parent != getpid()) continue;
    ++found;
    kill(std::stoi(name), SIGKILL);
    waitpid(std::stoi(name), nullptr, 0);
  }
  return found;
}

// Runs `sparsereduce-perf --spawn 3,2` (this process a subreaper, so that whatever it leaves becomes this
// process's child) with a long sweep, sends it `signal` once its table's header is out (the ranks have joined and
// time their collectives), reads its output to the end and returns its exit status.
int SignalPerfSpawnOnceItTimes(int signal) {
  EXPECT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  auto perf = Subprocess::Spawn({SPARSEREDUCE_PERF_BIN, "--spawn", "3,2", "--aggregator-bin",
                                 SPARSEREDUCE_AGGREGATOR_BIN, "-b", "64K", "-e", "64K", "-n", "1000000", "-w", "0"},
                                /*capture_stdout=*/true);
  EXPECT_TRUE(perf.ok()) << perf.status().ToString();
  if (!perf.ok()) return -1;
  std::string output;
  bool signalled = false;
  auto read = (*perf)->ReadStdout(std::chrono::seconds(60), [&](std::string_view chunk) {
    output += chunk;
    if (!signalled && output.find("#       size") != std::string::npos) {
      signalled = true;
      (*perf)->Signal(signal);
    }
  });
  EXPECT_TRUE(read.ok()) << read.status().ToString() << "\n" << output;
  EXPECT_TRUE(signalled) << output;
  auto status = (*perf)->Wait(std::chrono::seconds(30));
  EXPECT_TRUE(status.ok()) << status.status().ToString();
  return status.ok() ? *status : -1;
}

// The tools, the Gloo bench and the torch baseline describe a rank's end in the same words (the Gloo bench had its
// own, with the signal's description and no number).
TEST(DescribeExit, NamesTheExitCodeOrTheSignalByNumberAndName) {
  EXPECT_EQ(DescribeExit(W_EXITCODE(3, 0)), "exit code 3");
  EXPECT_EQ(DescribeExit(SIGKILL), "killed by signal 9 (SIGKILL)");  // a waitpid status of a signalled process
  EXPECT_EQ(DescribeExit(SIGTERM), "killed by signal 15 (SIGTERM)");
}

// SIGTERM (or Ctrl-C) to `sparsereduce-perf --spawn` stops its ranks and aggregators and removes their temporary
// directory, and it exits 128 + 15. It used to die alone, leaving them all running (and the directory behind).
TEST(PerfSpawn, AStopSignalStopsTheRanksAndAggregators) {
  const int status = SignalPerfSpawnOnceItTimes(SIGTERM);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM) << DescribeExit(status);
  EXPECT_EQ(ReapLeftovers(), 0) << "processes of the run were left running";
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

// `sparsereduce-perf --spawn` killed outright (SIGKILL, no handler runs): its ranks and aggregators end by
// themselves (PR_SET_PDEATHSIG). They used to keep running, holding their ports, until killed by hand.
TEST(PerfSpawn, KilledOutrightItLeavesNothingRunning) {
  const int status = SignalPerfSpawnOnceItTimes(SIGKILL);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << DescribeExit(status);
  // perf's children (3 ranks, 2 aggregators) are now this test's (a subreaper). Each must exit on its own; waitpid
  // blocks until the last did, and a watchdog kills whatever is left after 30 s so that the test fails, not hangs.
  std::promise<void> all_exited;
  std::thread watchdog([finished = all_exited.get_future()] {
    if (finished.wait_for(std::chrono::seconds(30)) == std::future_status::timeout) {
      EXPECT_EQ(ReapLeftovers(), 0) << "the ranks and aggregators kept running after perf was killed";
    }
  });
  int exited = 0, killed_by_watchdog = 0, child_status = 0;
  while (waitpid(-1, &child_status, 0) > 0) {
    ++exited;
    if (WIFSIGNALED(child_status) && WTERMSIG(child_status) == SIGKILL) ++killed_by_watchdog;
  }
  all_exited.set_value();
  watchdog.join();
  EXPECT_EQ(killed_by_watchdog, 0);
  EXPECT_EQ(exited, 5);
  ASSERT_EQ(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
}

// --run-timeout-ms bounds a --spawn run (rank 0's output was cut at 20 x --timeout-ms, undocumented; a long sweep
// with the default timeout died after 40 minutes): at the deadline the ranks are stopped and the run fails.
TEST(PerfSpawn, TheRunTimeoutStopsTheRanks) {
  const auto start = std::chrono::steady_clock::now();
  const Outcome o = RunTool(SPARSEREDUCE_PERF_BIN, {"--spawn", "2", "--aggregator-bin", SPARSEREDUCE_AGGREGATOR_BIN,
                                                    "-b", "4K", "-e", "4K", "-n", "10000000", "-w", "0",
                                                    "--timeout-ms", "100", "--run-timeout-ms", "1000"});
  EXPECT_EQ(o.exit_code, 1) << o.output;
  EXPECT_NE(o.output.find("(--run-timeout-ms 1000); stopping the ranks"), std::string::npos) << o.output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

// The demo's counts are bounded like perf's, and usage errors exit 2: --workers 0 printed an empty table and "all
// results bit-exact", and CLI11's errors exited 105.
TEST(DemoOptions, CountsOutOfRangeAreUsageErrors) {
  ExpectUsageError(SPARSEREDUCE_DEMO_BIN, {"--workers", "0"}, "--workers: Value 0 not in range 1 to 4096");
  ExpectUsageError(SPARSEREDUCE_DEMO_BIN, {"--densities", "0.1,1.5"}, "--densities");
  ExpectUsageError(SPARSEREDUCE_DEMO_BIN, {"--iterations", "0"}, "--iterations");
  ExpectUsageError(SPARSEREDUCE_DEMO_BIN, {"--no-such-flag"}, "--no-such-flag");
}

// A server address nobody answers on: a run that gets past the options fails with exit code 1 after 5 s of retries.
TEST(BwOptions, ZeroIterationsIsAUsageError) {
  ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-n", "0", "127.0.0.1"}, "-n must be at least 1");
}

TEST(BwOptions, SizesAFrameCannotCarryAreUsageErrors) {
  ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-s", "4G", "127.0.0.1"}, "at most 4294967295 bytes");
  ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-s", "17179869185G", "127.0.0.1"}, "64 bits");
}

// -s 0 said only "bad -s '0'".
TEST(BwOptions, SizeZeroSaysWhatIsAllowed) {
  ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-s", "0", "127.0.0.1"}, "-s 0: a message carries at least 1");
}

// -D -1, -D nan and -D 0 fell back to -n without a word; -D 1e30 cast an out-of-range double to the frame count (16
// frames ran); text other than a number was a CLI11 conversion error (exit code 104).
TEST(BwOptions, DurationsThatCannotRunAreUsageErrors) {
  for (const char* bad : {"-1", "nan", "0", "1e-400"}) {
    ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-D", bad, "127.0.0.1"},
                     std::string("-D ") + bad + ": the duration must be a number of seconds above 0");
  }
  for (const char* bad : {"1e30", "inf", "86401", "1e400"}) {
    ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-D", bad, "127.0.0.1"},
                     std::string("-D ") + bad + ": the duration is at most 86400 seconds (a day)");
  }
  for (const char* bad : {"1s", "", " 1"}) {
    ExpectUsageError(SPARSEREDUCE_BW_BIN, {"-p", "9", "-D", bad, "127.0.0.1"},
                     std::string("-D '") + bad + "' is not a number of seconds");
  }
}

// A server on -p 0 said "waiting on port 0" while it listened on a port the system picked: it prints that port, and a
// client reaches the server there.
TEST(BwServer, PortZeroPrintsTheBoundPort) {
  auto server = Subprocess::Spawn({SPARSEREDUCE_BW_BIN, "-p", "0"}, /*capture_stdout=*/true);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  const std::string kWaiting = "waiting on port ";
  std::string output;
  bool client_ran = false;
  Outcome client;
  // The server ends after its one client; the client runs as soon as the server has said where it listens.
  auto read = (*server)->ReadStdout(std::chrono::seconds(60), [&](std::string_view chunk) {
    output += chunk;
    const size_t at = output.find(kWaiting);
    if (client_ran || at == std::string::npos) return;
    const size_t end = output.find('\n', at);
    if (end == std::string::npos) return;
    client_ran = true;
    const std::string port = output.substr(at + kWaiting.size(), end - at - kWaiting.size());
    EXPECT_NE(port, "0") << output;
    client = RunTool(SPARSEREDUCE_BW_BIN, {"-p", port, "-s", "1K", "-n", "16", "127.0.0.1"});
    if (client.exit_code != 0) (*server)->Signal(SIGKILL);  // nobody else would end it
  });
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_TRUE(client_ran) << output;
  EXPECT_EQ(client.exit_code, 0) << client.output;
  auto status = (*server)->Wait(std::chrono::seconds(10));
  ASSERT_TRUE(status.ok()) << status.status().ToString() << "\n" << output;
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << DescribeExit(*status) << "\n" << output;
}

}  // namespace
}  // namespace sparsereduce::tools
