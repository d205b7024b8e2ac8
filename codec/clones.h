// SPARSEREDUCE_CLONES: compile a hot loop twice, for AVX2 and for the x86-64 baseline, and let the dynamic loader
// pick the one the CPU runs (GNU ifunc). Packages must run on any x86-64, and -march=native would not.
//
// Only for loops whose result does not depend on the instruction set: elementwise float operations, integer
// reductions. "avx2" does not enable FMA, so no multiply-add is contracted differently between the two clones.
#ifndef SPARSEREDUCE_CODEC_CLONES_H_
#define SPARSEREDUCE_CODEC_CLONES_H_

// Not under ThreadSanitizer: the ifunc resolvers run while relocating, before TSan's runtime is set up, and the
// process crashes at start.
#if defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SPARSEREDUCE_NO_CLONES 1
#endif
#endif
#if defined(__SANITIZE_THREAD__)
#define SPARSEREDUCE_NO_CLONES 1
#endif

#if defined(__x86_64__) && defined(__linux__) && defined(__GNUC__) && !defined(SPARSEREDUCE_NO_CLONES)
#define SPARSEREDUCE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPARSEREDUCE_CLONES
#endif

#endif  // SPARSEREDUCE_CODEC_CLONES_H_
