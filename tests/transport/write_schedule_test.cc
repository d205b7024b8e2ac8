// The RDMA write schedule (transport/rdma/write_schedule.h) without verbs: what is posted, in which order, and that
// a full send queue makes writes wait instead of failing the connection.
#include "transport/rdma/write_schedule.h"

#include <gtest/gtest.h>

#include <deque>
#include <random>
#include <vector>

namespace sparsereduce::rdma {
namespace {

using Kind = WriteSchedule::Kind;

std::vector<WriteSchedule::Write> TakeAll(WriteSchedule& schedule) {
  std::vector<WriteSchedule::Write> writes;
  while (auto w = schedule.Next()) writes.push_back(*w);
  return writes;
}

TEST(WriteSchedule, DataGoesInOrderInSpansThatNeitherWrapNorOverflowTheImmediate) {
  WriteSchedule schedule(4096, 16);
  schedule.Publish(1000);
  auto writes = TakeAll(schedule);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].kind, Kind::kData);
  EXPECT_EQ(writes[0].offset, 0u);
  EXPECT_EQ(writes[0].length, 1000u);
  schedule.Publish(4000);
  schedule.Publish(5000);  // wraps: up to the end of the ring, then from its start
  writes = TakeAll(schedule);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].offset, 1000u);
  EXPECT_EQ(writes[0].length, 3096u);  // both publications up to the ring's end in one write
  EXPECT_EQ(writes[1].offset, 0u);
  EXPECT_EQ(writes[1].length, 904u);

  // The largest RDMA ring, 2^30 bytes: a span of all of it would be the end-of-stream immediate.
  WriteSchedule largest(uint64_t{1} << 30, 16);
  largest.Publish(uint64_t{1} << 30);
  writes = TakeAll(largest);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].length, WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[1].offset, WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[1].length, 1u);

  // A ring of 2^31 bytes (beyond RDMA's, for the arithmetic): cut below 2^30 wherever the span starts.
  WriteSchedule big(uint64_t{1} << 31, 16);
  big.Publish(uint64_t{1} << 31);
  writes = TakeAll(big);
  ASSERT_EQ(writes.size(), 3u);
  EXPECT_EQ(writes[0].length, WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[1].offset, WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[1].length, WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[2].offset, 2ull * WriteSchedule::kMaxDataWrite);
  EXPECT_EQ(writes[2].length, 2u);
  for (const auto& w : writes) EXPECT_EQ(w.length & (3u << 30), 0u) << "a length with a flag bit";
}

// A reader that pauses while its peer writes many small frames: the writes wait for the send queue, and what
// waited goes out in one write once there is room. The connection used to fail ("RDMA send queue full").
TEST(WriteSchedule, AFullSendQueueMakesWritesWaitAndMerges) {
  WriteSchedule schedule(1 << 20, 4);
  uint64_t head = 0;
  for (int frame = 0; frame < 4; ++frame) {
    schedule.Publish(head += 40);
    ASSERT_TRUE(schedule.Next()) << "frame " << frame;
  }
  for (int frame = 0; frame < 1000; ++frame) schedule.Publish(head += 40);
  schedule.Credit();
  EXPECT_FALSE(schedule.Next()) << "a fifth write with 4 in flight";
  EXPECT_TRUE(schedule.due());
  EXPECT_EQ(schedule.in_flight(), 4u);
  schedule.Completed();
  auto credit = schedule.Next();
  ASSERT_TRUE(credit);
  EXPECT_EQ(credit->kind, Kind::kCredit) << "a credit goes before data: the peer may wait for room";
  EXPECT_FALSE(schedule.Next());
  schedule.Completed();
  auto data = schedule.Next();
  ASSERT_TRUE(data);
  EXPECT_EQ(data->kind, Kind::kData);
  EXPECT_EQ(data->offset, 160u);
  EXPECT_EQ(data->length, 40000u);
  EXPECT_FALSE(schedule.due());
}

