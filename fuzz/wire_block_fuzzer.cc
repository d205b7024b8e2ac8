// libFuzzer target: one block of values in a codec's wire format (docs/PROTOCOL.md §11.1, §11.2), as an aggregator
// or a worker receives it. Input: byte 0 picks the format (raw, fp16, bf16, ternary), bytes 1-2 the element count
// (1..4096), the rest is the block.
//
// Invariants: nothing reads or writes past the input or the n output floats (ASan); CheckWireBlock, DecodeFloats
// (both modes) and, for ternary, DecodeTrits agree on what they accept; an accepted ternary block re-encodes from
// its trits and scale to at most its own length (the encoder collapses every run it can) and decodes again to the
// same values, bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "codec/ternary.h"
#include "codec/wire.h"
#include "fuzz/fuzz_common.h"

using namespace sparsereduce;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ByteReader in(data, size);
  const auto format = static_cast<codec::WireFormat>(in.U8() % 4);
  const uint32_t n = 1 + in.U16() % 4096;
  const std::span<const uint8_t> rest = in.Rest();
  // A heap copy of exactly the block, so that ASan sees any read past it.
  std::vector<std::byte> block(rest.size());
  if (!rest.empty()) std::memcpy(block.data(), rest.data(), rest.size());

  const Status checked = codec::CheckWireBlock(format, n, 4, block);
  std::vector<float> out(n), sum(n, 0.0f);
  const Status decoded = codec::DecodeFloats(format, block, n, out.data(), false);
  const Status accumulated = codec::DecodeFloats(format, block, n, sum.data(), true);
  FUZZ_CHECK(checked.ok() == decoded.ok(), "CheckWireBlock %d but DecodeFloats %d", checked.ok(), decoded.ok());
  FUZZ_CHECK(decoded.ok() == accumulated.ok(), "DecodeFloats accepts in one mode only");
  if (format != codec::WireFormat::kTernary) return 0;

  std::vector<int8_t> trits(n);
  Result<float> scale = codec::DecodeTrits(block, n, trits.data());
  FUZZ_CHECK(scale.ok() == checked.ok(), "DecodeTrits %d but CheckWireBlock %d", scale.ok(), checked.ok());
  if (!checked.ok()) return 0;
  std::vector<std::byte> again(codec::MaxTernaryBytes(n));
  again.resize(codec::EncodeTernary(trits.data(), n, *scale, again.data()));
  FUZZ_CHECK(again.size() <= block.size(), "re-encoded to %zu bytes from %zu", again.size(), block.size());
  std::vector<float> out_again(n);
  FUZZ_CHECK(codec::DecodeFloats(format, again, n, out_again.data(), false).ok(), "the re-encoded block is refused");
  FUZZ_CHECK(std::memcmp(out.data(), out_again.data(), n * sizeof(float)) == 0,
             "the re-encoded block decodes differently");
  return 0;
}
