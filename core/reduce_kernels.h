// Element-wise reduction kernels, looked up by (dtype, op).
#pragma once

#include <cstddef>

#include "core/dtype.h"

namespace sparsereduce {

// `dst` is aligned for the element type; `src` may start at any address.
struct ReduceKernels {
  // dst[i] = identity ⊕ src[i]. For float sums this is src[i] + 0.0f, which turns -0.0 into +0.0 exactly as the
  // dense reference sum (0 + x0 + x1 + ...) does.
  void (*first)(void* dst, const void* src, size_t count);
  // dst[i] = dst[i] ⊕ src[i].
  void (*accumulate)(void* dst, const void* src, size_t count);
};

// nullptr when the combination is not supported (yet).
const ReduceKernels* FindReduceKernels(DType dtype, ReduceOp op);

}  // namespace sparsereduce