TEST(WriteSchedule, CreditsThatWaitedGoAsOne) {
  WriteSchedule schedule(4096, 1);
  schedule.Publish(100);
  ASSERT_TRUE(schedule.Next());
  schedule.Credit();
  schedule.Credit();
  schedule.Credit();
  EXPECT_FALSE(schedule.Next());
  schedule.Completed();
  auto credit = schedule.Next();
  ASSERT_TRUE(credit);
  EXPECT_EQ(credit->kind, Kind::kCredit);
  schedule.Completed();
  EXPECT_FALSE(schedule.Next());
  EXPECT_TRUE(schedule.delivered());
}

TEST(WriteSchedule, EndOfStreamFollowsAllDataAndIsDeliveredOnceEverythingCompleted) {
  WriteSchedule schedule(4096, 2);
  EXPECT_TRUE(schedule.delivered());
  schedule.Publish(5000);
  schedule.EndOfStream();
  std::vector<WriteSchedule::Write> writes = TakeAll(schedule);
  ASSERT_EQ(writes.size(), 2u);
  EXPECT_EQ(writes[0].kind, Kind::kData);
  EXPECT_EQ(writes[1].kind, Kind::kData);
  EXPECT_FALSE(schedule.delivered());
  schedule.Completed();
  writes = TakeAll(schedule);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].kind, Kind::kEndOfStream);
  EXPECT_FALSE(schedule.due());
  schedule.Completed();
  EXPECT_FALSE(schedule.delivered()) << "one write still in flight";
  schedule.Completed();
  EXPECT_TRUE(schedule.delivered());
  EXPECT_FALSE(schedule.Next()) << "end of stream twice";
}

// Random publications, credits and completions: the data writes cover the published bytes exactly once, in order;
// the queue never holds more than its size; end of stream is the last write.
TEST(WriteSchedule, RandomTrafficKeepsEveryInvariant) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t capacity = uint64_t{4096} << (rng() % 6);
    const uint32_t queue = 1 + rng() % 8;
    WriteSchedule schedule(capacity, queue);
    uint64_t published = 0, covered = 0;
    uint32_t in_flight = 0;
    bool ended = false, end_posted = false;
    for (int step = 0; step < 2000 || schedule.due() || in_flight > 0; ++step) {
      const int action = static_cast<int>(rng() % 5);
      if (step < 2000 && action == 0) schedule.Publish(published += rng() % (capacity / 2));
      if (action == 1) schedule.Credit();  // also after end of stream: the peer may still be owed room
      if (step == 2000 && !ended) {
        schedule.EndOfStream();
        ended = true;
      }
      if ((action == 2 || step >= 2000) && in_flight > 0) {
        schedule.Completed();
        --in_flight;
      }
      if (action >= 3 || step >= 2000) {
        while (auto w = schedule.Next()) {
          ++in_flight;
          ASSERT_LE(in_flight, queue) << "seed " << seed;
          ASSERT_FALSE(end_posted && w->kind != Kind::kCredit)
              << "data or a second end of stream after it, seed " << seed;
          if (w->kind == Kind::kData) {
            ASSERT_EQ(w->offset, covered % capacity) << "seed " << seed;
            ASSERT_GT(w->length, 0u);
            ASSERT_LE(w->offset + w->length, capacity) << "a span across the ring's end, seed " << seed;
            covered += w->length;
            ASSERT_LE(covered, published);
          } else if (w->kind == Kind::kEndOfStream) {
            ASSERT_EQ(covered, published) << "end of stream before all data, seed " << seed;
            end_posted = true;
          }
        }
      }
      ASSERT_EQ(schedule.in_flight(), in_flight);
      ASSERT_LT(step, 100000) << "never delivered, seed " << seed;
    }
    EXPECT_EQ(covered, published) << "seed " << seed;
    EXPECT_TRUE(end_posted) << "seed " << seed;
    EXPECT_TRUE(schedule.delivered()) << "seed " << seed;
  }
}

}  // namespace
}  // namespace sparsereduce::rdma
