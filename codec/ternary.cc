#include "codec/ternary.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "codec/clones.h"

namespace sparsereduce::codec {
namespace {

// The five values of each packed byte 0..242.
struct GroupTable {
  std::array<std::array<int8_t, 5>, kMaxGroup + 1> q;
  GroupTable() {
    for (int b = 0; b <= kMaxGroup; ++b) {
      int rest = b;
      for (int i = 4; i >= 0; --i) {
        q[b][i] = static_cast<int8_t>(rest % 3 - 1);
        rest /= 3;
      }
    }
  }
};
const GroupTable kGroups;

inline uint8_t Pack(const int8_t* q) {
  return static_cast<uint8_t>(81 * (q[0] + 1) + 27 * (q[1] + 1) + 9 * (q[2] + 1) + 3 * (q[3] + 1) + (q[4] + 1));
}

SPARSEREDUCE_CLONES void PackGroups(const int8_t* q, size_t groups, uint8_t* packed) {
  for (size_t g = 0; g < groups; ++g) packed[g] = Pack(q + 5 * g);
}

// Replaces each run of zero groups (byte kZeroGroup) in packed[0..groups) by run bytes, in place; returns the new
// length. Works on 64-group masks and moves whole stretches, so its branches follow the runs rather than every
// group (per group, zero or not is close to a coin flip for a sparse 3LC block, which the CPU cannot predict).
size_t CollapseZeroRuns(uint8_t* packed, size_t groups) {
  size_t o = 0, run = 0;
  auto flush_run = [&] {
    while (run > 0) {
      const size_t k = run < kMaxRun ? run : kMaxRun;
      packed[o++] = static_cast<uint8_t>(k == 1 ? kZeroGroup : kRunBase + k);
      run -= k;
    }
  };
  for (size_t base = 0; base < groups; base += 64) {
    const size_t n = groups - base < 64 ? groups - base : 64;
    uint64_t zero = 0;
    for (size_t i = 0; i < n; ++i) zero |= uint64_t{packed[base + i] == kZeroGroup} << i;
    for (size_t i = 0; i < n;) {
      const uint64_t rest = zero >> i;
      if (rest & 1) {
        const size_t length = std::min<size_t>(std::countr_one(rest), n - i);
        run += length;
        i += length;
      } else {
        const size_t length = std::min<size_t>(std::countr_zero(rest), n - i);
        flush_run();
        std::memmove(packed + o, packed + base + i, length);  // o <= base + i: the output never passes the input
        o += length;
        i += length;
      }
    }
  }
  flush_run();
  return o;
}

// Calls group(values of one group) for each group, in order; ok when the block has exactly `groups` groups.
template <typename OnGroup>
Status ForEachGroup(std::span<const std::byte> in, size_t groups, OnGroup&& group) {
  size_t seen = 0;
  for (size_t i = 4; i < in.size(); ++i) {
    const uint8_t b = static_cast<uint8_t>(in[i]);
    const size_t count = b <= kMaxGroup ? 1 : b - kRunBase;
    if (seen + count > groups) {
      return ProtocolError("ternary block has more than its " + std::to_string(groups) + " groups");
    }
    for (size_t k = 0; k < count; ++k) group(seen++, kGroups.q[b <= kMaxGroup ? b : kZeroGroup].data());
  }
  if (seen != groups) {
    return ProtocolError("ternary block has " + std::to_string(seen) + " groups, expected " + std::to_string(groups));
  }
  return Status::Ok();
}

}  // namespace

size_t EncodeTernary(const int8_t* q, size_t n, float scale, std::byte* out) {
  static_assert(std::endian::native == std::endian::little, "the wire format is little-endian: memcpy of floats");
  std::memcpy(out, &scale, 4);
  // Pack every group straight into the output (branch-free), then collapse the zero runs in place: the output
  // never grows past the packed bytes, and the write position never passes the read position.
  uint8_t* packed = reinterpret_cast<uint8_t*>(out + 4);
  const size_t full = n / 5, groups = TernaryGroups(n);
  PackGroups(q, full, packed);
  if (n % 5) {
    int8_t last[5] = {0, 0, 0, 0, 0};
    std::memcpy(last, q + 5 * full, n % 5);
    packed[full] = Pack(last);
  }
  return 4 + CollapseZeroRuns(packed, groups);
}

float TernaryScale(std::span<const std::byte> in) {
  float scale;
  std::memcpy(&scale, in.data(), 4);
  return scale;
}

// A scale is a magnitude: finite and not negative, or NaN for a block that is not finite. An infinite scale would
// make every zero q_j decode to 0 and the others to ±Inf, neither the sender's value nor the marker.
[[gnu::cold, gnu::noinline]] static Status BadScale(std::span<const std::byte> in) {
  if (in.size() < 4) return ProtocolError("ternary block shorter than its scale");
  return ProtocolError("ternary block with scale " + std::to_string(TernaryScale(in)) +
                       " (must be finite and not negative, or NaN)");
}

static Status CheckScale(std::span<const std::byte> in) {
  if (in.size() >= 4) {
    const float scale = TernaryScale(in);
    if (std::isnan(scale) || (std::isfinite(scale) && scale >= 0.0f)) [[likely]] return Status::Ok();
  }
  return BadScale(in);
}

// The padding of a partial last group must be zero (runs of zero groups may be split in more than one way: a
// receiver takes any of them).
static Status CheckPadding(std::span<const std::byte> in, size_t n) {
  if (n % 5 == 0) return Status::Ok();
  const uint8_t b = static_cast<uint8_t>(in[in.size() - 1]);
  if (b > kMaxGroup) return Status::Ok();  // a run of zero groups
  for (size_t k = n % 5; k < 5; ++k) {
    if (kGroups.q[b][k] != 0) return ProtocolError("ternary block pads its last group with a nonzero value");
  }
  return Status::Ok();
}

Status DecodeTernary(std::span<const std::byte> in, size_t n, float* out, bool accumulate) {
  if (Status st = CheckScale(in); !st.ok()) return st;
  const float scale = TernaryScale(in);
  const float levels[3] = {-scale, 0.0f, scale};
  const size_t full = n / 5;
  Status st = ForEachGroup(in, TernaryGroups(n), [&](size_t g, const int8_t* q) {
    float* o = out + 5 * g;
    const size_t count = g < full ? 5 : n % 5;
    for (size_t k = 0; k < count; ++k) {
      if (accumulate) {
        o[k] += levels[q[k] + 1];
      } else {
        o[k] = levels[q[k] + 1];
      }
    }
  });
  return st.ok() ? CheckPadding(in, n) : st;
}

Status CheckTernary(std::span<const std::byte> in, size_t n) {
  if (Status st = CheckScale(in); !st.ok()) return st;
  Status st = ForEachGroup(in, TernaryGroups(n), [](size_t, const int8_t*) {});
  return st.ok() ? CheckPadding(in, n) : st;
}

Result<float> DecodeTrits(std::span<const std::byte> in, size_t n, int8_t* q) {
  if (Status st = CheckScale(in); !st.ok()) return st;
  const size_t full = n / 5;
  Status st = ForEachGroup(in, TernaryGroups(n), [&](size_t g, const int8_t* values) {
    std::memcpy(q + 5 * g, values, g < full ? 5 : n % 5);
  });
  if (st.ok()) st = CheckPadding(in, n);
  if (!st.ok()) return st;
  return TernaryScale(in);
}

}  // namespace sparsereduce::codec
