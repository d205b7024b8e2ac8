#include "transport/shm/channel.h"

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>

namespace sparsereduce::shm {

namespace asio = boost::asio;

namespace {

// A stream_descriptor that takes `fd` over only once registered with the reactor: if registering throws, `fd`
// still owns the descriptor and closes it (a descriptor released into a constructor that threw was leaked).
asio::posix::stream_descriptor Adopt(const asio::any_io_executor& executor, UniqueFd& fd) {
  asio::posix::stream_descriptor descriptor(executor);
  descriptor.assign(fd.get());  // throws boost::system::system_error
  fd.release();
  return descriptor;
}

}  // namespace

ShmChannel::ShmChannel(std::shared_ptr<Segment> segment, SegmentFds fds, Direction receive,
                       asio::ip::tcp::socket liveness, asio::any_io_executor executor)
    : RingChannel(segment->ring().capacity(), std::move(liveness), executor),
      segment_(std::move(segment)),
      receive_(receive),
      send_(receive == Direction::kToAggregator ? Direction::kToWorker : Direction::kToAggregator),
      rx_(segment_->control(receive_)),
      tx_(segment_->control(send_)),
      rx_data_(Adopt(executor, fds.data(receive_))),
      tx_space_(Adopt(executor, fds.space(send_))),
      rx_space_(Adopt(executor, fds.space(receive_))),
      tx_data_(Adopt(executor, fds.data(send_))) {
  // Frames are read in place: the segment stays mapped while a lent payload lives.
  EnableLending(segment_);
  StartLiveness();
}

ShmChannel::~ShmChannel() { StopLending(); }  // lent payloads must not reach the sockets below once they close

void ShmChannel::Signal(asio::posix::stream_descriptor& event) {
  const char byte = 1;
  // EAGAIN: the peer's buffer is full of earlier wake-ups, so it is already due to wake. EPIPE and the like: the
  // peer is gone, which the TCP connection (or the peer's Drain) reports.
  [[maybe_unused]] ssize_t n = ::send(event.native_handle(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

bool ShmChannel::Drain(asio::posix::stream_descriptor& event) {
  // Wake-ups pile up as bytes; one recv usually takes them all (a short read: nothing is left). Bounded, so a peer
  // that keeps writing cannot keep this thread here; what is left wakes the next wait at once, which is harmless.
  std::array<char, 256> bytes;
  for (int i = 0; i < 4; ++i) {
    const ssize_t n = ::recv(event.native_handle(), bytes.data(), bytes.size(), MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(bytes.size())) continue;
    if (n > 0) return true;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    return false;  // end of file: the peer closed its end, which would otherwise stay readable (and spin us)
  }
  return true;
}

transport::RingChannel::Received ShmChannel::LoadReceived() {
  // `producer_closed` is stored after the last `head`: load it first, so a set flag comes with the final head.
  const bool closed = rx_.producer_closed.load(std::memory_order_acquire) != 0;
  return {rx_.head.load(std::memory_order_acquire), closed};
}

// The wake-up handshake (docs/PROTOCOL.md §10.2) is Dekker's: each side stores its own word, then loads the
// other's, all sequentially consistent, so at least one of them sees the other's store and nobody sleeps through
// a wake-up. Consumed() may run on the thread that returns a lent payload: atomics and a send(2) only.
void ShmChannel::Consumed(uint64_t tail) {
  rx_.tail.store(tail, std::memory_order_seq_cst);
  if (rx_.producer_waiting.load(std::memory_order_seq_cst)) Signal(rx_space_);
}

asio::awaitable<void> ShmChannel::WaitForData(uint64_t tail) {
  if (failed()) co_return;  // the caller sees the failure; nothing would cancel a sleep begun now
  rx_.consumer_waiting.store(1, std::memory_order_seq_cst);
  // Sleep only if the ring is still empty now that the producer is sure to see the flag.
  if (rx_.head.load(std::memory_order_seq_cst) == tail && !rx_.producer_closed.load(std::memory_order_seq_cst)) {
    auto [ec] = co_await rx_data_.async_wait(asio::posix::stream_descriptor::wait_read,
                                             asio::as_tuple(asio::use_awaitable));
    // Cancelled (CancelWaits): nothing to read; the caller looks at the ring and the channel's state again.
    if (!ec && !Drain(rx_data_)) PeerGone();  // what the peer wrote is read first, as when its TCP connection ends
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
                                                           const boost::system::error_code& ec) {
                         if (!*alive) return;
                         tx_.producer_waiting.store(0, std::memory_order_relaxed);
                         if (!ec && !Drain(tx_space_)) PeerGone();  // fails the writes; wake() then stops
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
