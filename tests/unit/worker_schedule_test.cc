// WorkerSchedule on its own, against a scripted aggregator of one rank (the whole job's exchange is in
// protocol_simulation_test).
#include "protocol/worker_schedule.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "core/block_scan.h"

namespace sparsereduce {
namespace {

// Plays the aggregator of a one-rank job: answers the announce, then aggregates sent blocks lane by lane, in an
// order `pick` chooses among the lanes whose current block has been sent. Returns the largest frame_records() seen.
template <typename Pick>
size_t RunAlone(WorkerSchedule& schedule, Pick pick) {
  const ColumnLayout& layout = schedule.layout();
  std::vector<OutgoingFrame> frames;
  EXPECT_TRUE(schedule.StartSlot(0, &frames));
  const uint32_t lanes = layout.NonEmptyLanes(0, 0);
  std::vector<uint64_t> cur(lanes);
  std::vector<Entry> reply;
  for (uint32_t k = 0; k < lanes; ++k) {
    cur[k] = layout.Column(0, 0, k);
    reply.push_back(Entry{cur[k], cur[k], 0});  // every block is nonzero: the first block of the column comes first
  }
  uint64_t sent_up_to = 0;  // blocks below this were sent (every block is nonzero: sent in increasing order)
  auto take = [&](const std::vector<OutgoingFrame>& out) {
    for (const OutgoingFrame& frame : out) {
      for (const Entry& e : frame.entries) {
        if (e.data_bytes > 0) sent_up_to = std::max(sent_up_to, e.block + 1);
      }
    }
  };
  take(frames);
  frames.clear();
  EXPECT_TRUE(schedule.OnResult(0, reply, &frames).ok());
  take(frames);
  size_t most = schedule.frame_records();
  while (!schedule.done()) {
    std::vector<uint32_t> ready;
    for (uint32_t k = 0; k < lanes; ++k) {
      if (cur[k] != kEndOfColumn && cur[k] < sent_up_to) ready.push_back(k);
    }
    if (ready.empty()) {
      ADD_FAILURE() << "no lane has a sent block to aggregate: the schedule stalled";
      break;
    }
    const uint32_t k = pick(ready);
    const uint64_t next = cur[k] + layout.num_columns() < layout.num_blocks() ? cur[k] + layout.num_columns()
                                                                               : kEndOfColumn;
    const Entry result{cur[k], next, layout.BlockBytes(cur[k])};
    frames.clear();
    const Status st = schedule.OnResult(0, std::span(&result, 1), &frames);
    if (!st.ok()) {
      ADD_FAILURE() << st.ToString();
      break;
    }
    take(frames);
    cur[k] = next;
    most = std::max(most, schedule.frame_records());
  }
  return most;
}

TEST(WorkerSchedule, FrameRecordsFollowTheWindowNotTheCollectivesLength) {
  // Two one-element blocks per frame: 2048 frames in all.
  const JobShape shape{1, 1, 1, 2, 2};
  const CollectiveSpec spec{4096, DType::kFloat32, ReduceOp::kSum, 1};
  const std::vector<uint8_t> flags(spec.element_count, kBlockNonzero);
  const std::vector<ColumnLayout::ColumnPlace> places = ColumnLayout(shape, spec.element_count, 1, 4).AllPlaces();
  {
    WorkerSchedule schedule(shape, 0, spec, 4, flags, places);
    const size_t most = RunAlone(schedule, [](const std::vector<uint32_t>& ready) { return ready[0]; });
    EXPECT_TRUE(schedule.done());
    EXPECT_LE(most, shape.window) << "in order, only the held frames need a record";
    EXPECT_EQ(schedule.frame_records(), 0u);
  }
  {
    // The lanes in a random order: frames complete out of order, and the records end with the last one.
    std::mt19937_64 rng(3);
    WorkerSchedule schedule(shape, 0, spec, 4, flags, places);
    RunAlone(schedule, [&](const std::vector<uint32_t>& ready) { return ready[rng() % ready.size()]; });
    EXPECT_TRUE(schedule.done());
    EXPECT_EQ(schedule.frame_records(), 0u);
  }
}

}  // namespace
}  // namespace sparsereduce
