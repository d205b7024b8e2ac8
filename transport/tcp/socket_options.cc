#include "transport/tcp/socket_options.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace sparsereduce::tcp {
namespace {

Status SetInt(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof value) != 0) {
    return Status(StatusCode::kInternal, std::string("setsockopt ") + what + ": " + std::strerror(errno));
  }
  return Status::Ok();
}

}  // namespace

Status ApplyLiveness(Socket& socket, const LivenessOptions& o) {
  const int fd = socket.native_handle();
  if (Status st = SetInt(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE"); !st.ok()) return st;
  if (Status st = SetInt(fd, IPPROTO_TCP, TCP_KEEPIDLE, static_cast<int>(o.keepalive_idle.count()), "TCP_KEEPIDLE");
      !st.ok()) {
    return st;
  }
  if (Status st = SetInt(fd, IPPROTO_TCP, TCP_KEEPINTVL, static_cast<int>(o.keepalive_interval.count()),
                         "TCP_KEEPINTVL");
      !st.ok()) {
    return st;
  }
  if (Status st = SetInt(fd, IPPROTO_TCP, TCP_KEEPCNT, o.keepalive_probes, "TCP_KEEPCNT"); !st.ok()) return st;
  if (o.user_timeout.count() > 0) {
    return SetInt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, static_cast<int>(o.user_timeout.count()), "TCP_USER_TIMEOUT");
  }
  return Status::Ok();
}

}  // namespace sparsereduce::tcp
