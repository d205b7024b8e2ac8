#include "tools/common/json_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace sparsereduce::tools {

Status CheckJsonOutput(const std::string& path) {
  auto cannot = [&path](int error) {
    return Status(StatusCode::kInvalidArgument,
                  "--json " + path + ": cannot open for writing: " + std::strerror(error));
  };
  // O_NONBLOCK: a FIFO without a reader fails with ENXIO instead of waiting for one (it is written once one comes).
  const int fd = ::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd >= 0) {
    ::close(fd);
    return Status::Ok();
  }
  if (errno == ENXIO) return Status::Ok();
  if (errno != ENOENT) return cannot(errno);
  // A new file: its directory must exist and take one (the rewrite makes it beside, then renames it).
  std::string directory = std::filesystem::path(path).parent_path().string();
  if (directory.empty()) directory = ".";
  if (::faccessat(AT_FDCWD, directory.c_str(), W_OK | X_OK, AT_EACCESS) != 0) return cannot(errno);
  return Status::Ok();
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
  // document; so is a file not made yet (it was written in place, and a reader could find it half written).
  // Anything else (a symlink, a FIFO, /dev/stdout) is written in place: renaming over it would replace the link or
  // the device instead of writing through it.
  struct stat st {};
  if (::lstat(path_.c_str(), &st) == 0 ? S_ISREG(st.st_mode) : errno == ENOENT) {
    const std::string temp = path_ + ".tmp." + std::to_string(::getpid());
    if (WriteWhole(temp, document) && ::rename(temp.c_str(), path_.c_str()) == 0) return;
    ::unlink(temp.c_str());  // e.g. a directory without write permission: fall back to writing in place
  }
  if (WriteWhole(path_, document)) return;
  std::fprintf(stderr, "%s: --json %s: writing failed\n", tool_.c_str(), path_.c_str());
  failed_ = true;
}

}  // namespace sparsereduce::tools
