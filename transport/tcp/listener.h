// Opening a listening socket from "HOST:PORT" / "[IPV6]:PORT" text (port 0 picks a free port).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace sparsereduce::tcp {

// Resolves (numerically or by name), binds with SO_REUSEADDR (IPv6 listeners are v6-only, so "[::]:P" and
// "0.0.0.0:P" can both be given) and listens. `what` names the address in errors ("listen address"). The acceptor's
// completions run on `executor` (a strand, so that closing it is serialized with its accepts).
// How long a listener pauses after a failed accept before the next one. Out of file descriptors (or memory), the
// connection stays in the backlog and accepting again at once fails again at once: a busy loop. Long enough not
// to spin (and to log at most 10 lines a second), short enough that a freed descriptor is used soon.
inline constexpr std::chrono::milliseconds kAcceptRetryDelay{100};

Result<std::unique_ptr<boost::asio::ip::tcp::acceptor>> OpenListener(const boost::asio::any_io_executor& executor,
                                                                     const std::string& address,
                                                                     const std::string& what);

}  // namespace sparsereduce::tcp
