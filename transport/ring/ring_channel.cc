#include "transport/ring/ring_channel.h"

#include <array>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cstring>

namespace sparsereduce::transport {

namespace asio = boost::asio;

namespace {

// UNAVAILABLE, as for TCP (transport/tcp/frame_stream.cc): a peer killed while writing.
Status ClosedInsideFrame(uint64_t done, uint64_t size) {
  return Status(StatusCode::kUnavailable, "connection closed inside a frame (" + std::to_string(done) + " of " +
                                              std::to_string(size) + " bytes)");
}

}  // namespace

// Lent payloads hold a reference to this, not to the channel: they may outlive it (the daemon's engine keeps a
// frame until its blocks are aggregated, whatever happened to the connection meanwhile).
class RingChannel::Lender final : public BufferLender {
 public:
  // `read`: how far the channel has read (and published) when lending starts.
  Lender(RingChannel* channel, const std::byte* memory, uint64_t capacity, std::shared_ptr<const void> memory_owner,
         uint64_t read)
      : channel_(channel),
        memory_(memory),
        capacity_(capacity),
        memory_owner_(std::move(memory_owner)),
        read_(read),
        published_(read) {}

  void Return(std::byte* data, size_t) override {
    std::lock_guard lock(mu_);
    ledger_.Return(static_cast<uint64_t>(data - memory_), capacity_);
    PublishLocked();
  }

  std::byte* Lend(uint64_t position, uint64_t offset) {
    std::lock_guard lock(mu_);
    ledger_.Lend(position);
    // The receive memory is the peer's to write and this side's to read; the buffer's data() is non-const only
    // because ByteBuffer's is, and nobody writes through it.
    return const_cast<std::byte*>(memory_) + offset;
  }
  void Publish(uint64_t read) {
    std::lock_guard lock(mu_);
    read_ = read;
    PublishLocked();
  }
  uint64_t HeldBack(uint64_t read) {
    std::lock_guard lock(mu_);
    return read - ledger_.ConsumableUpTo(read);
  }
  uint64_t outstanding() {
    std::lock_guard lock(mu_);
    return ledger_.outstanding();
  }
  void Detach() {
    std::lock_guard lock(mu_);
    channel_ = nullptr;
  }

 private:
  // Consumed() calls are serialized here, so the tail the peer sees only grows.
  void PublishLocked() {
    const uint64_t tail = ledger_.ConsumableUpTo(read_);
    if (channel_ == nullptr || tail == published_) return;
    published_ = tail;
    channel_->Consumed(tail);
  }

  std::mutex mu_;
  RingChannel* channel_;  // null once the channel stopped lending
  const std::byte* const memory_;
  const uint64_t capacity_;
  const std::shared_ptr<const void> memory_owner_;  // keeps `memory_` mapped
  LoanLedger ledger_;
  uint64_t read_;       // how far the channel has read
  uint64_t published_;  // the tail last given to Consumed()
};

RingChannel::RingChannel(uint64_t ring_capacity, asio::ip::tcp::socket liveness, asio::any_io_executor executor)
    : ring_(ring_capacity), liveness_(std::move(liveness)), executor_(std::move(executor)) {}

void RingChannel::StartLiveness() {
  liveness_.async_read_some(
      asio::buffer(liveness_sink_),
      asio::bind_executor(executor_, [this, alive = alive_](const boost::system::error_code& ec, size_t n) {
        if (!*alive) return;
        if (!ec && n > 0) {
          Fail(ProtocolError(std::string("the peer sent data on its TCP connection after switching to ") + kind()));
          return;
        }
        PeerGone();  // what the peer wrote before is in the ring: read it first
      }));
}

void RingChannel::ShutdownLiveness() {
  boost::system::error_code ignored;
  liveness_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);
}

RingChannel::~RingChannel() {
  *alive_ = false;
  StopLending();
}

void RingChannel::EnableLending(std::shared_ptr<const void> memory_owner) {
  lend_memory_owner_ = std::move(memory_owner);
}

void RingChannel::set_recall_handler(std::function<void()> handler) {
  on_recall_ = std::move(handler);
  // Only a reader that can be asked to give loans back gets them; the others publish their tail without the
  // lender's lock.
  if (!lender_ && lend_memory_owner_) {
    lender_ = std::make_shared<Lender>(this, ReceiveMemory(), ring_.capacity(), lend_memory_owner_, rx_tail_);
  }
}

