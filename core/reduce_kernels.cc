#include "core/reduce_kernels.h"

#include <cstdint>

namespace sparsereduce {
namespace {

// Buffers handed to the kernels are element-aligned (frame data is 8-byte aligned, tensors are typed).
void FirstSumFloat(void* dst, const void* src, size_t n) {
  float* __restrict d = static_cast<float*>(dst);
  const float* __restrict s = static_cast<const float*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i] + 0.0f;
}

void AccumulateSumFloat(void* dst, const void* src, size_t n) {
  float* __restrict d = static_cast<float*>(dst);
  const float* __restrict s = static_cast<const float*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

// int32 sums wrap around; unsigned arithmetic keeps that defined.
void FirstSumInt32(void* dst, const void* src, size_t n) {
  uint32_t* __restrict d = static_cast<uint32_t*>(dst);
  const uint32_t* __restrict s = static_cast<const uint32_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i];
}

void AccumulateSumInt32(void* dst, const void* src, size_t n) {
  uint32_t* __restrict d = static_cast<uint32_t*>(dst);
  const uint32_t* __restrict s = static_cast<const uint32_t*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

constexpr ReduceKernels kSumFloat32{FirstSumFloat, AccumulateSumFloat};
constexpr ReduceKernels kSumInt32{FirstSumInt32, AccumulateSumInt32};

}  // namespace

const ReduceKernels* FindReduceKernels(DType dtype, ReduceOp op) {
  if (op != ReduceOp::kSum) return nullptr;
  switch (dtype) {
    case DType::kFloat32: return &kSumFloat32;
    case DType::kInt32: return &kSumInt32;
    default: return nullptr;
  }
}

}  // namespace sparsereduce
