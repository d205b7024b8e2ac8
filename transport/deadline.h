// A deadline on a wait: closes an object (a socket, an acceptor) when it expires, which ends every wait on it.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <memory>

namespace sparsereduce::transport {

// Closes `target` at `when` unless cancelled (or destroyed) first. The expiry handler may already be queued, with
// success, when Cancel runs; it then finds no target and does nothing, so it never touches an object that has
// gone or moved on (e.g. a socket that another strand now reads). It must run on the executor of whoever calls
// Cancel (a strand), as the timer's completions do when `executor` is that strand.
template <typename Closable>
class Deadline {
 public:
  Deadline(const boost::asio::any_io_executor& executor, std::chrono::steady_clock::time_point when, Closable& target)
      : timer_(executor, when), state_(std::make_shared<State>(State{false, &target})) {
    timer_.async_wait([state = state_](const boost::system::error_code& ec) {
      if (ec || state->target == nullptr) return;
      state->expired = true;
      boost::system::error_code ignored;
      state->target->close(ignored);
    });
  }
  ~Deadline() { Cancel(); }
  Deadline(const Deadline&) = delete;
  Deadline& operator=(const Deadline&) = delete;

  void Cancel() {
    state_->target = nullptr;
    timer_.cancel();
  }
  // True once it has closed the target.
  bool expired() const { return state_->expired; }
  std::chrono::steady_clock::time_point expiry() const { return timer_.expiry(); }

 private:
  struct State {
    bool expired;
    Closable* target;
  };
  boost::asio::steady_timer timer_;
  std::shared_ptr<State> state_;
};

}  // namespace sparsereduce::transport