Result<RingChannel::Received> RingChannel::LoadChecked() {
  if (failed_) return *failed_;
  const Received received = LoadReceived();
  if (failed_) return *failed_;  // the backend may fail while it looks (RDMA: a completion error, a bad immediate)
  if (Status st = CheckReceived(received.head); !st.ok()) {
    Fail(st.WithContext("ring of the " + std::string(kind()) + " connection"));
    return *failed_;
  }
  return received;
}

void RingChannel::StopLending() {
  if (lender_) lender_->Detach();
}

void RingChannel::PublishConsumed() {
  if (lender_) {
    lender_->Publish(rx_tail_);
  } else {
    Consumed(rx_tail_);
  }
}

bool RingChannel::YieldDue(uint64_t bytes) {
  read_without_yield_ += bytes;
  if (++reads_without_yield_ < kReadsPerYield && read_without_yield_ < ring_.capacity()) return false;
  read_without_yield_ = 0;
  reads_without_yield_ = 0;
  return true;
}

uint64_t RingChannel::HeldBack() { return lender_ ? lender_->HeldBack(rx_tail_) : 0; }

Status RingChannel::CheckReceived(uint64_t head) {
  if (Status st = ring_.CheckPositions(head, rx_tail_); !st.ok()) return st;
  // A producer only ever appends. A head that moved back (and forth) kept a reader that waits for a whole payload
  // going round without ever suspending.
  if (head < rx_head_seen_) {
    return ProtocolError("the peer's head moved back from " + std::to_string(rx_head_seen_) + " to " +
                         std::to_string(head));
  }
  rx_head_seen_ = head;
  // The peer may write no further than a ring past the tail it was given, which loans hold behind what was read.
  const uint64_t held = HeldBack();
  if (head - rx_tail_ + held > ring_.capacity()) {
    return ProtocolError("the peer's head " + std::to_string(head) + " runs over " + std::to_string(held) +
                         " bytes this side still uses in place (read up to " + std::to_string(rx_tail_) +
                         ", capacity " + std::to_string(ring_.capacity()) + ")");
  }
  return Status::Ok();
}

void RingChannel::Recall() {
  if (!lender_ || !on_recall_ || lender_->outstanding() == 0) return;
  on_recall_();  // destroys the lent buffers, each of which publishes what it frees
}

asio::awaitable<Status> RingChannel::ReadScattered(std::span<const asio::mutable_buffer> targets, bool in_frame) {
  uint64_t size = 0;
  for (const asio::mutable_buffer& t : targets) size += t.size();
  uint64_t done = 0;
  size_t target = 0;         // the target being filled
  uint64_t target_done = 0;  // its bytes filled
  while (done < size) {
    Result<Received> checked = LoadChecked();
    if (!checked.ok()) co_return checked.status();
    const Received received = *checked;
    if (received.head != rx_tail_) {
      // Everything that is there, across as many targets as it fills, then one Consumed: the peer is told (and
      // maybe woken) once per chunk, not once per target.
      const uint64_t n = std::min(received.head - rx_tail_, size - done);
      const std::byte* memory = ReceiveMemory();
      const RingSpans spans = ring_.Locate(rx_tail_, n);
      for (int i = 0; i < spans.count; ++i) {
        const std::byte* from = memory + spans.span[i].offset;
        uint64_t left = spans.span[i].length;
        while (left > 0) {
          while (targets[target].size() == target_done) {  // zero-size or full: the sizes add up, so one follows
            ++target;
            target_done = 0;
          }
          const uint64_t k = std::min<uint64_t>(left, targets[target].size() - target_done);
          if (targets[target].data() != nullptr) {  // nullptr: discard
            std::memcpy(static_cast<std::byte*>(targets[target].data()) + target_done, from, k);
          }
          from += k;
          left -= k;
          target_done += k;
        }
      }
      rx_tail_ += n;
      done += n;
      PublishConsumed();
      if (YieldDue(n)) co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
      continue;
    }
    if (received.closed || peer_gone_) {
      // Closing follows the last byte, so what was read above is complete unless the head moved meanwhile.
      if (LoadReceived().head != rx_tail_) continue;
      if (done == 0 && !in_frame) co_return PeerClosed();
      co_return ClosedInsideFrame(done, size);
    }
    // The peer may be waiting for room that loans hold back: never sleep on it with more than MaxHeldBack() lent.
    if (HeldBack() > MaxHeldBack()) Recall();
    co_await WaitForData(rx_tail_);
  }
  co_return Status::Ok();
}

