#include "tools/common/size_parse.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

namespace sparsereduce::tools {
namespace {

TEST(ParseByteSize, PlainAndSuffixedSizes) {
  for (const auto& [text, want] : {std::pair<std::string, uint64_t>{"0", 0}, {"4096", 4096}, {"4K", 4096},
                                   {"4k", 4096}, {"64M", 64ull << 20}, {"2G", 2ull << 30},
                                   {"18446744073709551615", UINT64_MAX}}) {
    auto got = ParseByteSize(text);
    ASSERT_TRUE(got.ok()) << text << ": " << got.status().ToString();
    EXPECT_EQ(*got, want) << text;
  }
}

TEST(ParseByteSize, RejectsMalformedText) {
  for (const char* text : {"", "K", "-1", "4T", "4KB", "4 K", "18446744073709551616"}) {
    EXPECT_FALSE(ParseByteSize(text).ok()) << text;
  }
}

// A suffix must not wrap around: 17179869184G is 2^64 bytes, which used to come back as 0.
TEST(ParseByteSize, RejectsSuffixedSizesAbove64Bits) {
  const uint64_t largest_g = UINT64_MAX >> 30;  // the largest count of GiB that fits
  auto fits = ParseByteSize(std::to_string(largest_g) + "G");
  ASSERT_TRUE(fits.ok()) << fits.status().ToString();
  EXPECT_EQ(*fits, largest_g << 30);
  for (const std::string& text : {std::to_string(largest_g + 1) + "G",  // 17179869184G
                                 std::to_string((UINT64_MAX >> 20) + 1) + "M",
                                 std::to_string((UINT64_MAX >> 10) + 1) + "k", std::string("18446744073709551615K")}) {
    auto got = ParseByteSize(text);
    EXPECT_FALSE(got.ok()) << text << " gave " << (got.ok() ? std::to_string(*got) : "");
    if (!got.ok()) {
      EXPECT_NE(got.status().message().find("64 bits"), std::string::npos) << got.status().ToString();
    }
  }
}

}  // namespace
}  // namespace sparsereduce::tools
