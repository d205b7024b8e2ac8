#include "codec/tensor_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>

#include "codec/clones.h"
#include "codec/half.h"
#include "codec/ternary.h"
#include "codec/three_lc.h"
#include "codec/wire.h"
#include "core/block_scan.h"
#include "core/dtype.h"

namespace sparsereduce::codec {
namespace {

// Fills the key's WireBlocks: each block's bytes go after the previous one's.
class BlockStore {
 public:
  // Room for `blocks` blocks of at most `max_block_bytes` each.
  void Reset(WireBlocks& wire, uint64_t blocks, uint64_t max_block_bytes) {
    wire_ = &wire;
    wire.offset.resize(blocks);
    wire.length.assign(blocks, 0);
    if (wire.bytes.size() < blocks * max_block_bytes) wire.bytes = ByteBuffer(blocks * max_block_bytes);
    used_ = 0;
  }
  // Where `block`'s bytes go; End says how many were written.
  std::byte* Begin(uint64_t block) {
    wire_->offset[block] = used_;
    return wire_->bytes.data() + used_;
  }
  void End(uint64_t block, uint32_t length) {
    wire_->length[block] = length;
    used_ += length;
  }
  std::span<const std::byte> Block(uint64_t block) const {
    return {wire_->bytes.data() + wire_->offset[block], wire_->length[block]};
  }

 private:
  WireBlocks* wire_ = nullptr;
  uint64_t used_ = 0;
};

struct Blocks {
  uint64_t count;
  uint32_t size;
  uint64_t elements;
  uint64_t Begin(uint64_t b) const { return b * size; }
  uint32_t Length(uint64_t b) const { return static_cast<uint32_t>(std::min<uint64_t>(size, elements - b * size)); }
};

Blocks Split(uint64_t elements, uint32_t block_size) {
  return {(elements + block_size - 1) / block_size, block_size, elements};
}

// A fresh state when the key is new or its tensor changed size or codec. The wire buffer is storage, not state
// (every Prepare rewrites what it uses): it stays, or a key whose sizes vary (the Python group sends every bucket
// under key 0) allocated and faulted in a new one at each change.
void Fit(KeyState& state, Codec codec, uint64_t elements) {
  if (state.codec == codec && state.elements == elements) return;
  WireBlocks wire = std::move(state.wire);
  state = KeyState{};
  state.codec = codec;
  state.elements = elements;
  state.wire = std::move(wire);
}

// SplitMix64's finalizer: spreads a seed's bits.
uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

constexpr uint32_t kUniformLanes = 8;

SPARSEREDUCE_CLONES void FillUniform(uint32_t* state, float* out, uint32_t n) {
  constexpr float kScale = 1.0f / 16777216.0f;
  for (uint32_t j = 0; j < n; j += kUniformLanes) {
    float draws[kUniformLanes];
    for (uint32_t l = 0; l < kUniformLanes; ++l) {
      uint32_t x = state[l];
      x ^= x << 13;
      x ^= x >> 17;
      x ^= x << 5;
      state[l] = x;
      draws[l] = static_cast<float>(x >> 8) * kScale;
    }
    const uint32_t take = n - j < kUniformLanes ? n - j : kUniformLanes;
    for (uint32_t l = 0; l < take; ++l) out[j + l] = draws[l];
  }
}

// Uniform floats in [0, 1) with 24 random bits each, from 8 independent xorshift32 lanes stepped together (shifts
// and xors only, so the loop vectorizes with plain SSE2): DIANA draws one per element, which made the standard
// library's engines most of its encoding time.
class UniformStream {
 public:
  static constexpr uint32_t kLanes = kUniformLanes;
  explicit UniformStream(uint64_t seed) {
    for (uint32_t l = 0; l < kLanes; ++l) state_[l] = static_cast<uint32_t>(Mix(seed + l)) | 1;  // never 0
  }
  // out[0..n) for n a multiple of kLanes; a shorter tail takes the first lanes.
  void Fill(float* out, uint32_t n) { FillUniform(state_, out, n); }

