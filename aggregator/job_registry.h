// The jobs an aggregator serves, by job id. Thread-safe; a job's own state is guarded by its strand instead.
#pragma once

#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"

namespace sparsereduce::aggregator {

class Job;
struct ServiceContext;

class JobRegistry {
 public:
  JobRegistry(boost::asio::io_context& io, ServiceContext& context) : io_(io), context_(context) {}

  // The live job with this id, created if there is none. RESOURCE_EXHAUSTED when max_jobs are live,
  // SHUTTING_DOWN for a new job while the aggregator drains.
  Result<std::shared_ptr<Job>> FindOrCreate(uint64_t id);
  // The live job with this id, or nullptr.
  std::shared_ptr<Job> Find(uint64_t id) const;
  // Replaces `stale` (dead or superseded) by a fresh job with the same id and returns the live one; SHUTTING_DOWN
  // instead of a fresh job while the aggregator drains, RESOURCE_EXHAUSTED when `stale` has left the registry
  // already and max_jobs others are live.
  Result<std::shared_ptr<Job>> Replace(uint64_t id, const std::shared_ptr<Job>& stale);
  // Forgets `job` if it is still the one registered under its id.
  void Remove(const Job* job);
  std::vector<std::shared_ptr<Job>> Snapshot() const;
  size_t size() const;
  // Called (once, from the thread that removed the last job) when no job is left, after StartDraining().
  void StartDraining(std::function<void()> on_empty);

 private:
  std::shared_ptr<Job> MakeJob(uint64_t id);

  boost::asio::io_context& io_;
  ServiceContext& context_;
  mutable std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Job>> jobs_;
  std::function<void()> on_empty_;  // set while draining, until called
};

}  // namespace sparsereduce::aggregator
