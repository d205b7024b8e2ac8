// An aggregator's host name looked up on a thread of its own, awaited with a deadline and a cancel. getaddrinfo
// cannot be interrupted, and Asio's resolver holds the io_context's work until it returns: a DNS server that did
// not answer held the Worker's constructor past its deadlines and its cancel, and its destructor, for as long. A
// lookup given up on finishes on its thread and is dropped.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace sparsereduce::worker {

// The TCP endpoints of `host` (a name or a numeric address) and `port`, as getaddrinfo gives them (AI_ADDRCONFIG).
// Waits on `wait`, which it sets to `deadline`: cancelling it (the link's Close) ends the wait with ABORTED, the
// deadline with DEADLINE_EXCEEDED; a failed lookup is UNAVAILABLE with getaddrinfo's reason. `wait` must outlive
// the coroutine.
boost::asio::awaitable<Result<std::vector<boost::asio::ip::tcp::endpoint>>> LookUpHost(
    const std::string& host, uint16_t port, boost::asio::steady_timer& wait,
    std::chrono::steady_clock::time_point deadline);

}  // namespace sparsereduce::worker
