// "HOST:PORT" parsing for aggregator addresses and listen addresses; IPv6 literals go in brackets ("[::1]:7000").
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace sparsereduce::tcp {

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string ToString() const;
};

Result<HostPort> ParseHostPort(const std::string& text);

// HOST:PORT of an endpoint, an IPv6 host in brackets ([::1]:34843), as --listen takes it and URLs write it.
std::string EndpointText(const boost::asio::ip::tcp::endpoint& endpoint);

}  // namespace sparsereduce::tcp
