// Helpers shared by the fuzz targets: a front-to-back input reader, a deterministic PRNG, small job shapes and
// specs derived from input bytes, tensor generation, an independent little-endian frame writer, and the
// invariant check macro. Header-only so every target is a single translation unit.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "codec/codec_spec.h"
#include "core/dtype.h"
#include "protocol/frame_format.h"
#include "protocol/layout.h"

// An invariant of the code under test does not hold: print why and crash so that libFuzzer keeps the input.
#define FUZZ_CHECK(cond, ...)                                                      \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n", __FILE__, __LINE__, \
                   #cond);                                                         \
      std::fprintf(stderr, "  " __VA_ARGS__);                                      \
      std::fprintf(stderr, "\n");                                                  \
      __builtin_trap();                                                            \
    }                                                                              \
  } while (0)

namespace sparsereduce::fuzz {

// Reads the fuzz input front to back; once it is exhausted every read returns zeros (so any input is usable and
// the seed files can be written by hand in the order the target reads them).
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  bool empty() const { return n_ == 0; }
  size_t remaining() const { return n_; }

  uint8_t U8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  uint32_t U32() { return uint32_t{U16()} | (uint32_t{U16()} << 16); }
  uint64_t U64() { return uint64_t{U32()} | (uint64_t{U32()} << 32); }
  // Up to `n` bytes (fewer at the end of the input).
  std::span<const uint8_t> Bytes(size_t n) {
    n = std::min(n, n_);
    std::span<const uint8_t> out(p_, n);
    p_ += n;
    n_ -= n;
    return out;
  }
  std::span<const uint8_t> Rest() { return Bytes(n_); }

 private:
  const uint8_t* p_;
  size_t n_;
};

// SplitMix64: deterministic, seedable, good enough to expand a few input bytes into tensors and payloads.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : static_cast<uint32_t>(Next() % n); }

 private:
  uint64_t s_;
};

// Bytes 0..6 of the input: a small job shape and spec (W 1..4, A 1..2, S 1..3, K 1..4, N 0..200, B 1..8 or
// rarely 9..72, float32 or int32, window D 1..3). Layout of those bytes is part of the seed format, see
// fuzz/README.md; byte 6 holds both the dtype (bit 0) and the window (1 + (byte >> 1) % 3).
struct SmallSetup {
  JobShape shape;
  CollectiveSpec spec;
  uint32_t element_size = 4;
  uint8_t codec_selector = 0;  // bits 2-7 of byte 0: the codec, see ReadCodec
};

inline SmallSetup ReadSmallSetup(ByteReader& in) {
  SmallSetup s;
  const uint8_t w = in.U8();  // bits 0-1: W; bits 2-7: the codec (ReadCodec; 0, as in every older seed: none)
  s.shape.world_size = 1 + w % 4;
  s.codec_selector = w >> 2;
  s.shape.num_aggregators = 1 + in.U8() % 2;
  s.shape.slots = 1 + in.U8() % 3;
  s.shape.blocks_per_message = 1 + in.U8() % 4;
  s.spec.element_count = in.U8() % 201;
  const uint8_t b = in.U8();  // mostly 1..8; 9..72 (blocks of >= 64 bytes reach the scan's wide loop) for b >= 0xE0
  s.spec.block_size = b < 0xE0 ? 1 + b % 8 : 9 + b % 64;
  const uint8_t d = in.U8();  // bit 0: dtype; the rest: window D 1..3
  s.spec.dtype = (d & 1) ? DType::kInt32 : DType::kFloat32;
  s.shape.window = 1 + (d >> 1) % 3;
  s.spec.op = ReduceOp::kSum;
  s.element_size = 4;
  return s;
}

