// fp32 <-> IEEE fp16 and bfloat16 for the fp16 / bf16 wire formats (docs/PROTOCOL.md §11.1): round to nearest,
// ties to even; overflow to infinity; NaN stays NaN (quiet); fp16 subnormals are kept. The bulk conversions use
// F16C when the CPU has it and a portable loop otherwise; both give the same bits, except for a signalling-NaN
// half, which F16C widens to a quiet NaN and the portable loop keeps signalling (a NaN either way; encoders only
// ever write quiet NaNs).
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparsereduce::codec {

uint16_t FloatToHalf(float value);
float HalfToFloat(uint16_t half);
uint16_t FloatToBFloat16(float value);
inline float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// Little-endian 16-bit values at `out` (2n bytes).
void EncodeHalf(const float* in, size_t n, std::byte* out);
void EncodeBFloat16(const float* in, size_t n, std::byte* out);
// out[j] = value, or out[j] += value with `accumulate`.
void DecodeHalf(const std::byte* in, size_t n, float* out, bool accumulate);
void DecodeBFloat16(const std::byte* in, size_t n, float* out, bool accumulate);

// The portable loops behind EncodeHalf / DecodeHalf (used where the CPU has no F16C; tested against it).
void EncodeHalfPortable(const float* in, size_t n, std::byte* out);
void DecodeHalfPortable(const std::byte* in, size_t n, float* out, bool accumulate);

}  // namespace sparsereduce::codec
