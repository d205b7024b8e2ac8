#include "tools/common/json_output.h"

#include <sys/stat.h>
#include <unistd.h>

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

namespace {

bool WriteWhole(const std::string& path, const std::string& document) {
  std::ofstream out(path, std::ios::trunc);
  out.write(document.data(), static_cast<std::streamsize>(document.size()));
  out.close();
  return !out.fail();
}

}  // namespace

void JsonRewriter::Write(const std::string& document) {
  if (path_.empty() || failed_) return;
  // A regular file is replaced by rename(2), so that a reader (or a run killed while writing) never sees half a
  // document. Anything else (a symlink, a FIFO, /dev/stdout) is written in place: renaming over it would replace
  // the link or the device instead of writing through it.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    const std::string temp = path_ + ".tmp." + std::to_string(::getpid());
    if (WriteWhole(temp, document) && ::rename(temp.c_str(), path_.c_str()) == 0) return;
    ::unlink(temp.c_str());  // e.g. a directory without write permission: fall back to writing in place
  }
  if (WriteWhole(path_, document)) return;
  std::fprintf(stderr, "%s: --json %s: writing failed\n", tool_.c_str(), path_.c_str());
  failed_ = true;
}

}  // namespace sparsereduce::tools
