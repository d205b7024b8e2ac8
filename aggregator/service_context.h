// What every job and connection of one aggregator consults: its options, metrics, shared memory budget, job
// secrets, allowed networks, pending shared-memory offers and whether it is draining. Owned by the Server; no
// globals.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>

#include "aggregator/connection_set.h"
#include "aggregator/handshake_limit.h"
#include "aggregator/job_secrets.h"
#include "aggregator/log_throttle.h"
#include "aggregator/memory_budget.h"
#include "aggregator/metrics.h"
#include "aggregator/network_allowlist.h"
#include "aggregator/server_options.h"
#include "core/buffer_pool.h"
#include "transport/shm/handoff.h"
#if SPARSEREDUCE_HAVE_RDMA
#include "transport/rdma/device.h"
#endif

namespace sparsereduce::aggregator {

struct ServiceContext {
  ServiceContext(const ServerOptions& options, NetworkAllowlist allowlist)
      : options(options),
        metrics(options.name),
        memory(options.max_total_memory),
        secrets(options.job_secrets_dir),
        allowlist(std::move(allowlist)),
        buffers(BufferPool::Create(options.buffer_pool_bytes)) {}

  const ServerOptions& options;
  Metrics metrics;
  MemoryBudget memory;
  JobSecrets secrets;
  NetworkAllowlist allowlist;
  // Frame buffers (contributions read, results built) recycled across frames and jobs.
  std::shared_ptr<BufferPool> buffers;
  // Shared-memory offers whose descriptors their worker has not received yet, capped (docs/PROTOCOL.md §10.1).
  shm::PendingOffers shm_offers{shm::PendingOffers::kDefaultCap};
#if SPARSEREDUCE_HAVE_RDMA
  std::shared_ptr<rdma::RdmaDevice> rdma;  // opened at startup when --transports lists rdma
#endif
  std::atomic<bool> draining{false};
  // Sessions still in their handshake, which Server::Stop ends instead of waiting for their deadline.
  ConnectionSet handshakes;
  // and how many of them one client address may have.
  HandshakeLimit handshake_limit{options.max_handshakes_per_address};
  // The lines about connections that never became members of a job: any client can cause them as fast as it can
  // connect, so they are rate limited (docs/OPERATIONS.md, Logs). Two budgets, so that connections merely closed
  // early (info) cannot use up the one of refusals (warnings).
  static constexpr uint32_t kConnectionLogBurst = 20;
  static constexpr std::chrono::seconds kConnectionLogWindow{10};
  LogThrottle refusal_log{"connections refused or timed out before joining a job", spdlog::level::warn,
                          kConnectionLogBurst, kConnectionLogWindow};
  LogThrottle early_close_log{"connections closed during their handshake", spdlog::level::info, kConnectionLogBurst,
                              kConnectionLogWindow};
  // Failed accepts (out of descriptors: one per listener every sparsereduce::tcp::kAcceptRetryDelay).
  LogThrottle accept_failure_log{"failed accepts", spdlog::level::warn, kConnectionLogBurst, kConnectionLogWindow};

  std::string RenderMetrics() { return metrics.Render(memory.reserved(), draining.load()); }
};

}  // namespace sparsereduce::aggregator
