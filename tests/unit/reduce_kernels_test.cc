// Reduction kernels (core/reduce_kernels.h, docs/PROTOCOL.md §6).
#include "core/reduce_kernels.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace sparsereduce {
namespace {

const ReduceKernels& FloatSum() {
  const ReduceKernels* k = FindReduceKernels(DType::kFloat32, ReduceOp::kSum);
  EXPECT_NE(k, nullptr);
  return *k;
}
const ReduceKernels& IntSum() {
  const ReduceKernels* k = FindReduceKernels(DType::kInt32, ReduceOp::kSum);
  EXPECT_NE(k, nullptr);
  return *k;
}

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }

// Random finite floats over a wide exponent range, with plenty of +-0 and denormals mixed in.
std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> kind(0, 9);
  std::uniform_real_distribution<float> mant(-2.0f, 2.0f);
  std::uniform_int_distribution<int> exp(-30, 30);
  std::vector<float> out(n);
  for (float& v : out) {
    switch (kind(rng)) {
      case 0: v = 0.0f; break;
      case 1: v = -0.0f; break;
      case 2: v = std::bit_cast<float>(static_cast<uint32_t>(rng() & 0x807FFFFF)); break;  // denormal
      default: v = std::ldexp(mant(rng), exp(rng)); break;
    }
  }
  return out;
}

TEST(ReduceKernelsTest, Lookup) {
  EXPECT_NE(FindReduceKernels(DType::kFloat32, ReduceOp::kSum), nullptr);
  EXPECT_NE(FindReduceKernels(DType::kInt32, ReduceOp::kSum), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat32, ReduceOp::kMax), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat32, ReduceOp::kMin), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat32, ReduceOp::kAvg), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat16, ReduceOp::kSum), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat64, ReduceOp::kSum), nullptr);
  EXPECT_EQ(FindReduceKernels(static_cast<DType>(99), ReduceOp::kSum), nullptr);
  EXPECT_EQ(FindReduceKernels(DType::kFloat32, static_cast<ReduceOp>(99)), nullptr);
}

// The daemon sums frames in place in a shared-memory ring, where a frame starts wherever the previous one ended:
// sources at every offset within an element sum exactly as aligned ones do (make test-asan's UBSan checks the loads).
TEST(ReduceKernelsTest, UnalignedSourcesSumExactly) {
  const size_t n = 1000;
  const std::vector<float> a = RandomFloats(n, 1), b = RandomFloats(n, 2);
  std::vector<float> expected(n);
  FloatSum().first(expected.data(), a.data(), n);
  FloatSum().accumulate(expected.data(), b.data(), n);
  std::vector<uint32_t> ia(n), ib(n), iexpected(n);
  for (size_t i = 0; i < n; ++i) {
    ia[i] = Bits(a[i]);
    ib[i] = Bits(b[i]) * 2654435761u;
  }
  IntSum().first(iexpected.data(), ia.data(), n);
  IntSum().accumulate(iexpected.data(), ib.data(), n);
  for (size_t offset = 1; offset < 8; ++offset) {
    std::vector<std::byte> sa(n * 4 + 8), sb(n * 4 + 8);
    std::memcpy(sa.data() + offset, a.data(), n * 4);
    std::memcpy(sb.data() + offset, b.data(), n * 4);
    std::vector<float> out(n);
    FloatSum().first(out.data(), sa.data() + offset, n);
    FloatSum().accumulate(out.data(), sb.data() + offset, n);
    EXPECT_EQ(std::memcmp(out.data(), expected.data(), n * 4), 0) << "offset " << offset;
    std::memcpy(sa.data() + offset, ia.data(), n * 4);
    std::memcpy(sb.data() + offset, ib.data(), n * 4);
    std::vector<uint32_t> iout(n);
    IntSum().first(iout.data(), sa.data() + offset, n);
    IntSum().accumulate(iout.data(), sb.data() + offset, n);
    EXPECT_EQ(iout, iexpected) << "offset " << offset;
  }
}

TEST(ReduceKernelsTest, FloatFirstNormalizesNegativeZeroAndKeepsSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> src = {-0.0f, 0.0f, inf, -inf, nan, -nan, 1e-45f, -1e-45f, 1.5f, -2.25f,
                                  std::numeric_limits<float>::max(), std::numeric_limits<float>::lowest()};
  std::vector<float> dst(src.size(), 123.0f);
  FloatSum().first(dst.data(), src.data(), src.size());
  EXPECT_EQ(Bits(dst[0]), 0u) << "-0.0 must become +0.0";
  EXPECT_EQ(Bits(dst[1]), 0u);
  EXPECT_EQ(dst[2], inf);
  EXPECT_EQ(dst[3], -inf);
  EXPECT_TRUE(std::isnan(dst[4]));
  EXPECT_TRUE(std::isnan(dst[5]));
  for (size_t i = 6; i < src.size(); ++i) EXPECT_EQ(Bits(dst[i]), Bits(src[i])) << i;  // denormals survive

  // The same over a length long enough for the vector loop and its tail.
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{33}, size_t{1000}}) {
    std::vector<float> neg(n, -0.0f);
    std::vector<float> out(n, 5.0f);
    FloatSum().first(out.data(), neg.data(), n);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(Bits(out[i]), 0u) << "n=" << n << " i=" << i;
  }
}

