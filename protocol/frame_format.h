// Constants of the frame format. The format itself is specified in docs/PROTOCOL.md §3.
#pragma once

#include <cstdint>

namespace sparsereduce {

inline constexpr uint32_t kFrameMagic = 0x46445253;  // bytes "SRDF" read little-endian
inline constexpr uint8_t kProtocolVersion = 3;  // 2: §2 layout in runs; 3: §4 streamed contributions
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
// The largest data payload (§3.2) of a frame of up to `entries` entries whose blocks take at most
// `max_block_bytes` each on the wire.
inline constexpr uint64_t MaxDataPayloadFor(uint64_t entries, uint64_t max_block_bytes) {
  return entries * (kEntrySize + Pad8(max_block_bytes));
}

}  // namespace sparsereduce
