// The worker's connection to one aggregator: connect with retries, Hello, then a read loop that hands control
// messages and RESULT frames to its owner. Runs on the worker's single I/O thread.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "proto/control.pb.h"
#include "protocol/frame.h"
#include "transport/channel.h"
#if SPARSEREDUCE_HAVE_RDMA
#include "transport/rdma/channel.h"
#endif
#include "transport/tcp/frame_stream.h"

namespace sparsereduce::worker {

// `from` + `timeout`, saturating at the latest time point: a timeout meant as "as long as it takes"
// (milliseconds::max()) would otherwise overflow, in nanoseconds, into a deadline in the past. A timeout of zero or
// less is `from`.
inline std::chrono::steady_clock::time_point DeadlineAfter(std::chrono::steady_clock::time_point from,
                                                           std::chrono::milliseconds timeout) {
  using std::chrono::steady_clock;
  if (timeout <= std::chrono::milliseconds::zero()) return from;
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::time_point::max() - from)) {
    return steady_clock::time_point::max();
  }
  return from + timeout;
}

class AggregatorLink {
 public:
  struct Handler {
    virtual ~Handler() = default;
    virtual void OnControl(AggregatorLink& link, const proto::ControlMessage& message) = 0;
    // Whether the link may take a TransportOffer now (the offer comes after authentication, docs/PROTOCOL.md §10.1),
    // or the reason it may not.
    virtual Status TransportOfferAllowed(AggregatorLink& link) = 0;
    // Largest RESULT payload acceptable now, or the reason none is.
    virtual Result<uint64_t> ResultLimit(AggregatorLink& link, const FrameHeader& header) = 0;
    // A RESULT in two steps, so that its data lands where it belongs without a buffer in between: BeginResult gets
    // the header and the entry table and fills `targets` with where the rest of the payload goes (exactly that
    // many bytes), or returns false to have the rest read and dropped (the worker failed, or will fail for this
    // frame). EndResult follows once the targets are filled; it is not called when the read fails.
    virtual bool BeginResult(AggregatorLink& link, const FrameHeader& header, std::span<const std::byte> table,
                             std::vector<boost::asio::mutable_buffer>* targets) = 0;
    virtual void EndResult(AggregatorLink& link) = 0;
    virtual void OnFailure(AggregatorLink& link, const Status& status) = 0;
    // The link has no frame in flight any more (its writer ran empty).
    virtual void OnWriterIdle(AggregatorLink& link) = 0;
  };

  struct Options {
    std::string transport = "auto";  // the worker's option: "auto", "tcp", "shm" or "rdma"
    std::chrono::milliseconds setup_timeout{30'000};  // bounds taking a shared-memory or RDMA offer
    uint32_t tcp_send_buffer = 0;  // SO_SNDBUF of the TCP connection; 0: the kernel's autotuning
  };

  AggregatorLink(boost::asio::io_context& io, uint32_t index, std::string address, Handler& handler,
                 Options options);
#if SPARSEREDUCE_HAVE_RDMA
  // The device for transport "rdma" (opened by the Worker), with the ring size to use.
  void set_rdma(std::shared_ptr<rdma::RdmaDevice> device) { rdma_device_ = std::move(device); }
#endif

  // Connects (retrying until `deadline`), sends `hello`, then reads until the connection ends. Taking a transport
  // offer ends by `join_deadline` at the latest, so that it cannot hold up a join that has failed.
  boost::asio::awaitable<void> Run(proto::Hello hello, std::chrono::steady_clock::time_point deadline,
                                   std::chrono::steady_clock::time_point join_deadline);

  // Frames are sent only once connected (Run has sent Hello).
  void Send(ByteBuffer frame) {
    Count(frame.size());
    channel_->Send(std::move(frame));
  }
  void Send(std::vector<boost::asio::const_buffer> buffers, std::shared_ptr<const void> owner, uint64_t bytes) {
    Count(bytes);
    channel_->Send(std::move(buffers), std::move(owner));
  }
  void Close();  // flushes queued frames, then shuts the connection down
  // Forgets frames not yet started (the one being written is finished, so the stream stays framed).
  void DropQueued() {
    if (channel_) channel_->DropQueued();
  }
  bool writer_idle() const { return !channel_ || channel_->idle(); }
  // Between a BeginResult that returned targets and the end of their read: the transport may still write into
  // them, until Abort.
  bool reading_result_data() const { return reading_result_data_; }
  // Closes the socket now; pending operations complete with an error.
  void Abort();

  uint32_t index() const { return index_; }
  const std::string& address() const { return address_; }  // as configured
  // "aggregator 1 (10.0.0.5:19875)"
  std::string Name() const;
  bool connected() const { return connected_; }
  bool job_ready() const { return job_ready_; }  // JobReady came: the handshake is over
  // "tcp", "shm" or "rdma" once connected (the handshake may move a connection from TCP to another transport).
  const char* transport() const { return channel_ ? channel_->kind() : "tcp"; }
  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }

 private:
  boost::asio::awaitable<Status> Connect(std::chrono::steady_clock::time_point deadline);
  void Count(uint64_t bytes) { bytes_sent_ += bytes; }
  void UseChannel(std::unique_ptr<transport::Channel> channel);
  // Moves the connection to shared memory, or declines the offer over TCP when the aggregator is on another host
  // and the transport is "auto".
  boost::asio::awaitable<Status> TakeOffer(const proto::TransportOffer& offer);
  boost::asio::awaitable<Status> TakeShmOffer(const proto::TransportOffer& offer);
  boost::asio::awaitable<Status> TakeRdmaOffer(const proto::TransportOffer& offer);
  void Decline(const std::string& reason);
  // Reads the payload of a RESULT whose header was read: the entry table, then the data into the targets that
  // the handler names.
  boost::asio::awaitable<Status> ReadResult(const FrameHeader& header);

  boost::asio::io_context& io_;
  uint32_t index_;
  std::string address_;
  Handler& handler_;
  Options options_;
#if SPARSEREDUCE_HAVE_RDMA
  std::shared_ptr<rdma::RdmaDevice> rdma_device_;
#endif
  tcp::Socket socket_;  // while connecting; then it moves into channel_
  std::unique_ptr<transport::Channel> channel_;
  bool connected_ = false;
  std::chrono::steady_clock::time_point join_deadline_{};
  bool job_ready_ = false;  // JobReady came: the handshake, and with it any transport offer, is over (§10.1)
  bool closing_ = false;
  bool reading_result_data_ = false;
  std::vector<std::byte> result_table_;                 // ReadResult's, kept across frames
  std::vector<boost::asio::mutable_buffer> result_targets_;
  // The pause between connection attempts; Close() cancels it, so a closed link stops retrying at once.
  boost::asio::steady_timer retry_timer_;
  // Waits for the host name's lookup (LookUpHost) until the connect deadline; Close() cancels it.
  boost::asio::steady_timer lookup_wait_;
  // Ends a transport handoff in progress (TakeShmOffer) when the link is closed: the handoff waits on a socket of
  // its own, which closing the connection does not reach. Waited on (never expiring) only during a handoff.
  boost::asio::steady_timer setup_cancel_;
  // A write error is reported only after a grace period, so that an Error frame the aggregator sent before closing
  // (already in our receive buffer) is read and reported instead of the bare "broken pipe".
  boost::asio::steady_timer write_error_grace_;
  uint64_t bytes_sent_ = 0;
  uint64_t bytes_received_ = 0;
};

}  // namespace sparsereduce::worker
