// The daemon's configuration (aggregator/config.h): flag > environment > config file > default, and invalid
// configuration as exit code 2 with a message naming the setting.
#include "aggregator/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "aggregator/job.h"
#include "aggregator/job_registry.h"
#include "aggregator/logging.h"
#include "aggregator/memory_budget.h"
#include "aggregator/network_allowlist.h"
#include "aggregator/peer_text.h"
#include "aggregator/service_context.h"
#include "core/exception_text.h"
#include "tools/common/temp_dir.h"

namespace sparsereduce::aggregator {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto dir = tools::TempDir::Create("sr-config-");
    ASSERT_TRUE(dir.ok()) << dir.status().ToString();
    temp_dir_.emplace(std::move(*dir));
    dir_ = temp_dir_->path();
  }
  void TearDown() override {
    for (const auto& name : set_) unsetenv(name.c_str());
    temp_dir_.reset();
  }
  void SetEnv(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    set_.push_back(name);
  }
  std::string WriteConfig(const std::string& text) {
    const std::string path = dir_ + "/aggregator.toml";
    std::ofstream(path) << text;
    return path;
  }
  std::variant<DaemonConfig, int> Parse(std::vector<std::string> args) {
    args.insert(args.begin(), "sparsereduce-aggregator");
    out_.str("");
    err_.str("");
    return ParseDaemonConfig(args, out_, err_);
  }
  DaemonConfig ParseOk(std::vector<std::string> args) {
    auto result = Parse(std::move(args));
    EXPECT_TRUE(std::holds_alternative<DaemonConfig>(result)) << err_.str();
    return std::holds_alternative<DaemonConfig>(result) ? std::get<DaemonConfig>(result) : DaemonConfig{};
  }
  void ExpectExit2(std::vector<std::string> args, const std::string& mention) {
    auto result = Parse(std::move(args));
    ASSERT_TRUE(std::holds_alternative<int>(result));
    EXPECT_EQ(std::get<int>(result), 2);
    EXPECT_NE(err_.str().find(mention), std::string::npos) << mention << ": " << err_.str();
  }

  std::optional<tools::TempDir> temp_dir_;
  std::string dir_;
  std::vector<std::string> set_;
  std::ostringstream out_, err_;
};

TEST_F(ConfigTest, Defaults) {
  const DaemonConfig c = ParseOk({});
  EXPECT_EQ(c.server.listen, std::vector<std::string>{"0.0.0.0:19875"});
  EXPECT_EQ(c.metrics_listen, "0.0.0.0:19876");
  EXPECT_EQ(c.server.stall_timeout, std::chrono::milliseconds(30000));
  EXPECT_EQ(c.server.begin_timeout, std::chrono::minutes(30));
  EXPECT_FALSE(c.server.require_auth);
}

TEST_F(ConfigTest, FlagBeatsEnvironmentBeatsFileBeatsDefault) {
  const std::string path = WriteConfig(
      "max-jobs = 10\nmax-world-size = 20\nstall-timeout-ms = 30\nlisten = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n");
  SetEnv("SPARSEREDUCE_MAX_JOBS", "11");
  SetEnv("SPARSEREDUCE_MAX_WORLD_SIZE", "21");
  const DaemonConfig c = ParseOk({"--config", path, "--max-jobs", "12"});
  EXPECT_EQ(c.server.max_jobs, 12u);                               // flag
  EXPECT_EQ(c.server.max_world_size, 21u);                         // environment over file
  EXPECT_EQ(c.server.stall_timeout, std::chrono::milliseconds(30));  // file
  EXPECT_EQ(c.server.listen, (std::vector<std::string>{"127.0.0.1:1", "127.0.0.1:2"}));
  EXPECT_EQ(c.server.max_tensor_bytes, ServerOptions{}.max_tensor_bytes);  // default
}

TEST_F(ConfigTest, ConfigPathFromEnvironment) {
  SetEnv("SPARSEREDUCE_CONFIG", WriteConfig("max-jobs = 9\n"));
  EXPECT_EQ(ParseOk({}).server.max_jobs, 9u);
}

