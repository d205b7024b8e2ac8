#include "transport/ring/byte_ring.h"
#include "transport/ring/loan_ledger.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

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

TEST(LoanLedger, ConsumableUpToStopsAtTheFirstLoanStillOut) {
  LoanLedger ledger;
  EXPECT_EQ(ledger.ConsumableUpTo(500), 500u);  // nothing lent: everything read is consumed
  ledger.Lend(100);
  ledger.Lend(300);
  ledger.Lend(4096 + 50);  // positions past the ring's end, offsets wrapped
  EXPECT_EQ(ledger.outstanding(), 3u);
  EXPECT_EQ(ledger.ConsumableUpTo(5000), 100u);
  EXPECT_TRUE(ledger.Return(300, 4096));  // a later loan back first: the first still holds everything
  EXPECT_EQ(ledger.ConsumableUpTo(5000), 100u);
  EXPECT_TRUE(ledger.Return(100, 4096));
  EXPECT_EQ(ledger.ConsumableUpTo(5000), 4096u + 50);
  EXPECT_TRUE(ledger.Return(50, 4096));
  EXPECT_EQ(ledger.outstanding(), 0u);
  EXPECT_EQ(ledger.ConsumableUpTo(5000), 5000u);
}

TEST(LoanLedger, ReturningWhatWasNotLentChangesNothing) {
  LoanLedger ledger;
  ledger.Lend(8);
  EXPECT_FALSE(ledger.Return(16, 4096));
  EXPECT_TRUE(ledger.Return(8, 4096));
  EXPECT_FALSE(ledger.Return(8, 4096));  // twice
  EXPECT_EQ(ledger.outstanding(), 0u);
  EXPECT_EQ(ledger.ConsumableUpTo(64), 64u);
}

// Against a model: loans of random sizes in ring order, returned in random order; the consumable position is
// always the first loan not yet returned.
TEST(LoanLedger, RandomReturnOrderMatchesModel) {
  std::mt19937_64 rng(7);
  const uint64_t capacity = 8192;
  for (int round = 0; round < 200; ++round) {
    LoanLedger ledger;
    std::vector<uint64_t> begins;
    const uint64_t first = rng() % 100000;
    uint64_t position = first;
    for (int i = 0, n = 1 + static_cast<int>(rng() % 12); i < n; ++i) {
      position += rng() % 300;  // bytes read by copy between loans
      begins.push_back(position);
      ledger.Lend(position);
      position += 8 + rng() % 300;  // the loan itself
    }
    // As RingChannel lends: all loans within less than a ring, so no two start at the same offset.
    ASSERT_LT(position - first, capacity);
    std::vector<bool> back(begins.size(), false);
    std::vector<size_t> order(begins.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    for (size_t i : order) {
      ASSERT_TRUE(ledger.Return(begins[i] % capacity, capacity));
      back[i] = true;
      const auto first_out = std::find(back.begin(), back.end(), false);
      const uint64_t expected = first_out == back.end() ? position : begins[first_out - back.begin()];
      ASSERT_EQ(ledger.ConsumableUpTo(position), expected);
    }
  }
}

}  // namespace
}  // namespace sparsereduce::transport
