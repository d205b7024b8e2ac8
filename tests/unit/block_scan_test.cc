// Nonzero-block detection (core/block_scan.h).
#include "core/block_scan.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace sparsereduce {
namespace {

const DTypeInfo& F32() { return *FindDType(DType::kFloat32); }
const DTypeInfo& I32() { return *FindDType(DType::kInt32); }

constexpr uint8_t kUnwritten = 0xAA;

uint64_t NumBlocks(uint64_t n, uint32_t b) { return (n + b - 1) / b; }

// Element-by-element reference, written independently of the word-at-a-time implementation.
std::vector<uint8_t> ReferenceFlags(const std::byte* data, uint64_t n, uint32_t block, const DTypeInfo& dt) {
  std::vector<uint8_t> flags(NumBlocks(n, block), 0);
  for (uint64_t i = 0; i < n; ++i) {
    uint64_t bits = 0;
    std::memcpy(&bits, data + i * dt.size, dt.size);
    uint8_t& f = flags[i / block];
    if (bits & dt.value_mask) {
      f = kBlockNonzero;
    } else if (bits != 0 && f != kBlockNonzero) {
      f = kBlockHasNegativeZero;
    }
  }
  return flags;
}

// Runs ScanBlocks into an exactly sized flag array pre-filled with a marker, and checks every flag was written and
// the count matches.
std::vector<uint8_t> Scan(const std::byte* data, uint64_t n, uint32_t block, const DTypeInfo& dt) {
  std::vector<uint8_t> flags(NumBlocks(n, block), kUnwritten);
  const uint64_t count = ScanBlocks(data, n, block, dt, flags);
  uint64_t expected_count = 0;
  for (uint8_t f : flags) {
    EXPECT_NE(f, kUnwritten);
    if (f & kBlockNonzero) ++expected_count;
  }
  EXPECT_EQ(count, expected_count);
  return flags;
}

template <typename T>
std::vector<uint8_t> Scan(const std::vector<T>& v, uint32_t block, const DTypeInfo& dt) {
  return Scan(reinterpret_cast<const std::byte*>(v.data()), v.size(), block, dt);
}

template <typename T>
std::vector<uint8_t> Reference(const std::vector<T>& v, uint32_t block, const DTypeInfo& dt) {
  return ReferenceFlags(reinterpret_cast<const std::byte*>(v.data()), v.size(), block, dt);
}

std::vector<uint64_t> Sizes(uint32_t b) { return {0, 1, b - 1, b, b + 1, 5ull * b + 3}; }

TEST(BlockScanTest, AllZeroOfEverySize) {
  for (uint32_t b : {1u, 3u, 4u, 256u}) {
    for (uint64_t n : Sizes(b)) {
      std::vector<float> f(n, 0.0f);
      std::vector<uint8_t> flags = Scan(f, b, F32());
      EXPECT_EQ(flags, std::vector<uint8_t>(NumBlocks(n, b), 0)) << "B=" << b << " N=" << n;
      std::vector<int32_t> i(n, 0);
      flags = Scan(i, b, I32());
      EXPECT_EQ(flags, std::vector<uint8_t>(NumBlocks(n, b), 0)) << "B=" << b << " N=" << n;
    }
  }
}

TEST(BlockScanTest, AllDenseOfEverySize) {
  for (uint32_t b : {1u, 3u, 4u, 256u}) {
    for (uint64_t n : Sizes(b)) {
      std::vector<float> f(n, 1.5f);
      EXPECT_EQ(Scan(f, b, F32()), std::vector<uint8_t>(NumBlocks(n, b), kBlockNonzero));
      std::vector<int32_t> i(n, -1);
      EXPECT_EQ(Scan(i, b, I32()), std::vector<uint8_t>(NumBlocks(n, b), kBlockNonzero));
    }
  }
}

TEST(BlockScanTest, MatchesReferenceOnRandomSparseData) {
  for (uint32_t b : {1u, 3u, 4u, 256u}) {
    for (uint64_t n : Sizes(b)) {
      for (uint32_t seed = 1; seed <= 4; ++seed) {
        std::mt19937 rng(seed * 1000 + b + static_cast<uint32_t>(n));
        // Density from very sparse to dense, so both zero and nonzero blocks occur with B = 256.
        const double density = seed == 1 ? 0.001 : seed == 2 ? 0.01 : seed == 3 ? 0.2 : 0.9;
        std::bernoulli_distribution nonzero(density);
        std::bernoulli_distribution neg_zero(0.05);
        std::uniform_int_distribution<uint32_t> bits;
        std::vector<float> f(n);
        std::vector<int32_t> i(n);
        for (uint64_t k = 0; k < n; ++k) {
          if (nonzero(rng)) {
            uint32_t v = bits(rng);
            if ((v & 0x7FFFFFFF) == 0) v |= 1;
            f[k] = std::bit_cast<float>(v);
            i[k] = static_cast<int32_t>(v | 1);
          } else {
            f[k] = neg_zero(rng) ? -0.0f : 0.0f;
            i[k] = 0;
          }
        }
        EXPECT_EQ(Scan(f, b, F32()), Reference(f, b, F32())) << "B=" << b << " N=" << n << " seed=" << seed;
        EXPECT_EQ(Scan(i, b, I32()), Reference(i, b, I32())) << "B=" << b << " N=" << n << " seed=" << seed;
      }
    }
  }
}

TEST(BlockScanTest, SingleNonzeroMarksExactlyItsBlock) {
  constexpr uint64_t n = 37;
  // Bit patterns that land in each byte of an element, including the smallest denormal and the sign bit of int32.
  const std::vector<uint32_t> f32_patterns = {0x3F800000, 0x00000001, 0x00000100, 0x00010000, 0x00800000,
                                              0x7F800000, 0x80000001, 0x7FC00000};
  const std::vector<uint32_t> i32_patterns = {1, 0x100, 0x10000, 0x1000000, 0x80000000, 0xFFFFFFFF};
  for (uint32_t b : {1u, 2u, 3u, 4u, 5u, 8u, 16u, 17u, 256u}) {
    for (uint64_t pos = 0; pos < n; ++pos) {
      std::vector<uint8_t> expected(NumBlocks(n, b), 0);
      expected[pos / b] = kBlockNonzero;
      for (uint32_t pattern : f32_patterns) {
        std::vector<float> f(n, 0.0f);
        f[pos] = std::bit_cast<float>(pattern);
        EXPECT_EQ(Scan(f, b, F32()), expected) << "B=" << b << " pos=" << pos << std::hex << " bits=" << pattern;
      }
      for (uint32_t pattern : i32_patterns) {
        std::vector<int32_t> i(n, 0);
        i[pos] = static_cast<int32_t>(pattern);
        EXPECT_EQ(Scan(i, b, I32()), expected) << "B=" << b << " pos=" << pos << std::hex << " bits=" << pattern;
      }
    }
  }
}

TEST(BlockScanTest, NegativeZeroOnlyBlocksAreZero) {
  for (uint32_t b : {1u, 3u, 4u, 256u}) {
    for (uint64_t n : Sizes(b)) {
      if (n == 0) continue;
      // A -0.0 at one position of an otherwise +0.0 tensor.
      for (uint64_t pos : {uint64_t{0}, n / 2, n - 1}) {
        std::vector<float> f(n, 0.0f);
        f[pos] = -0.0f;
        std::vector<uint8_t> expected(NumBlocks(n, b), 0);
        expected[pos / b] = kBlockHasNegativeZero;
        EXPECT_EQ(Scan(f, b, F32()), expected) << "B=" << b << " N=" << n << " pos=" << pos;
      }
      // All -0.0.
      std::vector<float> all(n, -0.0f);
      EXPECT_EQ(Scan(all, b, F32()), std::vector<uint8_t>(NumBlocks(n, b), kBlockHasNegativeZero));
      // -0.0 next to a real value: the block is nonzero, and only that.
      if (n >= 2) {
        std::vector<float> mixed(n, -0.0f);
        mixed[n - 1] = 2.0f;
        std::vector<uint8_t> expected(NumBlocks(n, b), kBlockHasNegativeZero);
        expected.back() = kBlockNonzero;
        EXPECT_EQ(Scan(mixed, b, F32()), expected);
      }
    }
  }
}

TEST(BlockScanTest, SpecialFloatsAreNonzero) {
  const std::vector<float> specials = {std::numeric_limits<float>::quiet_NaN(),
                                       -std::numeric_limits<float>::quiet_NaN(),
                                       std::numeric_limits<float>::signaling_NaN(),
                                       std::numeric_limits<float>::infinity(),
                                       -std::numeric_limits<float>::infinity(),
                                       1e-45f,
                                       -1e-45f,
                                       std::numeric_limits<float>::denorm_min(),
                                       std::numeric_limits<float>::min(),
                                       std::numeric_limits<float>::max(),
                                       std::numeric_limits<float>::lowest()};
  for (float v : specials) {
    for (uint32_t b : {1u, 4u, 256u}) {
      std::vector<float> f(2 * b, 0.0f);
      f[b] = v;  // first element of block 1
      std::vector<uint8_t> expected(2, 0);
      expected[1] = kBlockNonzero;
      EXPECT_EQ(Scan(f, b, F32()), expected) << v;
    }
  }
}

TEST(BlockScanTest, Int32SignBitIsNonzero) {
  for (uint32_t b : {1u, 3u, 4u, 256u}) {
    std::vector<int32_t> v(2 * b + 1, 0);
    v.back() = std::numeric_limits<int32_t>::min();  // 0x80000000: a value, not a negative zero
    std::vector<uint8_t> expected(NumBlocks(v.size(), b), 0);
    expected.back() = kBlockNonzero;
    EXPECT_EQ(Scan(v, b, I32()), expected);
  }
}

TEST(BlockScanTest, OtherElementSizes) {
  // The scan is generic over the dtype table; check the 2- and 8-byte types against the reference.
  for (DType dt : {DType::kFloat16, DType::kBFloat16, DType::kInt64, DType::kFloat64}) {
    const DTypeInfo& info = *FindDType(dt);
    for (uint32_t b : {1u, 3u, 4u, 256u}) {
      for (uint64_t n : Sizes(b)) {
        std::mt19937 rng(b * 7 + static_cast<uint32_t>(n));
        std::vector<std::byte> data(n * info.size, std::byte{0});
        for (uint64_t e = 0; e < n; ++e) {
          const uint32_t r = rng() % 16;
          std::byte* p = data.data() + e * info.size;
          if (r == 0) p[info.size - 1] = std::byte{0x80};       // negative zero
          if (r == 1) p[0] = std::byte{0x01};                   // smallest denormal / 1
          if (r == 2) p[info.size - 1] = std::byte{0x81};       // value with sign
        }
        EXPECT_EQ(Scan(data.data(), n, b, info), ReferenceFlags(data.data(), n, b, info))
            << info.name << " B=" << b << " N=" << n;
      }
    }
  }
}

// Reference OR-fold: byte i goes to bit position 8 * (i mod 8).
uint64_t ReferenceOr(const std::byte* p, size_t n) {
  uint64_t acc = 0;
  for (size_t i = 0; i < n; ++i) acc |= std::to_integer<uint64_t>(p[i]) << (8 * (i % 8));
  return acc;
}

TEST(OrReduceTest, UnalignedStartAllLengths) {
  std::mt19937 rng(12345);
  for (size_t len = 0; len <= 130; ++len) {
    // Exactly len + 1 bytes of storage; the data starts one byte in, so it is misaligned for 8-byte loads.
    std::vector<std::byte> storage(len + 1);
    std::byte* data = storage.data() + 1;
    // A sparse pattern so individual lanes stay distinguishable.
    for (size_t i = 0; i < len; ++i) {
      storage[i + 1] = (rng() % 5 == 0) ? std::byte(static_cast<uint8_t>(1u << (rng() % 8))) : std::byte{0};
    }
    const uint64_t expected = ReferenceOr(data, len);
    EXPECT_EQ(OrReduce(data, len, 0), expected) << "len=" << len;

    // With a stop mask the result may be partial, but must agree with the full OR on the masked bits' emptiness
    // and never report bits that are not there.
    for (uint64_t stop : {~uint64_t{0}, uint64_t{0x7FFFFFFF7FFFFFFF}, uint64_t{0xFF}, uint64_t{0x8000000000000000}}) {
      const uint64_t got = OrReduce(data, len, stop);
      EXPECT_EQ(got & ~expected, 0u) << "len=" << len;
      EXPECT_EQ((got & stop) != 0, (expected & stop) != 0) << "len=" << len << " stop=" << std::hex << stop;
    }

    // A single set byte at every position is found in the right lane.
    for (size_t pos = 0; pos < len; ++pos) {
      std::vector<std::byte> single(len + 1, std::byte{0});
      single[pos + 1] = std::byte{0x80};
      EXPECT_EQ(OrReduce(single.data() + 1, len, 0), uint64_t{0x80} << (8 * (pos % 8))) << len << " " << pos;
    }
  }
}

TEST(OrReduceTest, ZeroLengthReadsNothing) {
  EXPECT_EQ(OrReduce(nullptr, 0, ~uint64_t{0}), 0u);
}

}  // namespace
}  // namespace sparsereduce