TEST_F(ConfigTest, ListsFromEnvironmentAreCommaSeparated) {
  SetEnv("SPARSEREDUCE_ALLOW_NETWORK", "10.0.0.0/8,fd00::/8");
  EXPECT_EQ(ParseOk({}).server.allow_networks, (std::vector<std::string>{"10.0.0.0/8", "fd00::/8"}));
}

TEST_F(ConfigTest, InvalidConfigurationExitsWithCode2) {
  ExpectExit2({"--max-jobs", "many"}, "--max-jobs");
  ExpectExit2({"--no-such-flag"}, "--no-such-flag");
  ExpectExit2({"--config", dir_ + "/missing.toml"}, "missing.toml");
  ExpectExit2({"--config", WriteConfig("max-jbos = 3\n")}, "max-jbos");
  // A mistake in the file names the file: an unknown key, and a bad value (also with the path from the environment).
  ExpectExit2({"--config", WriteConfig("max-jbos = 3\n")}, "(in the config file " + dir_ + "/aggregator.toml)");
  ExpectExit2({"--config=" + WriteConfig("max-jobs = \"many\"\n")}, "--max-jobs = many (in the config file " + dir_);
  SetEnv("SPARSEREDUCE_CONFIG", WriteConfig("max-jobs = \"many\"\n"));
  ExpectExit2({}, "(in the config file " + dir_ + "/aggregator.toml)");
  ExpectExit2({"--max-jobs", "x"}, "(given on the command line)");
  unsetenv("SPARSEREDUCE_CONFIG");
  ExpectExit2({"--listen", "nohostport"}, "--listen");
  ExpectExit2({"--listen", "127.0.0.1:9000,127.0.0.1:9000"}, "--listen: 127.0.0.1:9000 is listed twice");
  // Clashes among the daemon's own addresses exited 1 ("Address already in use", retried by systemd).
  ExpectExit2({"--listen", "0.0.0.0:9000,127.0.0.1:9000"}, "--listen: 127.0.0.1:9000 takes the same port as 0.0.0.0:9000");
  ExpectExit2({"--listen", "[::1]:9000,[::]:9000"}, "--listen: [::]:9000 takes the same port as [::1]:9000");
  ExpectExit2({"--listen", "127.0.0.1:9000", "--metrics-listen", "0.0.0.0:9000"},
              "--metrics-listen: 0.0.0.0:9000 takes the port of --listen 127.0.0.1:9000");
  ExpectExit2({"--metrics-listen", "", "--metrics-port-file", dir_ + "/mp"}, "--metrics-port-file: there is no metrics");
  // CLI11's messages for TOML mistakes say what to write instead.
  ExpectExit2({"--config", WriteConfig("[server]\nmax-jobs = 5\n")},
              "unknown key [server]: tables are not read; every setting is a top-level key");
  ExpectExit2({"--config", WriteConfig("allow-network = []\n")}, "leave the setting out to get its default");
  ExpectExit2({"--config", WriteConfig("max-tensor-bytes = 4 GiB\n")}, "quote a value with spaces");
  // Not clashes: other ports, port 0, other families, link-local addresses on different interfaces (that may not
  // exist yet: their listeners' failures are retried).
  EXPECT_EQ(ParseOk({"--listen", "[fe80::1%sr-no-if-0]:9000,[fe80::1%sr-no-if-1]:9000"}).server.listen.size(), 2u);
  EXPECT_EQ(ParseOk({"--listen", "127.0.0.1:0,127.0.0.1:0,0.0.0.0:9000,[::]:9000", "--metrics-listen",
                     "127.0.0.1:9001"})
                .server.listen.size(),
            4u);
  ExpectExit2({"--allow-network", "10.0.0.0/33"}, "10.0.0.0/33");
  ExpectExit2({"--allow-network", "fd00::1/8"}, "allowed network fd00::1/8 has host bits set; did you mean fd00::/8?");
  ExpectExit2({"--metrics-listen", "nohostport"}, "--metrics-listen");
  ExpectExit2({"--transports", "tcp,udp"}, "--transports: unknown transport 'udp' (tcp, shm, rdma)");
  ExpectExit2({"--require-auth"}, "--job-secrets-dir");
  ExpectExit2({"--job-secrets-dir", dir_ + "/nope"}, "nope");
  ExpectExit2({"--log-level", "loud"}, "loud");
  ExpectExit2({"--max-job-memory", "10", "--max-total-memory", "5"}, "--max-total-memory");
  SetEnv("SPARSEREDUCE_MAX_JOBS", "x");
  ExpectExit2({}, "MAX_JOBS");
  unsetenv("SPARSEREDUCE_MAX_JOBS");
  // The checks after parsing say where the value came from too, and which limit is 0 (they said neither), and an
  // unknown key of the TOML file is not called INI.
  SetEnv("SPARSEREDUCE_RING_BYTES", "3000");
  ExpectExit2({}, "--ring-bytes: ring capacity 3000 is not a power of two");
  ExpectExit2({}, "(from SPARSEREDUCE_RING_BYTES)");
  unsetenv("SPARSEREDUCE_RING_BYTES");
  ExpectExit2({"--max-total-memory", "0"}, "--max-total-memory must be positive (given on the command line)");
  ExpectExit2({"--config", WriteConfig("listen = [\"nohostport\"]\n")}, "(in the config file " + dir_);
  ExpectExit2({"--config", WriteConfig("max-jbos = 3\n")}, "unknown key max-jbos (in the config file");
}

