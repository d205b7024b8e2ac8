// Deterministic sparse test tensors: every process can regenerate any rank's input from (seed, rank), so workers
// check their results against a locally computed reference without exchanging data.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace sparsereduce::tools {

enum class Overlap { kRandom, kFull, kDisjoint };

struct SyntheticSpec {
  uint64_t elements = 0;
  uint32_t block_size = 256;
  double density = 1.0;  // fraction of nonzero blocks per rank
  Overlap overlap = Overlap::kRandom;
  uint32_t world_size = 1;
  uint64_t seed = 1;
};

// Whether block `block` of `rank` is nonzero.
bool BlockIsNonzero(const SyntheticSpec& spec, uint32_t rank, uint64_t block);

// Fills `out` (spec.elements) with rank's tensor: nonzero blocks hold values in [-1, 1) without zeros, zero
// blocks hold +0.
void FillTensor(const SyntheticSpec& spec, uint32_t rank, std::span<float> out);
void FillTensor(const SyntheticSpec& spec, uint32_t rank, std::span<int32_t> out);

// The dense reference sum ((0 + x0) + x1) + ... over all ranks, in rank order.
std::vector<float> ReferenceSumFloat(const SyntheticSpec& spec);
std::vector<int32_t> ReferenceSumInt32(const SyntheticSpec& spec);

// Fraction of blocks nonzero on at least one rank.
double UnionDensity(const SyntheticSpec& spec);

}  // namespace sparsereduce::tools
