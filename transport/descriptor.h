// Watching a descriptor owned by someone else (a library) on the event loop.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <boost/asio/posix/stream_descriptor.hpp>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/status.h"

namespace sparsereduce::transport {

// Marks `fd` close-on-exec. Asio opens sockets without SOCK_CLOEXEC: a training process that runs a program
// (system(), a launcher) would hand it the worker's connections, and the aggregator would not see the worker's
// death while that program lives.
inline Status SetCloseOnExec(int fd) {
  const int flags = ::fcntl(fd, F_GETFD);
  if (flags < 0 || ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC) != 0) {
    return Status(StatusCode::kUnavailable, std::string("fcntl(FD_CLOEXEC): ") + std::strerror(errno));
  }
  return Status::Ok();
}

// Opens `descriptor` (not open yet) on a duplicate of `fd`, which stays its owner's (close-on-exec). Asio's
// constructor that takes a descriptor throws when it is -1 (a failed dup) or epoll refuses it, and a throw inside a
// detached coroutine ends a connection without a word; this returns a Status naming the operation (`what`: the descriptor's name).
inline Status AssignDuplicate(boost::asio::posix::stream_descriptor& descriptor, int fd, const std::string& what) {
  const int copy = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (copy < 0) return Status(StatusCode::kUnavailable, "dup of " + what + ": " + std::strerror(errno));
  boost::system::error_code ec;
  descriptor.assign(copy, ec);
  if (ec) {
    ::close(copy);  // assign takes ownership only when it succeeds
    return Status(StatusCode::kUnavailable, "watching " + what + " on the event loop (epoll): " + ec.message());
  }
  return Status::Ok();
}

}  // namespace sparsereduce::transport
