#include "core/buffer_pool.h"

namespace sparsereduce {

std::shared_ptr<BufferPool> BufferPool::Create(size_t max_retained_bytes) {
  return std::shared_ptr<BufferPool>(new BufferPool(max_retained_bytes));
}

BufferPool::~BufferPool() {
  for (auto& [capacity, buffers] : free_) {
    for (std::byte* data : buffers) delete[] data;
  }
}

ByteBuffer BufferPool::Acquire(size_t size) {
  if (size < kMinPooledBytes) return ByteBuffer(size);
  {
    std::lock_guard lock(mu_);
    // The smallest free capacity that fits, unless it would waste more than half of the buffer.
    auto it = free_.lower_bound(size);
    if (it != free_.end() && it->first / 2 <= size) {
      std::byte* data = it->second.back();
      const size_t capacity = it->first;
      it->second.pop_back();
      if (it->second.empty()) free_.erase(it);
      retained_ -= capacity;
      ++reuses_;
      return ByteBuffer::Borrowed(data, size, shared_from_this(), capacity, /*on_loan=*/false);
    }
  }
  const size_t capacity = CapacityFor(size);
  return ByteBuffer::Borrowed(new std::byte[capacity], size, shared_from_this(), capacity, /*on_loan=*/false);
}

void BufferPool::Return(std::byte* data, size_t capacity) {
  if (data == nullptr) return;
  {
    std::lock_guard lock(mu_);
    if (retained_ + capacity <= max_retained_) {
      free_[capacity].push_back(data);
      retained_ += capacity;
      return;
    }
  }
  delete[] data;
}

size_t BufferPool::retained_bytes() const {
  std::lock_guard lock(mu_);
  return retained_;
}

uint64_t BufferPool::reuses() const {
  std::lock_guard lock(mu_);
  return reuses_;
}

}  // namespace sparsereduce
