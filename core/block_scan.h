// Nonzero-block detection: the scan every collective starts with.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace sparsereduce {

// Per-block flags produced by ScanBlocks.
inline constexpr uint8_t kBlockNonzero = 1;        // some element compares unequal to zero
inline constexpr uint8_t kBlockHasNegativeZero = 2;  // zero block whose bits are not all zero (holds -0.0)

// OR of all bytes of `bytes` folded into 64-bit lanes, starting at data[0]. Lane boundaries line up with
// elements when the element size divides 8 and `data` is the start of an element. Returns early (with a partial
// OR) once `(or & stop_mask) != 0`.
uint64_t OrReduce(const std::byte* data, size_t bytes, uint64_t stop_mask);

// Scans `element_count` elements of type `dtype` at `data` in blocks of `block_size` elements and writes one
// flag byte per block to `flags` (size ceil(element_count / block_size)). Returns the number of nonzero blocks.
uint64_t ScanBlocks(const std::byte* data, uint64_t element_count, uint32_t block_size, const DTypeInfo& dtype,
                    std::span<uint8_t> flags);

}  // namespace sparsereduce
