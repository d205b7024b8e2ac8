// The memory bound shared by all jobs' running collectives (--max-total-memory). A collective reserves its bound
// when it starts and releases it when it ends, so one job's large collective is refused rather than letting the
// daemon run out of memory under every job.
#pragma once

#include <atomic>
#include <cstdint>

namespace sparsereduce::aggregator {

class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit) : limit_(limit) {}

  // Reserves `bytes` if they fit under the limit.
  bool TryReserve(uint64_t bytes);
  void Release(uint64_t bytes) { reserved_.fetch_sub(bytes, std::memory_order_relaxed); }
  uint64_t reserved() const { return reserved_.load(std::memory_order_relaxed); }
  uint64_t limit() const { return limit_; }

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> reserved_{0};
};

// A reservation released on destruction (held by the running collective, or by the job while that collective's
// RESULTs still wait in members' send queues). Movable: the moved-from one releases nothing.
class MemoryReservation {
 public:
  MemoryReservation(MemoryBudget& budget, uint64_t bytes) : budget_(&budget), bytes_(bytes) {}
  MemoryReservation(MemoryReservation&& other) noexcept : budget_(other.budget_), bytes_(other.bytes_) {
    other.bytes_ = 0;
  }
  MemoryReservation(const MemoryReservation&) = delete;
  MemoryReservation& operator=(const MemoryReservation&) = delete;
  MemoryReservation& operator=(MemoryReservation&&) = delete;
  ~MemoryReservation() {
    if (bytes_ > 0) budget_->Release(bytes_);
  }
  uint64_t bytes() const { return bytes_; }

 private:
  MemoryBudget* budget_;
  uint64_t bytes_;
};

}  // namespace sparsereduce::aggregator
