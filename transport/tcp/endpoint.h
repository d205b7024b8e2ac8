// "HOST:PORT" parsing for aggregator addresses and listen addresses; IPv6 literals go in brackets ("[::1]:7000").
#pragma once

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

}  // namespace sparsereduce::tcp