asio::awaitable<Result<FrameHeader>> RingChannel::ReadHeader() {
  std::array<std::byte, kFrameHeaderSize> bytes;
  const std::array target{asio::buffer(bytes)};
  if (Status st = co_await ReadScattered(target, /*in_frame=*/false); !st.ok()) co_return st;
  co_return DecodeFrameHeader(bytes);
}

asio::awaitable<Result<ByteBuffer>> RingChannel::ReadPayload(uint64_t size, BufferPool* pool) {
  ByteBuffer payload = pool ? pool->Acquire(size) : ByteBuffer(size);
  const std::array target{asio::mutable_buffer(payload.data(), size)};
  if (Status st = co_await ReadScattered(target, /*in_frame=*/true); !st.ok()) co_return st;
  co_return payload;
}

asio::awaitable<Result<ByteBuffer>> RingChannel::ReadPayloadLent(uint64_t size, BufferPool* pool) {
  if (!lender_ || !on_recall_ || size == 0 || size > MaxHeldBack() || ring_.Locate(rx_tail_, size).count != 1) {
    co_return co_await ReadPayload(size, pool);
  }
  if (HeldBack() + size > MaxHeldBack()) {
    Recall();
    if (HeldBack() + size > MaxHeldBack()) co_return co_await ReadPayload(size, pool);  // not all came back
  }
  // The whole payload must be in the ring before it is lent. The peer has room to write it: what is held back and
  // the payload together are at most MaxHeldBack().
  while (true) {
    Result<Received> checked = LoadChecked();
    if (!checked.ok()) co_return checked.status();
    const Received received = *checked;
    if (received.head - rx_tail_ >= size) break;
    if (received.closed || peer_gone_) {
      if (LoadReceived().head != received.head) continue;
      co_return ClosedInsideFrame(received.head - rx_tail_, size);
    }
    // WaitForData returns at once when the head moved: a peer that trickles its payload in a byte at a time must
    // not keep the thread here either. After the yield the channel is looked at again: a failure while it was
    // away (the liveness read's) cancelled no wait, and a sleep now would outlast it.
    if (YieldDue(0)) {
      co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
      continue;
    }
    co_await WaitForData(received.head);
  }
  std::byte* data = lender_->Lend(rx_tail_, ring_.Locate(rx_tail_, size).span[0].offset);
  rx_tail_ += size;
  PublishConsumed();
  if (YieldDue(size)) co_await asio::post(co_await asio::this_coro::executor, asio::use_awaitable);
  co_return ByteBuffer::Borrowed(data, size, lender_, size, /*on_loan=*/true);
}

asio::awaitable<Status> RingChannel::ReadInto(std::span<const asio::mutable_buffer> targets) {
  co_return co_await ReadScattered(targets, /*in_frame=*/true);
}

asio::awaitable<Status> RingChannel::Discard(uint64_t size) {
  const std::array target{asio::mutable_buffer(nullptr, size)};  // no data pointer: dropped
  co_return co_await ReadScattered(target, /*in_frame=*/true);
}

void RingChannel::Send(std::vector<asio::const_buffer> parts, std::shared_ptr<const void> owner) {
  if (failed_write_ || close_after_flush_) return;
  queue_.push_back(Item{std::move(parts), std::move(owner)});
  Pump();
}

