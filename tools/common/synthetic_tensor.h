// Deterministic sparse test tensors: every process can regenerate any rank's input from (seed, rank), so workers
// check their results against a locally computed reference without exchanging data.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/status.h"

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

// Fails unless block_size > 0, world_size > 0 and 0 <= density <= 1 (finite). The functions below need a valid spec
// (a block size of 0 divides by zero).
Status ValidateSpec(const SyntheticSpec& spec);

// The fraction of blocks each rank has nonzero, in expectation: spec.density, except that disjoint overlap caps it at
// 1/world_size (a rank owns only every world_size-th block).
double RankDensity(const SyntheticSpec& spec);

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

// Fraction of blocks nonzero on `rank`: what its tensor has, where RankDensity is what it has in expectation.
double BlockDensity(const SyntheticSpec& spec, uint32_t rank);

}  // namespace sparsereduce::tools
