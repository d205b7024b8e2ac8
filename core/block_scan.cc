#include "core/block_scan.h"

#include <cstring>

namespace sparsereduce {
namespace {

inline uint64_t Load64(const std::byte* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// The element mask replicated across a 64-bit word.
uint64_t ReplicateMask(const DTypeInfo& dtype) {
  uint64_t mask = 0;
  for (uint32_t shift = 0; shift < 64; shift += dtype.size * 8) mask |= dtype.value_mask << shift;
  return mask;
}

}  // namespace

uint64_t OrReduce(const std::byte* data, size_t bytes, uint64_t stop_mask) {
  // 64-byte chunks with independent accumulators so the compiler keeps the loop vectorized; the early exit is
  // checked once per chunk, which makes dense blocks nearly free to scan.
  uint64_t acc = 0;
  size_t i = 0;
  for (; i + 64 <= bytes; i += 64) {
    uint64_t a0 = Load64(data + i) | Load64(data + i + 8);
    uint64_t a1 = Load64(data + i + 16) | Load64(data + i + 24);
    uint64_t a2 = Load64(data + i + 32) | Load64(data + i + 40);
    uint64_t a3 = Load64(data + i + 48) | Load64(data + i + 56);
    acc |= (a0 | a1) | (a2 | a3);
    if (acc & stop_mask) return acc;
  }
  for (; i + 8 <= bytes; i += 8) acc |= Load64(data + i);
  if (i < bytes) {
    uint64_t tail = 0;
    std::memcpy(&tail, data + i, bytes - i);  // little-endian: the tail fills the low lanes in element order
    acc |= tail;
  }
  return acc;
}

uint64_t ScanBlocks(const std::byte* data, uint64_t element_count, uint32_t block_size, const DTypeInfo& dtype,
                    std::span<uint8_t> flags) {
  const uint64_t mask = ReplicateMask(dtype);
  const uint64_t block_bytes = uint64_t{block_size} * dtype.size;
  const uint64_t total_bytes = element_count * dtype.size;
  uint64_t nonzero = 0;
  size_t b = 0;
  for (uint64_t offset = 0; offset < total_bytes; offset += block_bytes, ++b) {
    const uint64_t len = total_bytes - offset < block_bytes ? total_bytes - offset : block_bytes;
    const uint64_t bits = OrReduce(data + offset, len, mask);
    if (bits & mask) {
      flags[b] = kBlockNonzero;
      ++nonzero;
    } else {
      flags[b] = bits ? kBlockHasNegativeZero : 0;
    }
  }
  return nonzero;
}

}  // namespace sparsereduce
