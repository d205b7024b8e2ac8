#include "aggregator/server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>

#include "aggregator/job.h"
#include "aggregator/session.h"
#include "protocol/control.h"
#include "transport/tcp/endpoint.h"
#include "transport/tcp/listener.h"

namespace sparsereduce::aggregator {

namespace asio = boost::asio;
using asio::ip::tcp;

namespace {

NetworkAllowlist ParseAllowlist(const std::vector<std::string>& cidrs, Status* status) {
  Result<NetworkAllowlist> list = NetworkAllowlist::Parse(cidrs);
  if (!list.ok()) {
    *status = list.status();
    return NetworkAllowlist();
  }
  return std::move(*list);
}

// A client with --max-handshakes-per-address connections in their handshake opens another: it gets an Error at
// once (a new connection's send buffer takes it without blocking) and is closed, holding nothing. Not logged above
// debug, so that the refusals cannot flood the log; counted in sparsereduce_errors_total.
void RefuseBusyAddress(tcp::socket socket, const tcp::endpoint& remote, ServiceContext& context) {
  const std::string address = remote.address().to_string();
  const std::string peer = sparsereduce::tcp::HostPort{address, remote.port()}.ToString();
  const std::string text = "client " + peer + ": " + address + " already has " +
                           std::to_string(context.handshake_limit.per_address()) +
                           " connections in their handshake (--max-handshakes-per-address); connection refused";
  spdlog::debug("{}", text);
  context.metrics.Error(StatusCode::kResourceExhausted);
  proto::ControlMessage message;
  message.mutable_error()->set_code(ToProtoCode(StatusCode::kResourceExhausted));
  message.mutable_error()->set_message(text);
  const ByteBuffer frame = EncodeControl(message);
  boost::system::error_code ignored;
  socket.non_blocking(true, ignored);
  socket.write_some(asio::buffer(frame.data(), frame.size()), ignored);
  socket.shutdown(tcp::socket::shutdown_send, ignored);
  socket.close(ignored);
}

}  // namespace

Server::Server(asio::io_context& io, ServerOptions options)
    : io_(io),
      acceptor_strand_(asio::make_strand(io)),
      options_(std::move(options)),
      context_(options_, ParseAllowlist(options_.allow_networks, &allowlist_status_)),
      registry_(io, context_) {
  context_.refusal_log.OnHeldBack([this](LogThrottle::TimePoint end) {
    ArmLogReport(context_.refusal_log, refusal_log_timer_, end);
  });
  context_.early_close_log.OnHeldBack([this](LogThrottle::TimePoint end) {
    ArmLogReport(context_.early_close_log, early_close_log_timer_, end);
  });
  context_.accept_failure_log.OnHeldBack([this](LogThrottle::TimePoint end) {
    ArmLogReport(context_.accept_failure_log, accept_failure_log_timer_, end);
  });
}

Server::~Server() {
  // The I/O threads have ended: nothing calls Admit any more.
  context_.refusal_log.OnHeldBack(nullptr);
  context_.early_close_log.OnHeldBack(nullptr);
  context_.accept_failure_log.OnHeldBack(nullptr);
  ReportHeldBackLogs();
}

// A LogThrottle writes its line about held-back messages when a later message gets through; after a burst and then
// silence none does, so this timer writes it when the window ends (docs/OPERATIONS.md, Logs). Called from any
// thread (the Admit that held back the first message).
void Server::ArmLogReport(LogThrottle& throttle, asio::steady_timer& timer, LogThrottle::TimePoint window_end) {
  asio::dispatch(acceptor_strand_, [this, &throttle, &timer, window_end] {
    if (log_timers_stopped_) return;  // Stop reports what is held back, and ~Server what comes after
    timer.expires_at(window_end);
    timer.async_wait([this, &throttle, &timer](const boost::system::error_code& ec) {
      if (ec) return;  // cancelled: re-armed, or stopping
      if (const auto later = throttle.ReportHeldBack()) ArmLogReport(throttle, timer, *later);
    });
  });
}

void Server::ReportHeldBackLogs() {
  context_.refusal_log.ReportHeldBack(/*final=*/true);
  context_.early_close_log.ReportHeldBack(/*final=*/true);
  context_.accept_failure_log.ReportHeldBack(/*final=*/true);
}

Result<std::vector<tcp::endpoint>> Server::Listen() {
  if (!allowlist_status_.ok()) return allowlist_status_.WithContext("--allow-network");
  std::vector<tcp::endpoint> bound;
  for (const std::string& text : options_.listen) {
    auto acceptor = sparsereduce::tcp::OpenListener(acceptor_strand_, text, "listen address");
    if (!acceptor.ok()) return acceptor.status();
    std::unique_ptr<tcp::acceptor>& opened = *acceptor;
    bound.push_back(opened->local_endpoint());
    bound_text_.push_back(
        sparsereduce::tcp::EndpointText(bound.back()));
    acceptors_.push_back(std::move(opened));
    accept_retry_.push_back(std::make_unique<asio::steady_timer>(acceptor_strand_));
  }
  listening_ = true;
  return bound;
}

void Server::StartAccepting() {
  asio::dispatch(acceptor_strand_, [this] {
    for (size_t i = 0; i < acceptors_.size(); ++i) Accept(i);
  });
}

void Server::Accept(size_t listener) {
  tcp::acceptor& acceptor = *acceptors_[listener];
  acceptor.async_accept(asio::make_strand(io_), [this, listener](boost::system::error_code ec, tcp::socket socket) {
    if (stopping_ || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Pause (sparsereduce::tcp::kAcceptRetryDelay), and let closing connections free descriptors meanwhile.
      // Rate limited: out of descriptors this fails every pause for as long as the connections hold them.
      const auto delay = sparsereduce::tcp::kAcceptRetryDelay;
      if (context_.accept_failure_log.Admit()) {
        spdlog::warn("accept on {} failed: {}; retrying in {} ms", bound_text_[listener], ec.message(),
                     delay.count());
      }
      context_.metrics.Error(StatusCode::kResourceExhausted);
      accept_retry_[listener]->expires_after(delay);
      accept_retry_[listener]->async_wait([this, listener](const boost::system::error_code& wait_ec) {
        if (!wait_ec && !stopping_) Accept(listener);
      });
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    boost::system::error_code remote_ec;
    const tcp::endpoint remote = socket.remote_endpoint(remote_ec);
    if (Status st = sparsereduce::tcp::ApplyLiveness(socket, options_.liveness); !st.ok()) {
      spdlog::warn("connection from {} accepted on {}: {}",
                   remote_ec ? std::string("a peer already gone") : sparsereduce::tcp::EndpointText(remote),
                   bound_text_[listener], st.ToString());
    }
    std::optional<HandshakeLimit::Slot> slot;
    if (!remote_ec) {  // (else the connection is gone already, and its session ends at its first read)
      slot = context_.handshake_limit.TryAcquire(remote.address());
      if (!slot) {
        RefuseBusyAddress(std::move(socket), remote, context_);
        Accept(listener);
        return;
      }
    }
    std::make_shared<Session>(std::move(socket), registry_, context_)->Start(std::move(slot));
    Accept(listener);
  });
}

void Server::CloseAcceptors() {
  for (auto& acceptor : acceptors_) {
    boost::system::error_code ignored;
    acceptor->close(ignored);
  }
  for (auto& timer : accept_retry_) timer->cancel();
}

void Server::StopLogTimers() {  // on acceptor_strand_
  log_timers_stopped_ = true;
  refusal_log_timer_.cancel();
  early_close_log_timer_.cancel();
  accept_failure_log_timer_.cancel();
  ReportHeldBackLogs();
}

void Server::Drain(std::function<void()> on_drained) {
  asio::dispatch(acceptor_strand_, [this, on_drained = std::move(on_drained)]() mutable {
    if (stopping_) return;
    stopping_ = true;
    CloseAcceptors();
    registry_.StartDraining(std::move(on_drained));
  });
}

void Server::Stop(const std::string& why) {
  asio::dispatch(acceptor_strand_, [this, why] {
    stopping_ = true;
    context_.draining = true;
    context_.shm_offers.Stop();  // offers a hoarding peer never received must not keep the daemon from exiting
    CloseAcceptors();
    StopLogTimers();  // a pending report would keep io.run() from returning for up to a window
    context_.handshakes.CloseAll();  // connections that joined no job yet would otherwise wait for their deadline
    for (auto& job : registry_.Snapshot()) {
      asio::dispatch(job->strand(), [job, why] {
        job->Abort(Status(StatusCode::kShuttingDown,
                          "job " + std::to_string(job->id()) + ": the aggregator is shutting down: " + why),
                   {});
      });
    }
  });
}

}  // namespace sparsereduce::aggregator
