#include "transport/tcp/frame_stream.h"

#include <sys/socket.h>

#include <algorithm>
#include <array>
#include <boost/asio/as_tuple.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/completion_condition.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <climits>
#include <cstring>

#include "transport/channel.h"

namespace sparsereduce::tcp {
namespace {

Status FromErrorCode(const boost::system::error_code& ec, const char* operation) {
  if (ec == asio::error::eof) return transport::PeerClosed();
  if (ec == asio::error::operation_aborted) return Status(StatusCode::kAborted, std::string(operation) + " cancelled");
  return Status(StatusCode::kUnavailable, std::string(operation) + " failed: " + ec.message());
}

// A read of a frame that ended early. UNAVAILABLE, as a close between frames (docs/PROTOCOL.md §3): a peer that
// follows the protocol never ends its stream inside a frame, so this is a peer that was killed or crashed while
// writing, which a reset at the same point already reported as UNAVAILABLE; the message says where it was cut.
Status HeaderReadError(const boost::system::error_code& ec, size_t got) {
  if (ec == asio::error::eof && got > 0) {
    return Status(StatusCode::kUnavailable, "connection closed inside a frame header (" + std::to_string(got) +
                                                " bytes)");
  }
  return FromErrorCode(ec, "read");
}

Status PayloadReadError(const boost::system::error_code& ec, uint64_t got, uint64_t size) {
  if (ec == asio::error::eof) {
    return Status(StatusCode::kUnavailable, "connection closed inside a frame payload (" + std::to_string(got) +
                                                " of " + std::to_string(size) + " bytes)");
  }
  return FromErrorCode(ec, "read");
}

ByteBuffer NewPayload(uint64_t size, BufferPool* pool) { return pool ? pool->Acquire(size) : ByteBuffer(size); }

}  // namespace

asio::awaitable<Result<FrameHeader>> ReadFrameHeader(Socket& socket) {
  std::array<std::byte, kFrameHeaderSize> bytes;
  auto [ec, n] = co_await asio::async_read(socket, asio::buffer(bytes), asio::as_tuple(asio::use_awaitable));
  if (ec) co_return HeaderReadError(ec, n);
  co_return DecodeFrameHeader(bytes);
}

asio::awaitable<Result<ByteBuffer>> ReadPayload(Socket& socket, uint64_t size, BufferPool* pool) {
  ByteBuffer payload = NewPayload(size, pool);
  if (size == 0) co_return payload;
  auto [ec, n] = co_await asio::async_read(socket, asio::buffer(payload.data(), size),
                                           asio::as_tuple(asio::use_awaitable));
  if (ec) co_return PayloadReadError(ec, n, size);
  co_return payload;
}

FrameReader::FrameReader(Socket& socket, size_t read_ahead) : socket_(socket), buffer_(read_ahead) {}

asio::awaitable<boost::system::error_code> FrameReader::Fill(size_t bytes) {
  if (buffered() >= bytes) co_return boost::system::error_code{};
  if (buffer_.size() - begin_ < bytes) {  // move the unread bytes to the front to make room
    std::memmove(buffer_.data(), buffer_.data() + begin_, buffered());
    end_ -= begin_;
    begin_ = 0;
  }
  auto [ec, n] = co_await asio::async_read(socket_, asio::buffer(buffer_.data() + end_, buffer_.size() - end_),
                                           asio::transfer_at_least(bytes - buffered()),
                                           asio::as_tuple(asio::use_awaitable));
  end_ += n;
  co_return ec;
}

asio::awaitable<Result<FrameHeader>> FrameReader::ReadHeader() {
  if (const boost::system::error_code ec = co_await Fill(kFrameHeaderSize); ec) {
    co_return HeaderReadError(ec, buffered());
  }
  Result<FrameHeader> header = DecodeFrameHeader(std::span(buffer_.data() + begin_, kFrameHeaderSize));
  begin_ += kFrameHeaderSize;
  co_return header;
}

asio::awaitable<Result<ByteBuffer>> FrameReader::ReadPayload(uint64_t size, BufferPool* pool) {
  ByteBuffer payload = NewPayload(size, pool);
  const std::array target{asio::mutable_buffer(payload.data(), size)};
  if (Status st = co_await ReadInto(target); !st.ok()) co_return st;
  co_return payload;
}

asio::awaitable<Status> FrameReader::ReadInto(std::span<const asio::mutable_buffer> targets) {
  uint64_t size = 0;
  for (const asio::mutable_buffer& t : targets) size += t.size();
  // The read-ahead bytes first; once it is empty, the rest goes straight into place and what follows it into the
  // read-ahead buffer, in the same recv.
  size_t t = 0;
  size_t t_done = 0;
  while (t < targets.size() && buffered() > 0) {
    const size_t n = std::min(targets[t].size() - t_done, buffered());
    if (n > 0) std::memcpy(static_cast<std::byte*>(targets[t].data()) + t_done, buffer_.data() + begin_, n);
    begin_ += n;
    t_done += n;
    if (t_done == targets[t].size()) {
      ++t;
      t_done = 0;
    }
  }
  if (t == targets.size()) co_return Status::Ok();
  begin_ = end_ = 0;
  uint64_t rest = 0;
  std::vector<asio::mutable_buffer>& iov = scatter_;
  iov.clear();
  for (size_t i = t; i < targets.size(); ++i) {
    const size_t skip = i == t ? t_done : 0;
    if (targets[i].size() == skip) continue;
    iov.push_back(asio::buffer(static_cast<std::byte*>(targets[i].data()) + skip, targets[i].size() - skip));
    rest += targets[i].size() - skip;
  }
  if (rest == 0) co_return Status::Ok();
  iov.push_back(asio::buffer(buffer_.data(), buffer_.size()));
  auto [ec, n] = co_await asio::async_read(socket_, iov, asio::transfer_at_least(rest),
                                           asio::as_tuple(asio::use_awaitable));
  if (n > rest) end_ = n - rest;
  if (ec && n < rest) co_return PayloadReadError(ec, size - rest + n, size);
  co_return Status::Ok();
}

asio::awaitable<Status> FrameReader::Discard(uint64_t size) {
  const uint64_t total = size;
  while (size > 0) {
    if (buffered() == 0) {
      begin_ = end_ = 0;
      if (const boost::system::error_code ec = co_await Fill(1); ec)
        co_return PayloadReadError(ec, total - size, total);
    }
    const size_t take = static_cast<size_t>(std::min<uint64_t>(size, buffered()));
    begin_ += take;
    size -= take;
  }
  co_return Status::Ok();
}

void FrameWriter::Send(std::vector<asio::const_buffer> buffers, std::shared_ptr<const void> owner) {
  if (failed_ || close_after_flush_) return;
  queue_.push_back(Item{std::move(buffers), std::move(owner)});
  if (!waiting_) WriteNext(/*from_send=*/true);
}

void FrameWriter::Send(std::shared_ptr<const ByteBuffer> frame) {
  std::vector<asio::const_buffer> buffers{asio::buffer(frame->data(), frame->size())};
  Send(std::move(buffers), std::move(frame));
}

void FrameWriter::CloseAfterFlush(bool both) {
  close_after_flush_ = true;
  close_both_ = both;
  if (queue_.empty()) {
    boost::system::error_code ignored;
    socket_.shutdown(both ? Socket::shutdown_both : Socket::shutdown_send, ignored);
  }
}

void FrameWriter::DropQueued() {
  if (queue_.empty()) return;
  // A frame partly written must be finished, or the stream would lose its framing.
  const bool started = front_part_ > 0 || front_offset_ > 0;
  queue_.erase(queue_.begin() + (started ? 1 : 0), queue_.end());
  queue_notice_.Check(queue_.size(), executor_);
  if (queue_.empty() && on_idle_) on_idle_();
}

void FrameWriter::Consume(size_t bytes) {
  while (!queue_.empty()) {
    const Item& front = queue_.front();
    for (; front_part_ < front.buffers.size(); ++front_part_, front_offset_ = 0) {
      const size_t left = front.buffers[front_part_].size() - front_offset_;
      if (left > bytes) {
        front_offset_ += bytes;
        return;
      }
      bytes -= left;
    }
    queue_.pop_front();
    front_part_ = 0;
    front_offset_ = 0;
    queue_notice_.Check(queue_.size(), executor_);
  }
}

void FrameWriter::Notify(bool from_send, std::function<void()> notify) {
  if (!from_send) return notify();
  asio::post(executor_, [alive = alive_, notify = std::move(notify)] {
    if (*alive) notify();
  });
}

void FrameWriter::Failed(const boost::system::error_code& ec, bool from_send) {
  queue_.clear();
  front_part_ = front_offset_ = 0;
  queue_notice_.Check(0, executor_);
  if (failed_) return;
  failed_ = true;
  Notify(from_send, [this, status = FromErrorCode(ec, "write")] {
    if (on_error_) on_error_(status);
    if (on_idle_) on_idle_();
  });
}

void FrameWriter::WriteNext(bool from_send) {
  const size_t max_parts = IOV_MAX;
  while (!queue_.empty()) {
    iov_.clear();
    size_t requested = 0;
    for (auto item = queue_.begin(); item != queue_.end() && iov_.size() < max_parts; ++item) {
      const bool front = item == queue_.begin();
      for (size_t p = front ? front_part_ : 0; p < item->buffers.size() && iov_.size() < max_parts; ++p) {
        const size_t skip = front && p == front_part_ ? front_offset_ : 0;
        const asio::const_buffer& part = item->buffers[p];
        if (part.size() == skip) continue;
        iov_.push_back(iovec{const_cast<std::byte*>(static_cast<const std::byte*>(part.data())) + skip,
                             part.size() - skip});
        requested += part.size() - skip;
      }
    }
    msghdr message{};
    message.msg_iov = iov_.data();
    message.msg_iovlen = iov_.size();
    const ssize_t written = requested ? ::sendmsg(socket_.native_handle(), &message, MSG_NOSIGNAL | MSG_DONTWAIT) : 0;
    if (written < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        return Failed(boost::system::error_code(errno, boost::system::system_category()), from_send);
      }
    } else {
      Consume(static_cast<size_t>(written));
      if (static_cast<size_t>(written) == requested) continue;
    }
    // The socket's send buffer is full: go on when there is room.
    waiting_ = true;
    socket_.async_wait(Socket::wait_write,
                       asio::bind_executor(executor_, [this, alive = alive_](const boost::system::error_code& ec) {
                         if (!*alive) return;
                         waiting_ = false;
                         if (ec) return Failed(ec, /*from_send=*/false);
                         WriteNext(/*from_send=*/false);
                       }));
    return;
  }
  if (close_after_flush_) {
    boost::system::error_code ignored;
    socket_.shutdown(close_both_ ? Socket::shutdown_both : Socket::shutdown_send, ignored);
  }
  if (on_idle_) {
    Notify(from_send, [this] {
      if (queue_.empty() && on_idle_) on_idle_();
    });
  }
}

}  // namespace sparsereduce::tcp
