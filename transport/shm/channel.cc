#include "transport/shm/channel.h"

#include <array>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>

namespace sparsereduce::shm {

namespace asio = boost::asio;

ShmChannel::ShmChannel(std::shared_ptr<Segment> segment, SegmentFds fds, Direction receive,
                       asio::ip::tcp::socket liveness, asio::any_io_executor executor)
    : RingChannel(segment->ring().capacity(), std::move(liveness), executor),
      segment_(std::move(segment)),
      receive_(receive),
      send_(receive == Direction::kToAggregator ? Direction::kToWorker : Direction::kToAggregator),
      rx_(segment_->control(receive_)),
      tx_(segment_->control(send_)),
      rx_data_(executor, fds.data(receive_).release()),
      tx_space_(executor, fds.space(send_).release()),
      rx_space_(executor, fds.space(receive_).release()),
      tx_data_(executor, fds.data(send_).release()) {
  // Frames are read in place: the segment stays mapped while a lent payload lives.
  EnableLending(segment_);
  StartLiveness();
}

ShmChannel::~ShmChannel() { StopLending(); }  // lent payloads must not reach the eventfds below once they close

void ShmChannel::Signal(asio::posix::stream_descriptor& event) {
  const uint64_t one = 1;
  // EAGAIN only when the counter is about to overflow, i.e. the peer is already due to wake up.
  [[maybe_unused]] ssize_t n = ::write(event.native_handle(), &one, sizeof one);
}

void ShmChannel::Drain(asio::posix::stream_descriptor& event) {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(event.native_handle(), &count, sizeof count);
}

transport::RingChannel::Received ShmChannel::LoadReceived() {
  // `producer_closed` is stored after the last `head`: load it first, so a set flag comes with the final head.
  const bool closed = rx_.producer_closed.load(std::memory_order_acquire) != 0;
  return {rx_.head.load(std::memory_order_acquire), closed};
}

// The wake-up handshake (docs/PROTOCOL.md §10.2) is Dekker's: each side stores its own word, then loads the
// other's, all sequentially consistent, so at least one of them sees the other's store and nobody sleeps through
// a wake-up. Consumed() may run on the thread that returns a lent payload: atomics and a write(2) only.
void ShmChannel::Consumed(uint64_t tail) {
  rx_.tail.store(tail, std::memory_order_seq_cst);
  if (rx_.producer_waiting.load(std::memory_order_seq_cst)) Signal(rx_space_);
}

asio::awaitable<void> ShmChannel::WaitForData(uint64_t tail) {
  rx_.consumer_waiting.store(1, std::memory_order_seq_cst);
  // Sleep only if the ring is still empty now that the producer is sure to see the flag.
  if (rx_.head.load(std::memory_order_seq_cst) == tail && !rx_.producer_closed.load(std::memory_order_seq_cst)) {
    co_await rx_data_.async_wait(asio::posix::stream_descriptor::wait_read, asio::as_tuple(asio::use_awaitable));
    Drain(rx_data_);
  }
  rx_.consumer_waiting.store(0, std::memory_order_relaxed);
}

void ShmChannel::Publish(uint64_t, uint64_t to) {
  tx_.head.store(to, std::memory_order_seq_cst);
  if (tx_.consumer_waiting.load(std::memory_order_seq_cst)) Signal(tx_data_);
}

void ShmChannel::WaitForSpace(uint64_t head, std::function<void()> wake) {
  tx_.producer_waiting.store(1, std::memory_order_seq_cst);
  if (ring().Free(head, tx_.tail.load(std::memory_order_seq_cst)) > 0) {
    tx_.producer_waiting.store(0, std::memory_order_relaxed);
    asio::post(executor(), std::move(wake));
    return;
  }
  tx_space_.async_wait(asio::posix::stream_descriptor::wait_read,
                       asio::bind_executor(executor(), [this, alive = alive(), wake = std::move(wake)](
                                                           const boost::system::error_code&) {
                         if (!*alive) return;
                         tx_.producer_waiting.store(0, std::memory_order_relaxed);
                         Drain(tx_space_);
                         wake();
                       }));
}

void ShmChannel::CloseSend(uint64_t) {
  tx_.producer_closed.store(1, std::memory_order_seq_cst);
  if (tx_.consumer_waiting.load(std::memory_order_seq_cst)) Signal(tx_data_);
}

void ShmChannel::CancelWaits() {
  rx_data_.cancel();
  tx_space_.cancel();
}

}  // namespace sparsereduce::shm
