// Constants of the frame format. The format itself is specified in docs/PROTOCOL.md §3.
#pragma once

#include <cstdint>

namespace sparsereduce {

inline constexpr uint32_t kFrameMagic = 0x46445253;  // bytes "SRDF" read little-endian
inline constexpr uint8_t kProtocolVersion = 1;
inline constexpr uint32_t kFrameHeaderSize = 40;
inline constexpr uint32_t kEntrySize = 24;
inline constexpr uint32_t kMaxControlPayload = 64 * 1024;
inline constexpr uint64_t kMaxDataPayload = 256ull * 1024 * 1024;  // keeps payload_length far below 2^32
inline constexpr uint64_t kEndOfColumn = ~uint64_t{0};

enum class FrameType : uint8_t {
  kControl = 1,
  kContribution = 2,  // worker -> aggregator
  kResult = 3,        // aggregator -> worker
};

inline constexpr uint64_t Pad8(uint64_t n) { return (n + 7) & ~uint64_t{7}; }

}  // namespace sparsereduce