// A deadline is the steady clock plus the setting in nanoseconds: a value that does not fit (10^13 ms, to mean
// "never") wrapped around into the past, so every collective was aborted at once as having "made no progress for
// 10000000000000 ms" (--stall-timeout-ms) and every job as not formed in time (--formation-timeout-ms); 0 dropped
// every handshake. Such values are refused; up to 30 days are taken, and a drain deadline of 0.
TEST_F(ConfigTest, TimeoutsOutsideTheirRangeAreRefused) {
  for (const char* flag :
       {"--handshake-timeout-ms", "--stall-timeout-ms", "--begin-timeout-ms", "--formation-timeout-ms"}) {
    ExpectExit2({flag, "10000000000000"}, flag);
    ExpectExit2({flag, "0"}, flag);
    ParseOk({flag, "2592000000"});
  }
  ExpectExit2({"--drain-timeout-ms", "10000000000000"}, "--drain-timeout-ms");
  EXPECT_EQ(ParseOk({"--drain-timeout-ms", "0"}).drain_timeout.count(), 0);
  EXPECT_EQ(ParseOk({"--stall-timeout-ms", "2592000000"}).server.stall_timeout, std::chrono::hours(24 * 30));
  EXPECT_EQ(ParseOk({"--begin-timeout-ms", "2592000000"}).server.begin_timeout, std::chrono::hours(24 * 30));
  ExpectExit2({"--io-threads", "100000"}, "--io-threads");
  ExpectExit2({"--max-handshakes-per-address", "0"}, "--max-handshakes-per-address");
  EXPECT_EQ(ParseOk({"--max-handshakes-per-address", "500"}).server.max_handshakes_per_address, 500u);
}

// CLI11 read "-1" into the 64-bit byte settings as 2^64 - 1: a negative limit was no limit, from any source. Each is
// refused, naming the setting and where it came from.
TEST_F(ConfigTest, NegativeByteSettingsAreRefusedFromEverySource) {
  for (const char* flag : {"max-tensor-bytes", "max-job-memory", "max-total-memory", "buffer-pool-bytes", "ring-bytes"}) {
    const std::string option = std::string("--") + flag;
    ExpectExit2({option, "-1"}, option + ": Value -1 is negative; it takes 0 or more (given on the command line)");
    SetEnv(EnvironmentVariableFor(flag), "-1");
    ExpectExit2({}, option + ": Value -1 is negative");
    EXPECT_NE(err_.str().find("(from " + EnvironmentVariableFor(flag) + ")"), std::string::npos) << err_.str();
    unsetenv(EnvironmentVariableFor(flag).c_str());
    ExpectExit2({"--config", WriteConfig(std::string(flag) + " = -1\n")}, option + ": Value -1 is negative");
  }
}