inline uint64_t NumBlocks(const CollectiveSpec& spec) {
  return (spec.element_count + spec.block_size - 1) / spec.block_size;
}
// docs/PROTOCOL.md §2: the run length L, and the column of (aggregator a, slot s, lane k).
inline uint32_t RunLength(const JobShape& shape, uint64_t nb) {
  const uint64_t A = shape.num_aggregators, S = shape.slots, K = shape.blocks_per_message;
  if (nb >= A * S * K) return static_cast<uint32_t>(K);
  uint64_t best = 1;
  for (uint64_t d = 1; d <= K; ++d) {
    if (K % d == 0 && d <= std::max<uint64_t>(1, nb / (A * S))) best = d;
  }
  return static_cast<uint32_t>(best);
}
inline uint64_t ColumnOf(const JobShape& shape, uint32_t run_length, uint32_t a, uint32_t s, uint32_t k) {
  const uint64_t A = shape.num_aggregators, S = shape.slots, L = run_length;
  return ((k / L) * A * S + s * A + a) * L + k % L;
}
inline uint32_t BlockBytesOf(const CollectiveSpec& spec, uint64_t block) {
  const uint64_t start = block * spec.block_size;
  const uint64_t n = std::min<uint64_t>(spec.block_size, spec.element_count - start);
  return static_cast<uint32_t>(n * 4);
}

// A random element value: mostly small nonzero numbers, sometimes +0/-0 (floats) and rarely arbitrary bits.
inline uint32_t RandomElement(Rng& rng, DType dtype, bool allow_any_bits) {
  const uint32_t r = rng.Below(16);
  if (dtype == DType::kInt32) {
    if (r < 2) return 0;
    return static_cast<uint32_t>(rng.Next());
  }
  float f;
  if (r == 0) {
    f = 0.0f;
  } else if (r == 1) {
    f = -0.0f;
  } else if (r == 2 && allow_any_bits) {
    return static_cast<uint32_t>(rng.Next());
  } else {
    f = static_cast<float>(static_cast<int32_t>(rng.Below(2001)) - 1000) / 8.0f;
  }
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return bits;
}

// One rank's tensor: each block is nonzero with probability density/256; zero blocks hold a mix of +0 and -0
// (floats), so that the -0 rewrite of WorkerCollective::Finish is exercised.
inline std::vector<std::byte> MakeTensor(const CollectiveSpec& spec, Rng& rng, uint8_t density) {
  std::vector<std::byte> t(spec.element_count * 4);
  const uint64_t nb = NumBlocks(spec);
  for (uint64_t b = 0; b < nb; ++b) {
    const bool nonzero = rng.Below(256) < density;
    const uint64_t first = b * spec.block_size;
    const uint64_t last = std::min<uint64_t>(first + spec.block_size, spec.element_count);
    for (uint64_t i = first; i < last; ++i) {
      uint32_t v = 0;
      if (nonzero) {
        v = RandomElement(rng, spec.dtype, /*allow_any_bits=*/false);
      } else if (spec.dtype == DType::kFloat32 && rng.Below(4) == 0) {
        v = 0x80000000u;  // -0.0f
      }
      std::memcpy(t.data() + i * 4, &v, 4);
    }
    if (nonzero) {  // make sure the block really is nonzero
      uint32_t v = spec.dtype == DType::kFloat32 ? 0x3F800000u : 1u;  // 1.0f / 1
      std::memcpy(t.data() + (first + rng.Below(static_cast<uint32_t>(last - first))) * 4, &v, 4);
    }
  }
  return t;
}

// Independent scan: is any element of `block` unequal to zero (-0.0f counts as zero)?
inline bool BlockIsNonzero(const CollectiveSpec& spec, std::span<const std::byte> tensor, uint64_t block) {
  const uint64_t first = block * spec.block_size;
  const uint64_t last = std::min<uint64_t>(first + spec.block_size, spec.element_count);
  const uint32_t mask = spec.dtype == DType::kFloat32 ? 0x7FFFFFFFu : 0xFFFFFFFFu;
  for (uint64_t i = first; i < last; ++i) {
    uint32_t v;
    std::memcpy(&v, tensor.data() + i * 4, 4);
    if (v & mask) return true;
  }
  return false;
}

inline bool IsNanBits(uint32_t v) { return (v & 0x7F800000u) == 0x7F800000u && (v & 0x007FFFFFu) != 0; }

// Element-wise equality of two 4-byte-element regions; for float32, two NaNs are equal whatever their payloads
// (IEEE leaves the payload of NaN + NaN to the implementation, and the compiler may commute additions).
inline bool SameElements(std::span<const std::byte> a, std::span<const std::byte> b, DType dtype) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i + 4 <= a.size(); i += 4) {
    uint32_t x, y;
    std::memcpy(&x, a.data() + i, 4);
    std::memcpy(&y, b.data() + i, 4);
    if (x != y && !(dtype == DType::kFloat32 && IsNanBits(x) && IsNanBits(y))) return false;
  }
  return a.size() % 4 == 0 || std::memcmp(a.data() + a.size() / 4 * 4, b.data() + b.size() / 4 * 4, a.size() % 4) == 0;
}

