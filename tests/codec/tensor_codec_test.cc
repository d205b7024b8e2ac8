// The worker's side of each codec, one encoder at a time (tensor_codec.h), and the codec spec (codec_spec.h): which
// blocks go out and their exact wire bytes, how the key's state moves from step to step, the cost model's fit, and
// the validation, parsing and printing of specs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/codec_spec.h"
#include "codec/tensor_codec.h"
#include "codec/ternary.h"
#include "codec/three_lc.h"
#include "codec/wire.h"

namespace sparsereduce::codec {
namespace {

std::vector<std::byte> Bytes(std::span<const std::byte> s) { return {s.begin(), s.end()}; }

std::vector<std::byte> TernaryBlock(const std::vector<int8_t>& q, float scale) {
  std::vector<std::byte> out(MaxTernaryBytes(q.size()));
  out.resize(EncodeTernary(q.data(), q.size(), scale, out.data()));
  return out;
}

std::vector<std::byte> FixedBlock(WireFormat format, const std::vector<float>& v) {
  std::vector<std::byte> out(MaxWireBytes(format, static_cast<uint32_t>(v.size()), 4));
  EncodeFloats(format, v.data(), static_cast<uint32_t>(v.size()), out.data());
  return out;
}

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(TensorCodec, NoEncoderForTheExactCodec) {
  KeyState state;
  EXPECT_EQ(MakeEncoder(CodecSpec{}, 4, state, 0, 1, 0), nullptr);
}

// fp16 / bf16 send the blocks with a nonzero element, a tail block shorter than the rest included, in the wire
// type; a block of only -0.0 is not sent (the scan flags it as holding -0.0, which is not "nonzero").
TEST(TensorCodec, HalfEncodersSendNonzeroBlocksAndTheShortTailButNotNegativeZeros) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> x = {-0.0f, -0.0f, -0.0f, -0.0f, 1.0f, 0.0f, 0.0f, 3.0e-8f, nan, 2.5f};
  for (auto [codec, format] : {std::pair{Codec::kFloat16, WireFormat::kFloat16},
                               std::pair{Codec::kBFloat16, WireFormat::kBFloat16}}) {
    KeyState state;
    auto encoder = MakeEncoder({codec}, 4, state, 0, 1, 0);
    std::vector<uint8_t> send(3, 0xEE);
    EXPECT_EQ(encoder->Prepare(x, send), 2u) << CodecName(codec);
    EXPECT_EQ(send, std::vector<uint8_t>({0, 1, 1})) << CodecName(codec);
    EXPECT_EQ(Bytes(encoder->Block(1)), FixedBlock(format, {1.0f, 0.0f, 0.0f, 3.0e-8f})) << CodecName(codec);
    EXPECT_EQ(Bytes(encoder->Block(2)), FixedBlock(format, {nan, 2.5f})) << CodecName(codec);
    EXPECT_EQ(encoder->selected_blocks(), 0u);
  }
}

// An empty tensor sends nothing with any codec, step after step (adaptive's exploration changes k every step).
// Adaptive chose k = 1 of its 0 blocks and read past the end of its block order: the worker's I/O thread crashed.
TEST(TensorCodec, EveryCodecSendsNothingOfAnEmptyTensor) {
  for (Codec codec : {Codec::kFloat16, Codec::kBFloat16, Codec::kThreeLC, Codec::kDiana, Codec::kTopK,
                      Codec::kAdaptive}) {
    KeyState state;
    for (int step = 0; step < 4; ++step) {
      auto encoder = MakeEncoder({codec}, 4, state, 0, 1, 0);
      ASSERT_NE(encoder, nullptr) << CodecName(codec);
      std::vector<uint8_t> send;
      EXPECT_EQ(encoder->Prepare(std::span<const float>(), send), 0u) << CodecName(codec) << ", step " << step;
      EXPECT_EQ(encoder->selected_blocks(), 0u) << CodecName(codec) << ", step " << step;
      encoder->Finish(std::span<float>());
    }
  }
}

// 3LC, M per block: the wire bytes are the quantized T = x + E with M = max|T|·s; the error moves only in Finish
// (a failed collective keeps the old one), and the next step quantizes x plus that error. A block of zeros is not
// sent; the tail block (2 of 4 values) has its own M.
TEST(TensorCodec, ThreeLcErrorFeedbackAdvancesOnlyInFinish) {
  KeyState state;
  const std::vector<float> x = {1.0f, 0.25f, -0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 3.0f, -0.75f};
  auto step1 = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 4, state, 0, 1, 0);
  std::vector<uint8_t> send(3);
  EXPECT_EQ(step1->Prepare(x, send), 2u);
  EXPECT_EQ(send, std::vector<uint8_t>({1, 0, 1}));
  EXPECT_EQ(Bytes(step1->Block(0)), TernaryBlock({1, 0, -1, 0}, 1.0f));
  EXPECT_EQ(Bytes(step1->Block(2)), TernaryBlock({1, 0}, 3.0f));
  EXPECT_EQ(state.error, std::vector<float>(10, 0.0f));  // not yet
  std::vector<float> result(10);
  step1->Finish(result);
  EXPECT_EQ(state.error, std::vector<float>({0.0f, 0.25f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, -0.75f}));
  EXPECT_EQ(state.steps, 1u);

