// WorkerOptions fields left empty by the caller, filled from the SPARSEREDUCE_* variables worker.h names
// (SPARSEREDUCE_AGGREGATORS, SPARSEREDUCE_SECRET and SPARSEREDUCE_SECRET_FILE are the ones the Kubernetes and
// systemd examples use), and checked.
#pragma once

#include "core/status.h"
#include "sparsereduce/worker.h"

namespace sparsereduce::worker {

Result<WorkerOptions> ApplyEnvironment(WorkerOptions options);

// The largest WorkerOptions::tcp_send_buffer (SO_SNDBUF takes an int, which the kernel doubles).
inline constexpr uint64_t kMaxTcpSendBuffer = uint64_t{1} << 30;

// WorkerOptions::aggregators as the Worker checks them (defined in worker.cc): each address parses, names a port
// to connect to, and appears once. Tools check their --aggregators with it before starting anything.
Status CheckAggregatorAddresses(const std::vector<std::string>& aggregators);

}  // namespace sparsereduce::worker
