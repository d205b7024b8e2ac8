// Frames over a TCP socket: exact reads for the handshake, a read-ahead FrameReader for the data path (header
// first, then a payload whose size the caller has checked), and an ordered write queue that gathers queued frames
// into one sendmsg. Shared by the aggregator daemon and the worker library. Include only from .cc files: it pulls
// in Asio.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <sys/uio.h>

#include "transport/queue_notice.h"

#include "core/buffer_pool.h"
#include "core/byte_buffer.h"
#include "core/status.h"
#include "protocol/frame.h"

namespace sparsereduce::tcp {

namespace asio = boost::asio;
using Socket = asio::ip::tcp::socket;

// Exact reads, nothing read ahead: for the handshake, after which the socket may move to another transport.
// Reads and decodes a frame header. End of stream before the first byte is kUnavailable "connection closed".
asio::awaitable<Result<FrameHeader>> ReadFrameHeader(Socket& socket);
// Reads exactly `size` payload bytes, into a buffer from `pool` when one is given.
asio::awaitable<Result<ByteBuffer>> ReadPayload(Socket& socket, uint64_t size, BufferPool* pool = nullptr);

// Reads frames from one socket through a read-ahead buffer, so that a stream of frames costs about one recv per
// frame or fewer instead of one for the header and one for the payload: a header, and the payloads of small frames,
// usually arrive with the recv that finished the previous frame. A payload is read straight into its own buffer,
// with the read-ahead buffer as a second iovec that catches what follows. Not thread-safe; one read at a time.
class FrameReader {
 public:
  explicit FrameReader(Socket& socket, size_t read_ahead = 64 * 1024);
  FrameReader(const FrameReader&) = delete;
  FrameReader& operator=(const FrameReader&) = delete;

  // As ReadFrameHeader and ReadPayload above; Discard reads and drops `size` bytes.
  asio::awaitable<Result<FrameHeader>> ReadHeader();
  asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool);
  asio::awaitable<Status> Discard(uint64_t size);
  // Reads exactly the bytes of `targets` into them, in order: what is read ahead first, the rest straight into
  // place with the read-ahead buffer as one more iovec (ReadPayload is ReadInto of one new buffer).
  asio::awaitable<Status> ReadInto(std::span<const asio::mutable_buffer> targets);

  // Bytes received but not yet consumed by a read.
  size_t buffered() const { return end_ - begin_; }

 private:
  // Reads until at least `bytes` (<= capacity) are buffered. Returns the error and how many bytes are buffered.
  asio::awaitable<boost::system::error_code> Fill(size_t bytes);

  Socket& socket_;
  std::vector<std::byte> buffer_;
  std::vector<asio::mutable_buffer> scatter_;  // ReadInto's iovecs (Asio copies them into the operation)
  size_t begin_ = 0;  // unread bytes are buffer_[begin_, end_)
  size_t end_ = 0;
};

// Serializes writes on one socket. Not thread-safe: use it from the executor `executor` only (the worker's I/O
// thread, or the job strand in the aggregator); completions are bound to that executor. Queued frames go out
// together: one sendmsg takes as many of their parts as the kernel accepts in one call (IOV_MAX), where an Asio
// write stops at 64 parts, so a fused frame of 128 blocks is one system call instead of three.
class FrameWriter {
 public:
  using ErrorHandler = std::function<void(const Status&)>;
  using IdleHandler = std::function<void()>;

  FrameWriter(Socket& socket, asio::any_io_executor executor) : socket_(socket), executor_(std::move(executor)) {}
  FrameWriter(const FrameWriter&) = delete;
  FrameWriter& operator=(const FrameWriter&) = delete;

  // Called once with the first write error.
  void set_error_handler(ErrorHandler handler) { on_error_ = std::move(handler); }
  // Called whenever the queue runs empty (also after an error).
  void set_idle_handler(IdleHandler handler) { on_idle_ = std::move(handler); }

  // Queues a frame made of `buffers`; `owner` keeps the memory they point to alive until written.
  void Send(std::vector<asio::const_buffer> buffers, std::shared_ptr<const void> owner);
  void Send(std::shared_ptr<const ByteBuffer> frame);
  void Send(ByteBuffer frame) { Send(std::make_shared<const ByteBuffer>(std::move(frame))); }

  // After the queued frames are written, shut down the sending side (the peer reads them, then end of stream);
  // with `both`, the receiving side too.
  void CloseAfterFlush(bool both = true);
  // Forgets queued frames that have not started; a frame being written is finished (the stream stays framed).
  void DropQueued();

  // sendmsg copies what it accepts, so only queued frames still use their parts.
  bool idle() const { return queue_.empty(); }
  size_t queued_frames() const { return queue_.size(); }
  void NotifyWhenQueuedAtMost(size_t frames, std::function<void()> handler) {
    queue_notice_.Arm(frames, std::move(handler));
    queue_notice_.Check(queue_.size(), executor_);
  }

 private:
  struct Item {
    std::vector<asio::const_buffer> buffers;
    std::shared_ptr<const void> owner;
  };
  // Writes queued bytes until the queue is empty or the socket is full, then waits for it to become writable.
  // Handlers run later (posted) when `from_send`, so that Send never calls back into its caller.
  void WriteNext(bool from_send);
  // Drops `bytes` written bytes from the front of the queue, and items with nothing left to write.
  void Consume(size_t bytes);
  void Failed(const boost::system::error_code& ec, bool from_send);
  void Notify(bool from_send, std::function<void()> notify);

  Socket& socket_;
  asio::any_io_executor executor_;
  std::deque<Item> queue_;
  size_t front_part_ = 0;    // first part of queue_.front() not completely written
  size_t front_offset_ = 0;  // bytes of that part already written
  bool waiting_ = false;     // for the socket to become writable
  std::vector<iovec> iov_;   // scratch for sendmsg
  bool close_after_flush_ = false;
  bool close_both_ = true;
  bool failed_ = false;
  ErrorHandler on_error_;
  IdleHandler on_idle_;
  transport::QueueNotice queue_notice_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

 public:
  ~FrameWriter() { *alive_ = false; }
};

}  // namespace sparsereduce::tcp
