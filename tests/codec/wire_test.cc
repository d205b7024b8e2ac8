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


// Each decoder refuses a malformed block with the same code and the message that names what is wrong: a receiver's
// error report (CheckTernary on arrival) and a test's (DecodeTrits) must agree with the decoder's.
TEST(Ternary, EveryDecoderRefusesEachMalformedBlockWithItsOwnMessage) {
  const std::vector<std::byte> good = Encode({1, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1}, 1.0f);  // 3 groups: 11 values
  std::vector<std::byte> trailing = good;
  trailing.push_back(std::byte{121});  // a fourth group
  std::vector<std::byte> padded = Encode({1}, 1.0f);
  padded[4] = std::byte{242};
  std::vector<std::byte> negative = Encode({1, 0}, -2.0f);
  struct Case {
    std::vector<std::byte> block;
    size_t n;
    std::string message;
  };
  const std::vector<Case> cases = {
      {good, 16, "ternary block has 3 groups, expected 4"},
      {good, 10, "ternary block has more than its 2 groups"},
      {trailing, 11, "ternary block has more than its 3 groups"},
      {std::vector<std::byte>(good.begin(), good.begin() + 3), 11, "ternary block shorter than its scale"},
      {std::vector<std::byte>(good.begin(), good.begin() + 4), 11, "ternary block has 0 groups, expected 3"},
      {padded, 1, "ternary block pads its last group with a nonzero value"},
      {negative, 2, "ternary block with scale -2.000000 (must be finite and not negative, or NaN)"},
  };
  for (const Case& c : cases) {
    std::vector<float> out(c.n + 5);
    std::vector<int8_t> trits(c.n + 5);
    const Status check = CheckTernary(c.block, c.n);
    const Status decode = DecodeTernary(c.block, c.n, out.data(), false);
    const Status trit = DecodeTrits(c.block, c.n, trits.data()).status();
    for (const Status& st : {check, decode, trit}) {
      EXPECT_EQ(st.code(), StatusCode::kProtocolViolation) << c.message;
      EXPECT_EQ(st.message(), c.message);
    }
  }
}

