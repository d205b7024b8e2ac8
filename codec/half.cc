#include "codec/half.h"

#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

namespace sparsereduce::codec {
namespace {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

#if defined(__x86_64__)
// CPUID rather than __builtin_cpu_supports("f16c"): clang 14 does not know that feature name. AVX also needs the
// OS to save YMM state (OSXSAVE + XCR0 bits 1 and 2).
bool DetectF16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const bool f16c = ecx & bit_F16C, avx = ecx & bit_AVX, osxsave = ecx & bit_OSXSAVE;
  if (!(f16c && avx && osxsave)) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  return (xcr0_lo & 0x6) == 0x6;
}

bool HaveF16c() {
  static const bool have = DetectF16c();
  return have;
}

__attribute__((target("avx,f16c"))) void EncodeHalfF16c(const float* in, size_t n, std::byte* out) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 2 * i), h);
  }
  for (; i < n; ++i) {
    const uint16_t h = FloatToHalf(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

__attribute__((target("avx,f16c"))) void DecodeHalfF16c(const std::byte* in, size_t n, float* out, bool accumulate) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + 2 * i)));
    if (accumulate) v = _mm256_add_ps(_mm256_loadu_ps(out + i), v);
    _mm256_storeu_ps(out + i, v);
  }
  for (; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = accumulate ? out[i] + HalfToFloat(h) : HalfToFloat(h);
  }
}
#endif

}  // namespace

uint16_t FloatToHalf(float value) {
  const uint32_t f = Bits(value);
  const uint32_t sign = (f >> 16) & 0x8000;
  const uint32_t abs = f & 0x7FFFFFFF;
  if (abs >= 0x7F800000) {  // inf or NaN (NaN stays quiet NaN)
    return static_cast<uint16_t>(sign | 0x7C00 | (abs > 0x7F800000 ? 0x200 | ((abs >> 13) & 0x3FF) : 0));
  }
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to above 65504: infinity
  if (abs < 0x38800000) {
    // Subnormal half (or zero): value = abs_float / 2^-24, rounded to nearest even.
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);  // below half the smallest subnormal
    const uint32_t exponent = abs >> 23;
    const uint32_t mantissa = (abs & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t half = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  // Normal: rebias the exponent, round the mantissa to 10 bits (a carry may bump the exponent, still correct).
  uint32_t half = ((abs - 0x38000000) >> 13);
  const uint32_t rest = abs & 0x1FFF;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return static_cast<uint16_t>(sign | half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) return FromBits(sign | 0x7F800000 | (mantissa << 13));
  if (exponent != 0) return FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  if (mantissa == 0) return FromBits(sign);
  // Subnormal: normalize.
  uint32_t e = 113;
  while ((mantissa & 0x400) == 0) {
    mantissa <<= 1;
    --e;
  }
  return FromBits(sign | (e << 23) | ((mantissa & 0x3FF) << 13));
}

uint16_t FloatToBFloat16(float value) {
  const uint32_t f = Bits(value);
  if ((f & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((f >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((f + 0x7FFF + ((f >> 16) & 1)) >> 16);
}

void EncodeHalf(const float* in, size_t n, std::byte* out) {
#if defined(__x86_64__)
  if (HaveF16c()) return EncodeHalfF16c(in, n, out);
#endif
  EncodeHalfPortable(in, n, out);
}

void EncodeHalfPortable(const float* in, size_t n, std::byte* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t h = FloatToHalf(in[i]);
    std::memcpy(out + 2 * i, &h, 2);
  }
}

void DecodeHalf(const std::byte* in, size_t n, float* out, bool accumulate) {
#if defined(__x86_64__)
  if (HaveF16c()) return DecodeHalfF16c(in, n, out, accumulate);
#endif
  DecodeHalfPortable(in, n, out, accumulate);
}

void DecodeHalfPortable(const std::byte* in, size_t n, float* out, bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + 2 * i, 2);
    out[i] = accumulate ? out[i] + HalfToFloat(h) : HalfToFloat(h);
  }
}

void EncodeBFloat16(const float* in, size_t n, std::byte* out) {
  for (size_t i = 0; i < n; ++i) {
    const uint16_t b = FloatToBFloat16(in[i]);
    std::memcpy(out + 2 * i, &b, 2);
  }
}

void DecodeBFloat16(const std::byte* in, size_t n, float* out, bool accumulate) {
  for (size_t i = 0; i < n; ++i) {
    uint16_t b;
    std::memcpy(&b, in + 2 * i, 2);
    out[i] = accumulate ? out[i] + BFloat16ToFloat(b) : BFloat16ToFloat(b);
  }
}

}  // namespace sparsereduce::codec
