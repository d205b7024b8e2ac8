// Time bounds of tests that measure how soon something happens, scaled for slower builds and machines:
// SPARSEREDUCE_TEST_TIME_SCALE when set (`make test-tsan` sets 5: ThreadSanitizer runs 5-15x slower), else 3 in an
// ASan or TSan build, else 1. The uninstrumented runs check the promised bound itself.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "tests/sanitized_build.h"

namespace sparsereduce::testing {

inline int TestTimeScale() {
  if (const char* scale = std::getenv("SPARSEREDUCE_TEST_TIME_SCALE")) return std::max(1, std::atoi(scale));
  return kSanitizedBuild ? 3 : 1;
}

// `bound` times TestTimeScale().
template <typename Rep, typename Period>
std::chrono::duration<Rep, Period> TestTime(std::chrono::duration<Rep, Period> bound) {
  return bound * TestTimeScale();
}

}  // namespace sparsereduce::testing
