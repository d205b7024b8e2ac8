#include "codec/three_lc.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/clones.h"
#include "codec/ternary.h"

namespace sparsereduce::codec {

SPARSEREDUCE_CLONES float MaxAbsWithError(const float* x, const float* error, size_t n) {
  // On the bits: for non-negative floats (NaN aside) the integer order is the float order, and an integer max
  // reduction vectorizes where a float one may not (NaN and signed-zero rules forbid reordering it).
  int32_t m = 0;
  for (size_t j = 0; j < n; ++j) {
    const float t = x[j] + error[j];
    int32_t bits;
    std::memcpy(&bits, &t, 4);
    bits &= 0x7FFFFFFF;
    m = m > bits ? m : bits;
  }
  float result;
  std::memcpy(&result, &m, 4);
  return result;
}

bool QuantizeWithError(const float* x, float* error, size_t n, float scale, int8_t* q) {
  return QuantizeWithError(x, error, error, n, scale, q);
}

float ScaleOf(float max_abs, float sparsity) {
  const float scale = max_abs * sparsity;
  return std::isfinite(scale) ? scale : kNotFiniteScale;
}

SPARSEREDUCE_CLONES bool QuantizeWithError(const float* x, const float* error_in, float* error_out, size_t n,
                                           float scale, int8_t* q) {
  if (std::isnan(scale)) {
    for (size_t j = 0; j < n; ++j) {
      if (error_out != error_in) error_out[j] = error_in[j];
      q[j] = 1;
    }
    return true;
  }
  if (!(scale > 0.0f)) {
    // Nothing to send: the whole of x joins the error.
    for (size_t j = 0; j < n; ++j) {
      error_out[j] = error_in[j] + x[j];
      q[j] = 0;
    }
    return false;
  }
  // |T / M| <= 1 / s <= 1, so round(T / M) is +1 from T >= M/2 on, -1 up to -M/2, else 0 (ties away from zero,
  // as std::round). Comparing 2T with M instead of dividing keeps the loop branch-free and vectorized; 2T is exact
  // (or overflows to ±Inf, which compares right), where M/2 is not for a subnormal M with an odd last bit.
  int any = 0;
  for (size_t j = 0; j < n; ++j) {
    const float t = x[j] + error_in[j];
    const float twice = t + t;
    const int v = static_cast<int>(twice >= scale) - static_cast<int>(twice <= -scale);
    q[j] = static_cast<int8_t>(v);
    error_out[j] = t - scale * static_cast<float>(v);
    any |= v;
  }
  return any != 0;
}

}  // namespace sparsereduce::codec
