#include "core/reduce_kernels.h"

#include <cstdint>

namespace sparsereduce {
namespace {

// `dst` is element-aligned (a frame the engine builds, a tensor). `src` may not be: a frame read in place from a
// shared-memory ring starts wherever the previous frames ended (a CONTROL payload has any length). The GCC/Clang
// alignment attribute makes the loads unaligned ones, which cost the same as aligned ones on x86-64 and ARMv8.
using UnalignedFloat = float __attribute__((aligned(1)));
using UnalignedUint32 = uint32_t __attribute__((aligned(1)));

void FirstSumFloat(void* dst, const void* src, size_t n) {
  float* __restrict d = static_cast<float*>(dst);
  const UnalignedFloat* __restrict s = static_cast<const UnalignedFloat*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i] + 0.0f;
}

void AccumulateSumFloat(void* dst, const void* src, size_t n) {
  float* __restrict d = static_cast<float*>(dst);
  const UnalignedFloat* __restrict s = static_cast<const UnalignedFloat*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

// int32 sums wrap around; unsigned arithmetic keeps that defined.
void FirstSumInt32(void* dst, const void* src, size_t n) {
  uint32_t* __restrict d = static_cast<uint32_t*>(dst);
  const UnalignedUint32* __restrict s = static_cast<const UnalignedUint32*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = s[i];
}

void AccumulateSumInt32(void* dst, const void* src, size_t n) {
  uint32_t* __restrict d = static_cast<uint32_t*>(dst);
  const UnalignedUint32* __restrict s = static_cast<const UnalignedUint32*>(src);
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
