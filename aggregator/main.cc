// sparsereduce-aggregator: the aggregation daemon.
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <cstdio>
#include <fstream>
#include <thread>

#include "aggregator/server.h"

int main(int argc, char** argv) {
  using sparsereduce::aggregator::Server;
  using sparsereduce::aggregator::ServerOptions;

  ServerOptions options;
  std::string log_level = "info";
  std::string port_file;
  uint64_t handshake_ms = options.handshake_timeout.count();
  CLI::App app{"sparsereduce-aggregator: sums the nonzero blocks of sparse allreduces for many jobs at once"};
  app.add_option("--listen", options.listen, "Address to listen on, HOST:PORT or [IPV6]:PORT (repeatable)")
      ->capture_default_str();
  app.add_option("--io-threads", options.io_threads, "I/O threads (0: one per hardware thread)")
      ->capture_default_str();
  app.add_option("--handshake-timeout-ms", handshake_ms, "Drop connections that send no Hello within this")
      ->capture_default_str();
  uint64_t stall_ms = options.stall_timeout.count();
  app.add_option("--stall-timeout-ms", stall_ms,
                 "Abort a collective that makes no progress for this long, naming the ranks it waits for")
      ->capture_default_str();
  uint64_t keepalive_s = options.liveness.keepalive_idle.count();
  app.add_option("--keepalive-s", keepalive_s, "Idle seconds before TCP keepalive probes (1 s apart, 3 probes)")
      ->capture_default_str();
  app.add_option("--max-jobs", options.max_jobs, "Jobs served at once")->capture_default_str();
  app.add_option("--max-world-size", options.max_world_size, "Largest world size accepted")->capture_default_str();
  app.add_option("--max-collective-memory", options.max_collective_memory,
                 "Bytes one collective may hold on this aggregator (W+1 x slots x frame size)")
      ->capture_default_str();
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error, critical or off")
      ->capture_default_str();
  app.add_option("--port-file", port_file, "Write the first bound port to this file once listening");
  CLI11_PARSE(app, argc, argv);

  const auto level = spdlog::level::from_str(log_level);
  if (level == spdlog::level::off && log_level != "off") {
    std::fprintf(stderr, "sparsereduce-aggregator: unknown --log-level '%s'\n", log_level.c_str());
    return 2;
  }
  spdlog::set_level(level);
  options.handshake_timeout = std::chrono::milliseconds(handshake_ms);
  options.stall_timeout = std::chrono::milliseconds(stall_ms);
  options.liveness.keepalive_idle = std::chrono::seconds(std::max<uint64_t>(1, keepalive_s));
  const uint32_t threads = options.io_threads ? options.io_threads : std::max(1u, std::thread::hardware_concurrency());

  boost::asio::io_context io(static_cast<int>(threads));
  Server server(io, options);
  auto bound = server.Listen();
  if (!bound.ok()) {
    spdlog::critical("{}", bound.status().ToString());
    return 2;
  }
  for (const auto& endpoint : *bound) {
    spdlog::info("listening on {}:{}", endpoint.address().to_string(), endpoint.port());
  }
  if (!port_file.empty()) {
    // Written to a temporary name and renamed, so a reader never sees a partial file.
    const std::string tmp = port_file + ".tmp";
    std::ofstream(tmp) << bound->front().port() << "\n";
    std::rename(tmp.c_str(), port_file.c_str());
  }

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  signals.async_wait([&](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    spdlog::info("signal {}: shutting down", signal);
    server.Stop();
  });
  server.StartAccepting();

  std::vector<std::thread> pool;
  for (uint32_t i = 1; i < threads; ++i) pool.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  spdlog::info("stopped");
  return 0;
}
