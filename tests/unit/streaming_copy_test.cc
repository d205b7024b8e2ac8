// StreamingCopy (core/streaming_copy.h) copies exactly what memcpy copies, for every size around the vector
// and line widths and every alignment of both sides; it writes nothing outside the destination range.
#include "core/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace sparsereduce {
namespace {

TEST(StreamingCopy, EqualsMemcpyForEverySizeAndAlignment) {
  constexpr size_t kGuard = 64;
  std::vector<std::byte> source(4096 + 64);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
  const std::vector<size_t> sizes = {0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025, 4096};
  for (size_t size : sizes) {
    for (size_t dst_offset = 0; dst_offset < 32; dst_offset += 1) {
      for (size_t src_offset : {size_t{0}, size_t{3}, size_t{16}}) {
        // 64-byte aligned storage, so dst_offset decides the destination's alignment.
        std::vector<std::byte> storage(size + 2 * kGuard + 64 + 32, std::byte{0xAB});
        auto base = reinterpret_cast<uintptr_t>(storage.data());
        std::byte* aligned = storage.data() + ((64 - base % 64) % 64);
        std::byte* dst = aligned + kGuard + dst_offset;
        StreamingCopy(dst, source.data() + src_offset, size);
        for (size_t i = 0; i < size; ++i) {
          ASSERT_EQ(dst[i], source[src_offset + i])
              << "size " << size << " dst offset " << dst_offset << " byte " << i;
        }
        for (std::byte* p = storage.data(); p < dst; ++p)
          ASSERT_EQ(*p, std::byte{0xAB}) << "wrote before dst";
        for (std::byte* p = dst + size; p < storage.data() + storage.size(); ++p) {
          ASSERT_EQ(*p, std::byte{0xAB}) << "wrote past dst + " << size;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sparsereduce
