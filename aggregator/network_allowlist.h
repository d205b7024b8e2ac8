// The client networks allowed to connect (--allow-network CIDR, repeatable). Empty allows everyone.
#pragma once

#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/network_v4.hpp>
#include <boost/asio/ip/network_v6.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace sparsereduce::aggregator {

class NetworkAllowlist {
 public:
  // Parses "10.0.0.0/8", "fd00::/8", "fe80::%eth0/10" or a single address (a /32 or /128). INVALID_ARGUMENT names
  // the bad entry (host bits set, an IPv4-mapped IPv6 network, a scope that names no interface or is not on a
  // link-local network).
  static Result<NetworkAllowlist> Parse(const std::vector<std::string>& cidrs);

  // IPv4-mapped IPv6 addresses (::ffff:a.b.c.d, seen on dual-stack listeners) match as their IPv4 address. An IPv6
  // entry without a scope matches its addresses on every interface; one with a scope only on that one.
  bool Allows(const boost::asio::ip::address& address) const;
  bool empty() const { return v4_.empty() && v6_.empty(); }

 private:
  std::vector<boost::asio::ip::network_v4> v4_;
  std::vector<boost::asio::ip::network_v6> v6_;
};

}  // namespace sparsereduce::aggregator
