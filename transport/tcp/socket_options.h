// Liveness options for long-lived TCP connections: keepalive probes find half-open peers (a host that vanished
// without a FIN or RST) while the connection is idle, and TCP_USER_TIMEOUT bounds how long sent data may stay
// unacknowledged before the kernel gives up (a partition while sending).
#pragma once

#include <chrono>

#include "core/status.h"
#include "transport/tcp/frame_stream.h"

namespace sparsereduce::tcp {

struct LivenessOptions {
  std::chrono::seconds keepalive_idle{2};      // first probe after this much silence
  std::chrono::seconds keepalive_interval{1};  // between probes
  int keepalive_probes = 3;                     // unanswered probes before the connection is reset
  std::chrono::milliseconds user_timeout{10000};  // 0: kernel default
};

Status ApplyLiveness(Socket& socket, const LivenessOptions& options);

}  // namespace sparsereduce::tcp
