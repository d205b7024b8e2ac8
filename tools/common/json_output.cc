#include "tools/common/json_output.h"

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace sparsereduce::tools {

Status OpenJsonOutput(const std::string& path, std::ofstream& out) {
  out.open(path);
  if (out) return Status::Ok();
  return Status(StatusCode::kInvalidArgument,
                "--json " + path + ": cannot open for writing: " + std::strerror(errno));
}

void JsonRewriter::Write(const std::string& document) {
  if (path_.empty() || failed_) return;
  std::ofstream out(path_, std::ios::trunc);
  out.write(document.data(), static_cast<std::streamsize>(document.size()));
  out.close();
  if (!out.fail()) return;
  std::fprintf(stderr, "%s: --json %s: writing failed\n", tool_.c_str(), path_.c_str());
  failed_ = true;
}

}  // namespace sparsereduce::tools