 private:
  uint32_t state_[kLanes];
};

// max_j |x_j|, on the bits so that the reduction vectorizes (for non-negative floats the integer order is the
// float order).
SPARSEREDUCE_CLONES float NormInf(const float* x, uint32_t n) {
  int32_t m = 0;
  for (uint32_t j = 0; j < n; ++j) {
    int32_t bits;
    std::memcpy(&bits, &x[j], 4);
    bits &= 0x7FFFFFFF;
    m = m > bits ? m : bits;
  }
  float result;
  std::memcpy(&result, &m, 4);
  return result;
}

// ‖x‖₂ with eight partial sums: a fixed order (so every run gives the same bits) that vectorizes. In double: fp32
// squares overflow from |x| ≈ 1.8e19 (a finite block then went out as not finite) and vanish below 1e-23.
SPARSEREDUCE_CLONES float Norm2(const float* x, uint32_t n) {
  double partial[8] = {};
  uint32_t j = 0;
  for (; j + 8 <= n; j += 8) {
    for (uint32_t l = 0; l < 8; ++l) partial[l] += static_cast<double>(x[j + l]) * x[j + l];
  }
  for (; j < n; ++j) partial[0] += static_cast<double>(x[j]) * x[j];
  double sum = 0.0;
  for (double p : partial) sum += p;
  return static_cast<float>(std::sqrt(sum));
}

// delta = x - h.
SPARSEREDUCE_CLONES void Subtract(const float* x, const float* h, uint32_t n, float* delta) {
  for (uint32_t j = 0; j < n; ++j) delta[j] = x[j] - h[j];
}

// DIANA's Q: P(q_j = sign Δ_j) = |Δ_j| / ‖Δ‖, so E[norm · q_j] = Δ_j. Branch-free: the draws are unpredictable.
// True when some q_j is nonzero.
SPARSEREDUCE_CLONES bool QuantizeStochastic(const float* delta, const float* draws, float norm, uint32_t n, int8_t* q) {
  // u·norm must keep its 24 significant bits for every draw u >= 2^-24 (the others are 0): for a norm under 2^-100
  // (it is at least 2^-126: Prepare sends no block with a subnormal one) it would fall among the subnormals.
  // Scaling both sides by 2^64 is exact there and overflows nothing.
  const float factor = norm < 0x1p-100f ? 0x1p64f : 1.0f;
  const float scaled_norm = norm * factor;
  int any = 0;
  for (uint32_t j = 0; j < n; ++j) {
    const int keep = static_cast<int>(draws[j] * scaled_norm < std::fabs(delta[j]) * factor);
    const int sign = static_cast<int>(delta[j] > 0.0f) - static_cast<int>(delta[j] < 0.0f);
    q[j] = static_cast<int8_t>(keep * sign);
    any |= keep;
  }
  return any != 0;
}

// fp16 / bf16: a block is sent when it has a nonzero element; the sums come back in the same format.
class HalfEncoder final : public TensorEncoder {
 public:
  HalfEncoder(Codec codec, WireFormat format, uint32_t block_size, KeyState& state)
      : codec_(codec), format_(format), block_size_(block_size), state_(state) {}

  uint64_t Prepare(std::span<const float> tensor, std::span<uint8_t> send) override {
    // No state of its own, but the key's 3LC error or top-k residual ends here as on any change of codec (the
    // aggregators drop theirs): it came back when the key returned to that codec.
    Fit(state_, codec_, tensor.size());
    const Blocks blocks = Split(tensor.size(), block_size_);
    const uint64_t count = ScanBlocks(reinterpret_cast<const std::byte*>(tensor.data()), tensor.size(), block_size_,
                                      *FindDType(DType::kFloat32), send);
    store_.Reset(state_.wire, blocks.count, MaxWireBytes(format_, block_size_, 4));
    for (uint64_t b = 0; b < blocks.count; ++b) {
      send[b] &= kBlockNonzero;  // a block of only ±0 is not sent
      if (!send[b]) continue;
      const uint32_t n = blocks.Length(b);
      store_.End(b, EncodeFloats(format_, tensor.data() + blocks.Begin(b), n, store_.Begin(b)));
    }
    return count;
  }
  std::span<const std::byte> Block(uint64_t block) const override { return store_.Block(block); }
  void Finish(std::span<float>) override {}

 private:
  Codec codec_;
  WireFormat format_;
  uint32_t block_size_;
  KeyState& state_;
  BlockStore store_;
};

// 3LC with error feedback; the scale M is each block's own (or, with tensor_scale, the whole tensor's); sums come
// back ternary (or fp32) from the aggregators, which keep their own error feedback.
class ThreeLcEncoder final : public TensorEncoder {
 public:
  ThreeLcEncoder(const CodecSpec& spec, uint32_t block_size, KeyState& state)
      : spec_(spec), block_size_(block_size), state_(state) {}

