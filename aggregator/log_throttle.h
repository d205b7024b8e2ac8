// A bound on how many lines one kind of log message may write: `burst` per `window`, the rest held back and counted.
// The daemon logs every connection it refuses or that fails its handshake, and any client can open connections as
// fast as it likes: unbounded, those lines would bury the ones an operator needs, and journald's own rate limit
// (10000 lines per 30 s per service by default) would then drop every line of the daemon, not only these. The
// refusals are still counted in sparsereduce_errors_total. Thread-safe.
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace sparsereduce::aggregator {

class LogThrottle {
 public:
  using Clock = std::function<std::chrono::steady_clock::time_point()>;

  // `what` completes the line that reports held-back messages: "N more messages about <what> were not logged";
  // `level` is theirs, and so that line's (an operator who does not see them is not told about them either).
  LogThrottle(std::string what, spdlog::level::level_enum level, uint32_t burst,
              std::chrono::steady_clock::duration window, Clock clock = std::chrono::steady_clock::now);
  LogThrottle(const LogThrottle&) = delete;
  LogThrottle& operator=(const LogThrottle&) = delete;

  // True if a message may be written now. The first message let through after some were held back is preceded by
  // a line that says how many.
  bool Admit();

  // Messages held back since the start (for tests and the curious).
  uint64_t suppressed_total() const;

 private:
  const std::string what_;
  const spdlog::level::level_enum level_;
  const uint32_t burst_;
  const std::chrono::steady_clock::duration window_;
  const Clock clock_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point window_start_{};
  bool started_ = false;
  uint32_t admitted_in_window_ = 0;
  uint64_t suppressed_since_last_ = 0;  // held back since the last message let through
  uint64_t suppressed_total_ = 0;
};

}  // namespace sparsereduce::aggregator
