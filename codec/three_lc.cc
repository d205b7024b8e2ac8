#include "codec/three_lc.h"

#include <algorithm>
#include <cmath>

namespace sparsereduce::codec {

float MaxAbsWithError(const float* x, const float* error, size_t n) {
  float m = 0.0f;
  for (size_t j = 0; j < n; ++j) m = std::max(m, std::fabs(x[j] + error[j]));
  return m;
}

bool QuantizeWithError(const float* x, float* error, size_t n, float scale, int8_t* q) {
  if (!(scale > 0.0f)) {
    // Nothing to send: the whole of x joins the error.
    for (size_t j = 0; j < n; ++j) {
      error[j] += x[j];
      q[j] = 0;
    }
    return false;
  }
  const float inverse = 1.0f / scale;
  bool any = false;
  for (size_t j = 0; j < n; ++j) {
    const float t = x[j] + error[j];
    // |t / M| <= 1 / s <= 1, so rounding gives -1, 0 or +1 (ties away from zero, as std::round).
    const float r = std::round(t * inverse);
    const int8_t v = static_cast<int8_t>(r);
    q[j] = v;
    error[j] = t - scale * static_cast<float>(v);
    any |= v != 0;
  }
  return any;
}

}  // namespace sparsereduce::codec