  uint64_t Prepare(std::span<const float> tensor, std::span<uint8_t> send) override {
    Fit(state_, Codec::kThreeLC, tensor.size());
    if (state_.error.empty()) state_.error.assign(tensor.size(), 0.0f);
    std::vector<float>& error = state_.staged;  // the key's error changes only in Finish
    error.resize(tensor.size());
    const Blocks blocks = Split(tensor.size(), block_size_);
    const float* x = tensor.data();
    const float* old_error = state_.error.data();
    // With tensor_scale, one M for the whole tensor. When it is not finite (some block holds an Inf or a NaN, or
    // its M overflows), each block's own M decides: those not finite go out as such, and the others share the
    // largest finite one (so that one overflowing block does not turn the whole tensor, zero blocks included, NaN).
    float tensor_scale = spec_.tensor_scale ? ScaleOf(MaxAbsWithError(x, old_error, tensor.size()), spec_.sparsity) : 0;
    const bool all_finite = !std::isnan(tensor_scale);
    if (!all_finite) {
      tensor_scale = 0;
      for (uint64_t b = 0; b < blocks.count; ++b) {
        const float m = ScaleOf(MaxAbsWithError(x + blocks.Begin(b), old_error + blocks.Begin(b), blocks.Length(b)),
                                spec_.sparsity);
        if (!std::isnan(m)) tensor_scale = std::max(tensor_scale, m);
      }
    }
    std::vector<int8_t> q(block_size_);
    store_.Reset(state_.wire, blocks.count, MaxTernaryBytes(block_size_));
    uint64_t count = 0;
    for (uint64_t b = 0; b < blocks.count; ++b) {
      const uint32_t n = blocks.Length(b);
      const uint64_t at = blocks.Begin(b);
      float scale = tensor_scale;
      if (!spec_.tensor_scale || !all_finite) {
        // The block's own M: its scale without tensor_scale, and with it whether the block is finite.
        const float own = ScaleOf(MaxAbsWithError(x + at, old_error + at, n), spec_.sparsity);
        if (!spec_.tensor_scale || std::isnan(own)) scale = own;
      }
      // Below the smallest normal float the block is not sent and its (subnormal) T stays in the error, as for a
      // zero scale: with sparsity s > 1 a block's error shrinks by s - 1 a step, so a block touched once was sent at
      // every later step, and a subnormal error stops shrinking (M = 1.5 · 1 ulp rounds to 2 ulps, leaving -1 ulp).
      if (scale < std::numeric_limits<float>::min()) scale = 0.0f;  // false for NaN: those go out as such
      send[b] = QuantizeWithError(x + at, old_error + at, error.data() + at, n, scale, q.data());
      if (!send[b]) continue;
      ++count;
      std::byte* out = store_.Begin(b);
      store_.End(b, static_cast<uint32_t>(EncodeTernary(q.data(), n, scale, out)));
    }
    return count;
  }
  std::span<const std::byte> Block(uint64_t block) const override { return store_.Block(block); }
  void Finish(std::span<float>) override {
    state_.error.swap(state_.staged);
    ++state_.steps;
  }

 private:
  CodecSpec spec_;
  uint32_t block_size_;
  KeyState& state_;
  BlockStore store_;
};

// DIANA (Mishchenko et al., 2019): sends Q(x − h_i) with Q unbiased block-wise ternary, receives S = Σ_i Q(Δ_i) in
// fp32; the result (a sum over ranks) is W·h + S, and h_i += α·Q(Δ_i), h += α·S/W on every worker alike.
class DianaEncoder final : public TensorEncoder {
 public:
  DianaEncoder(const CodecSpec& spec, uint32_t block_size, KeyState& state, uint32_t rank, uint32_t world_size,
               uint64_t seed)
      : spec_(spec),
        block_size_(block_size),
        state_(state),
        rank_(rank),
        world_size_(world_size),
        seed_(seed),
        alpha_(spec.alpha > 0.0f ? spec.alpha : DianaDefaultAlpha(block_size)) {}

