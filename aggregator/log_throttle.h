// A bound on how many lines one kind of log message may write: `burst` per `window`, the rest held back and counted.
// The daemon logs every connection it refuses or that fails its handshake, and any client can open connections as
// fast as it likes: unbounded, those lines would bury the ones an operator needs, and journald's own rate limit
// (10000 lines per 30 s per service by default) would then drop every line of the daemon, not only these. The
// refusals are still counted in sparsereduce_errors_total. Thread-safe.
//
// Pure logic on an injected clock: it has no timer of its own. So that the line about held-back messages comes when
// their window ends even if no later message comes (a burst, then silence), its owner arms a timer when told
// (OnHeldBack) and calls ReportHeldBack when it fires, and once more at shutdown (Server does both).
#pragma once

#include <spdlog/common.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

namespace sparsereduce::aggregator {

class LogThrottle {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using Clock = std::function<TimePoint()>;

  // `what` completes the line that reports held-back messages: "N more messages about <what> were not logged";
  // `level` is theirs, and so that line's (an operator who does not see them is not told about them either).
  LogThrottle(std::string what, spdlog::level::level_enum level, uint32_t burst,
              std::chrono::steady_clock::duration window, Clock clock = std::chrono::steady_clock::now);
  LogThrottle(const LogThrottle&) = delete;
  LogThrottle& operator=(const LogThrottle&) = delete;

  // True if a message may be written now. The first message let through after some were held back is preceded by
  // a line that says how many.
  bool Admit();

  // `notify` is called (outside the lock, on the thread of the Admit that held a message back) with the end of the
  // current window whenever a message is held back and none was held back since the last report: the owner calls
  // ReportHeldBack at or after that time. Set it before the throttle is used.
  void OnHeldBack(std::function<void(TimePoint window_end)> notify);

  // Writes the line about the messages held back, if any, once the window they were held back in is over, or at
  // once with `final` (at shutdown). Returns the end of that window when some are held back and it is not over yet
  // (call again then), else nothing.
  std::optional<TimePoint> ReportHeldBack(bool final = false);

  // Messages held back since the start (for tests and the curious).
  uint64_t suppressed_total() const;

 private:
  const std::string what_;
  const spdlog::level::level_enum level_;
  const uint32_t burst_;
  const std::chrono::steady_clock::duration window_;
  const Clock clock_;
  std::function<void(TimePoint)> on_held_back_;
  mutable std::mutex mutex_;
  std::chrono::steady_clock::time_point window_start_{};
  bool started_ = false;
  uint32_t admitted_in_window_ = 0;
  uint64_t suppressed_since_last_ = 0;  // held back since the last message let through
  uint64_t suppressed_total_ = 0;

  void Log(uint64_t held_back) const;
};

}  // namespace sparsereduce::aggregator
