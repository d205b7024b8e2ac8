// transport::Channel over a TCP socket: frame_stream's reads and its ordered, gather-writing FrameWriter.
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
      : socket_(std::move(socket)), writer_(socket_, std::move(executor)) {}

  const char* kind() const override { return "tcp"; }
  asio::awaitable<Result<FrameHeader>> ReadHeader() override { return ReadFrameHeader(socket_); }
  asio::awaitable<Result<ByteBuffer>> ReadPayload(uint64_t size, BufferPool* pool) override {
    return tcp::ReadPayload(socket_, size, pool);
  }
  asio::awaitable<Status> Discard(uint64_t size) override { return DiscardBytes(socket_, size); }

  using Channel::Send;
  void Send(std::vector<asio::const_buffer> parts, std::shared_ptr<const void> owner) override {
    writer_.Send(std::move(parts), std::move(owner));
  }
  void set_error_handler(ErrorHandler handler) override { writer_.set_error_handler(std::move(handler)); }
  void set_idle_handler(IdleHandler handler) override { writer_.set_idle_handler(std::move(handler)); }
  bool idle() const override { return writer_.idle(); }
  void CloseAfterFlush(bool both) override { writer_.CloseAfterFlush(both); }
  void DropQueued() override { writer_.DropQueued(); }
  void Abort() override {
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

  // Gives the socket back, e.g. to keep it beside a shared-memory channel. Only when idle().
  Socket ReleaseSocket() { return std::move(socket_); }

 private:
  Socket socket_;
  FrameWriter writer_;
};

}  // namespace sparsereduce::tcp
