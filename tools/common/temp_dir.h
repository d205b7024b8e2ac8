// A fresh directory for the port files of daemons that tools and tests start. Its name comes from mkdtemp, not
// from the process id: process ids are reused, and a directory that a killed process left behind then handed a
// later process a stale port file (the test connected to a port nobody listened on).
#pragma once

#include <string>

#include "core/status.h"

namespace sparsereduce::tools {

class TempDir {
 public:
  // Creates "<system temporary directory>/<prefix>XXXXXX".
  static Result<TempDir> Create(const std::string& prefix);

  // Removes the directory and everything in it.
  ~TempDir();
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  void Remove();

  std::string path_;  // empty once moved from
};

}  // namespace sparsereduce::tools