// memcmp that accepts empty (possibly null) ranges.
inline bool SameBytes(const void* a, const void* b, size_t n) { return n == 0 || std::memcmp(a, b, n) == 0; }

// A little-endian frame writer written independently of protocol/frame.cc (so the fuzzers do not check the
// codec against itself).
class FrameWriter {
 public:
  void U8(uint8_t v) { bytes_.push_back(std::byte{v}); }
  void U16(uint16_t v) {
    for (int i = 0; i < 2; ++i) bytes_.push_back(std::byte(v >> (8 * i)));
  }
  void U32(uint32_t v) {
    for (int i = 0; i < 4; ++i) bytes_.push_back(std::byte(v >> (8 * i)));
  }
  void U64(uint64_t v) {
    for (int i = 0; i < 8; ++i) bytes_.push_back(std::byte(v >> (8 * i)));
  }
  void Raw(std::span<const std::byte> b) { bytes_.insert(bytes_.end(), b.begin(), b.end()); }
  std::vector<std::byte>& bytes() { return bytes_; }

 private:
  std::vector<std::byte> bytes_;
};

struct PlainEntry {
  uint64_t block = 0;
  uint64_t next = kEndOfColumn;
  std::vector<std::byte> data;
};

// A complete data frame: 40-byte header, entry table, data padded to 8 bytes (docs/PROTOCOL.md §3).
inline std::vector<std::byte> WriteDataFrame(FrameType type, uint32_t slot, uint64_t job, uint64_t seq,
                                             const std::vector<PlainEntry>& entries) {
  uint64_t payload = uint64_t{kEntrySize} * entries.size();
  for (const PlainEntry& e : entries) payload += Pad8(e.data.size());
  FrameWriter w;
  w.U32(kFrameMagic);
  w.U8(kProtocolVersion);
  w.U8(static_cast<uint8_t>(type));
  w.U16(0);
  w.U32(static_cast<uint32_t>(payload));
  w.U32(slot);
  w.U64(job);
  w.U64(seq);
  w.U32(static_cast<uint32_t>(entries.size()));
  w.U32(0);
  for (const PlainEntry& e : entries) {
    w.U64(e.block);
    w.U64(e.next);
    w.U32(static_cast<uint32_t>(e.data.size()));
    w.U32(0);
  }
  for (const PlainEntry& e : entries) {
    w.Raw(e.data);
    for (size_t i = e.data.size(); i < Pad8(e.data.size()); ++i) w.U8(0);
  }
  return std::move(w.bytes());
}

// Overwrites 1..4 bytes of `frame` at input-chosen positions (set, xor, or +-1); returns false if nothing changed.
inline bool MutateFrame(std::vector<std::byte>& frame, ByteReader& in) {
  if (frame.empty()) return false;
  const std::vector<std::byte> before = frame;
  const uint32_t n = 1 + in.U8() % 4;
  for (uint32_t i = 0; i < n; ++i) {
    const size_t pos = in.U16() % frame.size();
    const uint8_t mode = in.U8();
    const uint8_t value = in.U8();
    uint8_t b = std::to_integer<uint8_t>(frame[pos]);
    switch (mode % 4) {
      case 0: b = value; break;
      case 1: b ^= value ? value : 1; break;
      case 2: b = static_cast<uint8_t>(b + 1); break;
      case 3: b = static_cast<uint8_t>(b - 1); break;
    }
    frame[pos] = std::byte{b};
  }
  return frame != before;
}

