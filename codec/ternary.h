// Ternary blocks, the wire form of 3LC and DIANA (docs/PROTOCOL.md §11.2): n values q_j ∈ {-1, 0, +1} and one fp32
// scale, standing for scale · q_j. After the scale (4 bytes, little-endian) come the values five to a byte
// ("quartic packing", Lim et al., 3LC, SysML 2019): b = 81·d0 + 27·d1 + 9·d2 + 3·d3 + d4 with d = q + 1, so
// 0..242, the last group padded with zeros (d = 1). Then "zero-run encoding": a run of k all-zero bytes (121),
// 2 ≤ k ≤ 14, becomes the single byte 241 + k (243..255); longer runs are split into runs of 14, the rest as above.
//
// Pure functions. Decoders check everything: a malformed block is an error, never a read past the input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>

#include "core/status.h"

namespace sparsereduce::codec {

inline constexpr uint8_t kZeroGroup = 121;   // five zeros
inline constexpr uint8_t kMaxGroup = 242;    // five +1s
inline constexpr uint8_t kRunBase = 241;     // 241 + k: k zero groups
inline constexpr uint32_t kMaxRun = 14;

// Groups of five in n values, and the most bytes a block of n values can take (no run collapsed).
inline size_t TernaryGroups(size_t n) { return (n + 4) / 5; }
inline size_t MaxTernaryBytes(size_t n) { return 4 + TernaryGroups(n); }

// Encodes q[0..n) (each -1, 0 or +1) with `scale` into `out` (at least MaxTernaryBytes(n) bytes); returns the bytes
// written.
size_t EncodeTernary(const int8_t* q, size_t n, float scale, std::byte* out);

// The scale of a block that is not finite (docs/PROTOCOL.md §11.2): sent with every q_j = +1, it decodes to NaN.
inline constexpr float kNotFiniteScale = std::numeric_limits<float>::quiet_NaN();

// The scale of an encoded block (at least 4 bytes); NaN for a block that is not finite.
float TernaryScale(std::span<const std::byte> in);

// Decodes a block of n values: out[j] = scale · q_j, or out[j] += scale · q_j with `accumulate`. Fails on a scale
// that is negative or infinite (NaN is allowed: a block that is not finite), a wrong number of groups, a padding
// value that is not zero, or trailing bytes. A failure can come after some values were written (the group count is
// known only at the end): callers that must not touch `out` on bad input check the block first (CheckTernary).
Status DecodeTernary(std::span<const std::byte> in, size_t n, float* out, bool accumulate);

// Checks a block of n values as DecodeTernary does, without writing anything.
Status CheckTernary(std::span<const std::byte> in, size_t n);

// Decodes only the values q_j (for tests and for codecs that apply the scale themselves); returns the scale.
Result<float> DecodeTrits(std::span<const std::byte> in, size_t n, int8_t* q);

}  // namespace sparsereduce::codec
