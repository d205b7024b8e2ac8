#include "aggregator/server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/strand.hpp>

#include "aggregator/job.h"
#include "aggregator/session.h"
#include "transport/tcp/endpoint.h"

namespace sparsereduce::aggregator {

namespace asio = boost::asio;
using asio::ip::tcp;

Server::Server(asio::io_context& io, ServerOptions options)
    : io_(io), options_(std::move(options)), registry_(io, options_) {}

Result<std::vector<tcp::endpoint>> Server::Listen() {
  std::vector<tcp::endpoint> bound;
  for (const std::string& text : options_.listen) {
    Result<sparsereduce::tcp::HostPort> hp = sparsereduce::tcp::ParseHostPort(text);
    if (!hp.ok()) return hp.status();
    boost::system::error_code ec;
    tcp::resolver resolver(io_);
    auto results = resolver.resolve(hp->host, std::to_string(hp->port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
    if (ec || results.empty()) {
      return Status(StatusCode::kInvalidArgument, "cannot resolve listen address " + text + ": " + ec.message());
    }
    const tcp::endpoint endpoint = results.begin()->endpoint();
    auto acceptor = std::make_unique<tcp::acceptor>(io_);
    acceptor->open(endpoint.protocol(), ec);
    if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec && endpoint.address().is_v6()) acceptor->set_option(asio::ip::v6_only(true), ec);
    if (!ec) acceptor->bind(endpoint, ec);
    if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Status(StatusCode::kUnavailable, "cannot listen on " + text + ": " + ec.message());
    bound.push_back(acceptor->local_endpoint());
    acceptors_.push_back(std::move(acceptor));
  }
  return bound;
}

void Server::StartAccepting() {
  for (auto& acceptor : acceptors_) Accept(*acceptor);
}

void Server::Accept(tcp::acceptor& acceptor) {
  acceptor.async_accept(asio::make_strand(io_), [this, &acceptor](boost::system::error_code ec, tcp::socket socket) {
    if (stopping_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      spdlog::warn("accept failed: {}", ec.message());
    } else {
      socket.set_option(tcp::no_delay(true), ec);
      if (Status st = sparsereduce::tcp::ApplyLiveness(socket, options_.liveness); !st.ok()) {
        spdlog::warn("accepted connection: {}", st.ToString());
      }
      std::make_shared<Session>(std::move(socket), registry_, options_)->Start();
    }
    Accept(acceptor);
  });
}

void Server::Stop() {
  asio::dispatch(io_, [this] {
    if (stopping_) return;
    stopping_ = true;
    for (auto& acceptor : acceptors_) {
      boost::system::error_code ignored;
      acceptor->close(ignored);
    }
    for (auto& job : registry_.Snapshot()) {
      asio::dispatch(job->strand(), [job] {
        job->Abort(Status(StatusCode::kShuttingDown, "the aggregator is shutting down"), {});
      });
    }
  });
}

}  // namespace sparsereduce::aggregator