  auto step2 = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 4, state, 0, 1, 0);
  EXPECT_EQ(step2->Prepare(x, send), 2u);  // T = {1, 0.5, 0, 0 | 0... | 3, -1.5}
  EXPECT_EQ(Bytes(step2->Block(0)), TernaryBlock({1, 1, 0, 0}, 1.0f));
  EXPECT_EQ(Bytes(step2->Block(2)), TernaryBlock({1, -1}, 3.0f));
  step2->Finish(result);
  EXPECT_EQ(state.error, std::vector<float>({0.0f, -0.5f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 1.5f}));
}

// With a tensor-wide M and a block that is not finite, that block goes out with the NaN scale and the others share
// the largest finite block's M, so a small block under it is not sent (with M per block it would be).
TEST(TensorCodec, ThreeLcTensorScaleSkipsTheBlockThatIsNotFinite) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {1.0f, 2.0f, inf, 0.0f, 0.5f, 0.25f};
  KeyState state;
  CodecSpec spec{Codec::kThreeLC, 1, 1.0f};
  spec.tensor_scale = true;
  auto encoder = MakeEncoder(spec, 2, state, 0, 1, 0);
  std::vector<uint8_t> send(3);
  EXPECT_EQ(encoder->Prepare(x, send), 2u);
  EXPECT_EQ(send, std::vector<uint8_t>({1, 1, 0}));
  EXPECT_EQ(Bytes(encoder->Block(0)), TernaryBlock({1, 1}, 2.0f));
  EXPECT_TRUE(std::isnan(TernaryScale(encoder->Block(1))));
  EXPECT_EQ(Bytes(encoder->Block(1)).size(), 5u);
  std::vector<float> result(6);
  encoder->Finish(result);
  EXPECT_EQ(state.error, std::vector<float>({-1.0f, 0.0f, 0.0f, 0.0f, 0.5f, 0.25f}));  // the Inf block's stays 0
}

// With a tensor-wide M that overflows (a finite value above FLT_MAX / s), only the block whose own M overflows goes
// out not finite; the others share the largest finite M, and a block of zeros is not sent (the whole tensor went
// out NaN, zero blocks included).
TEST(TensorCodec, ThreeLcTensorScaleThatOverflowsSpoilsOnlyItsBlock) {
  const std::vector<float> x = {2.5e38f, 1.0f, 0.0f, 0.0f, 0.5f, -2.0f};
  KeyState state;
  CodecSpec spec{Codec::kThreeLC, 1, 1.5f};
  spec.tensor_scale = true;
  auto encoder = MakeEncoder(spec, 2, state, 0, 1, 0);
  std::vector<uint8_t> send(3);
  EXPECT_EQ(encoder->Prepare(x, send), 2u);
  EXPECT_EQ(send, std::vector<uint8_t>({1, 0, 1}));
  EXPECT_TRUE(std::isnan(TernaryScale(encoder->Block(0))));
  EXPECT_EQ(Bytes(encoder->Block(2)), TernaryBlock({0, -1}, 3.0f));  // M = 2 · 1.5 of the last block
}

// 3LC rounds T / M to the nearest of -1, 0, +1 exactly, also for a subnormal M: with M = 5·dmin, T = 2·dmin is 0.4 M
// and rounds to 0 (M / 2 rounded to 2·dmin made it +1, and the error 3·dmin exceeded M / 2).
TEST(TensorCodec, ThreeLcRoundsExactlyUnderASubnormalScale) {
  const float dmin = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {5 * dmin, 2 * dmin, -3 * dmin, 0.0f};
  std::vector<float> error(4, 0.0f);
  std::vector<int8_t> q(4);
  const float scale = ScaleOf(5 * dmin, 1.0f);
  ASSERT_EQ(scale, 5 * dmin);
  EXPECT_TRUE(QuantizeWithError(x.data(), error.data(), x.size(), scale, q.data()));
  EXPECT_EQ(q, std::vector<int8_t>({1, 0, -1, 0}));  // -3·dmin is -0.6 M
  for (size_t j = 0; j < x.size(); ++j) EXPECT_LE(std::fabs(error[j]), scale / 2 + dmin) << j;
  EXPECT_EQ(error[1], 2 * dmin);
}

