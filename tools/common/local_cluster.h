// Starts aggregator daemons on 127.0.0.1 (ephemeral ports) for --spawn modes of the tools, and stops them.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "tools/common/subprocess.h"
#include "tools/common/temp_dir.h"

namespace sparsereduce::tools {

class LocalAggregators {
 public:
  // Starts `count` daemons from `binary` with `extra_args`; waits until each listens.
  static Result<std::unique_ptr<LocalAggregators>> Start(const std::string& binary, uint32_t count,
                                                         const std::vector<std::string>& extra_args = {});
  ~LocalAggregators();

  // "127.0.0.1:P1,127.0.0.1:P2,..."
  std::string AddressList() const;
  // SIGTERM and wait; false if one did not exit cleanly.
  bool Stop();

 private:
  std::unique_ptr<TempDir> dir_;  // declared first: destroyed after the daemons
  std::vector<std::unique_ptr<Subprocess>> daemons_;
  std::vector<std::string> addresses_;
};

// The path of a sibling tool: next to this executable, or in ../<subdir>/ of the build tree.
std::string FindToolBinary(const std::string& name, const std::string& build_subdir);

}  // namespace sparsereduce::tools
