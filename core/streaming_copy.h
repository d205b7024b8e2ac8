// A copy for data that is written now and read rarely, if ever: the worker's backup of the input blocks a
// RESULT overwrites (read back only when the collective fails).
#pragma once

#include <cstddef>

namespace sparsereduce {

// memcpy(dst, src, bytes), with non-temporal stores where the CPU has them and `dst` is 16-byte aligned. Such stores
// skip the read-for-ownership of each destination line and leave the cache to the data that is used next. They are
// weakly ordered: call StreamingFence before another thread may read `dst` (one fence after a batch of copies; a
// fence per small copy costs more than the stores save).
void StreamingCopy(void* dst, const void* src, size_t bytes);

// Orders the StreamingCopy stores before the stores that follow, so that a release after it publishes them.
void StreamingFence();

}  // namespace sparsereduce
