// transport::Channel over two one-sided byte rings (byte_ring.h): frames are copied into the ring the peer reads
// and out of the ring this side reads. How bytes reach the peer and how a sleeping side is woken belongs to the
// backend: shared memory (memcpy into the peer-visible ring, socket-pair wake-ups; transport/shm) or RDMA (a
// registered staging ring written to the peer's ring with RDMA_WRITE_WITH_IMM, completion events; transport/rdma).
// Everything else is here, once: reading frames, the ordered send queue, flow control by ring space, end of stream
// and failure, and watching the TCP connection the channel was negotiated on, which stays open beside it: the
// kernel closes it when the peer process dies, and the channel then ends once it has read everything the peer
// wrote.
#pragma once

#include <array>
#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "transport/channel.h"
#include "transport/ring/byte_ring.h"
#include "transport/ring/loan_ledger.h"
#include "transport/queue_notice.h"

namespace sparsereduce::transport {

class RingChannel : public Channel {
 public:
  // Takes the TCP connection as the liveness signal; everything runs on `executor`. Call StartLiveness() once the
  // derived class is constructed.
  RingChannel(uint64_t ring_capacity, boost::asio::ip::tcp::socket liveness, boost::asio::any_io_executor executor);
  ~RingChannel() override;

  boost::asio::awaitable<Result<FrameHeader>> ReadHeader() override;
  boost::asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool) override;
  // In place when the backend lends (EnableLending), a recall handler is set, the payload does not wrap around the
  // ring's end, and what loans hold back of the ring, with it, is at most MaxHeldBack(); otherwise a copy. Whatever
  // this side reads, it never waits for the peer while loans hold back more than that: it recalls them first, so
  // the peer always has room to write.
  boost::asio::awaitable<Result<ByteBuffer>> ReadPayloadLent(uint64_t size, BufferPool* pool) override;
  void set_recall_handler(std::function<void()> handler) override;
  boost::asio::awaitable<Status> ReadInto(std::span<const boost::asio::mutable_buffer> targets) override;
  boost::asio::awaitable<Status> Discard(uint64_t size) override;

  using Channel::Send;
  void Send(std::vector<boost::asio::const_buffer> parts, std::shared_ptr<const void> owner) override;
  void set_error_handler(ErrorHandler handler) override { on_error_ = std::move(handler); }
  void set_idle_handler(IdleHandler handler) override { on_idle_ = std::move(handler); }
  bool idle() const override { return queue_.empty(); }
  size_t queued_frames() const override { return queue_.size(); }
  void NotifyWhenQueuedAtMost(size_t frames, std::function<void()> handler) override {
    queue_notice_.Arm(frames, std::move(handler));
    queue_notice_.Check(queue_.size(), executor_);
  }
  void CloseAfterFlush(bool both) override;
  void DropQueued() override;
  void Abort() override;

 protected:
  // What the peer has made visible in the receive ring: its head, and whether nothing follows it.
  struct Received {
    uint64_t head = 0;
    bool closed = false;
  };

  // --- receive ring: the peer writes, this side reads ---
  virtual const std::byte* ReceiveMemory() = 0;
  virtual Received LoadReceived() = 0;
  // Everything before `tail` is consumed; the peer may write there again.
  virtual void Consumed(uint64_t tail) = 0;
  // Returns once LoadReceived() may show more than `tail` (or the peer closed, or waits were cancelled). Must not
  // lose a wakeup that happens between the caller's last LoadReceived() and the sleep.
  virtual boost::asio::awaitable<void> WaitForData(uint64_t tail) = 0;

  // --- send ring: this side writes, the peer reads ---
  // Where this side puts the bytes of position p (at offset p mod capacity); the backend moves them to the peer.
  virtual std::byte* SendMemory() = 0;
  virtual uint64_t LoadPeerTail() = 0;
  // Bytes [from, to) are in SendMemory(): make them visible to the peer and wake it if it sleeps.
  virtual void Publish(uint64_t from, uint64_t to) = 0;
  // Calls `wake` (on the channel's executor) once LoadPeerTail() may have moved past what it showed at `head`.
  virtual void WaitForSpace(uint64_t head, std::function<void()> wake) = 0;
  // No byte will follow `head`.
  virtual void CloseSend(uint64_t head) = 0;
  // Calls `then` (now or on the channel's executor) once everything published and the close are in the peer's
  // memory, or the channel failed. Only then may the TCP connection close: the peer takes its end as "nothing more
  // will arrive". Shared memory writes are visible at once.
  virtual void WhenDelivered(std::function<void()> then) { then(); }

  // --- lifecycle ---
  // Makes pending WaitForData / WaitForSpace return (their callers then look at the channel's state).
  virtual void CancelWaits() = 0;

