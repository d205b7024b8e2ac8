// Runs every loop that codec/clones.h compiles twice (AVX2 and baseline) over fixed inputs, and returns all it
// produced as bytes. clone_test.cc compiles this file twice: here, in namespace sparsereduce, against the codec
// library (whose clones the loader picks for this CPU), and in sparsereduce_codec_baseline, together with the codec
// sources, without clones and for the x86-64 baseline (the namespace renamed by a macro).
#pragma once

#include <cstdint>
#include <vector>

namespace sparsereduce::clone_probe {

std::vector<uint8_t> Run(uint64_t seed);

}  // namespace sparsereduce::clone_probe
