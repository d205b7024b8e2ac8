#include "transport/tcp/readable.h"

#include <sys/socket.h>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>

namespace sparsereduce::tcp {

boost::asio::awaitable<boost::system::error_code> WaitUntilReadable(boost::asio::ip::tcp::socket& socket) {
  while (true) {
    auto [ec] = co_await socket.async_wait(boost::asio::socket_base::wait_read,
                                           boost::asio::as_tuple(boost::asio::use_awaitable));
    if (ec) co_return ec;
    char byte;
    const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) co_return boost::system::error_code();
  }
}

}  // namespace sparsereduce::tcp
