#include "aggregator/config.h"

#include <spdlog/common.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <boost/asio/ip/address.hpp>
#include <cctype>
#include <cstdlib>
#include <memory>
#include <type_traits>

#include "aggregator/network_allowlist.h"
#include "transport/ring/byte_ring.h"
#include "transport/tcp/endpoint.h"

namespace sparsereduce::aggregator {
namespace {

constexpr const char* kConfigFlag = "config";

bool EnvironmentHas(const std::string& flag) {
  const char* value = std::getenv(EnvironmentVariableFor(flag).c_str());
  return value != nullptr && *value != '\0';
}

// CLI11 applies the config file before the environment and lets the file win. Dropping the file's entries that
// the environment also sets gives the documented order flag > environment > file.
class EnvironmentOverridesFile : public CLI::ConfigTOML {
 public:
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override {
    std::vector<CLI::ConfigItem> items = CLI::ConfigTOML::from_config(input);
    std::erase_if(items, [](const CLI::ConfigItem& item) {
      return item.parents.empty() && !item.name.empty() && item.name != kConfigFlag && EnvironmentHas(item.name);
    });
    return items;
  }
};

// CLI11 reads "-1" into an unsigned 64-bit setting as 2^64 - 1 (a 32-bit one refuses it), so a negative limit
// was taken as no limit at all: refused before the conversion, from every source.
const CLI::Validator kNotNegative(
    [](std::string& text) -> std::string {
      const size_t first = text.find_first_not_of(" \t\n\v\f\r");
      if (first != std::string::npos && text[first] == '-') return "Value " + text + " is negative; it takes 0 or more";
      return {};
    },
    "NONNEGATIVE");

// Adds --flag with its SPARSEREDUCE_* variable, so every setting has all three sources.
template <typename T>
CLI::Option* Add(CLI::App& app, const std::string& flag, T& value, const std::string& help) {
  CLI::Option* option =
      app.add_option("--" + flag, value, help)->envname(EnvironmentVariableFor(flag))->capture_default_str();
  if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) option->check(kNotNegative);
  return option;
}

// A byte setting: a number of bytes, or one with a unit as operators write sizes (4M, 16GiB, 256 MiB; K, M, G, T
// and their KiB/KB forms are all powers of 1024, as in the defaults' documentation).
CLI::Option* AddBytes(CLI::App& app, const std::string& flag, uint64_t& value, const std::string& help) {
  // CLI11 runs transforms first, the last added first: the sign is checked before the unit multiplies ("-1G" is
  // negative, not an overflow of 2^64 - 1). Without a description: --help names the check once, from Add.
  return Add(app, flag, value, help)
      ->transform(CLI::AsSizeValue(/*kb_is_1000=*/false))
      ->transform(CLI::Validator(kNotNegative).description(""));
}

// The longest timeout taken: a deadline is the steady clock plus the timeout in nanoseconds, and a value that
// does not fit (about 292 years in all) wraps around into the past, where it expires at once.
constexpr uint64_t kMaxTimeoutMs = 30ull * 24 * 3600 * 1000;  // 30 days

// `min_ms` is 1 for a timeout that must not expire before anything can happen, 0 where "at once" makes sense.
template <typename Rep, typename Period>
CLI::Option* AddMilliseconds(CLI::App& app, const std::string& flag, std::chrono::duration<Rep, Period>& value,
                             uint64_t& storage, uint64_t min_ms, const std::string& help) {
  storage = std::chrono::duration_cast<std::chrono::milliseconds>(value).count();
  return Add(app, flag, storage, help)->check(CLI::Range(min_ms, kMaxTimeoutMs));
}

// Whether the daemon's own listeners on `a` and `b` would clash: the same port (not 0: each of those gets its own)
// and the same host, or address literals of one family where either is the wildcard (0.0.0.0 takes the port on
// every IPv4 address). Names are compared as written; resolving them is the listener's job.
bool SameListenPort(const tcp::HostPort& a, const tcp::HostPort& b) {
  if (a.port == 0 || a.port != b.port) return false;
  if (a.host == b.host) return true;
  // Scopes as written: an interface that does not exist yet parses as scope 0 (fe80::1%ib0 and %ib1 alike), and
  // its listener's failure is retried (exit 1), not a clash.
  const size_t a_scope = a.host.find('%'), b_scope = b.host.find('%');
  if (a_scope != std::string::npos && b_scope != std::string::npos &&
      a.host.substr(a_scope) != b.host.substr(b_scope)) {
    return false;
  }
  boost::system::error_code a_error, b_error;
  const boost::asio::ip::address x = boost::asio::ip::make_address(a.host, a_error);
  const boost::asio::ip::address y = boost::asio::ip::make_address(b.host, b_error);
  if (a_error || b_error || x.is_v4() != y.is_v4()) return false;
  return x == y || x.is_unspecified() || y.is_unspecified();
}

Status Validate(const DaemonConfig& config) {
  if (config.server.listen.empty()) return InvalidArgument("--listen: at least one address is needed");
  // Bound twice, a port failed with "Address already in use" (exit 1, retried by systemd), which sent operators
  // looking for another process: a clash among the daemon's own addresses is a configuration error.
  std::vector<tcp::HostPort> seen;
  for (const std::string& text : config.server.listen) {
    Result<tcp::HostPort> hp = tcp::ParseHostPort(text);
    if (!hp.ok()) return hp.status().WithContext("--listen");
    for (const tcp::HostPort& earlier : seen) {
      if (SameListenPort(*hp, earlier)) {
        return InvalidArgument("--listen: " + hp->ToString() +
                               (hp->ToString() == earlier.ToString() ? " is listed twice"
                                                                     : " takes the same port as " + earlier.ToString()));
      }
    }
    seen.push_back(*hp);
  }
  if (!config.metrics_listen.empty()) {
    Result<tcp::HostPort> hp = tcp::ParseHostPort(config.metrics_listen);
    if (!hp.ok()) return hp.status().WithContext("--metrics-listen");
    for (const tcp::HostPort& data : seen) {
      if (SameListenPort(*hp, data)) {
        return InvalidArgument("--metrics-listen: " + hp->ToString() + " takes the port of --listen " +
                               data.ToString() + ": give the metrics endpoint a port of its own");
      }
    }
  } else if (!config.metrics_port_file.empty()) {
    return InvalidArgument("--metrics-port-file: there is no metrics endpoint (--metrics-listen is empty), so the "
                           "file would never be written");
  }
  if (Result<NetworkAllowlist> list = NetworkAllowlist::Parse(config.server.allow_networks); !list.ok()) {
    return list.status().WithContext("--allow-network");
  }
  if (config.server.require_auth && config.server.job_secrets_dir.empty()) {
    return InvalidArgument("--require-auth needs --job-secrets-dir");
  }
  for (const auto& [flag, value] : {std::pair{"--max-jobs", uint64_t{config.server.max_jobs}},
                                    std::pair{"--max-world-size", uint64_t{config.server.max_world_size}},
                                    std::pair{"--max-job-memory", uint64_t{config.server.max_job_memory}},
                                    std::pair{"--max-total-memory", uint64_t{config.server.max_total_memory}},
                                    std::pair{"--max-tensor-bytes", uint64_t{config.server.max_tensor_bytes}}}) {
    if (value == 0) return InvalidArgument(std::string(flag) + " must be positive");
  }
  bool tcp = false;
  for (const std::string& t : config.server.transports) {
    if (t != "tcp" && t != "shm" && t != "rdma") {
      return InvalidArgument("--transports: unknown transport '" + t + "' (tcp, shm, rdma)");
    }
    tcp = tcp || t == "tcp";
  }
  if (!tcp) return InvalidArgument("--transports must include tcp: every connection starts on it");
  if (Status st = transport::ByteRing::CheckCapacity(config.server.ring_bytes); !st.ok()) {
    return st.WithContext("--ring-bytes");
  }
  if (config.server.max_job_memory > config.server.max_total_memory) {
    return InvalidArgument("--max-job-memory (" + std::to_string(config.server.max_job_memory) +
                           ") exceeds --max-total-memory (" + std::to_string(config.server.max_total_memory) + ")");
  }
  return Status::Ok();
}

// The config file in effect: --config on the command line, else SPARSEREDUCE_CONFIG; "" if none.
std::string ConfigPath(const std::vector<std::string>& args, const char* env_config) {
  const std::string flag = std::string("--") + kConfigFlag;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == flag && i + 1 < args.size()) return args[i + 1];
    if (args[i].starts_with(flag + "=")) return args[i].substr(flag.size() + 1);
  }
  return env_config != nullptr ? env_config : "";
}

