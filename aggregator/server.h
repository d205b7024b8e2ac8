// The aggregator daemon's network front: listeners that hand each accepted connection to a Session.
#pragma once

#include <boost/asio/io_context.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "aggregator/job_registry.h"
#include "aggregator/server_options.h"
#include "aggregator/service_context.h"
#include "core/status.h"

namespace sparsereduce::aggregator {

class Server {
 public:
  Server(boost::asio::io_context& io, ServerOptions options);
  // Reports the log lines still held back (LogThrottle).
  ~Server();

  // Binds every listen address; returns the bound endpoints (with the real port when 0 was asked for).
  Result<std::vector<boost::asio::ip::tcp::endpoint>> Listen();
  void StartAccepting();
  // Stops accepting new connections and jobs; running collectives finish, then their jobs end with SHUTTING_DOWN.
  // `on_drained` runs once no job is left. Returns immediately.
  void Drain(std::function<void()> on_drained);
  // Stops accepting and aborts every job with SHUTTING_DOWN, whose message gives `why` (what ended the drain); returns
  // immediately. io.run() returns once the goodbyes are written (and the caller's own I/O objects are closed).
  void Stop(const std::string& why);

  const JobRegistry& registry() const { return registry_; }
  ServiceContext& context() { return context_; }
  // True once every listener is bound and until draining starts.
  bool ready() const { return listening_ && !context_.draining; }

 private:
  void Accept(size_t listener);
  void CloseAcceptors();
  // Arms `timer` (on acceptor_strand_) to report what `throttle` held back when its window ends.
  void ArmLogReport(LogThrottle& throttle, boost::asio::steady_timer& timer, LogThrottle::TimePoint window_end);
  void ReportHeldBackLogs();  // all of them, at once
  void StopLogTimers();

  boost::asio::io_context& io_;
  boost::asio::strand<boost::asio::io_context::executor_type> acceptor_strand_;  // acceptors and stopping_
  ServerOptions options_;
  Status allowlist_status_;
  ServiceContext context_;
  JobRegistry registry_;
  std::vector<std::unique_ptr<boost::asio::ip::tcp::acceptor>> acceptors_;
  // Per listener: the pause after a failed accept (e.g. out of file descriptors) before the next one.
  std::vector<std::unique_ptr<boost::asio::steady_timer>> accept_retry_;
  std::vector<std::string> bound_text_;  // per listener: its bound address, for the log
  // One per LogThrottle of context_: the line about held-back messages is written when their window ends, even if
  // no later message comes. On acceptor_strand_; cancelled by Stop, so that they do not delay the exit.
  boost::asio::steady_timer refusal_log_timer_{acceptor_strand_};
  boost::asio::steady_timer early_close_log_timer_{acceptor_strand_};
  boost::asio::steady_timer accept_failure_log_timer_{acceptor_strand_};
  bool log_timers_stopped_ = false;  // on acceptor_strand_
  bool stopping_ = false;
  std::atomic<bool> listening_{false};
};

}  // namespace sparsereduce::aggregator
