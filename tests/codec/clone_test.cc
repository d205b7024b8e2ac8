// The loops compiled twice (codec/clones.h) give the same bits on AVX2 as on the x86-64 baseline: DIANA's replicas
// of h stay bitwise equal only if workers on different CPUs compute alike, and a 3LC error must not depend on which
// machine ran the step.
#include <gtest/gtest.h>

#include "clone_probe.h"

namespace sparsereduce_baseline::clone_probe {
std::vector<uint8_t> Run(uint64_t seed);  // clone_probe.cc built without clones (tests/codec/CMakeLists.txt)
}  // namespace sparsereduce_baseline::clone_probe

namespace {

TEST(Clones, AvxAndBaselineBuildsProduceTheSameBits) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2: the loader picks the baseline clones too";
#endif
  for (uint64_t seed : {1u, 2u, 3u}) {
    const std::vector<uint8_t> picked = sparsereduce::clone_probe::Run(seed);
    const std::vector<uint8_t> baseline = sparsereduce_baseline::clone_probe::Run(seed);
    ASSERT_EQ(picked.size(), baseline.size()) << seed;
    size_t first = 0;
    while (first < picked.size() && picked[first] == baseline[first]) ++first;
    EXPECT_EQ(first, picked.size()) << "seed " << seed << ": the outputs differ from byte " << first << " of "
                                    << picked.size();
  }
}

}  // namespace