// Top-k's k: ceil(fraction · NB), with the fp32 fraction's rounding forgiven (0.3f is 0.30000001) and no fp32
// rounding of NB (1.0 of 2^24 + 1 blocks is all of them).
TEST(TensorCodec, TopKCountIsTheCeilingOfTheFractionOfTheBlocks) {
  EXPECT_EQ(TopKCount(0.3f, 10), 3u);
  EXPECT_EQ(TopKCount(0.3f, 11), 4u);
  EXPECT_EQ(TopKCount(0.01f, 1000), 10u);
  EXPECT_EQ(TopKCount(0.01f, 1001), 11u);
  EXPECT_EQ(TopKCount(0.001f, 10), 1u);  // at least one
  EXPECT_EQ(TopKCount(1.0f, 0), 0u);
  EXPECT_EQ(TopKCount(1.0f, (uint64_t{1} << 24) + 1), (uint64_t{1} << 24) + 1);
  EXPECT_EQ(TopKCount(0.5f, (uint64_t{1} << 25) + 2), (uint64_t{1} << 24) + 1);
  EXPECT_EQ(TopKCount(0.5f, (uint64_t{1} << 25) + 3), (uint64_t{1} << 24) + 2);
  EXPECT_EQ(TopKCount(1.0f, uint64_t{1} << 40), uint64_t{1} << 40);
  EXPECT_EQ(TopKCount(0.25f, (uint64_t{1} << 26) + 1), (uint64_t{1} << 24) + 1);  // 0.25 is exact: raised, not rounded
}

// DIANA keeps the largest element of a block with probability |Δ| / ‖Δ‖ = 1 and the others unbiased, also when the
// norm is tiny (under 2^-100, where u · norm falls among the subnormals unless scaled: rounded up to norm, it dropped
// the largest element in about one draw of six).
TEST(TensorCodec, DianaKeepsTheLargestElementOfATinyBlock) {
  const float tiny = std::numeric_limits<float>::min();  // 2^-126, the smallest norm a block is sent with
  const std::vector<float> x = {1.5f * tiny, 1.0f * tiny};
  int second = 0;
  const int draws = 3000;
  for (int d = 0; d < draws; ++d) {
    KeyState state;
    auto encoder = MakeEncoder({Codec::kDiana, 1, 1.0f, false, 0.01f, 0.0f, false}, 2, state, 0, 1,
                               static_cast<uint64_t>(d));
    std::vector<uint8_t> send(1);
    ASSERT_EQ(encoder->Prepare(x, send), 1u) << "draw " << d;
    std::vector<float> decoded(2);
    ASSERT_TRUE(DecodeFloats(WireFormat::kTernary, encoder->Block(0), 2, decoded.data(), false).ok());
    ASSERT_EQ(decoded[0], x[0]) << "draw " << d;
    second += decoded[1] != 0.0f;
  }
  // P = 2/3: 2000 expected, standard deviation 26.
  EXPECT_NEAR(second, 2000, 130);
}

// A block whose scale (3LC) or norm (DIANA) is subnormal is not sent: 3LC keeps it in the error, DIANA's h_i stays.
TEST(TensorCodec, ASubnormalBlockIsNotSent) {
  const float dmin = std::numeric_limits<float>::denorm_min();
  const std::vector<float> x = {5 * dmin, -2 * dmin, 0.0f, 1.0f};
  std::vector<float> sums(4, 0.0f);
  {
    KeyState state;
    auto encoder = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 2, state, 0, 1, 0);
    std::vector<uint8_t> send(2);
    EXPECT_EQ(encoder->Prepare(x, send), 1u);
    EXPECT_EQ(send, std::vector<uint8_t>({0, 1}));
    encoder->Finish(sums);
    EXPECT_EQ(state.error, std::vector<float>({5 * dmin, -2 * dmin, 0.0f, 0.0f}));
  }
  {
    KeyState state;
    auto encoder = MakeEncoder({Codec::kDiana, 1, 1.0f, false, 0.01f, 0.0f, false}, 2, state, 0, 1, 0);
    std::vector<uint8_t> send(2);
    EXPECT_EQ(encoder->Prepare(x, send), 1u);
    EXPECT_EQ(send, std::vector<uint8_t>({0, 1}));
    EXPECT_EQ(state.h_own[0], 0.0f);
    EXPECT_EQ(state.h_own[1], 0.0f);
  }
}

