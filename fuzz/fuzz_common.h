// Helpers shared by the fuzz targets: a front-to-back input reader, a deterministic PRNG, small job shapes and
// specs derived from input bytes, tensor generation, an independent little-endian frame writer, and the
// invariant check macro. Header-only so every target is a single translation unit.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

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
};

inline SmallSetup ReadSmallSetup(ByteReader& in) {
  SmallSetup s;
  s.shape.world_size = 1 + in.U8() % 4;
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

// A data frame of `type` made up by the fuzzer. `structured`: entries with fuzzer-chosen block/next indices (some
// past the tensor, END) and data lengths (the block's, multiples of 4, anything); otherwise a well-formed header
// over raw payload bytes.
inline std::vector<std::byte> ArbitraryDataFrame(ByteReader& in, Rng& rng, const CollectiveSpec& spec,
                                                 uint32_t blocks_per_message, FrameType type, uint32_t slot,
                                                 uint64_t job, uint64_t seq, bool structured) {
  const uint64_t nb = NumBlocks(spec);
  if (structured) {
    auto index = [&](uint8_t v) -> uint64_t { return v == 0xFF ? kEndOfColumn : v % (nb + 2); };
    std::vector<PlainEntry> entries(in.U8() % (blocks_per_message + 2));
    for (PlainEntry& e : entries) {
      e.block = index(in.U8());
      e.next = index(in.U8());
      const uint8_t len = in.U8();
      uint32_t bytes = 0;
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
