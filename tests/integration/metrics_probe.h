// The daemon's operations endpoint seen from a test: one HTTP GET, one sample of the Prometheus text, and a bounded
// wait for a state only observable from outside (the daemon runs in its own process).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

namespace sparsereduce::testing {

struct HttpReply {
  int status = 0;
  std::string body;
};

// GET `target` from 127.0.0.1:`port` (HTTP/1.1, 5 s deadline); throws on a connection or protocol failure.
HttpReply HttpGet(uint16_t port, const std::string& target);

// The value of the first sample whose line matches `series` (a regex over the name and labels), or -1.
double Sample(const std::string& metrics, const std::string& series);

// Waits (bounded) until `condition` holds, checking every 10 ms.
template <typename F>
bool Eventually(F condition, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

}  // namespace sparsereduce::testing