// ---- Codecs (docs/PROTOCOL.md §11), for the engine targets ----------------------------------------------------------
//
// The codec of a collective comes from bits 2-7 of setup byte 0 (SmallSetup::codec_selector): 0 is none (so every
// seed written before codecs keeps its meaning); otherwise selector % 8 picks 3LC (0, 3, 7), fp16 (1), bf16 (2),
// DIANA (4), top-k (5) or adaptive (6). For a codec, two more bytes follow the 7 setup bytes: a parameter byte p
// (3LC: sparsity 1 + p/256; DIANA: alpha 0 for even p, else p/255; top-k: fraction (p+1)/256) and a flag byte f
// (3LC: bit 0 result_fp32, bit 1 tensor_scale; DIANA: bit 0 diana_l2; bits 4-7: the key). A codec needs float32
// sums, so it overrides the dtype bit.
inline void ReadCodec(ByteReader& in, SmallSetup& s) {
  if (s.codec_selector == 0) return;
  static constexpr Codec kTable[8] = {Codec::kThreeLC, Codec::kFloat16, Codec::kBFloat16, Codec::kThreeLC,
                                      Codec::kDiana,   Codec::kTopK,    Codec::kAdaptive,  Codec::kThreeLC};
  CodecSpec& c = s.spec.codec;
  c.codec = kTable[s.codec_selector % 8];
  const uint8_t p = in.U8();
  const uint8_t f = in.U8();
  c.key = f >> 4;
  switch (c.codec) {
    case Codec::kThreeLC:
      c.sparsity = 1.0f + static_cast<float>(p) / 256.0f;
      c.result_fp32 = f & 1;
      c.tensor_scale = (f & 2) != 0;
      break;
    case Codec::kDiana:
      c.alpha = p % 2 == 0 ? 0.0f : static_cast<float>(p) / 255.0f;
      c.diana_l2 = f & 1;
      break;
    case Codec::kTopK:
    case Codec::kAdaptive: c.fraction = static_cast<float>(p + 1) / 256.0f; break;
    default: break;
  }
  s.spec.dtype = DType::kFloat32;
}

// The wire format of each direction (§11 table), written from the document rather than taken from codec/.
enum class Wire { kRaw, kHalf, kBFloat16, kTernary };
inline Wire UploadWire(const CodecSpec& c) {
  switch (c.codec) {
    case Codec::kFloat16: return Wire::kHalf;
    case Codec::kBFloat16: return Wire::kBFloat16;
    case Codec::kThreeLC:
    case Codec::kDiana: return Wire::kTernary;
    default: return Wire::kRaw;
  }
}
inline Wire DownloadWire(const CodecSpec& c) {
  switch (c.codec) {
    case Codec::kFloat16: return Wire::kHalf;
    case Codec::kBFloat16: return Wire::kBFloat16;
    case Codec::kThreeLC: return c.result_fp32 ? Wire::kRaw : Wire::kTernary;
    default: return Wire::kRaw;
  }
}
inline uint32_t TernaryGroupsOf(uint32_t n) { return (n + 4) / 5; }
// A block of n elements in `w`: exactly this many bytes (fixed formats), at most (ternary).
inline uint32_t MaxWireBytesOf(Wire w, uint32_t n) {
  switch (w) {
    case Wire::kRaw: return 4 * n;
    case Wire::kHalf:
    case Wire::kBFloat16: return 2 * n;
    case Wire::kTernary: return 4 + TernaryGroupsOf(n);
  }
  return 0;
}
inline uint32_t ElementsOf(const CollectiveSpec& spec, uint64_t block) { return BlockBytesOf(spec, block) / 4; }

inline float FloatOf(uint32_t bits) { return std::bit_cast<float>(bits); }
inline uint32_t BitsOf(float f) { return std::bit_cast<uint32_t>(f); }

