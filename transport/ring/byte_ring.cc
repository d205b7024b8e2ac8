#include "transport/ring/byte_ring.h"

#include <string>

namespace sparsereduce::transport {

Status ByteRing::CheckCapacity(uint64_t capacity) {
  if (capacity < kMinCapacity || capacity > kMaxCapacity || (capacity & (capacity - 1)) != 0) {
    return InvalidArgument("ring capacity " + std::to_string(capacity) + " is not a power of two between " +
                           std::to_string(kMinCapacity) + " and " + std::to_string(kMaxCapacity));
  }
  return Status::Ok();
}

RingSpans ByteRing::Locate(uint64_t position, uint64_t length) const {
  RingSpans spans;
  if (length == 0) return spans;
  const uint64_t offset = position & (capacity_ - 1);
  const uint64_t first = length < capacity_ - offset ? length : capacity_ - offset;
  spans.span[0] = {offset, first};
  spans.count = 1;
  if (first < length) {
    spans.span[1] = {0, length - first};
    spans.count = 2;
  }
  return spans;
}

Status ByteRing::CheckPositions(uint64_t head, uint64_t tail) const {
  if (head - tail > capacity_ || head < tail) {
    return ProtocolError("ring positions out of order: head " + std::to_string(head) + ", tail " +
                         std::to_string(tail) + ", capacity " + std::to_string(capacity_));
  }
  return Status::Ok();
}

}  // namespace sparsereduce::transport
