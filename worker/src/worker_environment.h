// WorkerOptions fields left empty by the caller, filled from SPARSEREDUCE_AGGREGATORS, SPARSEREDUCE_SECRET and
// SPARSEREDUCE_SECRET_FILE (the names the Kubernetes and systemd examples use).
#pragma once

#include "core/status.h"
#include "sparsereduce/worker.h"

namespace sparsereduce::worker {

Result<WorkerOptions> ApplyEnvironment(WorkerOptions options);

}  // namespace sparsereduce::worker
