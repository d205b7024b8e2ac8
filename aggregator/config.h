// The daemon's configuration: command-line flags, SPARSEREDUCE_* environment variables and a TOML config file,
// parsed with CLI11. Precedence, highest first: flag, environment variable, config file, built-in default.
#pragma once

#include <chrono>
#include <ostream>
#include <string>
#include <variant>
#include <vector>

#include "aggregator/server_options.h"

namespace sparsereduce::aggregator {

struct DaemonConfig {
  ServerOptions server;
  std::string metrics_listen = "0.0.0.0:19876";  // HTTP /metrics, /healthz, /readyz; empty disables
  // On SIGTERM: how long running collectives may take to finish before their jobs are aborted.
  std::chrono::milliseconds drain_timeout{25000};
  std::string log_level = "info";
  std::string log_format = "text";  // text or json
  std::string port_file;            // receives the first data port once every listener is bound
  std::string metrics_port_file;    // receives the metrics port
};

// The environment variable of a long flag: "max-jobs" -> "SPARSEREDUCE_MAX_JOBS".
std::string EnvironmentVariableFor(const std::string& flag);

// Parses argv (argv[0] is the program name). On --help returns exit code 0 after printing the help to `out`; on
// invalid configuration prints one clear message to `err` and returns exit code 2.
std::variant<DaemonConfig, int> ParseDaemonConfig(const std::vector<std::string>& args, std::ostream& out,
                                                  std::ostream& err);

}  // namespace sparsereduce::aggregator
