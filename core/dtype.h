// The element types and reduction operations, as tables. Adding a dtype or an op means adding a row here and its
// kernels in reduce_kernels.cc; the protocol engine only sees element sizes and kernel pointers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace sparsereduce {

// Values match proto/control.proto (DType).
enum class DType : uint32_t {
  kFloat32 = 1,
  kInt32 = 2,
  kFloat16 = 3,
  kBFloat16 = 4,
  kInt64 = 5,
  kFloat64 = 6,
};

// Values match proto/control.proto (ReduceOp).
enum class ReduceOp : uint32_t {
  kSum = 1,
  kAvg = 2,
  kMin = 3,
  kMax = 4,
};

struct DTypeInfo {
  DType dtype;
  const char* name;
  uint32_t size;  // bytes per element; divides 8
  // Bits that make an element compare unequal to zero: everything but the sign for floating point types, so
  // that -0.0 counts as zero.
  uint64_t value_mask;
};

// nullptr for a value outside the table (e.g. from the wire).
const DTypeInfo* FindDType(DType dtype);
const DTypeInfo* FindDType(uint32_t wire_value);

const char* ReduceOpName(ReduceOp op);
bool IsKnownReduceOp(uint32_t wire_value);

}  // namespace sparsereduce
