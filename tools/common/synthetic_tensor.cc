#include "tools/common/synthetic_tensor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace sparsereduce::tools {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double Uniform(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

uint64_t BlockSeed(const SyntheticSpec& spec, uint32_t rank, uint64_t block) {
  return SplitMix64(spec.seed ^ SplitMix64(rank * 0x100000001B3ull ^ SplitMix64(block)));
}

uint64_t BlockCount(const SyntheticSpec& spec) { return (spec.elements + spec.block_size - 1) / spec.block_size; }

template <typename T, typename Gen>
void Fill(const SyntheticSpec& spec, uint32_t rank, std::span<T> out, Gen value) {
  const uint64_t blocks = BlockCount(spec);
  for (uint64_t b = 0; b < blocks; ++b) {
    const uint64_t begin = b * spec.block_size;
    const uint64_t end = std::min<uint64_t>(begin + spec.block_size, spec.elements);
    if (!BlockIsNonzero(spec, rank, b)) {
      for (uint64_t i = begin; i < end; ++i) out[i] = T{};
      continue;
    }
    uint64_t state = BlockSeed(spec, rank, b) | 1;
    for (uint64_t i = begin; i < end; ++i) {
      state ^= state << 13;  // xorshift64: cheap enough for 64 MiB tensors
      state ^= state >> 7;
      state ^= state << 17;
      out[i] = value(state);
    }
  }
}

}  // namespace

Status ValidateSpec(const SyntheticSpec& spec) {
  if (spec.block_size == 0) return InvalidArgument("block size 0: a block holds at least one element");
  if (spec.world_size == 0) return InvalidArgument("world size 0: a job has at least one rank");
  if (!std::isfinite(spec.density) || spec.density < 0 || spec.density > 1) {
    char text[32];
    std::snprintf(text, sizeof text, "%g", spec.density);
    return InvalidArgument(std::string("density ") + text + ": not a fraction in [0, 1]");
  }
  return Status::Ok();
}

double RankDensity(const SyntheticSpec& spec) {
  if (spec.overlap == Overlap::kDisjoint) return std::min(spec.density, 1.0 / spec.world_size);
  return spec.density;
}

bool BlockIsNonzero(const SyntheticSpec& spec, uint32_t rank, uint64_t block) {
  switch (spec.overlap) {
    case Overlap::kFull: return Uniform(BlockSeed(spec, 0xFFFFFFFF, block)) < spec.density;
    case Overlap::kDisjoint:
      // Blocks are dealt to ranks round-robin; each rank keeps its own with probability density·W (capped).
      return block % spec.world_size == rank &&
             Uniform(BlockSeed(spec, 0xFFFFFFFF, block)) < spec.density * spec.world_size;
    case Overlap::kRandom: return Uniform(BlockSeed(spec, rank, block) ^ 0x5555) < spec.density;
  }
  return false;
}

void FillTensor(const SyntheticSpec& spec, uint32_t rank, std::span<float> out) {
  Fill<float>(spec, rank, out, [](uint64_t s) {
    // 23 random mantissa bits in [1, 2), shifted to [-1, 1) excluding 0: never a zero element.
    const float f = 1.0f + static_cast<float>(s >> 41) * 0x1.0p-23f;
    return (s & 1) ? f - 2.0f : f - 1.0f + 0x1.0p-24f;
  });
}

void FillTensor(const SyntheticSpec& spec, uint32_t rank, std::span<int32_t> out) {
  Fill<int32_t>(spec, rank, out, [](uint64_t s) { return static_cast<int32_t>((s >> 33) | 1); });
}

std::vector<float> ReferenceSumFloat(const SyntheticSpec& spec) {
  std::vector<float> sum(spec.elements, 0.0f), x(spec.elements);
  for (uint32_t r = 0; r < spec.world_size; ++r) {
    FillTensor(spec, r, x);
    for (uint64_t i = 0; i < spec.elements; ++i) sum[i] += x[i];
  }
  return sum;
}

std::vector<int32_t> ReferenceSumInt32(const SyntheticSpec& spec) {
  std::vector<int32_t> sum(spec.elements, 0), x(spec.elements);
  for (uint32_t r = 0; r < spec.world_size; ++r) {
    FillTensor(spec, r, x);
    for (uint64_t i = 0; i < spec.elements; ++i) {
      sum[i] = static_cast<int32_t>(static_cast<uint32_t>(sum[i]) + static_cast<uint32_t>(x[i]));
    }
  }
  return sum;
}

double UnionDensity(const SyntheticSpec& spec) {
  const uint64_t blocks = BlockCount(spec);
  if (blocks == 0) return 0;
  uint64_t nonzero = 0;
  for (uint64_t b = 0; b < blocks; ++b) {
    for (uint32_t r = 0; r < spec.world_size; ++r) {
      if (BlockIsNonzero(spec, r, b)) {
        ++nonzero;
        break;
      }
    }
  }
  return static_cast<double>(nonzero) / static_cast<double>(blocks);
}

double BlockDensity(const SyntheticSpec& spec, uint32_t rank) {
  const uint64_t blocks = BlockCount(spec);
  if (blocks == 0) return 0;
  uint64_t nonzero = 0;
  for (uint64_t b = 0; b < blocks; ++b) nonzero += BlockIsNonzero(spec, rank, b);
  return static_cast<double>(nonzero) / static_cast<double>(blocks);
}

}  // namespace sparsereduce::tools
