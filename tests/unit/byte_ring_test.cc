#include "transport/ring/byte_ring.h"

#include <gtest/gtest.h>

namespace sparsereduce::transport {
namespace {

TEST(ByteRing, CapacityMustBeAPowerOfTwoInRange) {
  EXPECT_TRUE(ByteRing::CheckCapacity(4096).ok());
  EXPECT_TRUE(ByteRing::CheckCapacity(uint64_t{1} << 32).ok());
  for (uint64_t bad : {uint64_t{0}, uint64_t{2048}, uint64_t{4097}, uint64_t{6144}, (uint64_t{1} << 33)}) {
    EXPECT_FALSE(ByteRing::CheckCapacity(bad).ok()) << bad;
  }
}

TEST(ByteRing, LocateWithinAndAcrossTheEnd) {
  const ByteRing ring(4096);
  RingSpans s = ring.Locate(100, 50);
  ASSERT_EQ(s.count, 1);
  EXPECT_EQ(s.span[0].offset, 100u);
  EXPECT_EQ(s.span[0].length, 50u);

  s = ring.Locate(4096 * 3 + 4000, 200);  // positions never wrap; offsets do
  ASSERT_EQ(s.count, 2);
  EXPECT_EQ(s.span[0].offset, 4000u);
  EXPECT_EQ(s.span[0].length, 96u);
  EXPECT_EQ(s.span[1].offset, 0u);
  EXPECT_EQ(s.span[1].length, 104u);

  s = ring.Locate(4000, 96);  // ends exactly at the end of the memory
  ASSERT_EQ(s.count, 1);
  EXPECT_EQ(s.span[0].length, 96u);

  s = ring.Locate(12345, 4096);  // the whole ring
  ASSERT_EQ(s.count, 2);
  EXPECT_EQ(s.span[0].length + s.span[1].length, 4096u);

  EXPECT_EQ(ring.Locate(7, 0).count, 0);
}

TEST(ByteRing, UsedAndFree) {
  const ByteRing ring(8192);
  EXPECT_EQ(ring.Used(10000, 9000), 1000u);
  EXPECT_EQ(ring.Free(10000, 9000), 7192u);
  EXPECT_EQ(ring.Free(5, 5), 8192u);
}

TEST(ByteRing, PositionsFromThePeerAreChecked) {
  const ByteRing ring(4096);
  EXPECT_TRUE(ring.CheckPositions(0, 0).ok());
  EXPECT_TRUE(ring.CheckPositions(5000, 904).ok());  // exactly full
  EXPECT_EQ(ring.CheckPositions(5001, 904).code(), StatusCode::kProtocolViolation);  // more than the ring holds
  EXPECT_EQ(ring.CheckPositions(10, 11).code(), StatusCode::kProtocolViolation);     // head behind tail
  EXPECT_EQ(ring.CheckPositions(~uint64_t{0}, 0).code(), StatusCode::kProtocolViolation);
}

}  // namespace
}  // namespace sparsereduce::transport
