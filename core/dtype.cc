#include "core/dtype.h"

#include <array>

namespace sparsereduce {
namespace {

constexpr std::array<DTypeInfo, 6> kDTypes = {{
    {DType::kFloat32, "float32", 4, 0x7FFF'FFFFull},
    {DType::kInt32, "int32", 4, 0xFFFF'FFFFull},
    {DType::kFloat16, "float16", 2, 0x7FFFull},
    {DType::kBFloat16, "bfloat16", 2, 0x7FFFull},
    {DType::kInt64, "int64", 8, ~0ull},
    {DType::kFloat64, "float64", 8, 0x7FFF'FFFF'FFFF'FFFFull},
}};

}  // namespace

const DTypeInfo* FindDType(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

const DTypeInfo* FindDType(uint32_t wire_value) { return FindDType(static_cast<DType>(wire_value)); }

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

bool IsKnownReduceOp(uint32_t wire_value) { return wire_value >= 1 && wire_value <= 4; }

}  // namespace sparsereduce
