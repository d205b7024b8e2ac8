// The worker's side of one collective on one aggregator: which blocks to send when (streamed in increasing order
// within the window), and the checks on every RESULT (docs/PROTOCOL.md §4, §7). Pure logic: it never touches tensor
// memory; the caller copies block data.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "protocol/frame.h"
#include "protocol/layout.h"

namespace sparsereduce {

// A CONTRIBUTION to send: entries with data_bytes > 0 carry tensor block `block`.
struct OutgoingFrame {
  uint32_t slot = 0;
  std::vector<Entry> entries;
};

class WorkerSchedule {
 public:
  // `block_flags` holds one ScanBlocks flag byte per block of the tensor, `places` the layout's AllPlaces (shared
  // by the schedules of all aggregators); both must outlive the schedule.
  WorkerSchedule(const JobShape& shape, uint32_t aggregator_index, const CollectiveSpec& spec,
                 uint32_t element_size, std::span<const uint8_t> block_flags,
                 std::span<const ColumnLayout::ColumnPlace> places);

  // Starts one slot: appends its announce and its first CONTRIBUTIONs (as many as the window allows) to
  // `*frames`, or returns false and appends nothing when the slot has no block. The flags of the slot's blocks
  // (layout().ForEachRun) must be final. Each slot is started once; the schedule is done only when all were started.
  bool StartSlot(uint32_t slot, std::vector<OutgoingFrame>* frames);

  // Checks a RESULT's entry table on `slot` (blocks, next indices, data sizes) and advances. On success, appends
  // to `*frames` the CONTRIBUTIONs that the blocks it aggregated let into the window (often none). The caller then
  // reads the data of `entries` into the tensor and checks its content (codec::CheckWireBlock). A non-ok status is
  // a protocol violation by the aggregator.
  Status OnResult(uint32_t slot, std::span<const Entry> entries, std::vector<OutgoingFrame>* frames);

  bool done() const { return started_slots_ == slots_.size() && active_slots_ == 0; }
  // Frames sent whose records the schedule still keeps, over all slots: those from each slot's oldest frame with
  // a block not yet aggregated on. Bounded by the frames in flight (the window's, and the finished ones behind an
  // old unfinished frame), not by the collective's length.
  size_t frame_records() const;
  const ColumnLayout& layout() const { return layout_; }

 private:
  struct Lane {
    uint64_t cur = 0;      // block the aggregator aggregates next (END: finished)
    uint64_t my_next = 0;  // own next nonzero block not yet aggregated
  };
  struct Slot {
    uint32_t lanes = 0;
    uint32_t active_lanes = 0;
    bool replied = false;  // the announce reply arrived; RESULTs then carry blocks
    std::vector<Lane> lane;
    std::vector<uint64_t> column;  // per lane
    // Sending: the own blocks go out in increasing order; the next one to consider is (send_row, send_lane).
    uint64_t send_row = 0;
    uint32_t send_lane = 0;
    bool all_sent = false;
    // The frames sent from the oldest one with a block not yet aggregated on (the ones before it are dropped, so
    // that these hold about the window's frames, not one entry per frame of the collective): the first block of
    // each, increasing, and how many of its blocks are not aggregated yet.
    std::deque<uint64_t> frame_first;
    std::deque<uint32_t> frame_waiting;
    bool any_sent = false;
    uint64_t last_sent = 0;               // the last block sent (when any_sent)
    uint32_t held_frames = 0;             // frames with blocks not yet aggregated (at most the window)
  };

  uint64_t NextNonzero(uint64_t from) const;  // first nonzero block >= from in from's column, or END
  // Appends CONTRIBUTIONs of the next own blocks while the window has room.
  void SendBlocks(Slot& slot, uint32_t s, std::vector<OutgoingFrame>* frames);
  Status OnAnnounceReply(Slot& slot, uint32_t s, std::span<const Entry> entries, std::vector<OutgoingFrame>* frames);
  // One of the own blocks was aggregated: its frame waits for one block less.
  void Aggregated(Slot& slot, uint64_t block);

  JobShape shape_;
  uint32_t aggregator_;
  ColumnLayout layout_;
  uint32_t element_size_;
  codec::WireFormat download_;
  std::span<const uint8_t> flags_;
  std::vector<Slot> slots_;
  std::span<const ColumnLayout::ColumnPlace> places_;  // layout_.AllPlaces(): a RESULT entry's lane
  uint32_t active_slots_ = 0;
  uint32_t started_slots_ = 0;
};

}  // namespace sparsereduce
