#include "aggregator/network_allowlist.h"

namespace sparsereduce::aggregator {

namespace ip = boost::asio::ip;

Result<NetworkAllowlist> NetworkAllowlist::Parse(const std::vector<std::string>& cidrs) {
  NetworkAllowlist list;
  for (const std::string& text : cidrs) {
    std::string cidr = text;
    boost::system::error_code ec;
    if (cidr.find('/') == std::string::npos) {
      const ip::address single = ip::make_address(cidr, ec);
      if (!ec) cidr += single.is_v4() ? "/32" : "/128";
    }
    ec.clear();
    if (cidr.find(':') == std::string::npos) {
      const ip::network_v4 net = ip::make_network_v4(cidr, ec);
      // A network with host bits set ("10.1.2.3/8") is almost always a typo for something else.
      if (!ec && net != net.canonical()) {
        return InvalidArgument("allowed network " + text + " has host bits set; did you mean " +
                               net.canonical().to_string() + "?");
      }
      if (!ec) list.v4_.push_back(net);
    } else {
      const ip::network_v6 net = ip::make_network_v6(cidr, ec);
      if (!ec && net != net.canonical()) {
        return InvalidArgument("allowed network " + text + " has host bits set; did you mean " +
                               net.canonical().to_string() + "?");
      }
      // A scope is an interface's (its name, or its number): Asio reads a name that is no interface as scope 0, which
      // would match link-local clients on every interface; and only link-local clients carry one.
      if (!ec && cidr.find('%') != std::string::npos) {
        if (net.address().scope_id() == 0) {
          return InvalidArgument("allowed network " + text + " names no interface of this host after '%'");
        }
        if (!net.address().is_link_local()) {
          return InvalidArgument("allowed network " + text +
                                 " has a scope, which only link-local networks (fe80::/10) take");
        }
      }
      // IPv4 clients, also those a dual-stack listener sees as ::ffff:a.b.c.d, match the IPv4 entries only: such an
      // entry would never match anything.
      if (!ec && net.prefix_length() >= 96 && net.address().is_v4_mapped()) {
        const ip::network_v4 v4(ip::make_address_v4(ip::v4_mapped, net.address()), net.prefix_length() - 96);
        return InvalidArgument("allowed network " + text + " is IPv4-mapped; IPv4 clients match IPv4 entries: write " +
                               v4.to_string());
      }
      if (!ec) list.v6_.push_back(net);
    }
    if (ec) return InvalidArgument("allowed network '" + text + "' is not a CIDR such as 10.0.0.0/8 or fd00::/8");
  }
  return list;
}

bool NetworkAllowlist::Allows(const ip::address& address) const {
  if (empty()) return true;
  ip::address a = address;
  if (a.is_v6() && a.to_v6().is_v4_mapped()) a = ip::make_address_v4(ip::v4_mapped, a.to_v6());
  if (a.is_v4()) {
    const ip::network_v4 host(a.to_v4(), 32);
    for (const auto& net : v4_) {
      if (host == net || host.is_subnet_of(net)) return true;
    }
    return false;
  }
  for (const auto& net : v6_) {
    // Asio compares scope ids too: an entry without one ("fe80::/10", "::/0") matches a link-local client on any
    // interface (its address carries "%eth0"), one with a scope ("fe80::%eth0/10") only on that interface.
    ip::address_v6 client = a.to_v6();
    const unsigned long scope = net.address().scope_id();
    if (scope != 0 && client.scope_id() != scope) continue;
    client.scope_id(scope);
    const ip::network_v6 host(client, 128);
    if (host == net || host.is_subnet_of(net)) return true;
  }
  return false;
}

}  // namespace sparsereduce::aggregator
