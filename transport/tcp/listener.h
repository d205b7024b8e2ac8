// Opening a listening socket from "HOST:PORT" / "[IPV6]:PORT" text (port 0 picks a free port).
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <memory>
#include <string>

#include "core/status.h"

namespace sparsereduce::tcp {

// Resolves (numerically or by name), binds with SO_REUSEADDR (IPv6 listeners are v6-only, so "[::]:P" and
// "0.0.0.0:P" can both be given) and listens. `what` names the address in errors ("listen address").
Result<std::unique_ptr<boost::asio::ip::tcp::acceptor>> OpenListener(boost::asio::io_context& io,
                                                                     const std::string& address,
                                                                     const std::string& what);

}  // namespace sparsereduce::tcp
