#include "transport/tcp/listener.h"

#include <net/if.h>

#include <boost/asio/ip/v6_only.hpp>

#include "transport/tcp/endpoint.h"

namespace sparsereduce::tcp {

namespace asio = boost::asio;
using asio::ip::tcp;

Result<std::unique_ptr<tcp::acceptor>> OpenListener(const asio::any_io_executor& executor, const std::string& address,
                                                    const std::string& what) {
  Result<HostPort> hp = ParseHostPort(address);
  if (!hp.ok()) return hp.status().WithContext(what);
  boost::system::error_code ec;
  tcp::resolver resolver(executor);
  auto results = resolver.resolve(hp->host, std::to_string(hp->port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    // A name server that does not answer yet (at boot) and an interface that does not exist yet (a scoped link-local
    // address on a late interface) may be there later: UNAVAILABLE, which the daemon's exit code lets systemd retry.
    // Anything else is a mistake in the address.
    const size_t percent = hp->host.find('%');
    const std::string scope = percent == std::string::npos ? "" : hp->host.substr(percent + 1);
    const bool interface_missing = scope.find_first_not_of("0123456789") != std::string::npos &&
                                   if_nametoindex(scope.c_str()) == 0;  // a name, not a number, of no interface
    if (ec == asio::error::host_not_found_try_again || interface_missing) {
      return Status(StatusCode::kUnavailable,
                    "cannot resolve " + what + " " + address + ": " +
                        (interface_missing ? "this host has no interface " + scope + " (yet)" : ec.message()));
    }
    return Status(StatusCode::kInvalidArgument, "cannot resolve " + what + " " + address + ": " + ec.message());
  }
  const tcp::endpoint endpoint = results.begin()->endpoint();
  auto acceptor = std::make_unique<tcp::acceptor>(executor);
  acceptor->open(endpoint.protocol(), ec);
  if (!ec) acceptor->set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec && endpoint.address().is_v6()) acceptor->set_option(asio::ip::v6_only(true), ec);
  if (!ec) acceptor->bind(endpoint, ec);
  if (!ec) acceptor->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status(StatusCode::kUnavailable, "cannot listen on " + what + " " + address + ": " + ec.message());
  return acceptor;
}

}  // namespace sparsereduce::tcp