  uint64_t Prepare(std::span<const float> tensor, std::span<uint8_t> send) override {
    Fit(state_, Codec::kDiana, tensor.size());
    if (state_.h_own.empty()) {
      state_.h_own.assign(tensor.size(), 0.0f);
      state_.h_mean.assign(tensor.size(), 0.0f);
    }
    const float* h_own = state_.h_own.data();  // read here; Finish adds α·Q(Δ) from the blocks sent
    // One stream per (seed, key, step, rank): reproducible, and independent across ranks and steps.
    UniformStream uniform(seed_ ^ Mix(spec_.key) ^ Mix(state_.steps * 0x9E3779B97F4A7C15ull) ^ Mix(~uint64_t{rank_}));
    const Blocks blocks = Split(tensor.size(), block_size_);
    std::vector<float> delta(block_size_), draws(block_size_);
    std::vector<int8_t> q(block_size_);
    decoded_.resize(block_size_);
    store_.Reset(state_.wire, blocks.count, MaxTernaryBytes(block_size_));
    uint64_t count = 0;
    for (uint64_t b = 0; b < blocks.count; ++b) {
      const uint32_t n = blocks.Length(b);
      const float* x = tensor.data() + blocks.Begin(b);
      const float* h = h_own + blocks.Begin(b);
      Subtract(x, h, n, delta.data());
      float norm = spec_.diana_l2 ? Norm2(delta.data(), n) : NormInf(delta.data(), n);
      uniform.Fill(draws.data(), n);  // also for a block not finite: the draws of later blocks stay the same
      bool any;
      if (norm < std::numeric_limits<float>::min()) {
        // Zero, or all subnormal: not sent, h_i stays. A quiet block's Δ = -h_i shrinks by 1 - α a step only until
        // it is subnormal, where α · Q(Δ) rounds to nothing or to Δ's own ulps: it was sent at every step for good.
        any = false;
      } else if (std::isfinite(norm)) {
        any = QuantizeStochastic(delta.data(), draws.data(), norm, n, q.data());
      } else {
        // x holds an Inf or a NaN: the block goes out not finite (every element decodes to NaN, docs/PROTOCOL.md
        // §11.2) and leaves h_i as it was (Finish).
        norm = kNotFiniteScale;
        std::fill_n(q.data(), n, int8_t{1});
        any = true;
      }
      send[b] = any;
      if (!any) continue;
      ++count;
      std::byte* out = store_.Begin(b);
      store_.End(b, static_cast<uint32_t>(EncodeTernary(q.data(), n, norm, out)));
    }
    return count;
  }
  std::span<const std::byte> Block(uint64_t block) const override { return store_.Block(block); }
  void Finish(std::span<float> tensor) override {
    // h_i += α·Q(Δ_i) where the sum S (still in `tensor`) is finite: Q(Δ_i) of each block sent is its wire block,
    // norm · q_j exactly. Where S is not finite (some rank's block was, or the sum overflowed) h stays as it was
    // below, so every h_i must too: h = mean h_i held only while they skip the same elements. A rank whose block
    // was finite used to add it anyway, and the results of that block stayed off by α·Q(Δ_i) for good.
    const Blocks blocks = Split(tensor.size(), block_size_);
    std::vector<float>& sent = decoded_;  // allocated by Prepare: Finish must not fail half way (TensorEncoder)
    for (uint64_t b = 0; b < blocks.count; ++b) {
      if (store_.Block(b).empty() || std::isnan(TernaryScale(store_.Block(b)))) continue;
      const uint32_t n = blocks.Length(b);
      (void)DecodeTernary(store_.Block(b), n, sent.data(), false);
      float* h_i = state_.h_own.data() + blocks.Begin(b);
      const float* s = tensor.data() + blocks.Begin(b);
      for (uint32_t j = 0; j < n; ++j) h_i[j] += std::isfinite(s[j]) ? alpha_ * sent[j] : 0.0f;
    }
    // Every worker runs the same fp32 operations on the same S and h: the replicas stay bitwise equal.
    const float w = static_cast<float>(world_size_);
    float* h = state_.h_mean.data();
    for (size_t j = 0; j < tensor.size(); ++j) {
      const float s = tensor[j];
      tensor[j] = w * h[j] + s;
      h[j] += std::isfinite(s) ? alpha_ * (s / w) : 0.0f;
    }
    ++state_.steps;
  }

