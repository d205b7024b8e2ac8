// The --json file of the benchmark tools: checked before a run starts, so that a path that cannot be written fails
// the run at once rather than after a long sweep.
#pragma once

#include <string>
#include <utility>

#include "core/status.h"

namespace sparsereduce::tools {

// Checks that `path` can be written, without creating, truncating or changing it: an existing file must open for
// writing, else its directory must take a new file. The error says "--json PATH: cannot open for writing: REASON".
// (Opening it truncated the file: a --spawn run that failed before rank 0 wrote left it empty, and a reader saw no
// document while a rank joined.)
Status CheckJsonOutput(const std::string& path);

// Rank 0's --json file, rewritten with the whole document before the first row, after every row and at the end, so
// that a run stopped part-way (a failed rank, the run timeout, Ctrl-C) leaves the rows it measured. An empty path
// writes nothing. The first failure is reported on stderr ("TOOL: --json PATH: writing failed") and ends the
// writing.
class JsonRewriter {
 public:
  JsonRewriter(std::string tool, std::string path) : tool_(std::move(tool)), path_(std::move(path)) {}
  // Replaces the file's content with `document`: a regular file, or one that does not exist yet, by a temporary
  // file beside it renamed over it (a reader sees the old or the new document, or none, never part of one),
  // anything else in place.
  void Write(const std::string& document);
  bool failed() const { return failed_; }

 private:
  std::string tool_, path_;
  bool failed_ = false;
};

}  // namespace sparsereduce::tools
