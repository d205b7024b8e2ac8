#include "transport/tcp/frame_stream.h"

#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

namespace sparsereduce::tcp {
namespace {

Status FromErrorCode(const boost::system::error_code& ec, const char* operation) {
  if (ec == asio::error::eof) return Status(StatusCode::kUnavailable, "connection closed by peer");
  if (ec == asio::error::operation_aborted) return Status(StatusCode::kAborted, std::string(operation) + " cancelled");
  return Status(StatusCode::kUnavailable, std::string(operation) + " failed: " + ec.message());
}

}  // namespace

asio::awaitable<Result<FrameHeader>> ReadFrameHeader(Socket& socket) {
  std::array<std::byte, kFrameHeaderSize> bytes;
  auto [ec, n] = co_await asio::async_read(socket, asio::buffer(bytes), asio::as_tuple(asio::use_awaitable));
  if (ec) {
    if (ec == asio::error::eof && n > 0) {
      co_return ProtocolError("connection closed inside a frame header (" + std::to_string(n) + " bytes)");
    }
    co_return FromErrorCode(ec, "read");
  }
  co_return DecodeFrameHeader(bytes);
}

asio::awaitable<Result<ByteBuffer>> ReadPayload(Socket& socket, uint64_t size, BufferPool* pool) {
  ByteBuffer payload = pool ? pool->Acquire(size) : ByteBuffer(size);
  if (size == 0) co_return payload;
  auto [ec, n] = co_await asio::async_read(socket, asio::buffer(payload.data(), size),
                                           asio::as_tuple(asio::use_awaitable));
  if (ec) {
    if (ec == asio::error::eof) {
      co_return ProtocolError("connection closed inside a frame payload (" + std::to_string(n) + " of " +
                              std::to_string(size) + " bytes)");
    }
    co_return FromErrorCode(ec, "read");
  }
  co_return payload;
}

asio::awaitable<Status> DiscardBytes(Socket& socket, uint64_t size) {
  // On the heap, not in the coroutine frame: frames are allocated per call anyway and should stay small.
  std::vector<std::byte> scratch(size < 64 * 1024 ? static_cast<size_t>(size) : 64 * 1024);
  while (size > 0) {
    const size_t chunk = size < scratch.size() ? static_cast<size_t>(size) : scratch.size();
    auto [ec, n] = co_await asio::async_read(socket, asio::buffer(scratch.data(), chunk),
                                             asio::as_tuple(asio::use_awaitable));
    if (ec) co_return FromErrorCode(ec, "read");
    size -= n;
  }
  co_return Status::Ok();
}

void FrameWriter::Send(std::vector<asio::const_buffer> buffers, std::shared_ptr<const void> owner) {
  if (failed_ || close_after_flush_) return;
  queue_.push_back(Item{std::move(buffers), std::move(owner)});
  if (!writing_) WriteNext();
}

void FrameWriter::Send(std::shared_ptr<const ByteBuffer> frame) {
  std::vector<asio::const_buffer> buffers{asio::buffer(frame->data(), frame->size())};
  Send(std::move(buffers), std::move(frame));
}

void FrameWriter::CloseAfterFlush(bool both) {
  close_after_flush_ = true;
  close_both_ = both;
  if (!writing_ && queue_.empty()) {
    boost::system::error_code ignored;
    socket_.shutdown(both ? Socket::shutdown_both : Socket::shutdown_send, ignored);
  }
}

void FrameWriter::DropQueued() {
  if (queue_.empty()) return;
  // The front item is in flight while writing_; keep it.
  queue_.erase(queue_.begin() + (writing_ ? 1 : 0), queue_.end());
  if (!writing_ && on_idle_) on_idle_();
}

void FrameWriter::WriteNext() {
  if (queue_.empty()) {
    writing_ = false;
    if (close_after_flush_) {
      boost::system::error_code ignored;
      socket_.shutdown(close_both_ ? Socket::shutdown_both : Socket::shutdown_send, ignored);
    }
    if (on_idle_) on_idle_();
    return;
  }
  writing_ = true;
  asio::async_write(socket_, queue_.front().buffers,
                    asio::bind_executor(executor_, [this, alive = alive_](const boost::system::error_code& ec,
                                                                         size_t) {
                      if (!*alive) return;
                      queue_.pop_front();
                      if (ec) {
                        writing_ = false;
                        queue_.clear();
                        if (!failed_) {
                          failed_ = true;
                          if (on_error_) on_error_(FromErrorCode(ec, "write"));
                        }
                        if (*alive && on_idle_) on_idle_();
                        return;
                      }
                      WriteNext();
                    }));
}

}  // namespace sparsereduce::tcp
