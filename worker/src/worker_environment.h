// WorkerOptions fields left empty by the caller, filled from the SPARSEREDUCE_* variables worker.h names
// (SPARSEREDUCE_AGGREGATORS, SPARSEREDUCE_SECRET and SPARSEREDUCE_SECRET_FILE are the ones the Kubernetes and
// systemd examples use), and checked.
#pragma once

#include "core/status.h"
#include "sparsereduce/worker.h"

namespace sparsereduce::worker {

Result<WorkerOptions> ApplyEnvironment(WorkerOptions options);

}  // namespace sparsereduce::worker