  // --- lending the receive ring (ReadPayloadLent) ---
  // A backend whose receive memory a reader may use in place calls this from its constructor; `memory_owner`
  // keeps ReceiveMemory() valid while buffers lent from it live. Lending starts once a recall handler is set.
  // Consumed() may then also be called from the thread that destroys a lent buffer (serialized by the channel), so
  // it must be thread-safe, and the backend's destructor must call StopLending() before its members go.
  void EnableLending(std::shared_ptr<const void> memory_owner);
  void StopLending();

  // Watches the TCP connection: its end means the peer is gone.
  void StartLiveness();
  // The peer ended: reads drain what is in the ring and then end, writes fail at once.
  void PeerGone();
  // The connection is unusable (e.g. a hostile position, a device error): reads and writes fail with `error`.
  void Fail(const Status& error);

  // Fail() was called: the backend stops waiting and writing.
  bool failed() const { return failed_.has_value(); }
  const ByteRing& ring() const { return ring_; }
  const boost::asio::any_io_executor& executor() const { return executor_; }
  const std::shared_ptr<bool>& alive() const { return alive_; }

 private:
  struct Item {
    std::vector<boost::asio::const_buffer> parts;
    std::shared_ptr<const void> owner;
    size_t part = 0;       // first part not completely copied
    size_t part_done = 0;  // bytes of it already copied
  };

  class Lender;  // the BufferLender of lent payloads; outlives the channel while they do

  // Copies exactly the targets' bytes out of the receive ring into them, in order (a target without a data
  // pointer drops its bytes). `in_frame`: the bytes belong to a frame already started, so end of stream is a
  // protocol error.
  boost::asio::awaitable<Status> ReadScattered(std::span<const boost::asio::mutable_buffer> targets, bool in_frame);
  // Tells the backend what may be written again: everything read, up to the first part still lent.
  void PublishConsumed();
  // Bytes read but held back from the peer by loans, and the most they may be: three quarters of the ring (half made
  // the daemon recall all the time with 8 slots of 128 KiB frames in a 2 MiB ring; the other quarter keeps the peer
  // writing).
  uint64_t HeldBack();
  uint64_t MaxHeldBack() const { return ring_.capacity() / 4 * 3; }
  // Counts a read of `bytes` done without suspending; true once a ring's worth of bytes or kReadsPerYield reads
  // (header-only frames: many reads, few bytes) have been: the reader then lets the executor run other handlers
  // before going on. A peer that keeps its ring full would otherwise hold the thread, which serves other
  // connections and jobs. A post per 256 reads costs nothing measurable.
  bool YieldDue(uint64_t bytes);
  static constexpr uint32_t kReadsPerYield = 256;
  // Checks the peer's head against what this side has read and what loans still hold (docs/PROTOCOL.md §10.2).
  Status CheckReceived(uint64_t head);
  // What the peer has made visible, checked; a failed check fails the channel.
  Result<Received> LoadChecked();
  // Asks the reader to give back what it was lent (the recall handler), then publishes what that freed.
  void Recall();
  // Copies queued frames into the send ring as far as space allows, then waits for space. At most
  // kPassesPerPump passes (each copies what the peer has freed) before it lets the executor run other handlers:
  // a peer that frees its ring a few bytes at a time kept the thread copying, and signalling, for seconds.
  void Pump();
  static constexpr uint32_t kPassesPerPump = 16;
  void FailWrites(const Status& error);  // drops the queue, reports `error` once
  void NotifyIdle();
  void ShutdownLiveness();

  ByteRing ring_;
  // Where a byte on the liveness connection would go (nothing should ever arrive): the channel's own, as the read
  // may complete on any thread of the loop; declared before the socket, whose destruction ends the read.
  std::array<std::byte, 1> liveness_sink_{};
  boost::asio::ip::tcp::socket liveness_;
  boost::asio::any_io_executor executor_;
  uint64_t rx_tail_ = 0;
  uint64_t rx_head_seen_ = 0;         // the peer's head never moves back (CheckReceived)
  uint64_t read_without_yield_ = 0;   // YieldDue: bytes
  uint32_t reads_without_yield_ = 0;  // and reads
  uint64_t tx_head_ = 0;
  std::shared_ptr<const void> lend_memory_owner_;  // set by a backend that can lend (EnableLending)
  std::shared_ptr<Lender> lender_;  // once it can and a recall handler is set
  std::function<void()> on_recall_;

  std::deque<Item> queue_;
  bool waiting_for_space_ = false;
  bool pump_posted_ = false;  // Pump's continuation is queued on the executor
  bool close_after_flush_ = false;
  bool close_both_ = false;
  bool send_closed_ = false;
  bool peer_gone_ = false;              // read what is left, then end of stream
  std::optional<Status> failed_;        // reads fail with it
  std::optional<Status> failed_write_;  // sends are dropped
  ErrorHandler on_error_;
  IdleHandler on_idle_;
  QueueNotice queue_notice_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace sparsereduce::transport
