// Configuration of the aggregation service (aggregator/config.cc maps flags, environment and config file onto it;
// `sparsereduce-aggregator --help` lists every setting with its default).
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
  std::string name;                                     // instance name for logs and metrics (default: hostname)
  std::chrono::milliseconds handshake_timeout{10000};  // a connection must finish its handshake within this
  // Connections from one client address in their handshake at once; more are refused with RESOURCE_EXHAUSTED.
  // Far above the ranks of one host that connect at once (clients behind one NAT address may need more), far
  // below the descriptors a daemon has (the unit allows 1M).
  uint32_t max_handshakes_per_address = 1024;
  // A collective every rank has started that makes no progress for this long is aborted, naming the ranks it still
  // waits for.
  std::chrono::milliseconds stall_timeout{30000};
  // A collective is aborted when some rank has not started it this long after it last progressed (a CollectiveBegin
  // or data from the others; nothing can be summed before every rank has started). Long, like torch.distributed's
  // 30 min default: a rank may be late on purpose (rank 0 writing a checkpoint); a rank whose host died is found by
  // TCP keepalive within seconds. A member that stops reading is still found at the stall timeout.
  std::chrono::milliseconds begin_timeout{1'800'000};
  // A job that has not formed (not all ranks said Hello) this long after its first Hello ends with
  // DEADLINE_EXCEEDED naming the ranks it waited for, and frees its place (--max-jobs) and its members'
  // connections. Longer than a worker's default connect + join timeout (90 s).
  std::chrono::milliseconds formation_timeout{300000};
  tcp::LivenessOptions liveness;

  // Limits. Going over one rejects that job or collective with RESOURCE_EXHAUSTED; other jobs are unaffected.
  uint32_t max_jobs = 1024;
  uint32_t max_world_size = 4096;
  uint32_t max_slots = 1024;
  uint32_t max_blocks_per_message = 4096;
  uint32_t max_window = 256;
  uint64_t max_tensor_bytes = 16ull << 30;  // element count x element size of one collective
  // What one job's collective may hold on this aggregator (ColumnEngine::MemoryBound): every rank's window of D
  // frames per slot, W · D · L · (24 + B · element size + 64) bytes for its L ≤ S · K non-empty columns, plus a
  // RESULT per slot and the engine's per-column tables.
  uint64_t max_job_memory = 1ull << 30;
  uint64_t max_total_memory = 8ull << 30;  // the same, summed over all jobs' running collectives
  // Free frame buffers kept for reuse (core/buffer_pool.h), on top of what the running collectives hold.
  uint64_t buffer_pool_bytes = 256ull << 20;

  // Transports a worker's connection may switch to besides TCP (always offered): "shm" for workers on this host,
  // "rdma" over the NIC below.
  std::vector<std::string> transports = {"tcp", "shm"};
  uint64_t ring_bytes = 2ull << 20;  // per direction of each shm or RDMA connection (a power of two)
  std::string rdma_device;           // empty: the first device
  uint32_t rdma_port = 1;
  int32_t rdma_gid_index = -1;       // RoCE: the GID index (RoCEv2 usually 3); -1: InfiniBand LID addressing

  // Security (docs/SECURITY.md).
  std::string job_secrets_dir;              // one file per job: name = decimal job id, content = shared secret
  bool require_auth = false;                // reject jobs that have no secret in job_secrets_dir
  std::vector<std::string> allow_networks;  // CIDRs whose clients may connect; empty: everyone
};

}  // namespace sparsereduce::aggregator