// A block touched once and zero from then on stops being sent: 3LC with s > 1 left half its error behind at every
// step, and DIANA a fraction 1 - α of h_i, until they were subnormal, where neither shrank any more (1.5 · 1 ulp
// rounds to 2 ulps; α · h_i to 0 or h_i's own ulps): the block went out at every step for good. Here, one rank:
// the sums are its own decoded blocks.
TEST(TensorCodec, ABlockTouchedOnceGoesQuiet) {
  for (const CodecSpec& spec : {CodecSpec{Codec::kThreeLC, 1, 1.5f}, CodecSpec{Codec::kThreeLC, 1, 1.9f},
                                CodecSpec{Codec::kDiana, 1, 1.0f, false, 0.01f, 0.0f, false},
                                CodecSpec{Codec::kDiana, 1, 1.0f, false, 0.01f, 0.05f, true}}) {
    SCOPED_TRACE(spec.ToString());
    KeyState state;
    uint64_t last_sent = 0;
    for (uint64_t step = 0; step < 2000; ++step) {
      const std::vector<float> x = step == 0 ? std::vector<float>{1.0f, 0.5f} : std::vector<float>{0.0f, 0.0f};
      auto encoder = MakeEncoder(spec, 2, state, 0, 1, 7);
      std::vector<uint8_t> send(1);
      std::vector<float> sums(2, 0.0f);
      if (encoder->Prepare(x, send) > 0) {
        last_sent = step;
        ASSERT_TRUE(DecodeFloats(WireFormat::kTernary, encoder->Block(0), 2, sums.data(), false).ok());
      }
      encoder->Finish(sums);
    }
    // The error shrinks by s - 1 a step (0.5, 0.9), h_i by 1 - α (0.29, 0.95): below 2^-126 within about 1700
    // steps (126, 1663, 71 and 1647 here); the block went out at all 2000 steps (but for α = 0.71, whose h_i reached 0).
    EXPECT_LT(last_sent, 1900u);
  }
}

// The wire buffer outlives a change of the key's size: the Python group sends every bucket under key 0 with fp16
// or bf16, and a new buffer (allocated and faulted in) at every change of bucket size was what it is kept to avoid.
TEST(TensorCodec, TheWireBufferIsKeptWhenTheKeysSizeChanges) {
  KeyState state;
  const std::vector<float> large(64, 1.0f), small(16, 1.0f);
  std::vector<uint8_t> send_large(8), send_small(2);
  MakeEncoder({Codec::kFloat16, 0}, 8, state, 0, 1, 0)->Prepare(large, send_large);
  const std::byte* buffer = state.wire.bytes.data();
  ASSERT_NE(buffer, nullptr);
  auto encoder = MakeEncoder({Codec::kFloat16, 0}, 8, state, 0, 1, 0);
  EXPECT_EQ(encoder->Prepare(small, send_small), 2u);
  EXPECT_EQ(state.elements, 16u);
  EXPECT_EQ(state.wire.bytes.data(), buffer);
  std::vector<float> decoded(8);
  ASSERT_TRUE(DecodeFloats(WireFormat::kFloat16, encoder->Block(1), 8, decoded.data(), false).ok());
  EXPECT_EQ(decoded, std::vector<float>(8, 1.0f));
}

// The key's state starts afresh when its tensor changes size or codec: an error memory of another shape or meaning
// must not leak into the next collective.
TEST(TensorCodec, KeyStateStartsAfreshWhenTheSizeOrCodecChanges) {
  KeyState state;
  std::vector<float> x = {1.0f, 0.25f, 0.0f, 0.0f};
  std::vector<uint8_t> send(2);
  std::vector<float> result(4);
  auto first = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 2, state, 0, 1, 0);
  first->Prepare(x, send);
  first->Finish(result);
  ASSERT_EQ(state.error, std::vector<float>({0.0f, 0.25f, 0.0f, 0.0f}));
  ASSERT_EQ(state.steps, 1u);

  std::vector<float> longer = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};  // same codec, 6 elements
  std::vector<uint8_t> send3(3);
  auto resized = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 2, state, 0, 1, 0);
  EXPECT_EQ(resized->Prepare(longer, send3), 0u);
  EXPECT_EQ(state.steps, 0u);
  EXPECT_EQ(state.error, std::vector<float>(6, 0.0f));
  EXPECT_EQ(state.elements, 6u);

  std::vector<float> result6(6);
  resized->Finish(result6);
  auto topk = MakeEncoder({Codec::kTopK, 1, 1.0f, false, 1.0f}, 2, state, 0, 1, 0);  // same size, other codec
  EXPECT_EQ(topk->Prepare(longer, send3), 0u);
  EXPECT_EQ(state.codec, Codec::kTopK);
  EXPECT_EQ(state.steps, 0u);
}

