// Whether this build runs under AddressSanitizer or ThreadSanitizer (GCC defines __SANITIZE_*__, clang answers
// __has_feature), for tests whose premise such a build changes: the runtimes' shadow memory, their own descriptors
// and helper processes, an allocator that never returns memory.
#pragma once

namespace sparsereduce::testing {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitizedBuild = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
inline constexpr bool kSanitizedBuild = true;
#else
inline constexpr bool kSanitizedBuild = false;
#endif
#else
inline constexpr bool kSanitizedBuild = false;
#endif

}  // namespace sparsereduce::testing