 private:
  CodecSpec spec_;
  uint32_t block_size_;
  KeyState& state_;
  uint32_t rank_, world_size_;
  uint64_t seed_;
  float alpha_;
  BlockStore store_;
  std::vector<float> decoded_;  // Finish's one block of Q(Δ_i)
};

// Block top-k with error feedback: T = x + R; the k blocks of T with the largest 2-norm go out exactly, the others
// stay as the residual R for the next collective. Adaptive picks k per collective (see ChooseK).
class TopKEncoder final : public TensorEncoder {
 public:
  TopKEncoder(const CodecSpec& spec, uint32_t block_size, KeyState& state)
      : spec_(spec), block_size_(block_size), state_(state) {}

  uint64_t Prepare(std::span<const float> tensor, std::span<uint8_t> send) override {
    Fit(state_, spec_.codec, tensor.size());
    if (state_.error.empty()) state_.error.assign(tensor.size(), 0.0f);
    std::vector<float>& total = state_.staged;  // T = x + R; what is not sent becomes R in Finish
    total.resize(tensor.size());
    const Blocks blocks = Split(tensor.size(), block_size_);
    std::vector<double> norm2(blocks.count, 0.0);
    for (uint64_t b = 0; b < blocks.count; ++b) {  // T and each block's squared norm in one pass
      const uint64_t at = blocks.Begin(b);
      double s = 0;
      for (uint32_t j = 0; j < blocks.Length(b); ++j) {
        const float t = state_.error[at + j] + tensor[at + j];
        total[at + j] = t;
        s += double{t} * t;
      }
      // A block that is not finite (NaN included) is always sent, besides the k (below): its Inf or NaN reaches
      // the result, where a loss scaler sees it, and does not stay in the residual.
      norm2[b] = std::isfinite(s) ? s : HUGE_VAL;
    }
    std::vector<uint64_t> order(blocks.count);
    std::iota(order.begin(), order.end(), 0);
    // Blocks that are not finite rank last: they go anyway and must not take the places of the k largest (they
    // ranked first, and k of them sent no finite block at all). Ties by index: a deterministic choice.
    const auto rank_key = [&](uint64_t b) { return norm2[b] == HUGE_VAL ? -1.0 : norm2[b]; };
    const auto larger_norm = [&](uint64_t a, uint64_t b) {
      return rank_key(a) > rank_key(b) || (rank_key(a) == rank_key(b) && a < b);
    };
    k_ = TopKCount(spec_.fraction, blocks.count);
    if (spec_.codec == Codec::kAdaptive) {
      std::sort(order.begin(), order.end(), larger_norm);
      k_ = ChooseK(norm2, order, blocks.count);
      // Every other step strays by a factor of two around the choice, so the cost model sees a spread of sizes to
      // fit its slope to (a model fitted only where it already chooses cannot correct itself).
      if (state_.steps % 4 == 1) k_ = std::max<uint64_t>(1, k_ / 2);
      if (state_.steps % 4 == 3) k_ = 2 * k_;
      k_ = std::min(blocks.count, k_);  // ChooseK and the halving give at least 1, more than an empty tensor has
    } else if (k_ < blocks.count) {
      std::nth_element(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k_), order.end(), larger_norm);
    }
    std::fill(send.begin(), send.begin() + static_cast<std::ptrdiff_t>(blocks.count), 0);
    uint64_t count = 0;
    for (uint64_t i = 0; i < k_; ++i) {
      if (rank_key(order[i]) > 0.0) {
        send[order[i]] = 1;
        ++count;
      }
    }
    for (uint64_t b = 0; b < blocks.count; ++b) {  // blocks not finite beyond the k
      if (norm2[b] == HUGE_VAL && !send[b]) {
        send[b] = 1;
        ++count;
      }
    }
    blocks_ = blocks;
    sent_.assign(send.begin(), send.begin() + static_cast<std::ptrdiff_t>(blocks.count));
    return count;
  }
  std::span<const std::byte> Block(uint64_t block) const override {
    return std::as_bytes(std::span(state_.staged.data() + blocks_.Begin(block), blocks_.Length(block)));
  }
  void Finish(std::span<float>) override {
    // The residual: T where it was not sent.
    std::vector<float>& residual = state_.error;
    residual.swap(state_.staged);
    for (uint64_t b = 0; b < blocks_.count; ++b) {
      if (sent_[b]) std::fill_n(residual.data() + blocks_.Begin(b), blocks_.Length(b), 0.0f);
    }
    ++state_.steps;
  }
  uint64_t selected_blocks() const override { return k_; }

