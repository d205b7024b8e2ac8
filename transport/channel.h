// One end of a worker-aggregator connection once its transport is set up: frames in both directions, reliable and
// in order. TCP (transport/tcp), shared memory (transport/shm) and RDMA (transport/rdma) implement it; the daemon's
// Session and the worker's AggregatorLink use nothing else, so the protocol above never changes per transport.
//
// Threading: a channel belongs to one executor (the worker's I/O thread, or the job strand in the daemon). Reads
// run in one coroutine at a time on it; Send and the other calls are made on it; handlers are called on it.
#pragma once

#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer_pool.h"
#include "core/byte_buffer.h"
#include "core/status.h"
#include "protocol/frame.h"

namespace sparsereduce::transport {

// The end of a stream between frames: the peer closed the connection, or its process ended. Every transport reports
// it this way (UNAVAILABLE), so that those above can tell it from other failures and say what it means.
Status PeerClosed();
bool IsPeerClosed(const Status& status);

class Channel {
 public:
  using ErrorHandler = std::function<void(const Status&)>;
  using IdleHandler = std::function<void()>;

  Channel() = default;
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;
  virtual ~Channel() = default;

  // "tcp", "shm" or "rdma".
  virtual const char* kind() const = 0;

  // Reads and decodes a frame header. End of stream before its first byte is kUnavailable "connection closed by
  // peer"; inside a frame it is a protocol error.
  virtual boost::asio::awaitable<Result<FrameHeader>> ReadHeader() = 0;
  // Reads exactly `size` payload bytes (the caller has checked `size` against its limit), into a buffer from
  // `pool` when one is given.
  virtual boost::asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool) = 0;
  // Like ReadPayload, but the buffer may be the transport's own receive memory, lent in place (no copy) until the
  // buffer is destroyed: a shared-memory ring then holds that part back from the peer. Its bytes are the peer's
  // to change while lent (it shares the memory), so a reader validates what it reads from it once and keeps the
  // result (ByteBuffer::on_loan() tells). When lent buffers would hold back too much of the ring, the channel
  // calls the recall handler (below) first, which must destroy (or copy and destroy) every buffer it lent. A
  // channel without a recall handler, or one that cannot lend, reads into a buffer as ReadPayload does.
  virtual boost::asio::awaitable<Result<ByteBuffer>> ReadPayloadLent(uint64_t size, BufferPool* pool) {
    return ReadPayload(size, pool);
  }
  // Called on the channel's executor, from inside a read, when the channel needs its lent buffers back. Lent
  // buffers themselves may be destroyed on any thread, also after the channel is gone.
  virtual void set_recall_handler(std::function<void()> handler) { (void)handler; }
  // Reads exactly as many payload bytes as `targets` hold, in order, straight into them (the caller has checked
  // that the frame has that many left). Lets a reader place a payload's parts where they belong, e.g. a RESULT's
  // blocks in the tensor, without a buffer in between.
  virtual boost::asio::awaitable<Status> ReadInto(std::span<const boost::asio::mutable_buffer> targets) = 0;
  // Reads and drops `size` bytes.
  virtual boost::asio::awaitable<Status> Discard(uint64_t size) = 0;

  // Queues one frame made of `parts`; frames go out in Send order. `owner` keeps the memory of `parts` alive
  // until the channel no longer needs it.
  virtual void Send(std::vector<boost::asio::const_buffer> parts, std::shared_ptr<const void> owner) = 0;
  void Send(std::shared_ptr<const ByteBuffer> frame);
  void Send(ByteBuffer frame) { Send(std::make_shared<const ByteBuffer>(std::move(frame))); }

  // Called once with the first write error.
  virtual void set_error_handler(ErrorHandler handler) = 0;
  // Called whenever the send queue runs empty (also after an error).
  virtual void set_idle_handler(IdleHandler handler) = 0;
  // True when nothing is queued or being written: no part given to Send is still in use.
  virtual bool idle() const = 0;
  // Frames given to Send that are not completely written yet.
  virtual size_t queued_frames() const = 0;
  // Calls `handler` once, later on the channel's executor, when at most `frames` frames are queued (at once if that
  // holds already; also when the channel fails). A new call replaces the pending one.
  virtual void NotifyWhenQueuedAtMost(size_t frames, std::function<void()> handler) = 0;

  // After the queued frames are written, ends the sending direction (the peer reads them, then end of stream);
  // with `both`, the receiving direction too.
  virtual void CloseAfterFlush(bool both) = 0;
  // Forgets queued frames that have not started; a frame being written is finished, so the stream stays framed.
  virtual void DropQueued() = 0;
  // Closes both directions now; pending reads and writes complete with errors.
  virtual void Abort() = 0;
};

}  // namespace sparsereduce::transport