// Byte settings take units as the documentation writes sizes (powers of 1024), from every source: "9G" was refused
// with "Could not convert".
TEST_F(ConfigTest, ByteSettingsTakeUnits) {
  const DaemonConfig c = ParseOk({"--max-tensor-bytes", "32GiB", "--max-job-memory", "2G", "--max-total-memory",
                                  "9g", "--buffer-pool-bytes", "512 MiB", "--ring-bytes", "4096"});
  EXPECT_EQ(c.server.max_tensor_bytes, 32ull << 30);
  EXPECT_EQ(c.server.max_job_memory, 2ull << 30);
  EXPECT_EQ(c.server.max_total_memory, 9ull << 30);
  EXPECT_EQ(c.server.buffer_pool_bytes, 512ull << 20);
  EXPECT_EQ(c.server.ring_bytes, 4096u);
  SetEnv("SPARSEREDUCE_RING_BYTES", "4M");
  EXPECT_EQ(ParseOk({}).server.ring_bytes, 4ull << 20);
  unsetenv("SPARSEREDUCE_RING_BYTES");
  EXPECT_EQ(ParseOk({"--config", WriteConfig("ring-bytes = \"8KiB\"\nbuffer-pool-bytes = 1M\n")}).server.ring_bytes,
            8192u);
  ExpectExit2({"--ring-bytes", "4X"}, "--ring-bytes");
  ExpectExit2({"--max-tensor-bytes", "1.5G"}, "--max-tensor-bytes");
  ExpectExit2({"--max-tensor-bytes", "-1G"}, "--max-tensor-bytes: Value -1G is negative");
  ExpectExit2({"--max-tensor-bytes", "16777216T"}, "--max-tensor-bytes");  // 2^64: overflows
}

// A check between two settings names where each came from: the config file was blamed for both when neither was in
// it (the message's first flag decided).
TEST_F(ConfigTest, AConflictBetweenTwoSettingsNamesTheSourceOfEach) {
  const std::string file = WriteConfig("name = \"x\"\n");
  ExpectExit2({"--config", file, "--max-total-memory", "1000"},
              "--max-job-memory (1073741824) exceeds --max-total-memory (1000) (--max-job-memory: the default; "
              "--max-total-memory: given on the command line)");
  SetEnv("SPARSEREDUCE_MAX_TOTAL_MEMORY", "1000");
  ExpectExit2({"--config", WriteConfig("max-job-memory = 2000\n")},
              "(--max-job-memory: in the config file " + dir_ + "/aggregator.toml; --max-total-memory: from "
              "SPARSEREDUCE_MAX_TOTAL_MEMORY)");
}

// A job's members are a table of world_size entries, made at its first Hello by whoever sends it. With
// --max-world-size 4000000000 a Hello for 4e9 ranks failed to allocate the table: the exception ended the Hello's
// session without an Error (co_spawn's detached handler drops it) while its job kept its place. The limit is
// bounded: 65536 ranks make a 1 MiB table.
TEST_F(ConfigTest, WorldSizeLimitIsBounded) {
  ExpectExit2({"--max-world-size", "4000000000"}, "--max-world-size");
  ExpectExit2({"--max-world-size", "0"}, "--max-world-size");
  EXPECT_EQ(ParseOk({"--max-world-size", "65536"}).server.max_world_size, 65536u);
}

TEST_F(ConfigTest, HelpListsEveryFlagWithItsVariableAndExitsZero) {
  auto result = Parse({"--help"});
  ASSERT_TRUE(std::holds_alternative<int>(result));
  EXPECT_EQ(std::get<int>(result), 0);
  for (const char* flag : {"--listen", "--metrics-listen", "--config", "--drain-timeout-ms", "--max-total-memory",
                           "--job-secrets-dir", "--allow-network", "SPARSEREDUCE_MAX_JOBS"}) {
    EXPECT_NE(out_.str().find(flag), std::string::npos) << flag;
  }
}

