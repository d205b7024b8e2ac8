// Wire formats of block values: ternary packing and zero runs, fp16 and bf16 conversion, length checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/half.h"
#include "codec/ternary.h"
#include "codec/three_lc.h"
#include "codec/wire.h"

namespace sparsereduce::codec {
namespace {

std::vector<std::byte> Encode(const std::vector<int8_t>& q, float scale) {
  std::vector<std::byte> out(MaxTernaryBytes(q.size()));
  out.resize(EncodeTernary(q.data(), q.size(), scale, out.data()));
  return out;
}

std::vector<uint8_t> Body(const std::vector<std::byte>& encoded) {
  std::vector<uint8_t> body;
  for (size_t i = 4; i < encoded.size(); ++i) body.push_back(static_cast<uint8_t>(encoded[i]));
  return body;
}

TEST(Ternary, QuarticPackingMatchesTheFormula) {
  // b = 81·d0 + 27·d1 + 9·d2 + 3·d3 + d4 with d = q + 1
  EXPECT_EQ(Body(Encode({-1, 0, 1, 1, -1}, 1.0f)), std::vector<uint8_t>({0 * 81 + 1 * 27 + 2 * 9 + 2 * 3 + 0}));
  EXPECT_EQ(Body(Encode({1, 1, 1, 1, 1}, 1.0f)), std::vector<uint8_t>({242}));
  EXPECT_EQ(Body(Encode({-1, -1, -1, -1, -1}, 1.0f)), std::vector<uint8_t>({0}));
  EXPECT_EQ(Body(Encode({0, 0, 0, 0, 0}, 1.0f)), std::vector<uint8_t>({121}));
  // A partial last group is padded with zeros.
  EXPECT_EQ(Body(Encode({1, -1}, 1.0f)), std::vector<uint8_t>({2 * 81 + 0 * 27 + 9 + 3 + 1}));
  const std::vector<std::byte> e = Encode({1}, 2.5f);
  float scale;
  std::memcpy(&scale, e.data(), 4);
  EXPECT_EQ(scale, 2.5f);
}

// Runs of zero groups: 1 stays 121, 2..14 become 241 + k, longer ones split.
TEST(Ternary, ZeroRunEdgeCases) {
  struct Case {
    size_t zero_groups;
    std::vector<uint8_t> body;
  };
  for (const Case& c : std::vector<Case>{{1, {121}},
                                         {2, {243}},
                                         {14, {255}},
                                         {15, {255, 121}},
                                         {16, {255, 243}},
                                         {28, {255, 255}},
                                         {70, {255, 255, 255, 255, 255}},
                                         {71, {255, 255, 255, 255, 255, 121}}}) {
    std::vector<int8_t> q(5 * c.zero_groups + 5, 0);
    q.back() = 1;  // a nonzero group ends the run
    std::vector<uint8_t> expected = c.body;
    expected.push_back(122);
    EXPECT_EQ(Body(Encode(q, 1.0f)), expected) << c.zero_groups << " zero groups";
    // ... and a run at the end of the block (the tail).
    std::vector<int8_t> tail(5 + 5 * c.zero_groups, 0);
    tail[0] = -1;
    std::vector<uint8_t> tail_expected = {81 + 27 + 9 + 3 + 1 - 81};
    tail_expected.insert(tail_expected.end(), c.body.begin(), c.body.end());
    EXPECT_EQ(Body(Encode(tail, 1.0f)), tail_expected) << c.zero_groups << " zero groups at the tail";
  }
}

// The format as the spec states it, one group at a time: what EncodeTernary must produce byte for byte.
std::vector<std::byte> ReferenceEncode(const std::vector<int8_t>& q, float scale) {
  std::vector<uint8_t> groups;
  for (size_t i = 0; i < q.size(); i += 5) {
    int b = 0;
    for (size_t k = 0; k < 5; ++k) b = 3 * b + (i + k < q.size() ? q[i + k] + 1 : 1);
    groups.push_back(static_cast<uint8_t>(b));
  }
  std::vector<std::byte> out(4);
  std::memcpy(out.data(), &scale, 4);
  for (size_t g = 0; g < groups.size();) {
    size_t run = 0;
    while (g + run < groups.size() && groups[g + run] == 121) ++run;
    if (run == 0) {
      out.push_back(std::byte{groups[g++]});
      continue;
    }
    g += run;
    for (; run > 0; run -= std::min<size_t>(run, 14)) {
      const size_t k = std::min<size_t>(run, 14);
      out.push_back(std::byte{static_cast<uint8_t>(k == 1 ? 121 : 241 + k)});
    }
  }
  return out;
}

TEST(Ternary, RoundTripsEveryLengthAndDensity) {
  std::mt19937 random(7);
  for (size_t n : {1, 2, 4, 5, 6, 9, 10, 11, 64, 255, 256, 257, 319, 320, 321, 1000, 4096}) {
    for (double density : {0.0, 0.01, 0.05, 0.3, 1.0}) {
      std::vector<int8_t> q(n);
      for (int8_t& v : q) v = std::bernoulli_distribution(density)(random) ? (random() % 2 ? 1 : -1) : 0;
      const float scale = 0.125f * static_cast<float>(1 + random() % 100);
      const std::vector<std::byte> e = Encode(q, scale);
      ASSERT_LE(e.size(), MaxTernaryBytes(n));
      EXPECT_EQ(e, ReferenceEncode(q, scale)) << n << " " << density;  // runs across 64-group words included
      std::vector<int8_t> back(n, 9);
      auto s = DecodeTrits(e, n, back.data());
      ASSERT_TRUE(s.ok()) << s.status().ToString();
      EXPECT_EQ(*s, scale);
      EXPECT_EQ(back, q) << n << " " << density;
      std::vector<float> values(n, 1.0f);
      ASSERT_TRUE(DecodeTernary(e, n, values.data(), /*accumulate=*/true).ok());
      for (size_t j = 0; j < n; ++j) EXPECT_EQ(values[j], 1.0f + scale * q[j]);
    }
  }
}

TEST(Ternary, MalformedBlocksAreRefused) {
  const std::vector<std::byte> good = Encode({1, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1}, 1.0f);  // 3 groups
  std::vector<float> out(16);  // room for the largest n tried
  EXPECT_TRUE(DecodeTernary(good, 11, out.data(), false).ok());
  EXPECT_FALSE(DecodeTernary(good, 16, out.data(), false).ok());  // too few groups for 16 values
  EXPECT_FALSE(DecodeTernary(good, 10, out.data(), false).ok());  // too many groups for 10
  EXPECT_FALSE(DecodeTernary(std::span(good).first(3), 11, out.data(), false).ok());  // no scale
  std::vector<std::byte> long_run = good;
  long_run[5] = std::byte{255};  // 14 zero groups: more groups than the block has
  EXPECT_FALSE(DecodeTernary(long_run, 11, out.data(), false).ok());
  // A last group of 1 value padded with a nonzero digit.
  std::vector<std::byte> padded = Encode({1}, 1.0f);
  padded[4] = std::byte{242};
  EXPECT_FALSE(DecodeTernary(padded, 1, out.data(), false).ok());
  // Every truncation of a longer block fails cleanly.
  std::vector<int8_t> q(256);
  for (size_t j = 0; j < q.size(); ++j) q[j] = static_cast<int8_t>(j % 3) - 1;
  const std::vector<std::byte> block = Encode(q, 3.0f);
  std::vector<float> values(256);
  for (size_t len = 0; len < block.size(); ++len) {
    EXPECT_FALSE(DecodeTernary(std::span(block).first(len), 256, values.data(), false).ok()) << len;
  }
}

// A scale is finite and not negative, or NaN: a block that is not finite, whose every element then decodes to NaN.
// Anything else (±Inf, negative) is refused on receipt by CheckTernary and DecodeTernary alike, and by DecodeTrits,
// which also checks the padding now.
TEST(Ternary, ScalesMustBeMagnitudesOrNaN) {
  const std::vector<int8_t> q = {1, 0, -1, 1, 0, 0, 1};
  std::vector<float> out(q.size());
  std::vector<int8_t> trits(q.size());
  const float inf = std::numeric_limits<float>::infinity();
  for (float scale : {0.0f, 1.0f, 1e-45f, 3e38f, -0.0f}) {
    const std::vector<std::byte> block = Encode(q, scale);
    EXPECT_TRUE(CheckTernary(block, q.size()).ok()) << scale;
    EXPECT_TRUE(DecodeTernary(block, q.size(), out.data(), false).ok()) << scale;
    EXPECT_TRUE(DecodeTrits(block, q.size(), trits.data()).ok()) << scale;
  }
  for (float scale : {inf, -inf, -1.0f, -1e-45f}) {
    const std::vector<std::byte> block = Encode(q, scale);
    EXPECT_FALSE(CheckTernary(block, q.size()).ok()) << scale;
    EXPECT_FALSE(DecodeTernary(block, q.size(), out.data(), false).ok()) << scale;
    EXPECT_FALSE(DecodeTrits(block, q.size(), trits.data()).ok()) << scale;
  }
  const std::vector<std::byte> not_finite = Encode(std::vector<int8_t>(q.size(), 1), std::nanf(""));
  ASSERT_TRUE(DecodeTernary(not_finite, q.size(), out.data(), false).ok());
  for (float v : out) EXPECT_TRUE(std::isnan(v));
  EXPECT_TRUE(std::isnan(TernaryScale(not_finite)));
  // DecodeTrits refuses a padding that is not zero, as the other decoders do.
  std::vector<std::byte> padded = Encode({1}, 1.0f);
  padded[4] = std::byte{242};
  EXPECT_FALSE(DecodeTrits(padded, 1, trits.data()).ok());
}

// 3LC's scale of a block that is not finite (an Inf or a NaN in x + E, or M overflowing) is NaN; quantizing with it
// sends every value as +1 and leaves the error as it was.
TEST(ThreeLc, ABlockThatIsNotFiniteKeepsItsError) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_TRUE(std::isnan(ScaleOf(inf, 1.0f)));
  EXPECT_TRUE(std::isnan(ScaleOf(std::nanf(""), 1.0f)));
  EXPECT_TRUE(std::isnan(ScaleOf(3e38f, 1.9f)));  // overflows
  EXPECT_EQ(ScaleOf(2.0f, 1.5f), 3.0f);
  std::vector<float> x = {1.0f, inf, -2.0f, 0.0f};
  std::vector<float> error = {0.5f, 0.25f, -0.125f, 0.0f};
  const std::vector<float> before = error;
  std::vector<int8_t> q(x.size());
  const float scale = ScaleOf(MaxAbsWithError(x.data(), error.data(), x.size()), 1.0f);
  EXPECT_TRUE(QuantizeWithError(x.data(), error.data(), x.size(), scale, q.data()));
  EXPECT_EQ(error, before);
  EXPECT_EQ(q, std::vector<int8_t>(x.size(), 1));
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The portable conversion against the CPU's F16C (when present) over a wide sweep of bit patterns, and known values.
TEST(Half, PortableMatchesHardwareAndKnownValues) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xC000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);           // the tie above the largest half rounds to infinity
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // half of it: tie to even
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  for (uint32_t h = 0; h < 0x10000; ++h) {  // every half decodes and re-encodes to itself (NaNs stay NaNs)
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToHalf(f), h) << std::hex << h;
  }
  std::vector<float> in;
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) {
    float f;
    const uint32_t bits = static_cast<uint32_t>(u);
    std::memcpy(&f, &bits, 4);
    if (!std::isnan(f)) in.push_back(f);
  }
  std::vector<std::byte> fast(2 * in.size()), portable(2 * in.size());
  EncodeHalf(in.data(), in.size(), fast.data());
  EncodeHalfPortable(in.data(), in.size(), portable.data());
  EXPECT_EQ(fast, portable);
  std::vector<float> a(in.size()), b(in.size());
  DecodeHalf(fast.data(), in.size(), a.data(), false);
  DecodeHalfPortable(fast.data(), in.size(), b.data(), false);
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(Bits(a[i]), Bits(b[i])) << i;
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  float f;
  uint32_t tie = 0x3F808000;  // exactly between 0x3F80 and 0x3F81: to even
  std::memcpy(&f, &tie, 4);
  EXPECT_EQ(FloatToBFloat16(f), 0x3F80);
  tie = 0x3F818000;
  std::memcpy(&f, &tie, 4);
  EXPECT_EQ(FloatToBFloat16(f), 0x3F82);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
}