// An fp16 or bf16 collective is a change of codec too: the 3LC error of the key ends there, as the aggregators' does
// (they drop their 3LC memory for a key that runs another codec). The half encoders left the state alone, and a
// key back on 3LC sent its old error (2 blocks of an all-zero tensor).
TEST(TensorCodec, AHalfPrecisionCollectiveEndsTheKeysThreeLcError) {
  for (Codec half : {Codec::kFloat16, Codec::kBFloat16}) {
    KeyState state;
    std::vector<float> x = {1.0f, 0.25f, 0.0f, 0.0f};
    std::vector<uint8_t> send(2);
    std::vector<float> result(4);
    auto first = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 2, state, 0, 1, 0);
    first->Prepare(x, send);
    first->Finish(result);
    ASSERT_EQ(state.error, std::vector<float>({0.0f, 0.25f, 0.0f, 0.0f}));

    const std::vector<float> zeros(4, 0.0f);
    auto between = MakeEncoder({half}, 2, state, 0, 1, 0);
    EXPECT_EQ(between->Prepare(zeros, send), 0u) << CodecName(half);
    between->Finish(result);
    EXPECT_EQ(state.codec, half);

    auto again = MakeEncoder({Codec::kThreeLC, 1, 1.0f}, 2, state, 0, 1, 0);
    EXPECT_EQ(again->Prepare(zeros, send), 0u) << CodecName(half) << ": the old 3LC error was sent";
    EXPECT_EQ(state.error, std::vector<float>(4, 0.0f)) << CodecName(half);
  }
}

// Top-k ranks blocks by the 2-norm of T = x + R, breaks ties by index, never sends a block of zeros even when k
// leaves room for it, and keeps what it did not send as R: the next step sends those blocks.
TEST(TensorCodec, TopKTiesGoToTheLowerIndexAndTheResidualIsSentLater) {
  const std::vector<float> x = {1.0f, 1.0f, -1.0f, 1.0f, 1.0f, -1.0f, 1.0f, 1.0f};  // four blocks of norm² 2
  KeyState state;
  std::vector<uint8_t> send(4);
  std::vector<float> result(8);
  auto step1 = MakeEncoder({Codec::kTopK, 1, 1.0f, false, 0.5f}, 2, state, 0, 1, 0);
  EXPECT_EQ(step1->Prepare(x, send), 2u);
  EXPECT_EQ(step1->selected_blocks(), 2u);
  EXPECT_EQ(send, std::vector<uint8_t>({1, 1, 0, 0}));
  EXPECT_EQ(Bytes(step1->Block(1)), FixedBlock(WireFormat::kRaw, {-1.0f, 1.0f}));
  step1->Finish(result);
  EXPECT_EQ(state.error, std::vector<float>({0.0f, 0.0f, 0.0f, 0.0f, 1.0f, -1.0f, 1.0f, 1.0f}));

  const std::vector<float> zeros(8, 0.0f);
  auto step2 = MakeEncoder({Codec::kTopK, 1, 1.0f, false, 0.5f}, 2, state, 0, 1, 0);
  EXPECT_EQ(step2->Prepare(zeros, send), 2u);
  EXPECT_EQ(send, std::vector<uint8_t>({0, 0, 1, 1}));
  EXPECT_EQ(Bytes(step2->Block(3)), FixedBlock(WireFormat::kRaw, {1.0f, 1.0f}));
  step2->Finish(result);
  EXPECT_EQ(state.error, zeros);

  // k = all four blocks (fraction 1), but only the two that are not zero go out.
  const std::vector<float> sparse = {0.0f, 0.0f, 2.0f, 0.0f, -0.0f, 0.0f, 0.0f, 0.5f};
  auto all = MakeEncoder({Codec::kTopK, 1, 1.0f, false, 1.0f}, 2, state, 0, 1, 0);
  EXPECT_EQ(all->Prepare(sparse, send), 2u);
  EXPECT_EQ(all->selected_blocks(), 4u);
  EXPECT_EQ(send, std::vector<uint8_t>({0, 1, 0, 1}));
}

