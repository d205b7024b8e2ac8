// systemd service notifications (Type=notify): READY=1 once every listener is bound, STOPPING=1 when draining
// starts, and WATCHDOG=1 every half WatchdogSec while the event loop runs. Does nothing when the daemon was not
// started by systemd (no NOTIFY_SOCKET).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <string>

namespace sparsereduce::aggregator {

class SystemdNotifier {
 public:
  // Timer completions run on `executor` (a strand shared with the caller's lifecycle handlers).
  explicit SystemdNotifier(const boost::asio::any_io_executor& executor);

  void Ready(const std::string& status);
  void Stopping(const std::string& status);
  // Starts the watchdog pings if systemd asked for them (WATCHDOG_USEC); the pings come from the io_context, so
  // a stuck event loop stops them and systemd restarts the daemon.
  void StartWatchdog();
  // Call on the executor given to the constructor.
  void StopWatchdog();

 private:
  void Ping();

  boost::asio::steady_timer watchdog_timer_;
  std::chrono::microseconds watchdog_interval_{0};
  bool stopped_ = false;
};

}  // namespace sparsereduce::aggregator