void RingChannel::Pump() {
  if (waiting_for_space_ || failed_write_ || pump_posted_) return;
  std::byte* const memory = SendMemory();
  uint32_t passes = 0;
  while (!queue_.empty()) {
    if (++passes > kPassesPerPump) {
      pump_posted_ = true;
      asio::post(executor_, [this, alive = alive_] {
        if (!*alive) return;
        pump_posted_ = false;
        Pump();
      });
      return;
    }
    const uint64_t tail = LoadPeerTail();
    if (failed_write_) return;  // the backend failed while it looked: the queue is gone
    if (Status st = ring_.CheckPositions(tx_head_, tail); !st.ok()) {
      Fail(st.WithContext("ring of the " + std::string(kind()) + " connection"));
      return;
    }
    uint64_t free = ring_.Free(tx_head_, tail);
    if (free == 0) {
      waiting_for_space_ = true;
      WaitForSpace(tx_head_, [this, alive = alive_] {
        if (!*alive) return;
        waiting_for_space_ = false;
        Pump();
      });
      return;
    }
    // Copy as much of the front frame as fits, then publish it at once.
    Item& item = queue_.front();
    const uint64_t from = tx_head_;
    while (free > 0 && item.part < item.parts.size()) {
      const asio::const_buffer& part = item.parts[item.part];
      const uint64_t n = std::min<uint64_t>(free, part.size() - item.part_done);
      const RingSpans spans = ring_.Locate(tx_head_, n);
      uint64_t copied = 0;
      for (int i = 0; i < spans.count; ++i) {
        std::memcpy(memory + spans.span[i].offset, static_cast<const std::byte*>(part.data()) + item.part_done + copied,
                    spans.span[i].length);
        copied += spans.span[i].length;
      }
      tx_head_ += n;
      free -= n;
      item.part_done += n;
      if (item.part_done == part.size()) {
        ++item.part;
        item.part_done = 0;
      }
    }
    Publish(from, tx_head_);
    if (failed_write_) return;  // Publish may have failed the channel
    if (item.part == item.parts.size()) {
      queue_.pop_front();
      queue_notice_.Check(queue_.size(), executor_);
    }
  }
  if (close_after_flush_ && !send_closed_) {
    send_closed_ = true;
    CloseSend(tx_head_);
    if (close_both_) {
      WhenDelivered([this, alive = alive_] {
        if (*alive) ShutdownLiveness();
      });
    }
  }
  NotifyIdle();
}

void RingChannel::NotifyIdle() {
  // Later, not from inside Send: owners react to idleness (e.g. finishing a failure) as they do with TCP, where it
  // is always a completion.
  if (!on_idle_) return;
  asio::post(executor_, [this, alive = alive_] {
    if (*alive && queue_.empty() && on_idle_) on_idle_();
  });
}

void RingChannel::CloseAfterFlush(bool both) {
  if (close_after_flush_) return;
  close_after_flush_ = true;
  close_both_ = both;
  // With the writes failed nothing more is published, and the peer learns of the close from the liveness
  // connection, as TCP's FrameWriter shuts its socket down whatever its writes did.
  if (failed_write_) {
    if (both) ShutdownLiveness();
    return;
  }
  if (queue_.empty() && !waiting_for_space_) Pump();
}

void RingChannel::DropQueued() {
  if (queue_.empty()) return;
  const Item& front = queue_.front();
  const bool started = front.part > 0 || front.part_done > 0;
  queue_.erase(queue_.begin() + (started ? 1 : 0), queue_.end());
  queue_notice_.Check(queue_.size(), executor_);
  if (queue_.empty()) NotifyIdle();
}

void RingChannel::FailWrites(const Status& error) {
  if (failed_write_) return;
  failed_write_ = error;
  const bool had_items = !queue_.empty();
  queue_.clear();
  queue_notice_.Check(0, executor_);
  if (on_error_) {
    asio::post(executor_, [this, alive = alive_, error] {
      if (*alive && on_error_) on_error_(error);
    });
  }
  if (had_items) NotifyIdle();
}

void RingChannel::PeerGone() {
  if (peer_gone_) return;
  peer_gone_ = true;
  CancelWaits();  // a sleeping reader drains what is left; a writer waiting for space fails below
  FailWrites(PeerClosed());
}

void RingChannel::Fail(const Status& error) {
  if (failed_) return;
  failed_ = error;
  CancelWaits();
  FailWrites(error);
}

void RingChannel::Abort() {
  Fail(Status(StatusCode::kAborted, "connection closed"));
  CancelWaits();  // also when it had failed already: whatever waits now must end, as Abort promises
  boost::system::error_code ignored;
  liveness_.shutdown(asio::ip::tcp::socket::shutdown_both, ignored);  // as TcpChannel::Abort: also for a fork's copy
  liveness_.close(ignored);
}

}  // namespace sparsereduce::transport
