#include "aggregator/log_throttle.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace sparsereduce::aggregator {

LogThrottle::LogThrottle(std::string what, spdlog::level::level_enum level, uint32_t burst,
                         std::chrono::steady_clock::duration window, Clock clock)
    : what_(std::move(what)), level_(level), burst_(burst), window_(window), clock_(std::move(clock)) {}

void LogThrottle::OnHeldBack(std::function<void(TimePoint)> notify) { on_held_back_ = std::move(notify); }

bool LogThrottle::Admit() {
  uint64_t held_back = 0;
  bool notify = false;
  TimePoint window_end{};
  {
    std::lock_guard lock(mutex_);
    const auto now = clock_();
    if (!started_ || now - window_start_ >= window_) {
      started_ = true;
      window_start_ = now;
      admitted_in_window_ = 0;
    }
    if (admitted_in_window_ >= burst_) {
      ++suppressed_total_;
      if (suppressed_since_last_++ > 0 || !on_held_back_) return false;
      notify = true;
      window_end = window_start_ + window_;
    } else {
      ++admitted_in_window_;
      held_back = std::exchange(suppressed_since_last_, 0);
    }
  }
  if (notify) {  // the first held back since the last report: the owner arms its timer
    on_held_back_(window_end);
    return false;
  }
  if (held_back > 0) Log(held_back);
  return true;
}

std::optional<LogThrottle::TimePoint> LogThrottle::ReportHeldBack(bool final) {
  uint64_t held_back = 0;
  {
    std::lock_guard lock(mutex_);
    if (suppressed_since_last_ == 0) return std::nullopt;
    const TimePoint window_end = window_start_ + window_;
    if (!final && clock_() < window_end) return window_end;
    held_back = std::exchange(suppressed_since_last_, 0);
  }
  Log(held_back);
  return std::nullopt;
}

void LogThrottle::Log(uint64_t held_back) const {
  const auto seconds = std::chrono::duration_cast<std::chrono::milliseconds>(window_).count() / 1000.0;
  const bool one = held_back == 1;
  spdlog::log(level_, "{} more {} about {} {} not logged (at most {} are logged per {} s)", held_back,
              one ? "message" : "messages", what_, one ? "was" : "were", burst_, seconds);
}

uint64_t LogThrottle::suppressed_total() const {
  std::lock_guard lock(mutex_);
  return suppressed_total_;
}

}  // namespace sparsereduce::aggregator