// A peer's text on its way into logs and Errors: control characters and backslashes escaped, cut on a UTF-8
// character boundary (a cut inside one would make the protobuf string invalid, and the frame unreadable).
TEST(PeerText, EscapesAndCutsOnACharacterBoundary) {
  EXPECT_EQ(PeerText("plain reason"), "plain reason");
  EXPECT_EQ(PeerText("a\nb\r\x1b[31m\\"), "a\\x0ab\\x0d\\x1b[31m\\x5c");
  EXPECT_EQ(PeerText(std::string(2000, 'x')), std::string(1024, 'x') + " [...]");
  // "é" is two bytes: a cut after 3 bytes of "aéé" would split the second one.
  EXPECT_EQ(CutText("a\xc3\xa9\xc3\xa9", 4), "a\xc3\xa9 [...]");
  EXPECT_EQ(CutText("a\xc3\xa9\xc3\xa9", 5), "a\xc3\xa9\xc3\xa9");
  EXPECT_EQ(CutText("abc", 0), " [...]");
}

// What the co_spawn completion handlers of the daemon's and the worker's coroutines log instead of dropping it.
TEST(ExceptionText, NamesWhatEscapedACoroutine) {
  boost::asio::io_context io;
  std::vector<std::string> texts;
  auto note = [&texts](std::exception_ptr error) { texts.push_back(error ? ExceptionText(error) : "none"); };
  using Coroutine = boost::asio::awaitable<void>;
  boost::asio::co_spawn(io, []() -> Coroutine { throw std::runtime_error("out of frames"); co_return; }, note);
  boost::asio::co_spawn(io, []() -> Coroutine { throw 7; co_return; }, note);
  boost::asio::co_spawn(io, []() -> Coroutine { co_return; }, note);
  io.run();
  EXPECT_EQ(texts, (std::vector<std::string>{"out of frames", "an exception that is not a std::exception", "none"}));
}

TEST(NetworkAllowlist, MatchesV4V6AndMappedAddresses) {
  auto list = NetworkAllowlist::Parse({"10.0.0.0/8", "192.168.1.7", "fd00::/8"});
  ASSERT_TRUE(list.ok());
  namespace ip = boost::asio::ip;
  EXPECT_TRUE(list->Allows(ip::make_address("10.255.0.1")));
  EXPECT_FALSE(list->Allows(ip::make_address("11.0.0.1")));
  EXPECT_TRUE(list->Allows(ip::make_address("192.168.1.7")));
  EXPECT_FALSE(list->Allows(ip::make_address("192.168.1.8")));
  EXPECT_TRUE(list->Allows(ip::make_address("fd12::1")));
  EXPECT_FALSE(list->Allows(ip::make_address("::1")));
  EXPECT_TRUE(list->Allows(ip::make_address("::ffff:10.1.2.3")));
  EXPECT_TRUE(NetworkAllowlist::Parse({})->Allows(ip::make_address("1.2.3.4")));
  EXPECT_FALSE(NetworkAllowlist::Parse({"10.1.2.3/8"}).ok());  // host bits set
  EXPECT_FALSE(NetworkAllowlist::Parse({"banana"}).ok());
}

