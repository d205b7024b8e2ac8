// The operations HTTP endpoint (--metrics-listen): GET /metrics (Prometheus text format 0.0.4), /healthz (200
// while the process serves) and /readyz (200 when ready, 503 while starting or draining). Boost.Beast, on the
// daemon's io_context; each connection has a 10 s deadline per request and a small request size limit, and at most
// kMaxConnections are served at once (a new one closes the longest-open one), so clients can hold neither the
// descriptors the data plane needs nor every place the probes need. It keeps one descriptor in reserve (an open
// /dev/null), so that the probes are still answered when the data-plane connections have taken every other one.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "aggregator/connection_set.h"
#include "aggregator/log_throttle.h"
#include "core/status.h"

namespace sparsereduce::aggregator {

class HttpEndpoint {
 public:
  // A scraper and a few probes need a handful.
  static constexpr size_t kMaxConnections = 64;

  struct Handlers {
    std::function<std::string()> metrics;  // the exposition text
    std::function<bool()> ready;
  };

  // `accept_failures` rate-limits the line about a failed accept (the data-plane listeners' throttle: out of
  // descriptors, both fail at every pause); it must outlive the endpoint.
  HttpEndpoint(boost::asio::io_context& io, Handlers handlers, LogThrottle& accept_failures);
  ~HttpEndpoint();
  HttpEndpoint(const HttpEndpoint&) = delete;
  HttpEndpoint& operator=(const HttpEndpoint&) = delete;

  // Binds HOST:PORT (port 0 picks one); returns the bound endpoint.
  Result<boost::asio::ip::tcp::endpoint> Listen(const std::string& address);
  void Start();
  // Closes the listener and every connection (a response being written is cut off).
  void Stop();

 private:
  boost::asio::awaitable<void> AcceptLoop();
  void ReserveSpare();  // on strand_ (or before Start)
  void ReleaseSpare();  // on strand_

  boost::asio::io_context& io_;
  boost::asio::strand<boost::asio::io_context::executor_type> strand_;  // the acceptor's
  Handlers handlers_;
  LogThrottle& accept_failures_;
  std::unique_ptr<boost::asio::ip::tcp::acceptor> acceptor_;
  // The descriptor held in reserve for an accept that fails for want of one (EMFILE/ENFILE), or -1 while a
  // connection uses its place. On strand_.
  int spare_ = -1;
  ConnectionSet connections_;  // being served; each connection's coroutine removes itself when it ends
};

}  // namespace sparsereduce::aggregator