// CLI11 names the flag (or, for an unknown key of the config file, the key) but not where its value came from.
std::string SourceHint(const std::string& error, bool config_error, const std::vector<std::string>& args,
                       const std::string& config_path) {
  const std::string in_file = config_path.empty() ? "" : " (in the config file " + config_path + ")";
  if (config_error) return in_file;
  const size_t start = error.find("--");
  if (start == std::string::npos) return "";
  const size_t end = error.find_first_of(" =,:", start);
  const std::string flag = error.substr(start, end == std::string::npos ? std::string::npos : end - start);
  for (const std::string& arg : args) {
    if (arg == flag || arg.starts_with(flag + "=")) return " (given on the command line)";
  }
  if (EnvironmentHas(flag.substr(2))) return " (from " + EnvironmentVariableFor(flag.substr(2)) + ")";
  return in_file;
}

// Where each setting that a check after parsing names came from: " (given on the command line)" for one setting,
// " (--max-job-memory: the default; --max-total-memory: from SPARSEREDUCE_MAX_TOTAL_MEMORY)" for several. A
// conflict between two settings blamed the config file for both when neither was in it.
std::string SettingSources(const std::string& message, CLI::App& app, const std::vector<std::string>& args,
                           const std::string& config_path) {
  std::vector<std::pair<std::string, std::string>> sources;
  for (size_t at = message.find("--"); at != std::string::npos; at = message.find("--", at + 2)) {
    const size_t end = message.find_first_of(" =,:()", at);
    const std::string flag = message.substr(at, end == std::string::npos ? std::string::npos : end - at);
    if (std::any_of(sources.begin(), sources.end(), [&](const auto& s) { return s.first == flag; })) continue;
    const CLI::Option* option = app.get_option_no_throw(flag);
    if (option == nullptr) continue;
    std::string source;
    if (std::any_of(args.begin(), args.end(), [&](const std::string& a) { return a == flag || a.starts_with(flag + "="); })) {
      source = "given on the command line";
    } else if (EnvironmentHas(flag.substr(2))) {
      source = "from " + EnvironmentVariableFor(flag.substr(2));
    } else if (option->count() > 0) {
      source = "in the config file " + config_path;
    } else {
      source = "the default";
    }
    sources.emplace_back(flag, source);
  }
  if (sources.empty()) return "";
  if (sources.size() == 1) return " (" + sources[0].second + ")";
  std::string text = " (";
  for (size_t i = 0; i < sources.size(); ++i) text += (i ? "; " : "") + sources[i].first + ": " + sources[i].second;
  return text + ")";
}

}  // namespace

