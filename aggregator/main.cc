// sparsereduce-aggregator: the aggregation daemon. Wires the configuration, the Server, the operations HTTP
// endpoint, systemd notifications and signals together; the behaviour lives in those classes.
#include <algorithm>
#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/post.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <thread>

#include "aggregator/config.h"
#include "aggregator/http_endpoint.h"
#include "aggregator/logging.h"
#include "aggregator/server.h"
#include "aggregator/systemd_notifier.h"
#include "transport/tcp/endpoint.h"

namespace {

using namespace sparsereduce::aggregator;
using sparsereduce::Result;
using sparsereduce::Status;
using sparsereduce::StatusCode;

// Written whole, then renamed into place: a reader never sees part of it. A file that cannot be written stops the
// daemon (exit 2, a configuration error): whoever asked for it waits for it, and would wait in vain.
Status WritePortFile(const std::string& option, const std::string& path, uint16_t port) {
  if (path.empty()) return Status::Ok();
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp);
  out << port << "\n";
  out.close();
  // Readable by anyone, whatever the umask (the unit's is 0077): a port number is no secret, and the scripts and
  // tests that read it need not run as the daemon's user.
  if (out) chmod(tmp.c_str(), 0644);
  if (!out)
    return Status(StatusCode::kUnavailable, "--" + option + ": cannot write " + tmp + ": " + std::strerror(errno));
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int error = errno;
    std::remove(tmp.c_str());
    return Status(StatusCode::kUnavailable, "--" + option + ": cannot rename " + tmp + " to " + path + ": " +
                                                std::strerror(error));
  }
  return Status::Ok();
}

std::string Hostname() {
  char name[256] = {};
  return gethostname(name, sizeof name - 1) == 0 ? name : "sparsereduce-aggregator";
}

// With --transports rdma, the device is opened at startup, so a host without working RDMA fails at once with the
// reason instead of at the first worker.
Status OpenRdma(const ServerOptions& options, ServiceContext& context) {
  if (std::find(options.transports.begin(), options.transports.end(), "rdma") == options.transports.end()) {
    return Status::Ok();
  }
#if SPARSEREDUCE_HAVE_RDMA
  namespace rdma = sparsereduce::rdma;
  const rdma::RdmaOptions rdma_options{options.rdma_device, static_cast<uint8_t>(options.rdma_port),
                                       options.rdma_gid_index};
  // One connection's rings: the memlock limit must allow at least that much.
  Result<std::shared_ptr<rdma::RdmaDevice>> device = rdma::RdmaDevice::Open(rdma_options, 2 * options.ring_bytes);
  if (!device.ok()) return device.status();
  spdlog::info("RDMA transport on {} port {}", (*device)->name(), options.rdma_port);
  // Every connection pins its two rings: a limit that passes for one may not for all that may come.
  const uint64_t fit = rdma::ConnectionsWithinMemlock(rdma::ReadMemlockState(), 2 * options.ring_bytes);
  const uint64_t possible = uint64_t{options.max_jobs} * options.max_world_size;
  if (fit < possible) {
    spdlog::warn("the memlock limit allows RDMA rings (2 x --ring-bytes) for {} connection(s) at once, of up to {} "
                 "(--max-jobs x --max-world-size): connections beyond it stay on TCP, and workers that require RDMA "
                 "fail. Raise it (systemd LimitMEMLOCK=infinity, docker --ulimit memlock=-1) or grant CAP_IPC_LOCK",
                 fit, possible);
  }
  context.rdma = std::move(*device);
  return Status::Ok();
#else
  (void)context;
  return Status(StatusCode::kUnsupported,
                "this build has no RDMA transport (libibverbs-dev was missing at build time)");
#endif
}

// Every worker connection holds a descriptor (five over shared memory: the daemon's ends of its wake-ups), and the
// soft limit a daemon inherits is often 1024 (containers, shells) though the hard limit allows far more: raise it
// to the hard limit, as systemd's LimitNOFILE= does for the unit.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  if (limit.rlim_cur >= limit.rlim_max) {
    spdlog::debug("open-file limit {}", limit.rlim_cur);
    return;
  }
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("open-file limit {}: cannot raise it to the hard limit {}: {}", before, limit.rlim_max,
                 std::strerror(errno));
    return;
  }
  spdlog::info("open-file limit raised from {} to the hard limit {} (one per worker connection)", before,
               limit.rlim_max);
}

// The exit code of a listener or an RDMA device that cannot be opened: 1 where it is not there yet (the address is
// taken or not yet configured on this host; no RDMA device, driver or active port: a restart may succeed, and
// systemd's Restart=on-failure retries), 2 for what no restart changes (an unparsable or unresolvable address, a
// build without RDMA, the memlock limit: RestartPreventExitStatus=2 stops the retries).
int StartFailureExitCode(const Status& status) { return status.code() == StatusCode::kUnavailable ? 1 : 2; }


}  // namespace

