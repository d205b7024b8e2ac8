// Little-endian fixed-width integer encoding (least-significant byte first), independent of the host byte order.
// Callers bound-check before decoding; these helpers never read or write past the given width.
#pragma once

#include <cstddef>
#include <cstdint>

namespace sparsereduce {

inline void EncodeFixed16(std::byte* out, uint16_t v) {
  out[0] = std::byte(v);
  out[1] = std::byte(v >> 8);
}
inline void EncodeFixed32(std::byte* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out[i] = std::byte(v >> (8 * i));
}
inline void EncodeFixed64(std::byte* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = std::byte(v >> (8 * i));
}
inline uint16_t DecodeFixed16(const std::byte* in) {
  return static_cast<uint16_t>(std::to_integer<uint16_t>(in[0]) | (std::to_integer<uint16_t>(in[1]) << 8));
}
inline uint32_t DecodeFixed32(const std::byte* in) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= std::to_integer<uint32_t>(in[i]) << (8 * i);
  return v;
}
inline uint64_t DecodeFixed64(const std::byte* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= std::to_integer<uint64_t>(in[i]) << (8 * i);
  return v;
}

}  // namespace sparsereduce
