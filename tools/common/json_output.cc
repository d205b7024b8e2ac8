#include "tools/common/json_output.h"

#include <cerrno>
#include <cstring>

namespace sparsereduce::tools {

Status OpenJsonOutput(const std::string& path, std::ofstream& out) {
  out.open(path);
  if (out) return Status::Ok();
  return Status(StatusCode::kInvalidArgument,
                "--json " + path + ": cannot open for writing: " + std::strerror(errno));
}

}  // namespace sparsereduce::tools
