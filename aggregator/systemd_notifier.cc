#include "aggregator/systemd_notifier.h"

#include <spdlog/spdlog.h>
#include <systemd/sd-daemon.h>

#include <cstring>

namespace sparsereduce::aggregator {

namespace {

void Notify(const std::string& state) {
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0) spdlog::warn("sd_notify({}) failed: {}", state, std::strerror(-rc));
}

}  // namespace

SystemdNotifier::SystemdNotifier(const boost::asio::any_io_executor& executor) : watchdog_timer_(executor) {}

void SystemdNotifier::Ready(const std::string& status) { Notify("READY=1\nSTATUS=" + status); }

void SystemdNotifier::Stopping(const std::string& status) { Notify("STOPPING=1\nSTATUS=" + status); }

void SystemdNotifier::StartWatchdog() {
  uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return;
  watchdog_interval_ = std::chrono::microseconds(usec / 2);
  spdlog::info("systemd watchdog: pinging every {} ms", watchdog_interval_.count() / 1000);
  Ping();
}

void SystemdNotifier::StopWatchdog() {
  stopped_ = true;
  watchdog_timer_.cancel();
}

void SystemdNotifier::Ping() {
  if (stopped_) return;
  Notify("WATCHDOG=1");
  watchdog_timer_.expires_after(watchdog_interval_);
  watchdog_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) Ping();
  });
}

}  // namespace sparsereduce::aggregator
