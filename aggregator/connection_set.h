// Connections that belong to no job and must still end at shutdown: sessions in their handshake, HTTP connections.
// Each registers how to close it; CloseAll runs those closers, and a connection that registers afterwards is told
// to close at once. Without it they kept the stopped daemon running until their own deadlines (and an HTTP
// keep-alive connection renews its deadline with every request). Thread-safe; a connection's closer must post to
// the connection's own strand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace sparsereduce::aggregator {

class ConnectionSet {
 public:
  // An id for Remove, or nullopt once CloseAll has run: the caller then closes the connection itself.
  std::optional<uint64_t> Add(std::function<void()> close) {
    std::lock_guard lock(mutex_);
    if (closed_) return std::nullopt;
    const uint64_t id = next_id_++;
    open_.emplace(id, std::move(close));
    return id;
  }
  void Remove(uint64_t id) {
    std::lock_guard lock(mutex_);
    open_.erase(id);
  }
  void CloseAll() {
    std::vector<std::function<void()>> closers;
    {
      std::lock_guard lock(mutex_);
      closed_ = true;
      for (auto& [id, close] : open_) closers.push_back(std::move(close));
      open_.clear();
    }
    for (auto& close : closers) close();
  }
  // Closes the connection registered first (ids grow), if any: HttpEndpoint makes room this way at its limit.
  void CloseOldest() {
    std::function<void()> close;
    {
      std::lock_guard lock(mutex_);
      if (open_.empty()) return;
      close = std::move(open_.begin()->second);
      open_.erase(open_.begin());
    }
    close();
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return open_.size();
  }

 private:
  mutable std::mutex mutex_;
  std::map<uint64_t, std::function<void()>> open_;
  uint64_t next_id_ = 0;
  bool closed_ = false;
};

}  // namespace sparsereduce::aggregator
