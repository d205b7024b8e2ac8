#include "transport/channel.h"

namespace sparsereduce::transport {

namespace {
constexpr const char* kPeerClosed = "connection closed by peer";
}  // namespace

Status PeerClosed() { return Status(StatusCode::kUnavailable, kPeerClosed); }

bool IsPeerClosed(const Status& status) {
  return status.code() == StatusCode::kUnavailable && status.message() == kPeerClosed;
}

void Channel::Send(std::shared_ptr<const ByteBuffer> frame) {
  std::vector<boost::asio::const_buffer> parts{boost::asio::buffer(frame->data(), frame->size())};
  Send(std::move(parts), std::move(frame));
}

}  // namespace sparsereduce::transport
