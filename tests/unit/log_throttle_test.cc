#include "aggregator/log_throttle.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

namespace sparsereduce::aggregator {
namespace {

using namespace std::chrono_literals;

// The default logger replaced by one writing into a string for the test's lifetime.
class CapturedLog {
 public:
  CapturedLog() : previous_(spdlog::default_logger()) {
    auto sink = std::make_shared<spdlog::sinks::ostream_sink_st>(text_);
    sink->set_pattern("%l %v");
    spdlog::set_default_logger(std::make_shared<spdlog::logger>("captured", sink));
  }
  ~CapturedLog() { spdlog::set_default_logger(previous_); }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
  std::shared_ptr<spdlog::logger> previous_;
};

struct FakeClock {
  std::chrono::steady_clock::time_point now{std::chrono::steady_clock::time_point{} + 1h};
};

TEST(LogThrottle, LetsABurstThroughPerWindowAndReportsWhatItHeldBack) {
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("refused connections", spdlog::level::warn, 3, 10s, [&] { return clock.now; });
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(throttle.Admit()) << i;
  for (int i = 0; i < 5; ++i) EXPECT_FALSE(throttle.Admit()) << i;
  EXPECT_EQ(throttle.suppressed_total(), 5u);
  EXPECT_EQ(log.text(), "") << "nothing is reported while the window lasts";

  clock.now += 9999ms;
  EXPECT_FALSE(throttle.Admit()) << "the window is not over";
  clock.now += 1ms;
  EXPECT_TRUE(throttle.Admit());
  EXPECT_EQ(log.text(),
            "warning 6 more messages about refused connections were not logged (at most 3 are logged per 10 s)\n");
  EXPECT_TRUE(throttle.Admit());
  EXPECT_TRUE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  EXPECT_EQ(throttle.suppressed_total(), 7u);
}

TEST(LogThrottle, AQuietWindowReportsNothing) {
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("x", spdlog::level::warn, 2, 1s, [&] { return clock.now; });
  for (int window = 0; window < 4; ++window) {
    EXPECT_TRUE(throttle.Admit());
    EXPECT_TRUE(throttle.Admit());
    clock.now += 1s;
  }
  EXPECT_EQ(throttle.suppressed_total(), 0u);
  EXPECT_EQ(log.text(), "");
}

TEST(LogThrottle, TheCountCoversEveryWindowSinceTheLastLine) {
  // Held back in one window and the next (each window's burst used up), reported once, with both counts.
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("x", spdlog::level::warn, 1, 1s, [&] { return clock.now; });
  EXPECT_TRUE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  clock.now += 1s;
  EXPECT_TRUE(throttle.Admit());
  EXPECT_EQ(log.text(), "warning 1 more message about x was not logged (at most 1 are logged per 1 s)\n");
  EXPECT_FALSE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  clock.now += 5s;
  EXPECT_TRUE(throttle.Admit());
  EXPECT_NE(log.text().find("warning 2 more messages about x"), std::string::npos) << log.text();
}

// The report of held-back messages has their level: info lines held back are reported at info, which a daemon
// logging warnings only does not show (it told such a daemon at warn about lines it never meant to see).
TEST(LogThrottle, ReportsAtTheLevelOfTheMessages) {
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("x", spdlog::level::info, 1, 1s, [&] { return clock.now; });
  EXPECT_TRUE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  clock.now += 1s;
  EXPECT_TRUE(throttle.Admit());
  EXPECT_EQ(log.text(), "info 1 more message about x was not logged (at most 1 are logged per 1 s)\n");
}

// After a burst and then silence, no later message brings the line about those held back: the owner is told when
// the window ends (once per report, not per message), and ReportHeldBack writes the line then, not before.
TEST(LogThrottle, ReportsWhatItHeldBackWhenTheWindowEndsWithoutALaterMessage) {
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("x", spdlog::level::warn, 2, 10s, [&] { return clock.now; });
  std::vector<std::chrono::steady_clock::time_point> notified;
  throttle.OnHeldBack([&](std::chrono::steady_clock::time_point end) { notified.push_back(end); });
  const auto window_end = clock.now + 10s;
  EXPECT_FALSE(throttle.ReportHeldBack().has_value()) << "nothing held back";
  EXPECT_TRUE(throttle.Admit());
  clock.now += 1s;
  EXPECT_TRUE(throttle.Admit());
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(throttle.Admit()) << i;
  ASSERT_EQ(notified.size(), 1u) << "told once, at the first message held back";
  EXPECT_EQ(notified[0], window_end);

  clock.now += 8999ms;  // 1 ms before the window ends
  EXPECT_EQ(throttle.ReportHeldBack(), std::optional(window_end)) << "too early: wait until the window ends";
  EXPECT_EQ(log.text(), "");
  clock.now += 1ms;
  EXPECT_FALSE(throttle.ReportHeldBack().has_value());
  EXPECT_EQ(log.text(), "warning 3 more messages about x were not logged (at most 2 are logged per 10 s)\n");
  EXPECT_FALSE(throttle.ReportHeldBack().has_value());
  EXPECT_TRUE(throttle.Admit()) << "a new window";
  EXPECT_EQ(log.text(), "warning 3 more messages about x were not logged (at most 2 are logged per 10 s)\n")
      << "reported once";

  // The next window's burst used up: told again, with that window's end.
  EXPECT_TRUE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  ASSERT_EQ(notified.size(), 2u);
  EXPECT_EQ(notified[1], clock.now + 10s);
}

// At shutdown what is held back is reported at once, whether or not its window is over.
TEST(LogThrottle, AFinalReportDoesNotWaitForTheWindow) {
  CapturedLog log;
  FakeClock clock;
  LogThrottle throttle("x", spdlog::level::warn, 1, 10s, [&] { return clock.now; });
  EXPECT_TRUE(throttle.Admit());
  EXPECT_FALSE(throttle.Admit());
  EXPECT_FALSE(throttle.ReportHeldBack(/*final=*/true).has_value());
  EXPECT_EQ(log.text(), "warning 1 more message about x was not logged (at most 1 are logged per 10 s)\n");
  EXPECT_FALSE(throttle.ReportHeldBack(/*final=*/true).has_value());
  EXPECT_EQ(log.text(), "warning 1 more message about x was not logged (at most 1 are logged per 10 s)\n");
}

}  // namespace
}  // namespace sparsereduce::aggregator