// IEEE half <-> float (§11.1: round to nearest, ties to even; overflow to infinity; NaN stays NaN), via exact
// double arithmetic rather than bit tricks, so that it is independent of codec/half.cc.
inline float HalfToFloatRef(uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  double v;
  if (e == 0) {
    v = std::ldexp(static_cast<double>(m), -24);
  } else if (e == 31) {
    v = m == 0 ? INFINITY : NAN;
  } else {
    v = std::ldexp(static_cast<double>(1024 + m), e - 25);
  }
  return static_cast<float>((h & 0x8000) ? -v : v);
}
inline uint16_t FloatToHalfRef(float f) {
  const uint16_t sign = (BitsOf(f) >> 16) & 0x8000;
  if (std::isnan(f)) return sign | 0x7E00;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7C00;  // 65504 + half its ulp and beyond round to infinity
  if (a == 0.0) return sign;
  int e;
  std::frexp(a, &e);  // a = m · 2^e, m in [0.5, 1)
  const int exponent = std::max(e - 1, -14);
  const double quantum = std::ldexp(1.0, exponent - 10);
  const double r = std::nearbyint(a / quantum) * quantum;  // round to nearest even (default rounding mode)
  if (r == 0.0) return sign;
  std::frexp(r, &e);
  if (e - 1 < -14) return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::ldexp(r, 24)));
  const int biased = e - 1 + 15;
  const auto mantissa = static_cast<uint16_t>(std::ldexp(r, -(e - 1)) * 1024.0 - 1024.0);
  return static_cast<uint16_t>(sign | (biased << 10) | mantissa);
}
inline float BFloat16ToFloatRef(uint16_t b) { return FloatOf(uint32_t{b} << 16); }
inline uint16_t FloatToBFloat16Ref(float f) {
  const uint32_t u = BitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

// A ternary block (§11.2) checked and decoded as the document says: more than 4 and at most 4 + ceil(n/5) bytes;
// the scale finite and not negative, or NaN; bytes 0..242 one group, 243..255 (241 + k) k zero groups; exactly
// ceil(n/5) groups; a partial last group padded with zeros. On success `q` (if given) holds the n values.
inline bool TernaryBlockRef(std::span<const std::byte> in, uint32_t n, float* scale, int8_t* q) {
  if (in.size() <= 4 || in.size() > MaxWireBytesOf(Wire::kTernary, n)) return false;
  uint32_t bits = 0;
  for (int i = 0; i < 4; ++i) bits |= uint32_t{std::to_integer<uint8_t>(in[i])} << (8 * i);
  const float m = FloatOf(bits);
  if (!(std::isnan(m) || (std::isfinite(m) && m >= 0.0f))) return false;
  const uint32_t groups = TernaryGroupsOf(n);
  uint32_t g = 0;
  for (size_t i = 4; i < in.size(); ++i) {
    const uint8_t b = std::to_integer<uint8_t>(in[i]);
    int8_t values[5] = {0, 0, 0, 0, 0};
    uint32_t count = 1;
    if (b <= 242) {
      int rest = b;
      for (int k = 4; k >= 0; --k) {
        values[k] = static_cast<int8_t>(rest % 3 - 1);
        rest /= 3;
      }
    } else {
      count = b - 241;
    }
    for (uint32_t c = 0; c < count; ++c, ++g) {
      if (g >= groups) return false;
      for (uint32_t k = 0; k < 5; ++k) {
        const uint32_t j = 5 * g + k;
        if (j >= n) {
          if (values[k] != 0) return false;  // padding
        } else if (q) {
          q[j] = values[k];
        }
      }
    }
  }
  if (g != groups) return false;
  *scale = m;
  return true;
}

// Ternary bytes of q[0..n) with `scale`. `split` null: the canonical form (runs of 2..14 zero groups collapsed,
// longer runs split into 14s and the rest); otherwise runs are split at random, or left as single zero groups, as
// §11.2 allows a sender.
inline std::vector<std::byte> EncodeTernaryRef(const int8_t* q, uint32_t n, float scale, Rng* split) {
  std::vector<std::byte> out(4);
  const uint32_t bits = BitsOf(scale);
  for (int i = 0; i < 4; ++i) out[i] = std::byte(bits >> (8 * i));
  std::vector<uint8_t> groups;
  for (uint32_t g = 0; g < TernaryGroupsOf(n); ++g) {
    int b = 0;
    for (uint32_t k = 0; k < 5; ++k) b = 3 * b + (5 * g + k < n ? q[5 * g + k] : 0) + 1;
    groups.push_back(static_cast<uint8_t>(b));
  }
  for (size_t g = 0; g < groups.size();) {
    if (groups[g] != 121) {
      out.push_back(std::byte{groups[g++]});
      continue;
    }
    size_t run = 0;
    while (g + run < groups.size() && groups[g + run] == 121) ++run;
    g += run;
    while (run > 0) {
      size_t k = std::min<size_t>(run, 14);
      if (split) k = 1 + split->Below(static_cast<uint32_t>(k));
      out.push_back(std::byte{static_cast<uint8_t>(k == 1 ? 121 : 241 + k)});
      run -= k;
    }
  }
  return out;
}

// Is `data` a valid block of n elements in `w` (§7, §11)? With `out`, also decodes it to fp32 (overwriting).
inline bool DecodeWireRef(Wire w, std::span<const std::byte> data, uint32_t n, float* out) {
  switch (w) {
    case Wire::kRaw:
      if (data.size() != 4 * size_t{n}) return false;
      if (out) std::memcpy(out, data.data(), data.size());
      return true;
    case Wire::kHalf:
    case Wire::kBFloat16:
      if (data.size() != 2 * size_t{n}) return false;
      for (uint32_t j = 0; out && j < n; ++j) {
        const auto v = static_cast<uint16_t>(std::to_integer<uint8_t>(data[2 * j]) |
                                             (std::to_integer<uint8_t>(data[2 * j + 1]) << 8));
        out[j] = w == Wire::kHalf ? HalfToFloatRef(v) : BFloat16ToFloatRef(v);
      }
      return true;
    case Wire::kTernary: {
      std::vector<int8_t> q(n);
      float m;
      if (!TernaryBlockRef(data, n, &m, q.data())) return false;
      for (uint32_t j = 0; out && j < n; ++j) out[j] = q[j] == 0 ? 0.0f : (q[j] > 0 ? m : -m);
      return true;
    }
  }
  return false;
}

// fp32 values -> a fixed format's bytes.
inline std::vector<std::byte> EncodeFixedRef(Wire w, const float* v, uint32_t n) {
  std::vector<std::byte> out;
  for (uint32_t j = 0; j < n; ++j) {
    if (w == Wire::kRaw) {
      const uint32_t u = BitsOf(v[j]);
      for (int i = 0; i < 4; ++i) out.push_back(std::byte(u >> (8 * i)));
    } else {
      const uint16_t h = w == Wire::kHalf ? FloatToHalfRef(v[j]) : FloatToBFloat16Ref(v[j]);
      out.push_back(std::byte(h & 0xFF));
      out.push_back(std::byte(h >> 8));
    }
  }
  return out;
}

// A block of n elements in `w` made up by the fuzzer. `garbage` false: well-formed (random values, for ternary a
// random scale, sometimes 0, -0, NaN or subnormal, random trits and a random split of zero runs); true: bytes that
// may be anything the length check lets through (for ternary: a random length, random bytes, or a valid block
// with one byte or its scale replaced).
inline std::vector<std::byte> RandomWireBlock(Wire w, uint32_t n, Rng& rng, bool garbage) {
  if (w != Wire::kTernary) {
    std::vector<float> v(n);
    for (float& x : v) x = FloatOf(RandomElement(rng, DType::kFloat32, /*allow_any_bits=*/true));
    std::vector<std::byte> out = EncodeFixedRef(w, v.data(), n);
    if (garbage) {
      for (std::byte& b : out) b = std::byte(rng.Next());
    }
    return out;
  }
  const uint32_t r = rng.Below(16);
  float scale = FloatOf(RandomElement(rng, DType::kFloat32, false));
  scale = std::fabs(scale);
  if (r == 0) scale = std::numeric_limits<float>::quiet_NaN();
  if (r == 1) scale = -0.0f;
  if (r == 2) scale = FloatOf(1 + rng.Below(0x7FFFFF));  // subnormal
  if (r == 3) scale = std::numeric_limits<float>::max();
  std::vector<int8_t> q(n);
  const uint32_t density = rng.Below(4);  // 0: all zero, else 1/4, 1/2, 3/4 nonzero
  for (int8_t& x : q) x = rng.Below(4) < density ? static_cast<int8_t>(rng.Below(2) ? 1 : -1) : 0;
  std::vector<std::byte> out = EncodeTernaryRef(q.data(), n, scale, rng.Below(2) ? &rng : nullptr);
  if (!garbage) return out;
  switch (rng.Below(4)) {
    case 0: {  // random length and bytes
      out.resize(5 + rng.Below(MaxWireBytesOf(Wire::kTernary, n) - 4));
      for (std::byte& b : out) b = std::byte(rng.Next());
      if (rng.Below(2)) std::memset(out.data(), 0, 4);  // a valid scale (+0), so the groups get checked
      break;
    }
    case 1: out[4 + rng.Below(static_cast<uint32_t>(out.size() - 4))] = std::byte(rng.Next()); break;
    case 2: {
      const uint32_t bits = rng.Below(2) ? static_cast<uint32_t>(rng.Next()) : (rng.Below(2) ? 0x7F800000u : 0xBF800000u);
      for (int i = 0; i < 4; ++i) out[i] = std::byte(bits >> (8 * i));
      break;
    }
    default:  // one byte more or less (within the length check when possible)
      if (out.size() > 5 && rng.Below(2)) {
        out.pop_back();
      } else if (out.size() < MaxWireBytesOf(Wire::kTernary, n)) {
        out.push_back(std::byte(rng.Next()));
      }
      break;
  }
  return out;
}

// Two wire blocks that mean the same: byte for byte, except that any NaN equals any NaN (fp32 elements, fp16 /
// bf16 elements, a ternary scale), as IEEE leaves the payload of NaN + NaN open.
inline bool SameWireBlock(Wire w, std::span<const std::byte> a, std::span<const std::byte> b) {
  if (a.size() != b.size()) return false;
  auto u16 = [](std::span<const std::byte> s, size_t i) {
    return static_cast<uint16_t>(std::to_integer<uint8_t>(s[i]) | (std::to_integer<uint8_t>(s[i + 1]) << 8));
  };
  switch (w) {
    case Wire::kRaw: return SameElements(a, b, DType::kFloat32);
    case Wire::kHalf:
    case Wire::kBFloat16:
      for (size_t i = 0; i + 1 < a.size(); i += 2) {
        const uint16_t x = u16(a, i), y = u16(b, i);
        const bool nan_x = w == Wire::kHalf ? std::isnan(HalfToFloatRef(x)) : std::isnan(BFloat16ToFloatRef(x));
        const bool nan_y = w == Wire::kHalf ? std::isnan(HalfToFloatRef(y)) : std::isnan(BFloat16ToFloatRef(y));
        if (x != y && !(nan_x && nan_y)) return false;
      }
      return true;
    case Wire::kTernary:
      if (a.size() < 4) return SameBytes(a.data(), b.data(), a.size());
      return SameElements(a.first(4), b.first(4), DType::kFloat32) &&
             SameBytes(a.data() + 4, b.data() + 4, a.size() - 4);
  }
  return false;
}

// A data frame of `type` made up by the fuzzer. `structured`: entries with fuzzer-chosen block/next indices (some
// past the tensor, END) and data lengths (the block's, multiples of 4, anything); otherwise a well-formed header
// over raw payload bytes. `wire`: the format of the frame's direction; an entry with the block's length then has
// a well-formed body or arbitrary bytes of a length the format allows (RandomWireBlock).
inline std::vector<std::byte> ArbitraryDataFrame(ByteReader& in, Rng& rng, const CollectiveSpec& spec,
                                                 uint32_t blocks_per_message, FrameType type, uint32_t slot,
                                                 uint64_t job, uint64_t seq, bool structured,
                                                 Wire wire = Wire::kRaw) {
  const uint64_t nb = NumBlocks(spec);
  if (structured) {
    auto index = [&](uint8_t v) -> uint64_t { return v == 0xFF ? kEndOfColumn : v % (nb + 2); };
    std::vector<PlainEntry> entries(in.U8() % (blocks_per_message + 2));
    for (PlainEntry& e : entries) {
      e.block = index(in.U8());
      e.next = index(in.U8());
      const uint8_t len = in.U8();
      uint32_t bytes = 0;
      if (len % 4 == 1 && wire != Wire::kRaw && e.block < nb) {
        e.data = RandomWireBlock(wire, ElementsOf(spec, e.block), rng, /*garbage=*/(len >> 2) % 2 == 1);
        continue;
      }
      switch (len % 4) {
        case 1: bytes = e.block < nb ? BlockBytesOf(spec, e.block) : 4; break;
        case 2: bytes = 4 * (len >> 2); break;
        case 3: bytes = len >> 2; break;
      }
      e.data.resize(bytes);
      for (std::byte& b : e.data) b = std::byte(rng.Next());
    }
    return WriteDataFrame(type, slot, job, seq, entries);
  }
  const uint32_t count = in.U8() % (blocks_per_message + 1);
  const std::span<const uint8_t> raw = in.Bytes(in.U8());
  FrameWriter w;
  w.U32(kFrameMagic);
  w.U8(kProtocolVersion);
  w.U8(static_cast<uint8_t>(type));
  w.U16(0);
  w.U32(static_cast<uint32_t>(raw.size()));
  w.U32(slot);
  w.U64(job);
  w.U64(seq);
  w.U32(count);
  w.U32(0);
  w.Raw(std::as_bytes(raw));
  return std::move(w.bytes());
}


}  // namespace sparsereduce::fuzz
