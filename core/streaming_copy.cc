#include "core/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace sparsereduce {

void StreamingCopy(void* dst, const void* src, size_t bytes) {
  auto* out = static_cast<std::byte*>(dst);
  const auto* in = static_cast<const std::byte*>(src);
  size_t done = 0;
#if defined(__SSE2__)
  // A short copy stays in the cache.
  constexpr size_t kLine = 64;
  if (bytes >= 4 * kLine && (reinterpret_cast<uintptr_t>(out) & 15) == 0) {
    for (; done + kLine <= bytes; done += kLine) {
      const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done));
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 16));
      const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 32));
      const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + done + 48));
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + done), a);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 16), b);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 32), c);
      _mm_stream_si128(reinterpret_cast<__m128i*>(out + done + 48), d);
    }
  }
#endif
  if (done < bytes) std::memcpy(out + done, in + done, bytes - done);
}

void StreamingFence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace sparsereduce
