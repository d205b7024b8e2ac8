#include "transport/channel.h"

namespace sparsereduce::transport {

void Channel::Send(std::shared_ptr<const ByteBuffer> frame) {
  std::vector<boost::asio::const_buffer> parts{boost::asio::buffer(frame->data(), frame->size())};
  Send(std::move(parts), std::move(frame));
}

}  // namespace sparsereduce::transport