TEST(ReduceKernelsTest, FloatAccumulateMatchesScalarReferenceBitExactly) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{3}, size_t{4}, size_t{15}, size_t{16}, size_t{17}, size_t{255},
                   size_t{1031}}) {
    for (uint32_t seed = 1; seed <= 3; ++seed) {
      const std::vector<float> a = RandomFloats(n, seed * 7919 + static_cast<uint32_t>(n));
      const std::vector<float> b = RandomFloats(n, seed * 104729 + static_cast<uint32_t>(n));
      const std::vector<float> c = RandomFloats(n, seed * 1299709 + static_cast<uint32_t>(n));
      std::vector<float> dst(n);
      FloatSum().first(dst.data(), a.data(), n);
      FloatSum().accumulate(dst.data(), b.data(), n);
      FloatSum().accumulate(dst.data(), c.data(), n);
      for (size_t i = 0; i < n; ++i) {
        volatile float ref = 0.0f;  // volatile: one IEEE add at a time, in this order
        ref = ref + a[i];
        ref = ref + b[i];
        ref = ref + c[i];
        ASSERT_EQ(Bits(dst[i]), Bits(ref)) << "n=" << n << " i=" << i << " " << a[i] << "+" << b[i] << "+" << c[i];
      }
    }
  }
}

TEST(ReduceKernelsTest, FloatAccumulateSpecials) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> dst = {1.0f, inf, inf, 1.0f, std::numeric_limits<float>::max(), 0.0f};
  const std::vector<float> src = {nan, 1.0f, -inf, -0.0f, std::numeric_limits<float>::max(), -0.0f};
  FloatSum().accumulate(dst.data(), src.data(), dst.size());
  EXPECT_TRUE(std::isnan(dst[0]));
  EXPECT_EQ(dst[1], inf);
  EXPECT_TRUE(std::isnan(dst[2]));
  EXPECT_EQ(Bits(dst[3]), Bits(1.0f));
  EXPECT_EQ(dst[4], inf);  // overflow
  EXPECT_EQ(Bits(dst[5]), 0u);  // +0 + -0 = +0: the accumulator never becomes -0
}

// §6: reducing only the contributors (skipping ranks whose value is +-0) in ascending rank order gives the same bits
// as the dense sum ((0 + x0) + x1) + ... over all ranks.
TEST(ReduceKernelsTest, SparseReductionEqualsDenseSum) {
  constexpr int kRanks = 5;
  constexpr size_t n = 777;
  std::vector<std::vector<float>> x;
  for (int r = 0; r < kRanks; ++r) x.push_back(RandomFloats(n, 31 + r));
  for (size_t i = 0; i < n; ++i) {
    volatile float dense = 0.0f;
    for (int r = 0; r < kRanks; ++r) dense = dense + x[r][i];

    float sparse = 0.0f;  // all-zero bits when nobody contributes
    bool first = true;
    for (int r = 0; r < kRanks; ++r) {
      if ((Bits(x[r][i]) & 0x7FFFFFFF) == 0) continue;  // a zero element: this rank skipped it
      if (first) {
        FloatSum().first(&sparse, &x[r][i], 1);
        first = false;
      } else {
        FloatSum().accumulate(&sparse, &x[r][i], 1);
      }
    }
    ASSERT_EQ(Bits(sparse), Bits(dense)) << "i=" << i;
  }
}

TEST(ReduceKernelsTest, Int32SumWraps) {
  const int32_t max = std::numeric_limits<int32_t>::max();
  const int32_t min = std::numeric_limits<int32_t>::min();
  std::vector<int32_t> dst = {max, min, -1, 0, max, min};
  const std::vector<int32_t> src = {1, -1, 1, -1, max, min};
  IntSum().accumulate(dst.data(), src.data(), dst.size());
  EXPECT_EQ(dst[0], min);                        // INT32_MAX + 1
  EXPECT_EQ(dst[1], max);                        // INT32_MIN - 1
  EXPECT_EQ(dst[2], 0);
  EXPECT_EQ(dst[3], -1);
  EXPECT_EQ(static_cast<uint32_t>(dst[4]), 0xFFFFFFFEu);  // 2 * INT32_MAX
  EXPECT_EQ(dst[5], 0);                          // 2 * INT32_MIN

  std::vector<int32_t> copy(src.size(), 42);
  IntSum().first(copy.data(), src.data(), src.size());
  EXPECT_EQ(copy, src);
}

TEST(ReduceKernelsTest, Int32AccumulateMatchesWrappingReference) {
  std::mt19937 rng(2024);
  for (size_t n : {size_t{0}, size_t{1}, size_t{9}, size_t{64}, size_t{1001}}) {
    std::vector<int32_t> a(n), b(n);
    for (size_t i = 0; i < n; ++i) {
      a[i] = static_cast<int32_t>(rng());
      b[i] = static_cast<int32_t>(rng());
    }
    std::vector<int32_t> dst(n);
    IntSum().first(dst.data(), a.data(), n);
    IntSum().accumulate(dst.data(), b.data(), n);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t ref = static_cast<uint32_t>(a[i]) + static_cast<uint32_t>(b[i]);
      ASSERT_EQ(static_cast<uint32_t>(dst[i]), ref) << i;
    }
  }
}

}  // namespace
}  // namespace sparsereduce
