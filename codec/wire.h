// How a block's values travel in a data frame (docs/PROTOCOL.md §11.1): the wire format of each direction of a
// collective follows from its codec. fp32: the raw elements (also int32 tensors, which have no codec); fp16 / bf16:
// 2 bytes per element; ternary: a scale and packed trits (ternary.h), of variable length.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/status.h"

namespace sparsereduce::codec {

enum class WireFormat : uint8_t { kRaw, kFloat16, kBFloat16, kTernary };

const char* WireFormatName(WireFormat format);

// Bytes of a block of `n` elements (of `element_size` bytes in the tensor), exactly for the fixed formats, at most
// for ternary.
uint32_t MaxWireBytes(WireFormat format, uint32_t n, uint32_t element_size);

// Checks the length of a block's wire bytes before anything reads them: exact for fixed formats; for ternary more
// than the scale and at most MaxWireBytes.
Status CheckWireBytes(WireFormat format, uint32_t n, uint32_t element_size, uint32_t data_bytes);

// CheckWireBytes, and for ternary blocks also their body (group count, padding), without decoding it: a receiver
// checks each block when its frame arrives, so that the decode, later, cannot fail.
Status CheckWireBlock(WireFormat format, uint32_t n, uint32_t element_size, std::span<const std::byte> data);

// fp32 values -> wire bytes, for the fixed float formats (ternary blocks are produced by their codecs). Returns the
// bytes written (MaxWireBytes).
uint32_t EncodeFloats(WireFormat format, const float* values, uint32_t n, std::byte* out);

// Wire bytes -> fp32 values: out[j] = v_j, or out[j] += v_j with `accumulate`. For kRaw the block must be fp32.
// A ternary block that fails may have written part of `out`: check untrusted bytes first (CheckWireBlock).
Status DecodeFloats(WireFormat format, std::span<const std::byte> in, uint32_t n, float* out, bool accumulate);

}  // namespace sparsereduce::codec
