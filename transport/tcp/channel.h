// transport::Channel over a TCP socket: frame_stream's read-ahead FrameReader and its ordered, gathering
// FrameWriter.
#pragma once

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "transport/channel.h"
#include "transport/tcp/frame_stream.h"

namespace sparsereduce::tcp {

class TcpChannel final : public transport::Channel {
 public:
  // Takes the connected socket; writes complete on `executor`.
  TcpChannel(Socket socket, asio::any_io_executor executor)
      : socket_(std::move(socket)), reader_(socket_), writer_(socket_, std::move(executor)) {}

  const char* kind() const override { return "tcp"; }
  asio::awaitable<Result<FrameHeader>> ReadHeader() override { return reader_.ReadHeader(); }
  asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool) override {
    return reader_.ReadPayload(size, pool);
  }
  asio::awaitable<Status> ReadInto(std::span<const asio::mutable_buffer> targets) override {
    return reader_.ReadInto(targets);
  }
  asio::awaitable<Status> Discard(uint64_t size) override { return reader_.Discard(size); }

  using Channel::Send;
  void Send(std::vector<asio::const_buffer> parts, std::shared_ptr<const void> owner) override {
    writer_.Send(std::move(parts), std::move(owner));
  }
  void set_error_handler(ErrorHandler handler) override { writer_.set_error_handler(std::move(handler)); }
  void set_idle_handler(IdleHandler handler) override { writer_.set_idle_handler(std::move(handler)); }
  bool idle() const override { return writer_.idle(); }
  size_t queued_frames() const override { return writer_.queued_frames(); }
  void NotifyWhenQueuedAtMost(size_t frames, std::function<void()> handler) override {
    writer_.NotifyWhenQueuedAtMost(frames, std::move(handler));
  }
  void CloseAfterFlush(bool both) override { writer_.CloseAfterFlush(both); }
  void DropQueued() override { writer_.DropQueued(); }
  void Abort() override {
    boost::system::error_code ignored;
    // The connection ends for the peer even when a child of fork() holds a copy of the descriptor, which a close
    // alone leaves open (the peer then waits for the rest of a frame until its own timeout).
    socket_.shutdown(Socket::shutdown_both, ignored);
    socket_.close(ignored);
  }

  // Gives the socket back, e.g. to keep it beside a shared-memory channel. Only when idle() and no read is
  // running. Bytes the peer sent after its last frame read here are an error: once a connection moves to
  // another transport nothing more may arrive on TCP (docs/PROTOCOL.md §10).
  Result<Socket> ReleaseSocket() {
    if (reader_.buffered() > 0) {
      return ProtocolError(std::to_string(reader_.buffered()) +
                           " bytes arrived on TCP after the last frame before the move to another transport");
    }
    return std::move(socket_);
  }

 private:
  Socket socket_;
  FrameReader reader_;
  FrameWriter writer_;
};

}  // namespace sparsereduce::tcp