// A link-local client's address carries its interface ("fe80::1%2"): entries without a scope match it, even "::/0"
// (Asio's comparison counted the scope, so none did); an entry with a scope matches that interface only.
TEST(NetworkAllowlist, ScopedLinkLocalClientsMatchEntriesWithoutAScope) {
  namespace ip = boost::asio::ip;
  const ip::address client = ip::make_address("fe80::fc:ff:fe00:1%2");
  for (const char* entry : {"::/0", "fe80::/10", "fe80::fc:ff:fe00:1", "fe80::%2/10"}) {
    auto list = NetworkAllowlist::Parse({entry});
    ASSERT_TRUE(list.ok()) << entry << ": " << list.status().ToString();
    EXPECT_TRUE(list->Allows(client)) << entry;
  }
  auto other_interface = NetworkAllowlist::Parse({"fe80::%3/10"});
  ASSERT_TRUE(other_interface.ok());
  EXPECT_FALSE(other_interface->Allows(client));
  EXPECT_TRUE(other_interface->Allows(ip::make_address("fe80::1%3")));
  EXPECT_FALSE(NetworkAllowlist::Parse({"fd00::/8"})->Allows(client));
  // A scope that names no interface read as scope 0, which matched every interface; one on a network other than
  // link-local could never match.
  EXPECT_FALSE(NetworkAllowlist::Parse({"fe80::%nosuchinterface0/10"}).ok());
  EXPECT_FALSE(NetworkAllowlist::Parse({"fd00::%2/8"}).ok());
  EXPECT_TRUE(NetworkAllowlist::Parse({"::/0"})->Allows(ip::make_address("2001:db8::1")));
}

// An IPv4-mapped entry could never match (IPv4 clients match IPv4 entries): refused, with the entry to write.
TEST(NetworkAllowlist, RefusesIPv4MappedEntries) {
  auto mapped = NetworkAllowlist::Parse({"::ffff:10.0.0.0/104"});
  ASSERT_FALSE(mapped.ok());
  EXPECT_NE(mapped.status().message().find("write 10.0.0.0/8"), std::string::npos) << mapped.status().ToString();
  EXPECT_FALSE(NetworkAllowlist::Parse({"::ffff:10.1.2.3"}).ok());
  EXPECT_TRUE(NetworkAllowlist::Parse({"::/0"}).ok());  // wider than the mapped range: matches IPv6 clients
}

// Replace stands in for a stale job that may have left the registry already (aborted while its last session was
// still to read): if another job took its place meanwhile, the fresh one would be one beyond --max-jobs.
TEST(JobRegistry, ReplaceKeepsToMaxJobs) {
  ServerOptions options;
  options.max_jobs = 1;
  ServiceContext context(options, NetworkAllowlist{});
  boost::asio::io_context io;
  JobRegistry registry(io, context);
  Result<std::shared_ptr<Job>> first = registry.FindOrCreate(1);
  ASSERT_TRUE(first.ok());
  const std::shared_ptr<Job> stale = *first;
  Result<std::shared_ptr<Job>> again = registry.Replace(1, stale);  // still registered: replaced in its place
  ASSERT_TRUE(again.ok());
  EXPECT_NE(*again, stale);
  EXPECT_EQ(registry.size(), 1u);
  registry.Remove(again->get());
  ASSERT_TRUE(registry.FindOrCreate(2).ok());
  Result<std::shared_ptr<Job>> beyond = registry.Replace(1, *again);
  EXPECT_EQ(beyond.status().code(), StatusCode::kResourceExhausted) << beyond.status().ToString();
  EXPECT_EQ(registry.size(), 1u);
  EXPECT_EQ(registry.FindOrCreate(3).status().code(), StatusCode::kResourceExhausted);
}

TEST(MemoryBudget, ReservesUpToTheLimitAndReleases) {
  MemoryBudget budget(100);
  EXPECT_TRUE(budget.TryReserve(60));
  EXPECT_FALSE(budget.TryReserve(41));
  ASSERT_TRUE(budget.TryReserve(40));
  {
    MemoryReservation held(budget, 40);  // owns the 40 just reserved
    EXPECT_EQ(budget.reserved(), 100u);
  }
  EXPECT_EQ(budget.reserved(), 60u);
  EXPECT_TRUE(budget.TryReserve(40));
  EXPECT_FALSE(budget.TryReserve(~uint64_t{0}));  // no overflow
}

TEST(Logging, JsonEscape) {
  EXPECT_EQ(JsonEscape("a\"b\\c\nd\x01"), "a\\\"b\\\\c\\nd\\u0001");
}

}  // namespace
}  // namespace sparsereduce::aggregator
