// The shared-memory backend of RingChannel: both rings live in the segment (segment.h), so the sender copies
// straight into the ring the receiver reads and publishes with one atomic store; no system call moves data. A side
// that finds its ring empty (or full) sets its `waiting` flag and sleeps on its end of a socket pair, to which the
// other side sends a byte only when that flag is set (docs/PROTOCOL.md §10.2).
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <memory>

#include "transport/ring/ring_channel.h"
#include "transport/shm/segment.h"

namespace sparsereduce::shm {

class ShmChannel final : public transport::RingChannel {
 public:
  // `receive` is the direction this end reads: kToAggregator on the aggregator, kToWorker on the worker. Takes the
  // segment's descriptors (this side's socket ends) and the TCP socket; everything runs on `executor`.
  ShmChannel(std::shared_ptr<Segment> segment, SegmentFds fds, Direction receive,
             boost::asio::ip::tcp::socket liveness, boost::asio::any_io_executor executor);

  ~ShmChannel() override;

  const char* kind() const override { return "shm"; }

 private:
  const std::byte* ReceiveMemory() override { return segment_->data(receive_); }
  Received LoadReceived() override;
  void Consumed(uint64_t tail) override;  // thread-safe: the ring is lent (RingChannel::EnableLending)
  boost::asio::awaitable<void> WaitForData(uint64_t tail) override;
  std::byte* SendMemory() override { return segment_->data(send_); }
  uint64_t LoadPeerTail() override { return tx_.tail.load(std::memory_order_acquire); }
  void Publish(uint64_t from, uint64_t to) override;
  void WaitForSpace(uint64_t head, std::function<void()> wake) override;
  void CloseSend(uint64_t head) override;
  void CancelWaits() override;

  // One send(2) and one recv(2) per wake-up, both non-blocking per call (MSG_DONTWAIT): nothing the peer does to
  // its own socket ends can make them block. Drain is false when the peer closed its end (or it failed).
  static void Signal(boost::asio::posix::stream_descriptor& event);
  [[nodiscard]] static bool Drain(boost::asio::posix::stream_descriptor& event);

  std::shared_ptr<Segment> segment_;
  Direction receive_, send_;
  RingControl& rx_;
  RingControl& tx_;
  // This side's socket ends: the ones it sleeps on, and the ones it signals.
  boost::asio::posix::stream_descriptor rx_data_, tx_space_, rx_space_, tx_data_;
};

}  // namespace sparsereduce::shm
