// The --json file of the benchmark tools: opened before a run starts, so that a path that cannot be written fails
// the run at once rather than after a long sweep.
#pragma once

#include <fstream>
#include <string>

#include "core/status.h"

namespace sparsereduce::tools {

// Opens (creates or truncates) `path` into `out`; the error says "--json PATH: cannot open for writing: REASON".
Status OpenJsonOutput(const std::string& path, std::ofstream& out);

}  // namespace sparsereduce::tools