 private:
  // k maximizing expected descent per unit of time: descent ∝ ‖S_k(T)‖² / ‖T‖² (the fraction of the squared norm
  // in the k largest blocks), time C(k) = a + b · bytes(k) from the key's fitted cost model.
  uint64_t ChooseK(const std::vector<double>& norm2, const std::vector<uint64_t>& sorted, uint64_t k_max) const {
    // Blocks that are not finite are sent whatever k is: they count as nothing here.
    const auto finite = [](double v) { return v == HUGE_VAL ? 0.0 : v; };
    double total = 0;
    for (double v : norm2) total += finite(v);
    if (total <= 0) return 1;
    const double bytes_per_block = 24.0 + 4.0 * block_size_;  // entry + fp32 data
    double prefix = 0, best = -1;
    uint64_t best_k = 1;
    for (uint64_t k = 1; k <= k_max; ++k) {
      prefix += finite(norm2[sorted[k - 1]]);
      const double value = (prefix / total) / (state_.cost.a() + state_.cost.b() * bytes_per_block * k);
      if (value > best) {
        best = value;
        best_k = k;
      }
    }
    return best_k;
  }

  CodecSpec spec_;
  uint32_t block_size_;
  KeyState& state_;
  std::vector<uint8_t> sent_;
  Blocks blocks_{0, 1, 0};
  uint64_t k_ = 0;
};

}  // namespace

void CostModel::Add(double bytes, double seconds) {
  samples_.emplace_back(bytes, seconds);
  if (samples_.size() > kSamples) samples_.pop_front();
  // Least squares of seconds = a + b · bytes; kept only when it makes sense (positive slope, non-negative a).
  double n = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : samples_) {
    n += 1;
    sx += x;
    sy += y;
    sxx += x * x;
    sxy += x * y;
  }
  const double det = n * sxx - sx * sx;
  // A slope needs sizes that differ (by a fifth of the mean at least); timings are noisy.
  if (n < 4 || det <= 0 || det < 0.04 * sx * sx) return;
  const double b = (n * sxy - sx * sy) / det;
  const double a = (sy - b * sx) / n;
  if (b > 0) {
    b_ = b;
    a_ = std::max(a, 0.0);
  }
}

uint64_t TopKCount(float fraction, uint64_t blocks) {
  const double product = static_cast<double>(fraction) * static_cast<double>(blocks);
  const double nearest = std::round(product);
  // The forgiveness stays below a 1024th of a block: from 2^24 blocks on, the relative 2^-24 alone would round any
  // product, not raise it (0.25 of 2^26 + 1 blocks gave 2^24, not 2^24 + 1).
  const double k =
      std::fabs(product - nearest) <= std::min(product * 0x1p-24, 0x1p-10) ? nearest : std::ceil(product);
  return std::min(blocks, std::max<uint64_t>(1, static_cast<uint64_t>(k)));
}

float DianaDefaultAlpha(uint32_t block_size) { return 1.0f / std::sqrt(static_cast<float>(block_size)); }

std::unique_ptr<TensorEncoder> MakeEncoder(const CodecSpec& spec, uint32_t block_size, KeyState& state, uint32_t rank,
                                           uint32_t world_size, uint64_t seed) {
  switch (spec.codec) {
    case Codec::kFloat16: return std::make_unique<HalfEncoder>(Codec::kFloat16, WireFormat::kFloat16, block_size, state);
    case Codec::kBFloat16: return std::make_unique<HalfEncoder>(Codec::kBFloat16, WireFormat::kBFloat16, block_size, state);
    case Codec::kThreeLC: return std::make_unique<ThreeLcEncoder>(spec, block_size, state);
    case Codec::kDiana: return std::make_unique<DianaEncoder>(spec, block_size, state, rank, world_size, seed);
    case Codec::kTopK:
    case Codec::kAdaptive: return std::make_unique<TopKEncoder>(spec, block_size, state);
    case Codec::kNone: break;
  }
  return nullptr;
}

}  // namespace sparsereduce::codec
