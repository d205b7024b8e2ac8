// Little-endian fixed-width coding (protocol/coding.h).
#include "protocol/coding.h"

#include <array>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

namespace sparsereduce {
namespace {

constexpr std::byte kGuard{0xA5};

template <size_t N>
std::array<uint8_t, N> ToU8(const std::byte* p) {
  std::array<uint8_t, N> out{};
  for (size_t i = 0; i < N; ++i) out[i] = std::to_integer<uint8_t>(p[i]);
  return out;
}

TEST(CodingTest, Fixed16RoundTripsEdgeValues) {
  const std::vector<uint16_t> values = {0, 1, 0x7F, 0x80, 0xFF, 0x100, 0x7FFF, 0x8000, 0xFFFE, 0xFFFF, 0x1234};
  for (uint16_t v : values) {
    // One guard byte on each side, and an odd start so the helpers must not assume alignment.
    std::array<std::byte, 4> buf;
    buf.fill(kGuard);
    EncodeFixed16(buf.data() + 1, v);
    EXPECT_EQ(buf[0], kGuard);
    EXPECT_EQ(buf[3], kGuard);
    EXPECT_EQ(DecodeFixed16(buf.data() + 1), v) << v;
  }
}

TEST(CodingTest, Fixed32RoundTripsEdgeValues) {
  std::vector<uint32_t> values = {0, 1, 0x7F, 0x80, 0xFF, 0x100, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000,
                                  0xFFFFFFFE, 0xFFFFFFFF, 0xDEADBEEF};
  for (int bit = 0; bit < 32; ++bit) values.push_back(uint32_t{1} << bit);
  for (uint32_t v : values) {
    std::array<std::byte, 7> buf;
    buf.fill(kGuard);
    EncodeFixed32(buf.data() + 1, v);
    EXPECT_EQ(buf[0], kGuard);
    EXPECT_EQ(buf[5], kGuard);
    EXPECT_EQ(buf[6], kGuard);
    EXPECT_EQ(DecodeFixed32(buf.data() + 1), v) << v;
  }
}

TEST(CodingTest, Fixed64RoundTripsEdgeValues) {
  std::vector<uint64_t> values = {0,
                                  1,
                                  0xFF,
                                  0x100,
                                  0xFFFFFFFF,
                                  0x100000000,
                                  0x7FFFFFFFFFFFFFFF,
                                  0x8000000000000000,
                                  0xFFFFFFFFFFFFFFFE,
                                  std::numeric_limits<uint64_t>::max(),
                                  0x0123456789ABCDEF};
  for (int bit = 0; bit < 64; ++bit) values.push_back(uint64_t{1} << bit);
  for (uint64_t v : values) {
    std::array<std::byte, 11> buf;
    buf.fill(kGuard);
    EncodeFixed64(buf.data() + 1, v);
    EXPECT_EQ(buf[0], kGuard);
    EXPECT_EQ(buf[9], kGuard);
    EXPECT_EQ(buf[10], kGuard);
    EXPECT_EQ(DecodeFixed64(buf.data() + 1), v) << v;
  }
}

TEST(CodingTest, ByteOrderIsLittleEndian) {
  std::array<std::byte, 8> buf{};
  EncodeFixed16(buf.data(), 0x0201);
  EXPECT_EQ((ToU8<2>(buf.data())), (std::array<uint8_t, 2>{0x01, 0x02}));

  EncodeFixed32(buf.data(), 0x04030201);
  EXPECT_EQ((ToU8<4>(buf.data())), (std::array<uint8_t, 4>{0x01, 0x02, 0x03, 0x04}));

  EncodeFixed64(buf.data(), 0x0807060504030201);
  EXPECT_EQ((ToU8<8>(buf.data())), (std::array<uint8_t, 8>{0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08}));
}

TEST(CodingTest, DecodeReadsLittleEndianBytes) {
  const std::array<std::byte, 8> bytes = {std::byte{0xEF}, std::byte{0xCD}, std::byte{0xAB}, std::byte{0x89},
                                          std::byte{0x67}, std::byte{0x45}, std::byte{0x23}, std::byte{0x01}};
  EXPECT_EQ(DecodeFixed16(bytes.data()), 0xCDEF);
  EXPECT_EQ(DecodeFixed32(bytes.data()), 0x89ABCDEFu);
  EXPECT_EQ(DecodeFixed64(bytes.data()), 0x0123456789ABCDEFull);
  // High bytes with the top bit set must not sign-extend.
  const std::array<std::byte, 8> ff = {std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF},
                                       std::byte{0xFF}, std::byte{0xFF}, std::byte{0xFF}, std::byte{0x80}};
  EXPECT_EQ(DecodeFixed16(ff.data() + 6), 0x80FF);
  EXPECT_EQ(DecodeFixed32(ff.data() + 4), 0x80FFFFFFu);
  EXPECT_EQ(DecodeFixed64(ff.data()), 0x80FFFFFFFFFFFFFFull);
}

}  // namespace
}  // namespace sparsereduce
