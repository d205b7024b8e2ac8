// Bookkeeping of a single-producer single-consumer byte ring that the producer fills one-sidedly: by memcpy into
// shared memory (transport/shm) or by RDMA writes into the consumer's registered memory (transport/rdma). Frames
// stream through it as bytes, so a frame may be larger than the ring.
//
// Positions count bytes since the ring was created and never wrap (64 bits last centuries at any link rate); the
// byte at position p lives at offset p mod capacity. The producer owns `head` (bytes written), the consumer owns
// `tail` (bytes consumed): tail <= head <= tail + capacity. Pure arithmetic, no memory and no I/O.
#pragma once

#include <array>
#include <cstdint>

#include "core/status.h"

namespace sparsereduce::transport {

struct RingSpan {
  uint64_t offset = 0;  // into the ring's memory
  uint64_t length = 0;
};

// At most two spans: the part up to the end of the ring's memory, then the part from its start.
struct RingSpans {
  std::array<RingSpan, 2> span{};
  int count = 0;
};

class ByteRing {
 public:
  static constexpr uint64_t kMinCapacity = 4096;
  static constexpr uint64_t kMaxCapacity = uint64_t{1} << 32;

  // A power of two in [kMinCapacity, kMaxCapacity]; see Check.
  explicit ByteRing(uint64_t capacity) : capacity_(capacity) {}
  static Status CheckCapacity(uint64_t capacity);

  uint64_t capacity() const { return capacity_; }
  uint64_t Used(uint64_t head, uint64_t tail) const { return head - tail; }
  uint64_t Free(uint64_t head, uint64_t tail) const { return capacity_ - (head - tail); }

  // The memory of the `length` bytes at `position` (length <= capacity).
  RingSpans Locate(uint64_t position, uint64_t length) const;

  // Checks positions written by the other side (which may be broken or hostile): tail <= head <= tail + capacity.
  Status CheckPositions(uint64_t head, uint64_t tail) const;

 private:
  uint64_t capacity_;
};

}  // namespace sparsereduce::transport
