// transport::Channel over a shared-memory segment: each direction is a byte ring (segment.h) that the sender fills
// with memcpy and the receiver drains with memcpy; no system call moves data. A side that finds its ring empty (or
// full) sets its `waiting` flag and sleeps on an eventfd, which the other side signals only when that flag is set.
//
// The TCP connection the channel was negotiated on stays open beside it: the kernel closes it when the peer process
// dies, and the channel then fails once it has read everything the peer wrote.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <deque>
#include <memory>
#include <optional>

#include "transport/channel.h"
#include "transport/shm/segment.h"

namespace sparsereduce::shm {

class ShmChannel final : public transport::Channel {
 public:
  // `side` is the direction this end receives on: kToAggregator on the aggregator, kToWorker on the worker.
  // Takes the segment's eventfds and the TCP socket; everything runs on `executor`.
  ShmChannel(std::shared_ptr<Segment> segment, SegmentFds fds, Direction receive,
             boost::asio::ip::tcp::socket liveness, boost::asio::any_io_executor executor);
  ~ShmChannel() override;

  const char* kind() const override { return "shm"; }
  boost::asio::awaitable<Result<FrameHeader>> ReadHeader() override;
  boost::asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool) override;
  boost::asio::awaitable<Status> Discard(uint64_t size) override;

  using Channel::Send;
  void Send(std::vector<boost::asio::const_buffer> parts, std::shared_ptr<const void> owner) override;
  void set_error_handler(ErrorHandler handler) override { on_error_ = std::move(handler); }
  void set_idle_handler(IdleHandler handler) override { on_idle_ = std::move(handler); }
  bool idle() const override { return queue_.empty(); }
  void CloseAfterFlush(bool both) override;
  void DropQueued() override;
  void Abort() override;

 private:
  struct Item {
    std::vector<boost::asio::const_buffer> parts;
    std::shared_ptr<const void> owner;
    size_t part = 0;       // first part not completely copied
    size_t part_done = 0;  // bytes of it already copied
  };

  // Copies exactly `size` bytes out of the receive ring into `out` (nullptr: drops them). `in_frame`: the bytes
  // belong to a frame already started, so end of stream is a protocol error.
  boost::asio::awaitable<Status> ReadExact(std::byte* out, uint64_t size, bool in_frame);
  // Copies queued frames into the send ring as far as space allows; sleeps on the space eventfd when full.
  void Pump();
  void Finish(const Status& error);  // the channel is unusable: wakes the reader, fails the queue
  void FailWrites(const Status& error);  // drops the queue, reports `error` once
  void NotifyIdle();
  void WatchLiveness();
  static void Signal(boost::asio::posix::stream_descriptor& event);
  static void Drain(boost::asio::posix::stream_descriptor& event);

  std::shared_ptr<Segment> segment_;
  Direction receive_, send_;
  RingControl& rx_;
  RingControl& tx_;
  boost::asio::ip::tcp::socket liveness_;
  boost::asio::any_io_executor executor_;
  // Eventfds: the ones this side sleeps on, and the ones it signals.
  boost::asio::posix::stream_descriptor rx_data_, tx_space_, rx_space_, tx_data_;
  uint64_t rx_tail_ = 0;  // == rx_.tail, kept locally (only this side writes it)
  uint64_t tx_head_ = 0;  // == tx_.head

  std::deque<Item> queue_;
  bool waiting_for_space_ = false;  // a wait on tx_space_ is pending
  bool close_after_flush_ = false;
  bool close_both_ = false;
  bool peer_gone_ = false;              // the TCP connection ended: read what is left, then end of stream
  std::optional<Status> failed_;        // set once: reads fail with it
  std::optional<Status> failed_write_;  // set once: sends are dropped
  ErrorHandler on_error_;
  IdleHandler on_idle_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace sparsereduce::shm
