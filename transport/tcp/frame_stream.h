// Frames over a TCP socket: reading one frame (header first, then a payload whose size the caller has checked) and
// an ordered write queue with gather writes. Shared by the aggregator daemon and the worker library. Include only
// from .cc files: it pulls in Asio.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/buffer.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "core/buffer_pool.h"
#include "core/byte_buffer.h"
#include "core/status.h"
#include "protocol/frame.h"

namespace sparsereduce::tcp {

namespace asio = boost::asio;
using Socket = asio::ip::tcp::socket;

// Reads and decodes a frame header. End of stream before the first byte is kUnavailable "connection closed".
asio::awaitable<Result<FrameHeader>> ReadFrameHeader(Socket& socket);
// Reads exactly `size` payload bytes, into a buffer from `pool` when one is given.
asio::awaitable<Result<ByteBuffer>> ReadPayload(Socket& socket, uint64_t size, BufferPool* pool = nullptr);
// Reads and drops `size` bytes through a small scratch buffer (for frames of a job that no longer exists).
asio::awaitable<Status> DiscardBytes(Socket& socket, uint64_t size);

// Serializes writes on one socket. Not thread-safe: use it from the executor `executor` only (the worker's I/O
// thread, or the job strand in the aggregator); completions are bound to that executor.
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

  bool idle() const { return queue_.empty() && !writing_; }

 private:
  struct Item {
    std::vector<asio::const_buffer> buffers;
    std::shared_ptr<const void> owner;
  };
  void WriteNext();

  Socket& socket_;
  asio::any_io_executor executor_;
  std::deque<Item> queue_;
  bool writing_ = false;
  bool close_after_flush_ = false;
  bool close_both_ = true;
  bool failed_ = false;
  ErrorHandler on_error_;
  IdleHandler on_idle_;
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);

 public:
  ~FrameWriter() { *alive_ = false; }
};

}  // namespace sparsereduce::tcp
