// Codecs through the whole data plane (W WorkerCollectives and A ColumnEngines, random interleavings), against
// reference models that apply each codec densely, element by element, in the same order of operations:
// bit-exact results on every worker, state that advances only on success, and the codecs' own invariants.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codec/half.h"
#include "codec/tensor_codec.h"
#include "codec/ternary.h"
#include "codec/three_lc.h"
#include "simulation.h"

namespace sparsereduce::testing {
namespace {

using Tensors = std::vector<std::vector<std::byte>>;

// W tensors of n floats with blocks of B: block-sparse (density), values of mixed magnitude, some exact zeros.
std::vector<std::vector<float>> MakeInputs(uint32_t W, uint64_t n, uint32_t B, double density, uint64_t seed) {
  std::mt19937_64 random(seed);
  std::vector<std::vector<float>> inputs(W, std::vector<float>(n, 0.0f));
  for (auto& t : inputs) {
    for (uint64_t b = 0; b * B < n; ++b) {
      if (std::uniform_real_distribution<double>(0, 1)(random) >= density) continue;
      for (uint64_t j = b * B; j < std::min<uint64_t>(n, (b + 1) * B); ++j) {
        t[j] = static_cast<float>(std::normal_distribution<double>(0, 1)(random) *
                                  std::pow(10.0, static_cast<double>(random() % 4) - 2.0));
        if (random() % 7 == 0) t[j] = 0.0f;
      }
    }
  }
  return inputs;
}

Tensors AsBytes(const std::vector<std::vector<float>>& inputs) {
  Tensors tensors;
  for (const auto& t : inputs) {
    std::vector<std::byte> bytes(t.size() * 4);
    std::memcpy(bytes.data(), t.data(), bytes.size());
    tensors.push_back(std::move(bytes));
  }
  return tensors;
}

std::vector<float> AsFloats(const std::vector<std::byte>& bytes) {
  std::vector<float> f(bytes.size() / 4);
  std::memcpy(f.data(), bytes.data(), bytes.size());
  return f;
}

void ExpectBitEqual(const std::vector<float>& a, const std::vector<float>& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t j = 0; j < a.size(); ++j) {
    uint32_t x, y;
    std::memcpy(&x, &a[j], 4);
    std::memcpy(&y, &b[j], 4);
    ASSERT_EQ(x, y) << what << ", element " << j << ": " << a[j] << " vs " << b[j];
  }
}

CollectiveSpec SpecWith(uint64_t n, uint32_t B, CodecSpec codec) {
  CollectiveSpec spec{n, DType::kFloat32, ReduceOp::kSum, B};
  spec.codec = codec;
  return spec;
}

bool BlockNonzero(const std::vector<float>& t, uint64_t b, uint32_t B) {
  for (uint64_t j = b * B; j < std::min<uint64_t>(t.size(), (b + 1) * B); ++j) {
    if (t[j] != 0.0f) return true;
  }
  return false;
}

struct Shape {
  uint32_t W, A, S, K;
};
const Shape kShapes[] = {{1, 1, 1, 1}, {2, 1, 2, 3}, {3, 2, 2, 4}, {4, 3, 1, 8}, {5, 2, 4, 2}};
const uint64_t kSizes[] = {1, 63, 64, 65, 1000, 4099};

// fp16 / bf16: each rank's nonzero blocks rounded to the wire type, summed in fp32 in rank order, rounded again.
TEST(CodecSimulation, HalfFormatsMatchTheRoundedReference) {
  for (Codec c : {Codec::kFloat16, Codec::kBFloat16}) {
    auto round = [c](float v) {
      return c == Codec::kFloat16 ? codec::HalfToFloat(codec::FloatToHalf(v))
                                  : codec::BFloat16ToFloat(codec::FloatToBFloat16(v));
    };
    for (const Shape& s : kShapes) {
      for (uint64_t n : kSizes) {
        const uint32_t B = 64;
        const JobShape shape{s.W, s.A, s.S, s.K};
        const auto inputs = MakeInputs(s.W, n, B, 0.5, n * 31 + s.W);
        std::vector<float> expected(n, 0.0f);
        for (uint64_t j = 0; j < n; ++j) {
          const uint64_t b = j / B;
          float sum = 0.0f;
          bool first = true;
          for (uint32_t r = 0; r < s.W; ++r) {
            if (!BlockNonzero(inputs[r], b, B)) continue;
            sum = first ? round(inputs[r][j]) : sum + round(inputs[r][j]);
            first = false;
          }
          expected[j] = first ? 0.0f : round(sum);
        }
        Tensors tensors = AsBytes(inputs);
        SimulationOutcome out = Simulate(shape, SpecWith(n, B, {c}), tensors, n + s.A);
        ASSERT_TRUE(out.status.ok()) << out.status.ToString();
        for (uint32_t r = 0; r < s.W; ++r) {
          ExpectBitEqual(AsFloats(tensors[r]), expected, std::string(CodecName(c)) + " rank " + std::to_string(r));
        }
      }
    }
  }
}

// 3LC, dense reference: workers quantize x + E with each block's scale (or the tensor's) and keep the error; the
// aggregator sums the decoded values in rank order and quantizes sum + E' per block with its own error; three steps
// in a row.
TEST(CodecSimulation, ThreeLcMatchesTheReferenceOverSeveralSteps) {
  for (int mode = 0; mode < 4; ++mode) {
    const bool fp32_results = mode & 1, tensor_scale = mode & 2;
    for (const Shape& s : kShapes) {
      for (uint64_t n : {uint64_t{65}, uint64_t{1000}, uint64_t{4099}}) {
        const uint32_t B = 64;
        const float sparsity = 1.5f;
        const JobShape shape{s.W, s.A, s.S, s.K};
        CodecSpec codec{Codec::kThreeLC, 9, sparsity, fp32_results};
        codec.tensor_scale = tensor_scale;
        const CollectiveSpec spec = SpecWith(n, B, codec);
        const uint64_t blocks = (n + B - 1) / B;
        std::vector<std::vector<float>> worker_error(s.W, std::vector<float>(n, 0.0f));
        std::vector<float> aggregator_error(n, 0.0f);  // indexed by element: each block has one aggregator
        CodecStates states;
        for (int step = 0; step < 3; ++step) {
          const auto inputs = MakeInputs(s.W, n, B, 0.6, n * 7 + step);
          // Reference.
          std::vector<std::vector<float>> sent(s.W, std::vector<float>(n, 0.0f));
          std::vector<std::vector<bool>> sends(s.W, std::vector<bool>(blocks, false));
          for (uint32_t r = 0; r < s.W; ++r) {
            const float tensor = codec::MaxAbsWithError(inputs[r].data(), worker_error[r].data(), n) * sparsity;
            std::vector<int8_t> q(B);
            for (uint64_t b = 0; b < blocks; ++b) {
              const uint64_t begin = b * B, len = std::min<uint64_t>(B, n - begin);
              const float scale =
                  tensor_scale ? tensor
                               : codec::MaxAbsWithError(inputs[r].data() + begin, worker_error[r].data() + begin, len) *
                                     sparsity;
              sends[r][b] = codec::QuantizeWithError(inputs[r].data() + begin, worker_error[r].data() + begin, len,
                                                     scale, q.data());
              for (uint64_t j = 0; j < len; ++j) sent[r][begin + j] = scale * static_cast<float>(q[j]);
            }
          }
          std::vector<float> expected(n, 0.0f);
          for (uint64_t b = 0; b < blocks; ++b) {
            const uint64_t begin = b * B, len = std::min<uint64_t>(B, n - begin);
            std::vector<float> sum(len, 0.0f);
            bool first = true;
            for (uint32_t r = 0; r < s.W; ++r) {
              if (!sends[r][b]) continue;
              for (uint64_t j = 0; j < len; ++j) sum[j] = first ? sent[r][begin + j] : sum[j] + sent[r][begin + j];
              first = false;
            }
            if (first) continue;  // nobody sent the block: zero, and the aggregator's error is untouched
            if (fp32_results) {
              std::copy(sum.begin(), sum.end(), expected.begin() + static_cast<std::ptrdiff_t>(begin));
              continue;
            }
            float* e = aggregator_error.data() + begin;
            const float scale = codec::MaxAbsWithError(sum.data(), e, len) * sparsity;
            std::vector<int8_t> q(len);
            codec::QuantizeWithError(sum.data(), e, len, scale, q.data());
            for (uint64_t j = 0; j < len; ++j) expected[begin + j] = scale * static_cast<float>(q[j]);
          }
          // The data plane.
          Tensors tensors = AsBytes(inputs);
          SimulationOutcome out = Simulate(shape, spec, tensors, step * 13 + n, ~uint64_t{0}, &states);
          ASSERT_TRUE(out.status.ok()) << out.status.ToString();
          for (uint32_t r = 0; r < s.W; ++r) {
            ExpectBitEqual(AsFloats(tensors[r]), expected,
                           "3lc step " + std::to_string(step) + " rank " + std::to_string(r));
            ExpectBitEqual(states.workers[r].error, worker_error[r], "3lc worker error memory");
          }
        }
      }
    }
  }
}

// DIANA: S = Σ Q(Δ_i) summed in rank order; every worker ends with the same h (bit for bit) and the result W·h + S.
TEST(CodecSimulation, DianaReplicasOfHStayIdentical) {
  for (bool l2 : {false, true}) {
    for (const Shape& s : kShapes) {
      const uint64_t n = 1000;
      const uint32_t B = 64;
      const JobShape shape{s.W, s.A, s.S, s.K};
      const CollectiveSpec spec = SpecWith(n, B, {Codec::kDiana, 3, 1.0f, false, 0.01f, 0.0f, l2});
      CodecStates states;
      states.seed = 99;
      for (int step = 0; step < 4; ++step) {
        const auto inputs = MakeInputs(s.W, n, B, 0.7, step * 5 + s.W);
        const std::vector<float> h_before = states.workers.empty() || states.workers[0].h_mean.empty()
                                                ? std::vector<float>(n, 0.0f)
                                                : states.workers[0].h_mean;
        Tensors tensors = AsBytes(inputs);
        SimulationOutcome out = Simulate(shape, spec, tensors, step + 1, ~uint64_t{0}, &states);
        ASSERT_TRUE(out.status.ok()) << out.status.ToString();
        for (uint32_t r = 1; r < s.W; ++r) {
          ExpectBitEqual(states.workers[r].h_mean, states.workers[0].h_mean,
                         "DIANA h replica of rank " + std::to_string(r));
          ExpectBitEqual(AsFloats(tensors[r]), AsFloats(tensors[0]), "DIANA result of rank " + std::to_string(r));
        }
        // result = W·h_before + S and h = h_before + α·S/W, element by element.
        const float w = static_cast<float>(s.W), alpha = codec::DianaDefaultAlpha(B);
        const std::vector<float> result = AsFloats(tensors[0]);
        for (uint64_t j = 0; j < n; ++j) {
          const float sum = result[j] - w * h_before[j];
          ASSERT_NEAR(states.workers[0].h_mean[j], h_before[j] + alpha * (sum / w), 1e-5f * (1 + std::fabs(sum)));
        }
      }
    }
  }
}

// DIANA's h is the mean of the workers' h_i, also after a step where one rank's block was not finite (a gradient
// overflow under loss scaling): the ranks whose block was finite must not add it to their h_i either, since h
// skips it. They did, and that block's results stayed off by α·Q(Δ_i) from then on.
TEST(CodecSimulation, DianaSharedHStaysTheMeanOfTheWorkersHAfterAnOverflow) {
  for (bool l2 : {false, true}) {
    const Shape& s = kShapes[3];
    const uint64_t n = 1000;
    const uint32_t B = 64;
    const JobShape shape{s.W, s.A, s.S, s.K};
    const CollectiveSpec spec = SpecWith(n, B, {Codec::kDiana, 5, 1.0f, false, 0.01f, 0.0f, l2});
    ASSERT_GE(s.W, 2u);
    CodecStates states;
    for (int step = 0; step < 4; ++step) {
      auto inputs = MakeInputs(s.W, n, B, 1.0, step * 7 + 1);
      if (step == 1) inputs[0][70] = std::numeric_limits<float>::infinity();  // block 1 of rank 0 only
      Tensors tensors = AsBytes(inputs);
      SimulationOutcome out = Simulate(shape, spec, tensors, step + 1, ~uint64_t{0}, &states);
      ASSERT_TRUE(out.status.ok()) << out.status.ToString();
      for (uint64_t j = 0; j < n; ++j) {
        float sum_of_own = 0.0f;
        for (uint32_t r = 0; r < s.W; ++r) sum_of_own += states.workers[r].h_own[j];
        const float w_times_h = static_cast<float>(s.W) * states.workers[0].h_mean[j];
        ASSERT_NEAR(sum_of_own, w_times_h, 1e-4f * (1 + std::fabs(w_times_h)))
            << (l2 ? "l2" : "inf") << " norm, step " << step << ", element " << j << " (block " << j / B << ")";
      }
    }
  }
}

// DIANA's Q is unbiased: averaged over many draws, Q(Δ) approaches Δ (fixed seed, so the test is deterministic).
TEST(CodecSimulation, DianaQuantizerIsUnbiased) {
  for (bool l2 : {false, true}) {
    const uint64_t n = 64;
    const uint32_t B = 64;
    std::vector<float> x(n);
    for (uint64_t j = 0; j < n; ++j) x[j] = std::sin(static_cast<float>(j)) * (j % 5 == 0 ? 3.0f : 0.5f);
    std::vector<double> mean(n, 0.0);
    const int draws = 20000;
    for (int d = 0; d < draws; ++d) {
      codec::KeyState state;  // fresh: h = 0, so Q(x) is what is sent
      auto encoder = codec::MakeEncoder({Codec::kDiana, 1, 1.0f, false, 0.01f, 0.0f, l2}, B, state, 0, 1,
                                        static_cast<uint64_t>(d));
      std::vector<uint8_t> send(1);
      encoder->Prepare(x, send);
      if (!send[0]) continue;
      std::vector<float> decoded(n);
      ASSERT_TRUE(codec::DecodeFloats(codec::WireFormat::kTernary, encoder->Block(0), n, decoded.data(), false).ok());
      for (uint64_t j = 0; j < n; ++j) mean[j] += decoded[j];
    }
    float norm = 0;
    for (float v : x) norm = l2 ? norm + v * v : std::max(norm, std::fabs(v));
    if (l2) norm = std::sqrt(norm);
    for (uint64_t j = 0; j < n; ++j) {
      // Var(Q_j) <= norm · |x_j|: the mean of `draws` samples is within 5 standard errors.
      const double tolerance = 5 * std::sqrt(norm * std::fabs(x[j]) / draws) + 1e-6;
      EXPECT_NEAR(mean[j] / draws, x[j], tolerance) << (l2 ? "l2" : "linf") << " element " << j;
    }
  }
}

// DIANA's ℓ2 norm neither overflows nor vanishes for finite blocks far from 1: summed in fp32, squares of 1e20 made
// the block go out "not finite" (its result NaN) and squares of 1e-24 made its scale 0.
TEST(CodecSimulation, DianaL2NormOfLargeAndTinyFiniteBlocks) {
  const uint32_t B = 64;
  for (float magnitude : {1e20f, -3e25f, 1e-24f, 1e-30f}) {
    std::vector<float> x(B, magnitude);
    codec::KeyState state;
    auto encoder = codec::MakeEncoder({Codec::kDiana, 1, 1.0f, false, 0.01f, 0.0f, true}, B, state, 0, 1, 7);
    std::vector<uint8_t> send(1);
    encoder->Prepare(x, send);
    ASSERT_TRUE(send[0]) << magnitude;
    const float scale = codec::TernaryScale(encoder->Block(0));
    EXPECT_TRUE(std::isfinite(scale)) << magnitude << ": scale " << scale;
    EXPECT_NEAR(scale, std::fabs(magnitude) * 8.0f, std::fabs(magnitude) * 8e-6f) << magnitude;  // √64 = 8
  }
}

// A block that is not finite is sent besides the k largest (docs/PROTOCOL.md §11.3), for top-k and adaptive: it
// ranked first and took one of the k places, so with as many such blocks as k no finite block went out.
TEST(CodecSimulation, TopKSendsBlocksThatAreNotFiniteBesidesTheK) {
  const uint32_t B = 64;
  for (Codec codec : {Codec::kTopK, Codec::kAdaptive}) {
    std::vector<float> x(4 * B, 0.5f);
    std::fill_n(x.begin() + 2 * B, B, 3.0f);                 // block 2: the largest finite one
    x[5] = std::numeric_limits<float>::infinity();           // block 0: not finite
    codec::KeyState state;
    auto encoder = codec::MakeEncoder({codec, 1, 1.0f, false, 0.25f}, B, state, 0, 1, 7);  // top-k: k = 1
    std::vector<uint8_t> send(4);
    const uint64_t count = encoder->Prepare(x, send);
    EXPECT_EQ(send[0], 1) << CodecName(codec) << ": the block that is not finite was not sent";
    EXPECT_EQ(send[2], 1) << CodecName(codec) << ": the largest finite block was not sent";
    EXPECT_EQ(count, std::count(send.begin(), send.end(), uint8_t{1}));
    if (codec == Codec::kTopK) {
      EXPECT_EQ(count, 2u);
    }
  }
}

// Top-k: sent + residual = x + previous residual, exactly; the sum is over what was sent.
TEST(CodecSimulation, TopKErrorFeedbackLosesNothing) {
  for (const Shape& s : kShapes) {
    const uint64_t n = 4099;
    const uint32_t B = 64;
    const JobShape shape{s.W, s.A, s.S, s.K};
    const CollectiveSpec spec = SpecWith(n, B, {Codec::kTopK, 5, 1.0f, false, 0.1f});
    CodecStates states;
    std::vector<std::vector<float>> residual(s.W, std::vector<float>(n, 0.0f));
    for (int step = 0; step < 3; ++step) {
      const auto inputs = MakeInputs(s.W, n, B, 0.8, step + 100);
      Tensors tensors = AsBytes(inputs);
      SimulationOutcome out = Simulate(shape, spec, tensors, step, ~uint64_t{0}, &states);
      ASSERT_TRUE(out.status.ok()) << out.status.ToString();
      std::vector<float> expected(n, 0.0f);
      std::vector<bool> any(n, false);
      for (uint32_t r = 0; r < s.W; ++r) {
        const std::vector<float>& kept = states.workers[r].error;
        for (uint64_t j = 0; j < n; ++j) {
          const float total = inputs[r][j] + residual[r][j];
          // A block was sent iff its residual is now zero while its total is not.
          const uint64_t b = j / B;
          bool sent_block = true;
          for (uint64_t i = b * B; i < std::min<uint64_t>(n, (b + 1) * B); ++i) sent_block &= kept[i] == 0.0f;
          const float sent = sent_block ? total : 0.0f;
          ASSERT_EQ(sent + kept[j], total) << "rank " << r << " element " << j;
          if (sent_block) {
            expected[j] = any[j] ? expected[j] + sent : sent;
            any[j] = true;
          }
        }
        residual[r] = kept;
      }
      // Ranks must agree with each other; each block's sum is over the senders in rank order.
      for (uint32_t r = 1; r < s.W; ++r) ExpectBitEqual(AsFloats(tensors[r]), AsFloats(tensors[0]), "topk");
      const std::vector<float> result = AsFloats(tensors[0]);
      for (uint64_t j = 0; j < n; ++j) ASSERT_FLOAT_EQ(result[j], expected[j]) << j;
    }
  }
}

// A failed collective restores the tensor and leaves the codec's state as it was.
TEST(CodecSimulation, FailureRestoresTensorAndState) {
  const JobShape shape{3, 2, 2, 2};
  const uint64_t n = 1000;
  for (Codec c : {Codec::kFloat16, Codec::kThreeLC, Codec::kDiana, Codec::kTopK, Codec::kAdaptive}) {
    const CollectiveSpec spec = SpecWith(n, 64, {c, 1, 1.2f, false, 0.2f});
    int failures = 0;
    for (uint64_t cut = 0; cut < 40; cut += 3) {
      CodecStates states;
      auto warm = MakeInputs(3, n, 64, 0.5, 1);
      Tensors warm_tensors = AsBytes(warm);
      ASSERT_TRUE(Simulate(shape, spec, warm_tensors, 1, ~uint64_t{0}, &states).status.ok());
      struct Saved {
        std::vector<float> error, h_own, h_mean;
      };
      std::vector<Saved> before;
      for (const codec::KeyState& k : states.workers) before.push_back({k.error, k.h_own, k.h_mean});
      const auto inputs = MakeInputs(3, n, 64, 0.5, 2);
      Tensors tensors = AsBytes(inputs);
      SimulationOutcome out = Simulate(shape, spec, tensors, 2, cut, &states);
      if (out.status.ok()) continue;  // finished before the cut
      ++failures;
      for (uint32_t r = 0; r < 3; ++r) {
        ExpectBitEqual(AsFloats(tensors[r]), inputs[r], std::string(CodecName(c)) + " restored tensor");
        ExpectBitEqual(states.workers[r].error, before[r].error, "error memory unchanged");
        ExpectBitEqual(states.workers[r].h_own, before[r].h_own, "h_i unchanged");
        ExpectBitEqual(states.workers[r].h_mean, before[r].h_mean, "h unchanged");
      }
    }
    EXPECT_GT(failures, 0) << CodecName(c) << ": no cut landed inside the collective, nothing was checked";
  }
}

TEST(CostModel, FitsLineAndPicksKByCost) {
  codec::CostModel alike;
  for (int i = 0; i < 8; ++i) alike.Add(1e5 * (1 + i % 2 * 0.01), 1.0 + i % 2);  // sizes too alike: no slope
  EXPECT_DOUBLE_EQ(alike.b(), 1e-9);
  codec::CostModel model;
  EXPECT_DOUBLE_EQ(model.a(), 1e-3);
  for (double bytes : {1e5, 2e5, 4e5, 8e5}) model.Add(bytes, 0.002 + 5e-9 * bytes);
  EXPECT_NEAR(model.a(), 0.002, 1e-9);
  EXPECT_NEAR(model.b(), 5e-9, 1e-15);

  // The adaptive codec sends more blocks when bytes are cheap than when they are dear.
  const uint64_t n = 64 * 200;
  std::vector<float> x(n);
  std::mt19937 random(3);
  for (float& v : x) v = std::normal_distribution<float>(0, 1)(random);
  auto chosen = [&](double a, double b) {
    codec::KeyState state;
    state.codec = Codec::kAdaptive;
    state.elements = n;
    for (double bytes : {1e4, 1e5, 5e5, 1e6}) state.cost.Add(bytes, a + b * bytes);
    auto encoder = codec::MakeEncoder({Codec::kAdaptive}, 64, state, 0, 1, 0);
    std::vector<uint8_t> send(200);
    encoder->Prepare(x, send);
    return encoder->selected_blocks();
  };
  const uint64_t cheap = chosen(0.01, 1e-12), dear = chosen(1e-6, 1e-6);
  EXPECT_EQ(cheap, 200u);
  EXPECT_LT(dear, 20u);
  EXPECT_GE(dear, 1u);
}

// One step whose gradients overflow (an Inf, then a NaN, as an AMP loss scaler produces) reaches every rank's
// result as not finite, so the scaler sees it, and leaves no trace in the codec state: the steps after it are
// finite again. 3LC used to turn such a block's error into NaN for good (its scale Inf made Inf·0 = NaN), which
// zeroed the block, or with tensor_scale the whole tensor, in every later step; top-k and adaptive kept a NaN
// block in the residual and never sent it again; DIANA dropped it silently and then, once a NaN reached h, the
// replicas of h were NaN for good.
TEST(CodecSimulation, AStepThatIsNotFiniteLeavesTheStateFinite) {
  std::vector<std::pair<std::string, CodecSpec>> codecs;
  for (int mode = 0; mode < 4; ++mode) {
    CodecSpec c{Codec::kThreeLC, 4, 1.5f, (mode & 1) != 0};
    c.tensor_scale = (mode & 2) != 0;
    codecs.emplace_back("3lc mode " + std::to_string(mode), c);
  }
  codecs.emplace_back("diana", CodecSpec{Codec::kDiana, 4, 1.0f, false, 0.01f, 0.0f, false});
  codecs.emplace_back("diana l2", CodecSpec{Codec::kDiana, 4, 1.0f, false, 0.01f, 0.0f, true});
  codecs.emplace_back("topk", CodecSpec{Codec::kTopK, 4, 1.0f, false, 0.1f});
  codecs.emplace_back("adaptive", CodecSpec{Codec::kAdaptive, 4});
  const uint64_t n = 1000;
  const uint32_t B = 64;
  auto all_finite = [](const std::vector<float>& v) {
    return std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); });
  };
  for (const auto& [name, codec] : codecs) {
    for (const Shape& s : {kShapes[1], kShapes[3]}) {
      const JobShape shape{s.W, s.A, s.S, s.K};
      const CollectiveSpec spec = SpecWith(n, B, codec);
      CodecStates states;
      for (int step = 0; step < 5; ++step) {
        auto inputs = MakeInputs(s.W, n, B, 1.0, step * 3 + s.W);
        if (step == 1) inputs[0][70] = std::numeric_limits<float>::infinity();     // block 1
        if (step == 2) inputs[s.W - 1][300] = std::numeric_limits<float>::quiet_NaN();  // block 4
        Tensors tensors = AsBytes(inputs);
        SimulationOutcome out = Simulate(shape, spec, tensors, step + 1, ~uint64_t{0}, &states);
        const std::string what = name + ", W " + std::to_string(s.W) + ", step " + std::to_string(step);
        ASSERT_TRUE(out.status.ok()) << what << ": " << out.status.ToString();
        for (uint32_t r = 0; r < s.W; ++r) {
          const std::vector<float> result = AsFloats(tensors[r]);
          if (step == 1 || step == 2) {
            const uint64_t bad = step == 1 ? 70 : 300;
            EXPECT_FALSE(std::isfinite(result[bad])) << what << ", rank " << r << ": the overflow did not arrive";
          } else {
            EXPECT_TRUE(all_finite(result)) << what << ", rank " << r;
          }
          const codec::KeyState& state = states.workers[r];
          EXPECT_TRUE(all_finite(state.error) && all_finite(state.h_own) && all_finite(state.h_mean))
              << what << ", rank " << r << ": the worker's codec state is not finite";
        }
        for (size_t a = 0; a < states.aggregators.size(); ++a) {
          if (!states.aggregators[a]) continue;
          codec::ErrorMemory& memory = *states.aggregators[a];
          const std::vector<float> values(memory.Block(0), memory.Block(0) + memory.blocks() * memory.block_size());
          EXPECT_TRUE(all_finite(values)) << what << ": aggregator " << a << "'s error memory is not finite";
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparsereduce::testing
