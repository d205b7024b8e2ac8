// Waiting until a TCP socket really has something to read: data, its end of file, or an error.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/system/error_code.hpp>

namespace sparsereduce::tcp {

// Completes once a read of `socket` would not block, and reads nothing. A wait that completes with nothing to read
// (it happens: readiness is a hint) is waited past; the aggregator took one for a worker's answer it never sent.
// The error code is the wait's (the socket closed under it: the caller's deadline or a stop).
boost::asio::awaitable<boost::system::error_code> WaitUntilReadable(boost::asio::ip::tcp::socket& socket);

}  // namespace sparsereduce::tcp