std::string EnvironmentVariableFor(const std::string& flag) {
  std::string name = "SPARSEREDUCE_";
  for (char c : flag) name += c == '-' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::variant<DaemonConfig, int> ParseDaemonConfig(const std::vector<std::string>& args, std::ostream& out,
                                                  std::ostream& err) {
  DaemonConfig config;
  ServerOptions& server = config.server;
  CLI::App app{
      "sparsereduce-aggregator: sums the nonzero blocks of sparse allreduces for many jobs at once.\n"
      "Every flag can also be set as SPARSEREDUCE_<FLAG> in the environment (e.g. SPARSEREDUCE_MAX_JOBS) or as\n"
      "`flag = value` in the --config TOML file; precedence: flag > environment > config file > default."};
  app.config_formatter(std::make_shared<EnvironmentOverridesFile>());
  // A config path that does not exist is an error, also when it comes from the environment.
  const char* env_config = std::getenv(EnvironmentVariableFor(kConfigFlag).c_str());
  const bool config_from_env = env_config != nullptr && *env_config != '\0';
  app.set_config(std::string("--") + kConfigFlag, config_from_env ? env_config : "",
                 "TOML config file (keys are the long flag names), also SPARSEREDUCE_CONFIG", config_from_env);
  app.allow_config_extras(CLI::config_extras_mode::error);

  Add(app, "listen", server.listen, "Data-plane address HOST:PORT or [IPV6]:PORT (repeatable or comma-separated)")
      ->delimiter(',');
  Add(app, "metrics-listen", config.metrics_listen, "HTTP address for /metrics, /healthz and /readyz; '' disables");
  Add(app, "name", server.name, "Instance name in logs and metrics (default: the hostname)");
  Add(app, "io-threads", server.io_threads, "I/O threads (0: one per hardware thread)")
      ->check(CLI::Range(0u, 1024u));
  uint64_t handshake_ms = 0, stall_ms = 0, begin_ms = 0, drain_ms = 0, formation_ms = 0;
  AddMilliseconds(app, "handshake-timeout-ms", server.handshake_timeout, handshake_ms, 1,
                  "Drop connections that do not finish the handshake within this");
  Add(app, "max-handshakes-per-address", server.max_handshakes_per_address,
      "Connections from one client address that may be in their handshake at once; more are refused")
      ->check(CLI::Range(1u, 65536u));
  AddMilliseconds(app, "stall-timeout-ms", server.stall_timeout, stall_ms, 1,
                  "Abort a collective that every rank has started and that makes no progress for this long, naming "
                  "the ranks it waits for");
  AddMilliseconds(app, "begin-timeout-ms", server.begin_timeout, begin_ms, 1,
                  "Abort a collective that some rank has not started this long after it last progressed (a "
                  "CollectiveBegin or data from the others)");
  AddMilliseconds(app, "formation-timeout-ms", server.formation_timeout, formation_ms, 1,
                  "End a job whose ranks have not all joined this long after its first Hello, freeing its place");
  AddMilliseconds(app, "drain-timeout-ms", config.drain_timeout, drain_ms, 0,
                  "On SIGTERM, let running collectives finish for up to this long, then abort their jobs");
  uint64_t keepalive_s = server.liveness.keepalive_idle.count();
  Add(app, "keepalive-s", keepalive_s, "Idle seconds before TCP keepalive probes (1 s apart, 3 probes)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{7200}));
  Add(app, "max-jobs", server.max_jobs, "Jobs served at once");
  // A forming job's member table has world_size entries, made at its first Hello: bounded, so that a Hello cannot
  // ask for an allocation that fails.
  Add(app, "max-world-size", server.max_world_size, "Largest world size accepted (at most 65536)")
      ->check(CLI::Range(1u, 65536u));
  AddBytes(app, "max-tensor-bytes", server.max_tensor_bytes, "Largest tensor (elements x element size) of a collective");
  AddBytes(app, "max-job-memory", server.max_job_memory,
      "Bytes one job's running collective may hold here (W x window x its columns x block bytes, plus RESULTs "
      "and tables; docs/OPERATIONS.md, Sizing)");
  AddBytes(app, "max-total-memory", server.max_total_memory, "Bytes all jobs' running collectives may hold here");
  AddBytes(app, "buffer-pool-bytes", server.buffer_pool_bytes,
      "Bytes of free frame buffers kept for reuse, on top of what running collectives hold");
  Add(app, "transports", server.transports,
      "Transports workers may use (comma-separated): tcp (required: every connection starts on it), shm for "
      "workers on this host, rdma")
      ->delimiter(',');
  AddBytes(app, "ring-bytes", server.ring_bytes,
      "Bytes of each direction's ring of a shared-memory or RDMA connection (a power of two, 4 KiB to 4 GiB; RDMA: "
      "at most 1 GiB)");
  Add(app, "rdma-device", server.rdma_device, "RDMA device for --transports rdma (default: the first one)");
  Add(app, "rdma-port", server.rdma_port, "Port of the RDMA device")->check(CLI::Range(1, 255));
  Add(app, "rdma-gid-index", server.rdma_gid_index,
      "GID index for RoCE (RoCEv2: usually 3); -1: InfiniBand addressing by LID")
      ->check(CLI::Range(-1, 255));
  Add(app, "job-secrets-dir", server.job_secrets_dir,
      "Directory with one file per job (name: decimal job id, content: shared secret) for HMAC authentication")
      ->check(CLI::ExistingDirectory);
  app.add_flag("--require-auth", server.require_auth, "Reject jobs without a secret in --job-secrets-dir")
      ->envname(EnvironmentVariableFor("require-auth"))
      ->capture_default_str();
  Add(app, "allow-network", server.allow_networks,
      "Client network allowed to connect, CIDR (repeatable or comma-separated; default: all)")
      ->delimiter(',');
  Add(app, "log-level", config.log_level, "Log level")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "critical", "off"}));
  Add(app, "log-format", config.log_format, "Log format")->check(CLI::IsMember({"text", "json"}));
  Add(app, "port-file", config.port_file, "Write the first bound data port to this file once listening");
  Add(app, "metrics-port-file", config.metrics_port_file, "Write the bound metrics port to this file");

  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e, out, err);
  } catch (const CLI::ParseError& e) {
    const bool config_error = dynamic_cast<const CLI::ConfigError*>(&e) != nullptr;
    std::string what = e.what();
    // CLI11 reads TOML with its INI parser and says so for a key it has no flag for ("INI was not able to parse
    // KEY"); the user wrote TOML.
    const std::string extra_key = "INI was not able to parse ";
    if (what.starts_with(extra_key)) {
      std::string key = what.substr(extra_key.size());
      // A [table] header reaches CLI11 as the key "TABLE.++"; its keys as "TABLE.KEY".
      if (key.ends_with(".++")) key = "[" + key.substr(0, key.size() - 3) + "]";
      what = "unknown key " + key;
      if (key.find('.') != std::string::npos || key.starts_with("[")) {
        what += ": tables are not read; every setting is a top-level key (max-jobs = 5)";
      }
    }
    const std::string source =
        SourceHint(e.what(), config_error, args, ConfigPath(args, config_from_env ? env_config : nullptr));
    // CLI11's words for what a TOML user means (on the command line they mean something else: a flag given twice).
    if (source.find("in the config file") != std::string::npos) {
      if (what.find("At least 1 required but received 0") != std::string::npos) {
        what += ": an empty list is not a value; leave the setting out to get its default";
      } else if (what.find("At Most 1 required but received") != std::string::npos) {
        what += ": one value is expected; quote a value with spaces (max-tensor-bytes = \"4 GiB\")";
      }
    }
    err << "sparsereduce-aggregator: invalid configuration: " << what << source << "\n";
    return 2;
  }
  server.handshake_timeout = std::chrono::milliseconds(handshake_ms);
  server.stall_timeout = std::chrono::milliseconds(stall_ms);
  server.begin_timeout = std::chrono::milliseconds(begin_ms);
  server.formation_timeout = std::chrono::milliseconds(formation_ms);
  config.drain_timeout = std::chrono::milliseconds(drain_ms);
  server.liveness.keepalive_idle = std::chrono::seconds(keepalive_s);
  if (Status st = Validate(config); !st.ok()) {
    // The checks after parsing name the flag; where its value came from is told as for a parse error.
    err << "sparsereduce-aggregator: invalid configuration: " << st.message()
        << SettingSources(st.message(), app, args, ConfigPath(args, config_from_env ? env_config : nullptr)) << "\n";
    return 2;
  }
  return config;
}

}  // namespace sparsereduce::aggregator
