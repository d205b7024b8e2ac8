#include "aggregator/memory_budget.h"

namespace sparsereduce::aggregator {

bool MemoryBudget::TryReserve(uint64_t bytes) {
  uint64_t current = reserved_.load(std::memory_order_relaxed);
  do {
    if (bytes > limit_ || current > limit_ - bytes) return false;
  } while (!reserved_.compare_exchange_weak(current, current + bytes, std::memory_order_relaxed));
  return true;
}

}  // namespace sparsereduce::aggregator