// A padding digit is checked only in the positions past n: a last group of 4 values may use all four.
TEST(Ternary, PaddingIsCheckedOnlyPastTheLastValue) {
  for (size_t n = 1; n <= 9; ++n) {
    std::vector<int8_t> q(n, -1);
    const std::vector<std::byte> block = Encode(q, 1.0f);
    EXPECT_TRUE(CheckTernary(block, n).ok()) << n;
    if (n % 5 == 0) continue;
    // Each digit past n in turn set to -1 (d = 0) instead of the zero padding (d = 1).
    for (size_t k = n % 5; k < 5; ++k) {
      std::vector<std::byte> bad = block;
      constexpr uint8_t kWeight[5] = {81, 27, 9, 3, 1};
      bad.back() = std::byte{static_cast<uint8_t>(static_cast<uint8_t>(bad.back()) - kWeight[k])};
      EXPECT_EQ(CheckTernary(bad, n).message(), "ternary block pads its last group with a nonzero value")
          << n << " digit " << k;
    }
  }
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The bulk conversions against the scalar ones for every tail length past the 8-wide vector loop, overwriting and
// accumulating: the F16C path (the one this CPU takes, if it has F16C) and the portable loop, bit for bit.
TEST(Half, BulkConversionsMatchTheScalarOnesForEveryTailAndWhenAccumulating) {
  std::mt19937 random(5);
  for (size_t n = 0; n <= 35; ++n) {
    std::vector<float> in(n);
    for (float& v : in) v = FromBits(static_cast<uint32_t>(random()) & 0xC7FFFFFFu);  // |v| < 2^16 or tiny
    std::vector<std::byte> fast(2 * n), portable(2 * n), bf(2 * n);
    EncodeHalf(in.data(), n, fast.data());
    EncodeHalfPortable(in.data(), n, portable.data());
    EncodeBFloat16(in.data(), n, bf.data());
    ASSERT_EQ(fast, portable) << n;
    std::vector<float> base(n);
    for (float& v : base) v = std::normal_distribution<float>(0.0f, 100.0f)(random);
    for (bool accumulate : {false, true}) {
      std::vector<float> a = base, b = base, c = base;
      DecodeHalf(fast.data(), n, a.data(), accumulate);
      DecodeHalfPortable(fast.data(), n, b.data(), accumulate);
      DecodeBFloat16(bf.data(), n, c.data(), accumulate);
      for (size_t j = 0; j < n; ++j) {
        uint16_t h, g;
        std::memcpy(&h, fast.data() + 2 * j, 2);
        std::memcpy(&g, bf.data() + 2 * j, 2);
        ASSERT_EQ(h, FloatToHalf(in[j])) << n << " " << j;
        ASSERT_EQ(g, FloatToBFloat16(in[j])) << n << " " << j;
        const float half = accumulate ? base[j] + HalfToFloat(h) : HalfToFloat(h);
        const float bfloat = accumulate ? base[j] + BFloat16ToFloat(g) : BFloat16ToFloat(g);
        ASSERT_EQ(BitsOf(a[j]), BitsOf(half)) << n << " " << j << " accumulate " << accumulate;
        ASSERT_EQ(BitsOf(b[j]), BitsOf(half)) << n << " " << j << " accumulate " << accumulate;
        ASSERT_EQ(BitsOf(c[j]), BitsOf(bfloat)) << n << " " << j << " accumulate " << accumulate;
      }
    }
  }
}

// Every fp32 NaN (both signs, a sweep of payloads including the signalling ones with only low bits set) becomes a
// quiet NaN half that keeps the sign and the top payload bits, alike on the F16C and the portable path.
TEST(Half, EveryNaNBecomesAQuietNaNAlikeOnBothPaths) {
  std::vector<float> nans;
  for (uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t payload = 1; payload < 0x800000; payload += payload < 0x4000 ? 1 : 4093) {
      nans.push_back(FromBits(sign | 0x7F800000 | payload));
    }
    nans.push_back(FromBits(sign | 0x7FFFFFFF));
  }
  std::vector<std::byte> fast(2 * nans.size()), portable(2 * nans.size());
  EncodeHalf(nans.data(), nans.size(), fast.data());
  EncodeHalfPortable(nans.data(), nans.size(), portable.data());
  EXPECT_EQ(fast, portable);
  for (size_t i = 0; i < nans.size(); ++i) {
    const uint32_t f = BitsOf(nans[i]);
    const uint16_t expected = static_cast<uint16_t>(((f >> 16) & 0x8000) | 0x7E00 | ((f >> 13) & 0x3FF));
    uint16_t h;
    std::memcpy(&h, portable.data() + 2 * i, 2);
    ASSERT_EQ(h, expected) << std::hex << f;
    ASSERT_EQ(FloatToHalf(nans[i]), expected) << std::hex << f;
  }
}

