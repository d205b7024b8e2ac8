// The codec of a collective (docs/PROTOCOL.md §11): part of its spec, so every rank must pass the same one, and
// the wire format of each direction follows from it.
#pragma once

#include <cstdint>
#include <string>

#include "codec/wire.h"
#include "core/status.h"

namespace sparsereduce {

// Values match proto/control.proto (Codec).
enum class Codec : uint32_t {
  kNone = 0,      // exact: raw elements both ways
  kFloat16 = 1,   // fp16 both ways; the aggregator sums in fp32
  kBFloat16 = 2,  // bf16 both ways; the aggregator sums in fp32
  kThreeLC = 3,   // 3LC: ternary with error feedback both ways (or fp32 results)
  kDiana = 4,     // DIANA: unbiased ternary differences up, fp32 sums down; the aggregator keeps no state
  kTopK = 5,      // block top-k with error feedback on the worker; raw both ways
  kAdaptive = 6,  // top-k whose k each worker picks per step from a fitted cost model; raw both ways
};

struct CodecSpec {
  Codec codec = Codec::kNone;
  // Names the tensor across steps (e.g. the DDP bucket index): error memories and DIANA's h are kept per key.
  uint64_t key = 0;
  float sparsity = 1.0f;     // 3LC: s in [1, 2); M = max|T| · s, so a larger s makes more zeros
  bool result_fp32 = false;  // 3LC: the aggregator sends sums in fp32 instead of re-encoding them
  float fraction = 0.01f;    // top-k: the fraction of blocks sent
  float alpha = 0.0f;        // DIANA: step of h; 0 means 1 / sqrt(block size), i.e. 1 / (ω + 1) for ternary blocks
  bool diana_l2 = false;     // DIANA: scale blocks by their 2-norm instead of the ∞-norm
  // 3LC: M from the whole tensor (3LC's per-layer scale) instead of per block. A DDP bucket mixes layers whose
  // gradients differ by orders of magnitude, so per block (the default) is the closer match to 3LC's per-layer M.
  bool tensor_scale = false;

  bool operator==(const CodecSpec&) const = default;
  std::string ToString() const;
};

const char* CodecName(Codec codec);
// "none", "fp16", "bf16", "3lc", "diana", "topk", "adaptive"
Result<Codec> ParseCodec(const std::string& name);

Status ValidateCodec(const CodecSpec& codec);

// `codec` with the fields its codec does not use at their defaults, so that two specs compare (and print) equal
// when they mean the same: a peer that sends proto3 defaults, or a user's option for another codec, changes nothing.
CodecSpec WithoutUnusedFields(const CodecSpec& codec);

codec::WireFormat UploadFormat(const CodecSpec& codec);
codec::WireFormat DownloadFormat(const CodecSpec& codec);

}  // namespace sparsereduce
