#include "aggregator/log_throttle.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace sparsereduce::aggregator {

LogThrottle::LogThrottle(std::string what, spdlog::level::level_enum level, uint32_t burst,
                         std::chrono::steady_clock::duration window, Clock clock)
    : what_(std::move(what)), level_(level), burst_(burst), window_(window), clock_(std::move(clock)) {}

bool LogThrottle::Admit() {
  uint64_t held_back = 0;
  {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    if (!started_ || now - window_start_ >= window_) {
      started_ = true;
      window_start_ = now;
      admitted_in_window_ = 0;
    }
    if (admitted_in_window_ >= burst_) {
      ++suppressed_since_last_;
      ++suppressed_total_;
      return false;
    }
    ++admitted_in_window_;
    held_back = std::exchange(suppressed_since_last_, 0);
  }
  if (held_back > 0) {
    const auto seconds = std::chrono::duration_cast<std::chrono::milliseconds>(window_).count() / 1000.0;
    const bool one = held_back == 1;
    spdlog::log(level_, "{} more {} about {} {} not logged (at most {} are logged per {} s)", held_back,
                one ? "message" : "messages", what_, one ? "was" : "were", burst_, seconds);
  }
  return true;
}

uint64_t LogThrottle::suppressed_total() const {
  std::lock_guard lock(mutex_);
  return suppressed_total_;
}

}  // namespace sparsereduce::aggregator
