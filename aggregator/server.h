// The aggregator daemon's network front: listeners that hand each accepted connection to a Session.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <vector>

#include "aggregator/job_registry.h"
#include "aggregator/server_options.h"
#include "core/status.h"

namespace sparsereduce::aggregator {

class Server {
 public:
  Server(boost::asio::io_context& io, ServerOptions options);

  // Binds every listen address; returns the bound endpoints (with the real port when 0 was asked for).
  Result<std::vector<boost::asio::ip::tcp::endpoint>> Listen();
  void StartAccepting();
  // Stops accepting and aborts every job with SHUTTING_DOWN; returns immediately. io.run() returns once the
  // goodbyes are written.
  void Stop();

  const JobRegistry& registry() const { return registry_; }

 private:
  void Accept(boost::asio::ip::tcp::acceptor& acceptor);

  boost::asio::io_context& io_;
  ServerOptions options_;
  JobRegistry registry_;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> acceptors_;
  bool stopping_ = false;
};

}  // namespace sparsereduce::aggregator
