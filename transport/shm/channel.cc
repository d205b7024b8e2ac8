#include "transport/shm/channel.h"

#include <array>
#include <atomic>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>

namespace sparsereduce::shm {

namespace asio = boost::asio;

namespace {

Status PeerClosed() { return Status(StatusCode::kUnavailable, "connection closed by peer"); }

}  // namespace

ShmChannel::ShmChannel(std::shared_ptr<Segment> segment, SegmentFds fds, Direction receive,
                       asio::ip::tcp::socket liveness, asio::any_io_executor executor)
    : segment_(std::move(segment)),
      receive_(receive),
      send_(receive == Direction::kToAggregator ? Direction::kToWorker : Direction::kToAggregator),
      rx_(segment_->control(receive_)),
      tx_(segment_->control(send_)),
      liveness_(std::move(liveness)),
      executor_(executor),
      rx_data_(executor, fds.data(receive_).release()),
      tx_space_(executor, fds.space(send_).release()),
      rx_space_(executor, fds.space(receive_).release()),
      tx_data_(executor, fds.data(send_).release()) {
  // Positions continue from wherever the segment is (both start at zero on a fresh one).
  rx_tail_ = rx_.tail.load(std::memory_order_acquire);
  tx_head_ = tx_.head.load(std::memory_order_acquire);
  WatchLiveness();
}

ShmChannel::~ShmChannel() { *alive_ = false; }

void ShmChannel::Signal(asio::posix::stream_descriptor& event) {
  const uint64_t one = 1;
  // EAGAIN only when the counter is about to overflow, i.e. the peer is already due to wake up.
  [[maybe_unused]] ssize_t n = ::write(event.native_handle(), &one, sizeof one);
}

void ShmChannel::Drain(asio::posix::stream_descriptor& event) {
  uint64_t count;
  [[maybe_unused]] ssize_t n = ::read(event.native_handle(), &count, sizeof count);
}

void ShmChannel::WatchLiveness() {
  static thread_local std::array<std::byte, 1> sink;  // nothing should ever arrive
  liveness_.async_read_some(
      asio::buffer(sink),
      asio::bind_executor(executor_, [this, alive = alive_](const boost::system::error_code& ec, size_t n) {
        if (!*alive) return;
        if (!ec && n > 0) {
          Finish(ProtocolError("the peer sent data on its TCP connection after switching to shared memory"));
          return;
        }
        // The peer process ended or closed the connection: what it wrote before is in the ring, read that first.
        peer_gone_ = true;
        rx_data_.cancel();  // a sleeping reader re-checks
        if (!failed_) {
          failed_write_ = PeerClosed();
          FailWrites(*failed_write_);
        }
      }));
}

asio::awaitable<Status> ShmChannel::ReadExact(std::byte* out, uint64_t size, bool in_frame) {
  const transport::ByteRing& ring = segment_->ring();
  std::byte* const data = segment_->data(receive_);
  uint64_t done = 0;
  while (done < size) {
    if (failed_) co_return *failed_;
    const uint64_t head = rx_.head.load(std::memory_order_acquire);
    if (Status st = ring.CheckPositions(head, rx_tail_); !st.ok()) {
      Finish(st.WithContext("shared-memory ring"));
      co_return *failed_;
    }
    if (head != rx_tail_) {
      const uint64_t n = std::min(head - rx_tail_, size - done);
      if (out != nullptr) {
        const transport::RingSpans spans = ring.Locate(rx_tail_, n);
        uint64_t copied = 0;
        for (int i = 0; i < spans.count; ++i) {
          std::memcpy(out + done + copied, data + spans.span[i].offset, spans.span[i].length);
          copied += spans.span[i].length;
        }
      }
      rx_tail_ += n;
      done += n;
      rx_.tail.store(rx_tail_, std::memory_order_release);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (rx_.producer_waiting.load(std::memory_order_relaxed)) Signal(rx_space_);
      continue;
    }
    // Empty. The producer stores `producer_closed` after its last `head`, so check `head` again after it.
    if (rx_.producer_closed.load(std::memory_order_acquire) || peer_gone_) {
      if (rx_.head.load(std::memory_order_acquire) != rx_tail_) continue;
      if (done == 0 && !in_frame) co_return PeerClosed();
      co_return ProtocolError("connection closed inside a frame (" + std::to_string(done) + " of " +
                              std::to_string(size) + " bytes)");
    }
    rx_.consumer_waiting.store(1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (rx_.head.load(std::memory_order_acquire) == rx_tail_ && !rx_.producer_closed.load(std::memory_order_acquire)) {
      co_await rx_data_.async_wait(asio::posix::stream_descriptor::wait_read, asio::as_tuple(asio::use_awaitable));
      Drain(rx_data_);
    }
    rx_.consumer_waiting.store(0, std::memory_order_relaxed);
  }
  co_return Status::Ok();
}

asio::awaitable<Result<FrameHeader>> ShmChannel::ReadHeader() {
  std::array<std::byte, kFrameHeaderSize> bytes;
  if (Status st = co_await ReadExact(bytes.data(), bytes.size(), /*in_frame=*/false); !st.ok()) co_return st;
  co_return DecodeFrameHeader(bytes);
}

asio::awaitable<Result<ByteBuffer>> ShmChannel::ReadPayload(uint64_t size, BufferPool* pool) {
  ByteBuffer payload = pool ? pool->Acquire(size) : ByteBuffer(size);
  if (Status st = co_await ReadExact(payload.data(), size, /*in_frame=*/true); !st.ok()) co_return st;
  co_return payload;
}

asio::awaitable<Status> ShmChannel::Discard(uint64_t size) {
  co_return co_await ReadExact(nullptr, size, /*in_frame=*/true);
}

void ShmChannel::Send(std::vector<asio::const_buffer> parts, std::shared_ptr<const void> owner) {
  if (failed_write_ || close_after_flush_) return;
  queue_.push_back(Item{std::move(parts), std::move(owner)});
  Pump();
}

void ShmChannel::Pump() {
  if (waiting_for_space_ || failed_write_) return;
  const transport::ByteRing& ring = segment_->ring();
  std::byte* const data = segment_->data(send_);
  while (!queue_.empty()) {
    const uint64_t tail = tx_.tail.load(std::memory_order_acquire);
    if (Status st = ring.CheckPositions(tx_head_, tail); !st.ok()) {
      Finish(st.WithContext("shared-memory ring"));
      return;
    }
    uint64_t free = ring.Free(tx_head_, tail);
    if (free == 0) {
      tx_.producer_waiting.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (ring.Free(tx_head_, tx_.tail.load(std::memory_order_acquire)) > 0) {
        tx_.producer_waiting.store(0, std::memory_order_relaxed);
        continue;
      }
      waiting_for_space_ = true;
      tx_space_.async_wait(asio::posix::stream_descriptor::wait_read,
                           asio::bind_executor(executor_, [this, alive = alive_](const boost::system::error_code&) {
                             if (!*alive) return;
                             waiting_for_space_ = false;
                             tx_.producer_waiting.store(0, std::memory_order_relaxed);
                             Drain(tx_space_);
                             Pump();
                           }));
      return;
    }
    // Copy as much of the front frame as fits, then publish it in one store.
    Item& item = queue_.front();
    uint64_t written = 0;
    while (free > 0 && item.part < item.parts.size()) {
      const asio::const_buffer& part = item.parts[item.part];
      const uint64_t n = std::min<uint64_t>(free, part.size() - item.part_done);
      const transport::RingSpans spans = ring.Locate(tx_head_ + written, n);
      uint64_t copied = 0;
      for (int i = 0; i < spans.count; ++i) {
        std::memcpy(data + spans.span[i].offset, static_cast<const std::byte*>(part.data()) + item.part_done + copied,
                    spans.span[i].length);
        copied += spans.span[i].length;
      }
      written += n;
      free -= n;
      item.part_done += n;
      if (item.part_done == part.size()) {
        ++item.part;
        item.part_done = 0;
      }
    }
    tx_head_ += written;
    tx_.head.store(tx_head_, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (tx_.consumer_waiting.load(std::memory_order_relaxed)) Signal(tx_data_);
    if (item.part == item.parts.size()) queue_.pop_front();
  }
  if (close_after_flush_) {
    tx_.producer_closed.store(1, std::memory_order_release);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (tx_.consumer_waiting.load(std::memory_order_relaxed)) Signal(tx_data_);
    if (close_both_) {
      boost::system::error_code ignored;
      liveness_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
    }
  }
  NotifyIdle();
}

void ShmChannel::NotifyIdle() {
  // Later, not from inside Send: owners react to idleness (e.g. finishing a failure) as they do with TCP, where it
  // is always a completion.
  if (!on_idle_) return;
  asio::post(executor_, [this, alive = alive_] {
    if (*alive && queue_.empty() && on_idle_) on_idle_();
  });
}

void ShmChannel::CloseAfterFlush(bool both) {
  if (close_after_flush_) return;
  close_after_flush_ = true;
  close_both_ = both;
  if (queue_.empty() && !waiting_for_space_ && !failed_write_) Pump();
}

void ShmChannel::DropQueued() {
  if (queue_.empty()) return;
  const Item& front = queue_.front();
  const bool started = front.part > 0 || front.part_done > 0;
  queue_.erase(queue_.begin() + (started ? 1 : 0), queue_.end());
  if (queue_.empty()) NotifyIdle();
}

void ShmChannel::FailWrites(const Status& error) {
  const bool had_items = !queue_.empty();
  queue_.clear();
  tx_space_.cancel();
  if (on_error_) {
    asio::post(executor_, [this, alive = alive_, error] {
      if (*alive && on_error_) on_error_(error);
    });
  }
  if (had_items) NotifyIdle();
}

void ShmChannel::Finish(const Status& error) {
  if (failed_) return;
  failed_ = error;
  rx_data_.cancel();
  if (!failed_write_) {
    failed_write_ = error;
    FailWrites(error);
  }
}

void ShmChannel::Abort() {
  Finish(Status(StatusCode::kAborted, "connection closed"));
  boost::system::error_code ignored;
  liveness_.close(ignored);
}

}  // namespace sparsereduce::shm