TEST(Wire, LengthsAreCheckedBeforeDecoding) {
  EXPECT_TRUE(CheckWireBytes(WireFormat::kRaw, 256, 4, 1024).ok());
  EXPECT_FALSE(CheckWireBytes(WireFormat::kRaw, 256, 4, 1020).ok());
  EXPECT_TRUE(CheckWireBytes(WireFormat::kFloat16, 100, 4, 200).ok());
  EXPECT_FALSE(CheckWireBytes(WireFormat::kBFloat16, 100, 4, 400).ok());
  EXPECT_TRUE(CheckWireBytes(WireFormat::kTernary, 256, 4, 5).ok());
  EXPECT_TRUE(CheckWireBytes(WireFormat::kTernary, 256, 4, 4 + 52).ok());
  EXPECT_FALSE(CheckWireBytes(WireFormat::kTernary, 256, 4, 4).ok());
  EXPECT_FALSE(CheckWireBytes(WireFormat::kTernary, 256, 4, 4 + 53).ok());
  std::vector<float> v = {1.5f, -2.0f, 0.25f};
  for (WireFormat f : {WireFormat::kRaw, WireFormat::kFloat16, WireFormat::kBFloat16}) {
    std::vector<std::byte> bytes(MaxWireBytes(f, 3, 4));
    ASSERT_EQ(EncodeFloats(f, v.data(), 3, bytes.data()), bytes.size());
    std::vector<float> back(3, 1.0f);
    ASSERT_TRUE(DecodeFloats(f, bytes, 3, back.data(), true).ok());
    EXPECT_EQ(back, std::vector<float>({2.5f, -1.0f, 1.25f})) << WireFormatName(f);
  }
}



