// Recycles the memory of frame-sized buffers. Every frame a daemon or worker receives or builds needs a buffer of
// some tens of KiB; taking each from malloc and giving it back makes glibc trim and re-grow its heaps, and every
// trim is an madvise with a TLB shootdown and every re-grow a round of page faults. On the 2-core VM this project
// is measured on, that churn cost more CPU than moving the data (see BENCHMARKS.md). A pool keeps freed buffers
// for the next frame of about the same size instead.
//
// Thread-safe. Buffers hold a reference to their pool, so the pool lives until its last buffer is gone.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "core/byte_buffer.h"

namespace sparsereduce {

class BufferPool final : public BufferLender, public std::enable_shared_from_this<BufferPool> {
 public:
  // Requests below this many bytes go straight to the allocator, whose per-thread caches serve them well.
  static constexpr size_t kMinPooledBytes = 4096;
  // Capacities are rounded up to this granularity, so frames of nearly the same size share buffers.
  static constexpr size_t kGranularity = 4096;

  // The pool keeps at most `max_retained_bytes` of free buffers; a buffer returned beyond that is freed.
  static std::shared_ptr<BufferPool> Create(size_t max_retained_bytes);
  // A pool that keeps `count` free buffers of `size` bytes each: their capacities are rounded up, so `count · size`
  // would keep one fewer, and that one would be freed and allocated again on every round of use.
  static std::shared_ptr<BufferPool> ForBuffers(size_t count, size_t size) {
    return Create(count * CapacityFor(size));
  }
  // The capacity a buffer of `size` bytes gets.
  static size_t CapacityFor(size_t size) { return (size + kGranularity - 1) / kGranularity * kGranularity; }

  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  ~BufferPool();

  // An uninitialized buffer of `size` bytes: a free one whose capacity is at least `size` and at most about twice
  // that, or new memory.
  ByteBuffer Acquire(size_t size);

  // Free memory the pool holds right now, and how many Acquire calls it served from it (for tests and metrics).
  size_t retained_bytes() const;
  uint64_t reuses() const;

 private:
  explicit BufferPool(size_t max_retained_bytes) : max_retained_(max_retained_bytes) {}
  // A buffer of the pool was destroyed: keep its memory for the next Acquire, or free it.
  void Return(std::byte* data, size_t capacity) override;

  const size_t max_retained_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<std::byte*>> free_;  // by capacity
  size_t retained_ = 0;
  uint64_t reuses_ = 0;
};

}  // namespace sparsereduce
