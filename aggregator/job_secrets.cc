#include "aggregator/job_secrets.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "protocol/auth.h"

namespace sparsereduce::aggregator {

Result<std::optional<std::string>> JobSecrets::Lookup(uint64_t job) const {
  if (directory_.empty()) return std::optional<std::string>();
  const std::string path = directory_ + "/" + std::to_string(job);
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (errno == ENOENT) return std::optional<std::string>();
    return Status(StatusCode::kInternal, "cannot read the secret of job " + std::to_string(job) + " from " + path +
                                             ": " + std::strerror(errno));
  }
  std::ostringstream contents;
  contents << file.rdbuf();
  Result<std::string> secret = auth::NormalizeSecret(contents.str(), path);
  // The daemon's own configuration is at fault, not the worker's Hello: an internal error, as for an unreadable
  // file (docs/PROTOCOL.md §8), not the INVALID_ARGUMENT NormalizeSecret gives a worker's own secret.
  if (!secret.ok()) return Status(StatusCode::kInternal, secret.status().message());
  return std::optional<std::string>(std::move(*secret));
}

}  // namespace sparsereduce::aggregator
