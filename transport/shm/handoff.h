// Setting up a shm connection beside an established TCP connection (docs/PROTOCOL.md §10). The aggregator creates
// the segment and listens on a fresh abstract Unix socket, whose name and a random token it sends over TCP; the
// worker connects to that socket, presents the token and receives the segment's descriptors. Abstract sockets
// belong to a network namespace, so the worker reaches it exactly when it shares the aggregator's host (and
// network namespace), which is when shared memory is the right transport.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "core/status.h"
#include "transport/channel.h"
#include "transport/shm/segment.h"

namespace sparsereduce::shm {

inline constexpr size_t kTokenBytes = 16;
// What a worker lists in Hello.transports to be offered shared memory as this build hands it over (socket-pair
// wake-ups, docs/PROTOCOL.md §10.1). A worker of an earlier build lists "shm" and expects eventfds, which it would
// refuse to get as sockets: the aggregator does not offer it shared memory, and it stays on TCP.
inline constexpr char kShmCapability[] = "shm2";

// Offers whose descriptors were sent and not yet received by their worker (docs/PROTOCOL.md §10.1). Linux charges
// descriptors in flight to the sending user and refuses to send more beyond its RLIMIT_NOFILE (ETOOMANYREFS), so
// peers that take offers and never receive them could make every later handoff fail; the daemon caps such offers
// instead, and serves TCP beyond the cap. Owned by whoever makes offers (the daemon's ServiceContext); it must
// outlive their io_context. Thread-safe.
class PendingOffers {
 public:
  static constexpr int kDefaultCap = 32;  // 160 descriptors in flight at most, far below any RLIMIT_NOFILE in use

  explicit PendingOffers(int cap) : cap_(cap) {}
  PendingOffers(const PendingOffers&) = delete;
  PendingOffers& operator=(const PendingOffers&) = delete;

  bool full() const { return count_.load() >= cap_; }
  int count() const { return count_.load(); }
  int cap() const { return cap_; }
  bool TryAcquire();
  void Release() { count_.fetch_sub(1); }
  // Shutting down: the offers still waiting for their worker stop being watched (within 200 ms), so that they no
  // longer keep the io_context running.
  void Stop() { stopped_.store(true); }
  bool stopped() const { return stopped_.load(); }

 private:
  const int cap_;
  std::atomic<int> count_{0};
  std::atomic<bool> stopped_{false};
};

// The aggregator's side.
class ShmOffer {
 public:
  // Listens for its worker; the segment, with rings of `ring_capacity` bytes, is made when the worker has presented
  // the token. `pending` must outlive the executor's io_context (a hand-over that was not received is watched after
  // the offer is gone).
  static Result<std::unique_ptr<ShmOffer>> Create(const boost::asio::any_io_executor& executor,
                                                  uint64_t ring_capacity,
                                                  PendingOffers& pending);

  // The abstract socket's name (without the leading NUL) and the token, for the offer sent over TCP.
  const std::string& socket_name() const { return name_; }
  const std::string& token() const { return token_; }

  // Accepts connections until one presents the token. Every connection's token is read concurrently, so one that
  // stays silent does not hold back the worker behind it; connections with a wrong token are closed, and the others
  // when this ends. Ends with kDeadlineExceeded at `deadline` and kAborted when cancelled. Until it returns, the
  // worker has sent nothing on TCP since the offer other than, perhaps, a TransportDecline: the caller may race it
  // with a read of TCP.
  boost::asio::awaitable<Status> AcceptWorker(std::chrono::steady_clock::time_point deadline);

  // After AcceptWorker: hands the worker the segment and waits for its acknowledgement. Ends with kResourceExhausted
  // when the segment was not sent (the PendingOffers cap is reached, it could not be made, or sendmsg failed): the
  // caller then withdraws the offer by destroying this object, which closes the worker's Unix connection, and the
  // worker declines on TCP and stays there. Ends with kAborted when the worker received the descriptors and
  // closed its connection without acknowledging (it could not map the segment): its TransportDecline follows on
  // TCP. Not to be raced with a read of TCP: the decline may arrive at the same time as the end of file.
  boost::asio::awaitable<Status> HandOver(std::chrono::steady_clock::time_point deadline);

  // AcceptWorker, then HandOver.
  boost::asio::awaitable<Status> Handoff(std::chrono::steady_clock::time_point deadline);

  // How far HandOver got, for messages about a handoff cut short (also by cancellation): "not started", "the
  // descriptors were sent", "the worker had not received the descriptors", "the worker had received the descriptors
  // (or closed its end) and not acknowledged them", "acknowledged".
  const std::string& handover_progress() const { return handover_progress_; }

  // After Handoff: the aggregator's end of the connection.
  std::unique_ptr<transport::Channel> MakeChannel(boost::asio::ip::tcp::socket liveness,
                                                  const boost::asio::any_io_executor& executor);

 private:
  ShmOffer(boost::asio::local::stream_protocol::acceptor acceptor, std::string name, std::string token,
           uint64_t ring_capacity, PendingOffers* pending)
      : pending_(pending),
        acceptor_(std::move(acceptor)),
        name_(std::move(name)),
        token_(std::move(token)),
        ring_capacity_(ring_capacity) {}

  PendingOffers* pending_;
  boost::asio::local::stream_protocol::acceptor acceptor_;
  std::optional<boost::asio::local::stream_protocol::socket> worker_;  // the connection with the right token
  std::string name_;
  std::string token_;
  uint64_t ring_capacity_;
  std::string handover_progress_ = "not started";
  std::shared_ptr<Segment> segment_;     // made by HandOver
  SegmentFds fds_;                       // this side's
  std::array<UniqueFd, 4> peer_events_;  // the worker's socket ends, until handed over
};

// The worker's side: the segment received from an aggregator.
struct ShmAttachment {
  std::shared_ptr<Segment> segment;
  SegmentFds fds;

  std::unique_ptr<transport::Channel> MakeChannel(boost::asio::ip::tcp::socket liveness,
                                                  const boost::asio::any_io_executor& executor);
};

// Connects to the offered socket, presents the token, maps the segment it receives and acknowledges it; refuses
// wake-up descriptors that are not Unix stream sockets. kUnavailable when the socket
// cannot be reached (the aggregator is on another host).
boost::asio::awaitable<Result<ShmAttachment>> AttachShm(const boost::asio::any_io_executor& executor,
                                                        const std::string& socket_name, const std::string& token,
                                                        std::chrono::steady_clock::time_point deadline);

}  // namespace sparsereduce::shm