int main(int argc, char** argv) {
  // Sockets write with MSG_NOSIGNAL; the log does not: a log pipe whose reader went away (a restarted log shipper,
  // `| tee`) killed the daemon at its next line, every job lost without SHUTTING_DOWN. systemd ignores SIGPIPE for
  // its units already; containers and wrappers do not.
  std::signal(SIGPIPE, SIG_IGN);
  auto parsed = ParseDaemonConfig(std::vector<std::string>(argv, argv + argc), std::cout, std::cerr);
  if (const int* exit_code = std::get_if<int>(&parsed)) return *exit_code;
  DaemonConfig config = std::get<DaemonConfig>(std::move(parsed));
  if (config.server.name.empty()) config.server.name = Hostname();
  ConfigureLogging(config.log_level, config.log_format, config.server.name);
  RaiseOpenFileLimit();

  const uint32_t threads =
      config.server.io_threads ? config.server.io_threads : std::max(1u, std::thread::hardware_concurrency());
  boost::asio::io_context io(static_cast<int>(threads));
  Server server(io, config.server);
  if (const Status st = OpenRdma(config.server, server.context()); !st.ok()) {
    spdlog::critical("--transports rdma: {}", st.ToString());
    return StartFailureExitCode(st);
  }
  HttpEndpoint http(io, {[&server] { return server.context().RenderMetrics(); }, [&server] { return server.ready(); }},
                    server.context().accept_failure_log);
  // Signals, the drain deadline and the watchdog run on one strand, so stopping them is never concurrent with
  // their own handlers.
  auto lifecycle = boost::asio::make_strand(io);
  SystemdNotifier systemd(lifecycle);
  // Caught from before the port files and readiness say the daemon serves (handled below): a SIGHUP or SIGTERM
  // sent as soon as the port file appeared found the default actions still in place and ended the daemon at once.
  boost::asio::signal_set signals(lifecycle, SIGINT, SIGTERM, SIGHUP);

  if (!config.metrics_listen.empty()) {
    auto bound = http.Listen(config.metrics_listen);
    if (!bound.ok()) {
      spdlog::critical("{}", bound.status().ToString());
      return StartFailureExitCode(bound.status());
    }
    spdlog::info("metrics, health and readiness on http://{}/", sparsereduce::tcp::EndpointText(*bound));
    if (Status st = WritePortFile("metrics-port-file", config.metrics_port_file, bound->port()); !st.ok()) {
      spdlog::critical("{}", st.ToString());
      return 2;
    }
    http.Start();
  }
  auto bound = server.Listen();
  if (!bound.ok()) {
    spdlog::critical("{}", bound.status().ToString());
    return StartFailureExitCode(bound.status());
  }
  for (const auto& endpoint : *bound) {
    spdlog::info("{}: listening on {}", config.server.name, sparsereduce::tcp::EndpointText(endpoint));
  }
  if (Status st = WritePortFile("port-file", config.port_file, bound->front().port()); !st.ok()) {
    spdlog::critical("{}", st.ToString());
    return 2;
  }
  server.StartAccepting();
  systemd.Ready("serving on " + std::to_string(bound->size()) + " address(es)");
  boost::asio::dispatch(lifecycle, [&] { systemd.StartWatchdog(); });

  // First SIGTERM/SIGINT: drain. A second one, or the drain deadline: abort what is left. Either way exit 0.
  // SIGHUP, which daemons often take as "reload", is ignored with a warning: its default action would end the
  // daemon at once, without a drain, and systemd counts that a clean exit, so it would not restart it either.
  boost::asio::steady_timer drain_deadline(lifecycle);
  bool finished = false;
  // Once: the jobs that Stop() aborts empty the registry, which posts the drain's own "drained" finish again.
  auto finish = [&](const std::string& why) {
    if (finished) return;
    finished = true;
    drain_deadline.cancel();
    signals.cancel();
    systemd.StopWatchdog();
    http.Stop();
    server.Stop(why);
  };
  std::function<void(const boost::system::error_code&, int)> on_signal;
  bool draining = false;
  on_signal = [&](const boost::system::error_code& ec, int signal) {
    if (ec) return;
    if (signal == SIGHUP) {
      spdlog::warn("signal {} (SIGHUP) ignored: there is nothing to reload (job secrets are read at every "
                   "handshake; other settings are read at start: restart the service to change them)",
                   signal);
      signals.async_wait(on_signal);
      return;
    }
    if (draining) {
      spdlog::warn("signal {} while draining: aborting the remaining jobs", signal);
      finish("it was signalled again while draining, before this job's collective finished");
      return;
    }
    draining = true;
    spdlog::info("signal {}: draining (running collectives may finish within {} ms)", signal,
                 config.drain_timeout.count());
    systemd.Stopping("draining");
    drain_deadline.expires_after(config.drain_timeout);
    drain_deadline.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      spdlog::warn("drain deadline of {} ms passed: aborting the remaining jobs", config.drain_timeout.count());
      finish("its --drain-timeout-ms of " + std::to_string(config.drain_timeout.count()) +
             " ms passed before this job's collective finished");
    });
    server.Drain([&] { boost::asio::post(lifecycle, [&] {
      if (finished) return;
      spdlog::info("drained: no job left");
      finish("drained");
    }); });
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);

  std::vector<std::thread> pool;
  for (uint32_t i = 1; i < threads; ++i) pool.emplace_back([&io] { io.run(); });
  io.run();
  for (auto& t : pool) t.join();
  spdlog::info("stopped");
  return 0;
}