// Adaptive: a tensor of zeros picks k = 1 and sends nothing; otherwise step 1 (mod 4) halves the chosen k and step
// 3 doubles it, so the cost model sees more than one size.
TEST(TensorCodec, AdaptiveExploresHalfAndTwiceItsChoice) {
  const uint32_t B = 16, blocks = 64;
  KeyState zero_state;
  auto zero = MakeEncoder({Codec::kAdaptive}, B, zero_state, 0, 1, 0);
  std::vector<uint8_t> send(blocks);
  EXPECT_EQ(zero->Prepare(std::vector<float>(B * blocks, 0.0f), send), 0u);
  EXPECT_EQ(zero->selected_blocks(), 1u);

  std::vector<float> x(B * blocks);
  for (uint32_t b = 0; b < blocks; ++b) {
    for (uint32_t j = 0; j < B; ++j) x[b * B + j] = std::ldexp(1.0f, -static_cast<int>(b % 20));
  }
  auto k_at = [&](uint64_t steps) {
    KeyState state;
    state.codec = Codec::kAdaptive;
    state.elements = x.size();
    state.steps = steps;
    for (double bytes : {1e3, 1e4, 1e5, 1e6}) state.cost.Add(bytes, 1e-6 + 1e-8 * bytes);
    auto encoder = MakeEncoder({Codec::kAdaptive}, B, state, 0, 1, 0);
    const uint64_t count = encoder->Prepare(x, send);
    EXPECT_EQ(count, encoder->selected_blocks());  // the k largest are not zero
    return count;
  };
  const uint64_t k = k_at(0);
  ASSERT_GE(k, 2u);
  ASSERT_LE(2 * k, blocks);
  EXPECT_EQ(k_at(2), k);
  EXPECT_EQ(k_at(1), k / 2);
  EXPECT_EQ(k_at(3), 2 * k);
  EXPECT_EQ(k_at(5), k / 2);
}

// DIANA with a given α (not the default 1/√B): h_i += α·Q(Δ_i) from the block sent, h += α·S/W, and the result is
// W·h + S with the h of before the step.
TEST(TensorCodec, DianaUsesTheGivenAlphaAndAddsWTimesH) {
  EXPECT_EQ(DianaDefaultAlpha(4), 0.5f);
  EXPECT_EQ(DianaDefaultAlpha(64), 0.125f);
  const uint32_t B = 4, W = 2;
  const float alpha = 0.25f;
  CodecSpec spec{Codec::kDiana, 3};
  spec.alpha = alpha;
  KeyState state;
  const std::vector<float> x = {1.0f, -2.0f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f, 0.0f};
  const std::vector<float> other = {0.5f, 0.0f, -1.0f, 0.0f, 0.0f, 4.0f, 0.0f, 0.0f};  // another rank's Q(Δ)
  std::vector<float> h_mean(8, 0.0f);
  for (int step = 0; step < 3; ++step) {
    auto encoder = MakeEncoder(spec, B, state, 1, W, 99);
    std::vector<uint8_t> send(2);
    encoder->Prepare(x, send);
    std::vector<float> sent(8, 0.0f), sum(8, 0.0f);
    for (uint32_t b = 0; b < 2; ++b) {
      if (send[b]) {
        ASSERT_TRUE(DecodeTernary(encoder->Block(b), B, sent.data() + b * B, false).ok());
      }
    }
    EXPECT_EQ(send[1], 0) << "a block with Δ = 0 sends nothing";
    for (size_t j = 0; j < 8; ++j) sum[j] = sent[j] + other[j];
    const std::vector<float> h_own_before = state.h_own;
    std::vector<float> result = sum;
    encoder->Finish(result);
    for (size_t j = 0; j < 8; ++j) {
      EXPECT_EQ(Bits(state.h_own[j]), Bits(h_own_before[j] + alpha * sent[j])) << step << " " << j;
      EXPECT_EQ(Bits(result[j]), Bits(static_cast<float>(W) * h_mean[j] + sum[j])) << step << " " << j;
      h_mean[j] += alpha * (sum[j] / static_cast<float>(W));
      EXPECT_EQ(Bits(state.h_mean[j]), Bits(h_mean[j])) << step << " " << j;
    }
  }
  EXPECT_EQ(state.steps, 3u);
}