// 3LC's error feedback loses nothing, bit for bit: sent + new error = x + old error. (With |T| <= M, Sterbenz's
// lemma makes T − M exact when T >= M/2, so the float arithmetic keeps the identity.)
TEST(ThreeLc, SentPlusErrorIsExactlyTheInput) {
  std::mt19937 random(11);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t n = 1 + random() % 600;
    std::vector<float> x(n), error(n), before(n);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (size_t j = 0; j < n; ++j) {
      x[j] = normal(random) * std::pow(10.0f, static_cast<float>(random() % 7) - 3.0f);
      error[j] = normal(random) * 1e-2f;
    }
    before = error;
    for (float s : {1.0f, 1.5f, 1.99f}) {
      error = before;
      const float scale = MaxAbsWithError(x.data(), error.data(), n) * s;
      std::vector<int8_t> q(n);
      QuantizeWithError(x.data(), error.data(), n, scale, q.data());
      for (size_t j = 0; j < n; ++j) {
        ASSERT_TRUE(q[j] >= -1 && q[j] <= 1);
        const float total = x[j] + before[j];
        ASSERT_EQ(scale * static_cast<float>(q[j]) + error[j], total) << "trial " << trial << " element " << j;
        ASSERT_LE(std::fabs(error[j]), 0.5f * scale + std::fabs(total) * 1e-6f);  // what stays is below M/2
      }
    }
  }
}

}  // namespace
}  // namespace sparsereduce::codec
