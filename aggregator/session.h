// One worker connection on the aggregator: handshake, then a read loop that feeds the worker's job. Everything
// after the handshake runs on the job's strand.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "aggregator/handshake_limit.h"
#include "core/status.h"
#include "proto/control.pb.h"
#include "transport/channel.h"
#include "transport/shm/handoff.h"
#if SPARSEREDUCE_HAVE_RDMA
#include "transport/rdma/channel.h"
#endif
#include "transport/tcp/frame_stream.h"

namespace sparsereduce::aggregator {

class Job;
class JobRegistry;
struct ServiceContext;

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::Socket socket, JobRegistry& registry, ServiceContext& context);
  ~Session();

  // Runs the session to completion. `slot`: the place among its address's handshakes (--max-handshakes-per-address),
  // given back when the handshake ends.
  void Start(std::optional<HandshakeLimit::Slot> slot);

  const std::string& peer() const { return peer_; }
  uint32_t rank() const { return hello_.rank(); }
  const proto::Hello& hello() const { return hello_; }
  // "tcp" or "shm": what the connection runs on after the handshake.
  const char* transport() const { return channel_ ? channel_->kind() : "tcp"; }
  // Frames queued for this worker and not yet written (it reads more slowly than they come).
  size_t queued_frames() const { return channel_ ? channel_->queued_frames() : 0; }
  // See transport::Channel::NotifyWhenQueuedAtMost.
  void NotifyWhenQueuedAtMost(size_t frames, std::function<void()> handler) {
    if (channel_) channel_->NotifyWhenQueuedAtMost(frames, std::move(handler));
  }

  // On the job strand, once joined:
  void Send(std::shared_ptr<const ByteBuffer> frame);
  void SendControl(const proto::ControlMessage& message);
  // Sends `error` as an Error message, then closes the connection.
  void Fail(const Status& error, uint64_t seq, const std::vector<uint32_t>& ranks);
  void Close();

 private:
  boost::asio::awaitable<void> Handshake();
  boost::asio::awaitable<Result<proto::ControlMessage>> ReadControl();
  // The job's HMAC challenge-response (docs/PROTOCOL.md §5.1), or its refusal; ok when the job needs none.
  boost::asio::awaitable<Status> Authenticate();
  // Offers shared memory, then RDMA, as far as both the worker and this aggregator allow them (docs/PROTOCOL.md
  // §10); ok when the connection stays on TCP because the worker declined.
  boost::asio::awaitable<Status> OfferTransport(std::chrono::steady_clock::time_point deadline);
  boost::asio::awaitable<Status> OfferShm(std::chrono::steady_clock::time_point deadline);
#if SPARSEREDUCE_HAVE_RDMA
  boost::asio::awaitable<Status> OfferRdma(std::chrono::steady_clock::time_point deadline);
#endif
  std::string Who() const;  // "job J rank R (peer)"
  boost::asio::awaitable<Status> WriteControl(const proto::ControlMessage& message);
  // The channel for the rest of the connection, on `executor`: over the shm segment handed off, or over socket_.
  std::unique_ptr<transport::Channel> MakeChannel(const boost::asio::any_io_executor& executor);
  boost::asio::awaitable<void> ReadLoop(std::shared_ptr<Job> job);
  // Runs ReadLoop on the job's strand.
  void SpawnReadLoop(const std::shared_ptr<Job>& job);
  // An exception escaped Handshake or ReadLoop (core/exception_text.h), on their strand: logged, the job (when
  // the connection had gone to one) loses the rank, and the connection ends with an INTERNAL Error.
  void EndOnException(const char* what, const std::shared_ptr<Job>& job, const std::exception_ptr& error);
  // After Close: the connection is aborted unless the worker closes it within 5 s.
  void ArmCloseGrace();
  void RejectBeforeJoin(const Status& error);
  // A refused connection, closing (Fail): drops what the worker still sends until it closes, then ends the close
  // grace, so that the connection (with its handshake place) goes at once rather than after 5 s; the grace bounds
  // the wait for a worker that does not close.
  boost::asio::awaitable<void> DrainUntilClosed();
  // The read loop of a member ends with `reason`, which the job is told. When it answered with an Error (closed_:
  // a violation, or an abort), what the worker still sends is dropped until it closes or the close grace ends:
  // the loop (and so the job and this session) stays until then, and the queued RESULTs and the Error are written
  // instead of being lost to a reset when the job goes (docs/PROTOCOL.md §5).
  boost::asio::awaitable<void> EndMembership(Job& job, uint32_t rank, const Status& reason);
  // The connection goes to its job (on the session strand): Server::Stop no longer ends it through
  // context_.handshakes. Its address's handshake place is freed once the job has taken it as a member (ReadLoop);
  // a connection refused before (in its handshake, or by the job's Join) keeps it until it is closed (its close
  // grace), so that refusals cannot pile up connections past the limit.
  void HandOverToJob();
  // Server::Stop, on the session strand: closes the connection unless it went to its job.
  void StopHandshake();

  tcp::Socket socket_;  // the handshake runs on it; then it moves into channel_
  boost::asio::any_io_executor executor_;  // the session strand, then the job strand
  const boost::asio::any_io_executor handshake_strand_;  // the session strand
  // In context_.handshakes while the handshake runs (on the session strand); reset when the connection goes to its
  // job.
  std::optional<uint64_t> handshake_id_;
  // Held until the job takes the connection as a member, or the connection ends: one the job refuses (JOB_FULL,
  // a mismatch) keeps it while it waits for the worker to close, as one refused in its handshake does.
  std::optional<HandshakeLimit::Slot> handshake_slot_;
  bool handshake_stopped_ = false;        // on the session strand: Server::Stop closed the socket
  // Where the handshake is, for the warning when its deadline ends it: which side it waited for, and on what.
  std::string handshake_step_ = "waiting for the Hello";
  JobRegistry& registry_;
  ServiceContext& context_;
  std::string peer_;
  proto::Hello hello_;
  // Frames after the handshake (and the Error of a refused handshake), on executor_.
  std::unique_ptr<transport::Channel> channel_;
  std::unique_ptr<shm::ShmOffer> shm_;  // set once the worker took the segment
#if SPARSEREDUCE_HAVE_RDMA
  std::unique_ptr<rdma::RdmaConnection> rdma_;  // set once the queue pair is connected
#endif
  // The worker accepted an RDMA offer, so it reads nothing more on TCP: a refusal then closes without an Error.
  bool worker_left_tcp_ = false;
  bool closed_ = false;
  std::shared_ptr<boost::asio::steady_timer> close_grace_;  // after Close: how long the worker may take to close
};

}  // namespace sparsereduce::aggregator
