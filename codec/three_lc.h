// 3LC's quantizer (Lim, Andersen, Kaminsky, "3LC", SysML 2019) with error feedback: T = x + E, M = max|T| · s,
// q = round(T / M) ∈ {-1, 0, +1}, E ← T − M·q. Workers take M over the whole tensor (small blocks then quantize to
// zero and are not sent until their error grows); the aggregator, which produces result blocks one at a time,
// takes it per block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsereduce::codec {

// max_j |x_j + error_j| (NaN if some x_j + error_j is NaN).
float MaxAbsWithError(const float* x, const float* error, size_t n);

// The scale M = max_abs · sparsity, or NaN when that is not finite: the block holds an Inf or a NaN (a step whose
// gradients overflowed, as under AMP loss scaling), or M overflows. A block of scale NaN is sent "not finite":
// every q_j = +1, so every element decodes to NaN and the receiver sees the overflow (docs/PROTOCOL.md §11.2).
float ScaleOf(float max_abs, float sparsity);

// Quantizes T = x + error with scale M (> 0; M = 0 gives all zeros) into q = round(T / M), and leaves the new
// error T − M·q in `error`. Returns whether some q_j is nonzero. With M = NaN (ScaleOf) the block is not finite:
// q is all +1 and the error stays as it was, so one overflowing step does not poison the error for good.
bool QuantizeWithError(const float* x, float* error, size_t n, float scale, int8_t* q);
// The same, reading the error from `error_in` and writing the new one to `error_out` (which may be the same).
bool QuantizeWithError(const float* x, const float* error_in, float* error_out, size_t n, float scale, int8_t* q);

// Per-block error memory of one tensor (3LC on the aggregator: its blocks of one collective key).
class ErrorMemory {
 public:
  ErrorMemory(uint64_t blocks, uint32_t block_size)
      : block_size_(block_size), values_(blocks * block_size, 0.0f) {}
  uint64_t blocks() const { return values_.size() / block_size_; }
  uint32_t block_size() const { return block_size_; }
  float* Block(uint64_t index) { return values_.data() + index * block_size_; }

 private:
  uint32_t block_size_;
  std::vector<float> values_;
};

}  // namespace sparsereduce::codec
