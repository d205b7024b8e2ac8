#include "transport/tcp/endpoint.h"

#include <algorithm>
#include <charconv>

namespace sparsereduce::tcp {

std::string HostPort::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<HostPort> ParseHostPort(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return InvalidArgument("bad address '" + text + "': " + why + " (expected HOST:PORT or [IPV6]:PORT)");
  };
  HostPort out;
  std::string port;
  if (!text.empty() && text[0] == '[') {
    const size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return bad("unterminated IPv6 literal");
    }
    out.host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string::npos) return bad("missing port");
    out.host = text.substr(0, colon);
    if (out.host.find(':') != std::string::npos) return bad("IPv6 addresses must be written in brackets");
    port = text.substr(colon + 1);
  }
  if (out.host.empty()) return bad("empty host");
  if (std::any_of(out.host.begin(), out.host.end(), [](unsigned char c) { return c <= ' ' || c == 0x7f; })) {
    return bad("spaces or control characters in the host");
  }
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || port.empty() || value > 65535) {
    return bad("port must be a number 0-65535");
  }
  out.port = static_cast<uint16_t>(value);
  return out;
}

std::string EndpointText(const boost::asio::ip::tcp::endpoint& endpoint) {
  return HostPort{endpoint.address().to_string(), endpoint.port()}.ToString();
}

}  // namespace sparsereduce::tcp