// The cost model keeps its defaults until four samples of different sizes fit a positive slope; it clamps a
// negative intercept to 0 and fits only the last kSamples samples.
TEST(CostModel, IgnoresTooFewSamplesAndNegativeSlopesClampsTheInterceptAndForgetsOldSamples) {
  CostModel few;
  for (double bytes : {1e5, 2e5, 4e5}) few.Add(bytes, 1e-3 + 1e-8 * bytes);
  EXPECT_EQ(few.a(), 1e-3);
  EXPECT_EQ(few.b(), 1e-9);

  CostModel falling;
  for (double bytes : {1e5, 2e5, 4e5, 8e5}) falling.Add(bytes, 1e-2 - 1e-8 * bytes);
  EXPECT_EQ(falling.a(), 1e-3);
  EXPECT_EQ(falling.b(), 1e-9);

  CostModel below_zero;
  for (double bytes : {1e5, 2e5, 4e5, 8e5}) below_zero.Add(bytes, -5e-4 + 1e-8 * bytes);
  EXPECT_EQ(below_zero.a(), 0.0);
  EXPECT_NEAR(below_zero.b(), 1e-8, 1e-20);

  CostModel window;
  for (size_t i = 0; i < CostModel::kSamples; ++i) window.Add(1e5 * static_cast<double>(1 + i % 4), 1.0);  // flat
  for (size_t i = 0; i < CostModel::kSamples; ++i) {
    const double bytes = 1e5 * static_cast<double>(1 + i % 4);
    window.Add(bytes, 2e-3 + 3e-8 * bytes);
  }
  EXPECT_EQ(window.samples(), CostModel::kSamples);
  EXPECT_NEAR(window.a(), 2e-3, 1e-12);  // nothing left of the flat samples
  EXPECT_NEAR(window.b(), 3e-8, 1e-18);
}

TEST(CodecSpec, ParseCodecReadsEveryNameAndRefusesOthers) {
  for (Codec c : {Codec::kNone, Codec::kFloat16, Codec::kBFloat16, Codec::kThreeLC, Codec::kDiana, Codec::kTopK,
                  Codec::kAdaptive}) {
    const Result<Codec> parsed = ParseCodec(CodecName(c));
    ASSERT_TRUE(parsed.ok()) << CodecName(c);
    EXPECT_EQ(parsed.value(), c);
  }
  for (const char* bad : {"FP16", "", "3LC ", "top-k"}) {
    const Result<Codec> parsed = ParseCodec(bad);
    EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(parsed.status().message(),
              std::string("unknown codec '") + bad + "' (none, fp16, bf16, 3lc, diana, topk, adaptive)");
  }
  EXPECT_STREQ(CodecName(static_cast<Codec>(7)), "?");
}