// bf16 rounding against a reference that compares distances (in double) to the two neighbours, ties to even, over
// a sweep of every exponent: Inf where the value passes the largest bf16 by half an ulp or more, -0.0 kept, and
// every NaN a quiet NaN (without its own branch, a NaN whose payload has only low bits turned into Inf, and the
// NaN with all payload bits into -0.0).
TEST(BFloat16, RoundsLikeTheReferenceAndKeepsEveryNaNANaN) {
  auto reference = [](uint32_t f) -> uint16_t {
    const uint32_t sign = f & 0x80000000u, abs = f & 0x7FFFFFFFu;
    if (abs > 0x7F800000u) return static_cast<uint16_t>((f >> 16) | 0x40);
    const uint32_t lo = abs & 0xFFFF0000u, hi = lo + 0x10000u;
    const double x = static_cast<double>(FromBits(abs));
    const double lo_v = static_cast<double>(FromBits(lo));
    const double hi_v = hi >= 0x7F800000u ? std::ldexp(1.0, 128) : static_cast<double>(FromBits(hi));
    if (abs == 0x7F800000u) return static_cast<uint16_t>((sign | abs) >> 16);
    uint32_t pick;
    if (x - lo_v < hi_v - x) {
      pick = lo;
    } else if (x - lo_v > hi_v - x) {
      pick = hi;
    } else {
      pick = (lo & 0x10000u) ? hi : lo;
    }
    return static_cast<uint16_t>((sign | pick) >> 16);
  };
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 65521) {
    for (uint32_t low : {0u, 1u, 0x7FFFu, 0x8000u, 0x8001u, 0xFFFFu}) {
      const uint32_t f = (static_cast<uint32_t>(u) & 0xFFFF0000u) | low;
      const uint16_t b = FloatToBFloat16(FromBits(f));
      ASSERT_EQ(b, reference(f)) << std::hex << f;
      ASSERT_EQ(std::isnan(BFloat16ToFloat(b)), std::isnan(FromBits(f))) << std::hex << f;
    }
  }
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7F800001u)), 0x7FC0);
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7FFFFFFFu)), 0x7FFF);
  EXPECT_EQ(FloatToBFloat16(FromBits(0xFF800001u)), 0xFFC0);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);  // past the largest bf16: Inf
  EXPECT_EQ(FloatToBFloat16(FromBits(0x7F7F7FFFu)), 0x7F7F);              // just below the tie: stays finite
}

// A length that does not fit is refused before anything is read, naming the format, the count and the bound; the
// decoders refuse it the same way and leave `out` alone.
TEST(Wire, WrongLengthsAreRefusedWithTheExpectedSize) {
  EXPECT_EQ(CheckWireBytes(WireFormat::kRaw, 256, 4, 1020).message(),
            "1020 data bytes for a raw block of 256 elements (exactly 1024)");
  EXPECT_EQ(CheckWireBytes(WireFormat::kRaw, 3, 8, 12).message(),
            "12 data bytes for a raw block of 3 elements (exactly 24)");
  EXPECT_EQ(CheckWireBytes(WireFormat::kFloat16, 7, 4, 15).message(),
            "15 data bytes for a fp16 block of 7 elements (exactly 14)");
  EXPECT_EQ(CheckWireBytes(WireFormat::kBFloat16, 7, 4, 28).message(),
            "28 data bytes for a bf16 block of 7 elements (exactly 14)");
  EXPECT_EQ(CheckWireBytes(WireFormat::kTernary, 11, 4, 4).message(),
            "4 data bytes for a ternary block of 11 elements (5..7)");
  EXPECT_EQ(CheckWireBytes(WireFormat::kTernary, 11, 4, 8).code(), StatusCode::kProtocolViolation);
  EXPECT_TRUE(CheckWireBytes(WireFormat::kTernary, 11, 4, 7).ok());
  EXPECT_TRUE(CheckWireBytes(WireFormat::kTernary, 1, 4, 5).ok());
  for (WireFormat f : {WireFormat::kRaw, WireFormat::kFloat16, WireFormat::kBFloat16, WireFormat::kTernary}) {
    const std::vector<std::byte> bytes(MaxWireBytes(f, 5, 4) + 1);
    std::vector<float> out(5, 7.0f);
    const Status st = DecodeFloats(f, bytes, 5, out.data(), false);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation) << WireFormatName(f);
    EXPECT_EQ(st.message(), CheckWireBytes(f, 5, 4, static_cast<uint32_t>(bytes.size())).message());
    EXPECT_EQ(out, std::vector<float>(5, 7.0f)) << WireFormatName(f);
  }
  EXPECT_STREQ(WireFormatName(static_cast<WireFormat>(9)), "?");
  EXPECT_EQ(MaxWireBytes(static_cast<WireFormat>(9), 5, 4), 0u);
  std::vector<float> out(5);
  EXPECT_EQ(DecodeFloats(static_cast<WireFormat>(9), {}, 5, out.data(), false).message(), "unknown wire format");
}

