// Per-job shared secrets on the aggregator: --job-secrets-dir holds one file per job, named by the decimal job id
// (the layout a Kubernetes Secret volume produces). Read at every handshake, so rotated or added secrets apply to
// the next connection without a restart.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/status.h"

namespace sparsereduce::aggregator {

class JobSecrets {
 public:
  explicit JobSecrets(std::string directory) : directory_(std::move(directory)) {}

  // The job's secret; nullopt when there is none (no directory configured, or no file for the job); an error when
  // the file exists but cannot be read or is empty.
  Result<std::optional<std::string>> Lookup(uint64_t job) const;

 private:
  std::string directory_;
};

}  // namespace sparsereduce::aggregator
