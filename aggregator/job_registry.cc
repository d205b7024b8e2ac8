#include "aggregator/job_registry.h"

#include <boost/asio/dispatch.hpp>
#include <boost/asio/strand.hpp>

#include "aggregator/job.h"
#include "aggregator/service_context.h"

namespace sparsereduce::aggregator {

std::shared_ptr<Job> JobRegistry::MakeJob(uint64_t id) {
  return std::make_shared<Job>(id, boost::asio::make_strand(io_), *this, context_);
}

namespace {
// The caller names the job, rank and peer (Session::Who).
Status Draining() { return Status(StatusCode::kShuttingDown, "the aggregator is shutting down and admits no Hello"); }
Status Full(uint32_t max_jobs) {
  return Status(StatusCode::kResourceExhausted,
                "the aggregator already serves its maximum of " + std::to_string(max_jobs) + " jobs (--max-jobs)");
}
}  // namespace

Result<std::shared_ptr<Job>> JobRegistry::FindOrCreate(uint64_t id) {
  std::lock_guard lock(mutex_);
  // Before the lookup: a job that drains takes no newcomer either (a full one would answer JOB_FULL).
  if (context_.draining) return Draining();
  auto it = jobs_.find(id);
  if (it != jobs_.end()) return it->second;
  if (jobs_.size() >= context_.options.max_jobs) return Full(context_.options.max_jobs);
  auto job = MakeJob(id);
  jobs_.emplace(id, job);
  context_.metrics.SetJobs(jobs_.size());
  return job;
}

std::shared_ptr<Job> JobRegistry::Find(uint64_t id) const {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

Result<std::shared_ptr<Job>> JobRegistry::Replace(uint64_t id, const std::shared_ptr<Job>& stale) {
  std::lock_guard lock(mutex_);
  auto it = jobs_.find(id);
  if (it != jobs_.end() && it->second != stale) return it->second;
  if (context_.draining) return Draining();
  // The stale job may be gone from the registry already (aborted meanwhile), and its place taken by another job.
  if (it == jobs_.end() && jobs_.size() >= context_.options.max_jobs) return Full(context_.options.max_jobs);
  auto job = MakeJob(id);
  jobs_[id] = job;
  context_.metrics.SetJobs(jobs_.size());
  return job;
}

void JobRegistry::Remove(const Job* job) {
  std::function<void()> on_empty;
  {
    std::lock_guard lock(mutex_);
    auto it = jobs_.find(job->id());
    if (it != jobs_.end() && it->second.get() == job) jobs_.erase(it);
    context_.metrics.SetJobs(jobs_.size());
    if (jobs_.empty()) on_empty.swap(on_empty_);
  }
  if (on_empty) on_empty();
}

void JobRegistry::StartDraining(std::function<void()> on_empty) {
  std::vector<std::shared_ptr<Job>> jobs;
  {
    std::lock_guard lock(mutex_);
    context_.draining = true;
    for (const auto& [id, job] : jobs_) jobs.push_back(job);
    if (!jobs.empty()) on_empty_ = std::move(on_empty);
  }
  if (jobs.empty()) on_empty();  // nothing to drain
  for (auto& job : jobs) boost::asio::dispatch(job->strand(), [job] { job->Drain(); });
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
