// Configuration of the aggregator daemon (sparsereduce-aggregator --help lists the flags).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/tcp/socket_options.h"

namespace sparsereduce::aggregator {

struct ServerOptions {
  std::vector<std::string> listen = {"0.0.0.0:19875"};  // HOST:PORT or [IPV6]:PORT; port 0 picks a free port
  uint32_t io_threads = 0;                              // 0: one per hardware thread
  std::chrono::milliseconds handshake_timeout{10000};  // a connection must say Hello within this
  // A collective that makes no progress for this long is aborted, naming the ranks it still waits for.
  std::chrono::milliseconds stall_timeout{30000};
  tcp::LivenessOptions liveness;
  uint32_t max_jobs = 1024;
  uint32_t max_world_size = 4096;
  uint32_t max_slots = 1024;
  uint32_t max_blocks_per_message = 4096;
  // Bound on what one collective may hold on this aggregator: every rank's contributions of one round in every
  // slot, W · S · K · (24 + B · element size) bytes, plus one RESULT per slot.
  uint64_t max_collective_memory = 1ull << 30;
};

}  // namespace sparsereduce::aggregator
