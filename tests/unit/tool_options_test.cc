// sparsereduce-perf and sparsereduce-bw run as the user runs them: options that cannot work are usage errors (exit
// code 2, a message naming the option) before anything connects, and the table says when a check proves little.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

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
