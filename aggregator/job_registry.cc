#include "aggregator/job_registry.h"

#include <boost/asio/strand.hpp>

#include "aggregator/job.h"

namespace sparsereduce::aggregator {

std::shared_ptr<Job> JobRegistry::MakeJob(uint64_t id) {
  return std::make_shared<Job>(id, boost::asio::make_strand(io_), *this, options_.stall_timeout,
                               options_.max_collective_memory);
}

Result<std::shared_ptr<Job>> JobRegistry::FindOrCreate(uint64_t id) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return it->second;
  if (jobs_.size() >= options_.max_jobs) {
    return Status(StatusCode::kResourceExhausted, "the aggregator already serves its maximum of " +
                                                      std::to_string(options_.max_jobs) + " jobs");
  }
  auto job = MakeJob(id);
  jobs_.emplace(id, job);
  return job;
}

std::shared_ptr<Job> JobRegistry::Find(uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

std::shared_ptr<Job> JobRegistry::Replace(uint64_t id, const std::shared_ptr<Job>& stale) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(id);
  if (it != jobs_.end() && it->second != stale) return it->second;
  auto job = MakeJob(id);
  jobs_[id] = job;
  return job;
}

void JobRegistry::Remove(const Job* job) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(job->id());
  if (it != jobs_.end() && it->second.get() == job) jobs_.erase(it);
}

std::vector<std::shared_ptr<Job>> JobRegistry::Snapshot() const {
  std::lock_guard lock(mutex_);
  std::vector<std::shared_ptr<Job>> out;
  for (const auto& [id, job] : jobs_) out.push_back(job);
  return out;
}

size_t JobRegistry::size() const {
  std::lock_guard lock(mutex_);
  return jobs_.size();
}

}  // namespace sparsereduce::aggregator