// Every range at its edges, NaN in each, and the 3LC-only options on another codec; an unknown codec value is
// UNSUPPORTED (a newer peer), not INVALID_ARGUMENT.
TEST(CodecSpec, ValidateCodecRefusesEachFieldOutsideItsRangeWithItsMessage) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  auto with = [](auto edit) {
    CodecSpec c{Codec::kThreeLC};
    edit(c);
    return ValidateCodec(c);
  };
  EXPECT_TRUE(with([](CodecSpec& c) { c.sparsity = 1.0f; }).ok());
  EXPECT_TRUE(with([](CodecSpec& c) { c.sparsity = std::nextafter(2.0f, 0.0f); }).ok());
  EXPECT_TRUE(with([](CodecSpec& c) { c.fraction = 1.0f; }).ok());
  EXPECT_TRUE(with([](CodecSpec& c) { c.fraction = 1e-30f; }).ok());
  EXPECT_TRUE(with([](CodecSpec& c) { c.alpha = 1.0f; }).ok());
  EXPECT_TRUE(with([](CodecSpec& c) { c.result_fp32 = c.tensor_scale = true; }).ok());
  struct Case {
    Status status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {with([](CodecSpec& c) { c.sparsity = 2.0f; }), "3LC sparsity multiplier 2 is outside [1, 2)"},
      {with([](CodecSpec& c) { c.sparsity = 0.5f; }), "3LC sparsity multiplier 0.5 is outside [1, 2)"},
      {with([&](CodecSpec& c) { c.sparsity = nan; }), "3LC sparsity multiplier nan is outside [1, 2)"},
      {with([](CodecSpec& c) { c.fraction = 0.0f; }), "top-k fraction 0 is outside (0, 1]"},
      {with([](CodecSpec& c) { c.fraction = 1.5f; }), "top-k fraction 1.5 is outside (0, 1]"},
      // The value as given, not rounded to six decimals ("-0.000000").
      {with([](CodecSpec& c) { c.fraction = -1e-9f; }), "top-k fraction -1e-09 is outside (0, 1]"},
      {with([&](CodecSpec& c) { c.fraction = nan; }), "top-k fraction nan is outside (0, 1]"},
      {with([](CodecSpec& c) { c.alpha = -0.25f; }), "DIANA alpha -0.25 is outside [0, 1]"},
      {with([](CodecSpec& c) { c.alpha = 1.25f; }), "DIANA alpha 1.25 is outside [0, 1]"},
      {with([&](CodecSpec& c) { c.alpha = nan; }), "DIANA alpha nan is outside [0, 1]"},
      {with([](CodecSpec& c) { c.codec = Codec::kDiana, c.result_fp32 = true; }),
       "fp32 results and a tensor-wide scale are 3LC options"},
      {with([](CodecSpec& c) { c.codec = Codec::kTopK, c.tensor_scale = true; }),
       "fp32 results and a tensor-wide scale are 3LC options"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(c.status.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(c.status.message(), c.message);
  }
  const Status unknown = with([](CodecSpec& c) { c.codec = static_cast<Codec>(7); });
  EXPECT_EQ(unknown.code(), StatusCode::kUnsupported);
  EXPECT_EQ(unknown.message(), "unknown codec value 7");
}

// Each codec prints (and compares) only the fields it uses; formats of both directions follow from the codec.
TEST(CodecSpec, EachCodecKeepsPrintsAndMapsOnlyWhatItUses) {
  CodecSpec all{Codec::kDiana, 4, 1.5f, true, 0.25f, 0.5f, true, true};
  CodecSpec diana = WithoutUnusedFields(all);
  EXPECT_EQ(diana, (CodecSpec{Codec::kDiana, 4, 1.0f, false, 0.01f, 0.5f, true, false}));
  EXPECT_EQ(diana.ToString(), "diana(key=4 alpha=0.5 l2)");
  EXPECT_EQ((CodecSpec{Codec::kDiana}).ToString(), "diana(key=0 alpha=0 linf)");
  all.codec = Codec::kTopK;
  EXPECT_EQ(WithoutUnusedFields(all), (CodecSpec{Codec::kTopK, 4, 1.0f, false, 0.25f}));
  EXPECT_EQ(WithoutUnusedFields(all).ToString(), "topk(key=4 fraction=0.25)");
  all.codec = Codec::kAdaptive;
  EXPECT_EQ(WithoutUnusedFields(all), (CodecSpec{Codec::kAdaptive, 4}));
  EXPECT_EQ(WithoutUnusedFields(all).ToString(), "adaptive(key=4)");
  all.codec = Codec::kBFloat16;
  EXPECT_EQ(WithoutUnusedFields(all), (CodecSpec{Codec::kBFloat16, 4}));
  EXPECT_EQ(WithoutUnusedFields(all).ToString(), "bf16(key=4)");

  struct Formats {
    CodecSpec spec;
    WireFormat up, down;
  };
  CodecSpec fp32_results{Codec::kThreeLC};
  fp32_results.result_fp32 = true;
  for (const Formats& f : std::vector<Formats>{{{Codec::kNone}, WireFormat::kRaw, WireFormat::kRaw},
                                               {{Codec::kFloat16}, WireFormat::kFloat16, WireFormat::kFloat16},
                                               {{Codec::kBFloat16}, WireFormat::kBFloat16, WireFormat::kBFloat16},
                                               {{Codec::kThreeLC}, WireFormat::kTernary, WireFormat::kTernary},
                                               {fp32_results, WireFormat::kTernary, WireFormat::kRaw},
                                               {{Codec::kDiana}, WireFormat::kTernary, WireFormat::kRaw},
                                               {{Codec::kTopK}, WireFormat::kRaw, WireFormat::kRaw},
                                               {{Codec::kAdaptive}, WireFormat::kRaw, WireFormat::kRaw}}) {
    EXPECT_EQ(UploadFormat(f.spec), f.up) << f.spec.ToString();
    EXPECT_EQ(DownloadFormat(f.spec), f.down) << f.spec.ToString();
  }
}

}  // namespace
}  // namespace sparsereduce::codec