// CheckWireBlock checks a ternary body on arrival (so that the later decode cannot fail) and only the length of the
// fixed formats; DecodeFloats decodes a ternary block and accumulates like the others.
TEST(Wire, TernaryBlocksAreCheckedOnArrivalAndDecodedByDecodeFloats) {
  const std::vector<std::byte> block = Encode({1, -1, 0, 0, 0, 0, 1}, 0.5f);
  EXPECT_TRUE(CheckWireBlock(WireFormat::kTernary, 7, 4, block).ok());
  std::vector<std::byte> padded = block;
  padded.back() = std::byte{242};  // the last group's padding digits are +1
  EXPECT_EQ(CheckWireBlock(WireFormat::kTernary, 7, 4, padded).message(),
            "ternary block pads its last group with a nonzero value");
  EXPECT_EQ(CheckWireBlock(WireFormat::kTernary, 7, 4, std::span(block).first(4)).message(),
            "4 data bytes for a ternary block of 7 elements (5..6)");
  const std::vector<std::byte> raw(28, std::byte{0xFF});  // NaNs: only the length is a raw block's to check
  EXPECT_TRUE(CheckWireBlock(WireFormat::kRaw, 7, 4, raw).ok());
  EXPECT_FALSE(CheckWireBlock(WireFormat::kFloat16, 7, 4, raw).ok());
  std::vector<float> out(7, 1.0f);
  ASSERT_TRUE(DecodeFloats(WireFormat::kTernary, block, 7, out.data(), true).ok());
  EXPECT_EQ(out, std::vector<float>({1.5f, 0.5f, 1.0f, 1.0f, 1.0f, 1.0f, 1.5f}));
  ASSERT_TRUE(DecodeFloats(WireFormat::kTernary, block, 7, out.data(), false).ok());
  EXPECT_EQ(out, std::vector<float>({0.5f, -0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.5f}));
  std::vector<std::byte> none(8);
  EXPECT_EQ(EncodeFloats(WireFormat::kTernary, out.data(), 7, none.data()), 0u);  // ternary is the codecs' to write
}

// The quantizer's boundaries: a zero scale sends nothing and moves all of x into the error; T exactly at ±M/2
// rounds away from zero; error_in stays untouched when error_out is elsewhere; n = 0 gives a maximum of 0.
TEST(ThreeLc, QuantizerBoundariesAndSeparateErrorBuffers) {
  const std::vector<float> x = {1.0f, -1.0f, 0.25f, -0.0f};
  std::vector<float> error = {0.5f, 0.0f, -0.25f, 0.0f};
  std::vector<int8_t> q(4, 9);
  EXPECT_FALSE(QuantizeWithError(x.data(), error.data(), x.size(), 0.0f, q.data()));
  EXPECT_EQ(q, std::vector<int8_t>(4, 0));
  EXPECT_EQ(error, std::vector<float>({1.5f, -1.0f, 0.0f, 0.0f}));
  const std::vector<float> t = {1.0f, -1.0f, 0.999f, -0.999f, 2.0f, 0.0f};
  const std::vector<float> in(t.size(), 0.0f);
  std::vector<float> out(t.size(), 42.0f);
  std::vector<int8_t> q2(t.size());
  EXPECT_TRUE(QuantizeWithError(t.data(), in.data(), out.data(), t.size(), 2.0f, q2.data()));
  EXPECT_EQ(q2, std::vector<int8_t>({1, -1, 0, 0, 1, 0}));
  EXPECT_EQ(out, std::vector<float>({-1.0f, 1.0f, 0.999f, -0.999f, 0.0f, 0.0f}));
  EXPECT_EQ(in, std::vector<float>(t.size(), 0.0f));
  EXPECT_EQ(MaxAbsWithError(t.data(), in.data(), 0), 0.0f);
  const std::vector<float> neg_zero = {-0.0f, -0.0f};
  EXPECT_EQ(BitsOf(MaxAbsWithError(neg_zero.data(), neg_zero.data(), 2)), 0u);  // |-0| is +0
  std::vector<float> nan_error = {0.0f, std::nanf("")};
  EXPECT_TRUE(std::isnan(MaxAbsWithError(neg_zero.data(), nan_error.data(), 2)));
}

}  // namespace
}  // namespace sparsereduce::codec
