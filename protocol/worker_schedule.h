// The worker's side of one collective on one aggregator: which blocks to send in which round, and the checks on
// every RESULT (docs/PROTOCOL.md §4, §7). Pure logic: it never touches tensor memory; the caller copies block data.
#pragma once

#include <cstdint>
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
  // `block_flags` holds one ScanBlocks flag byte per block of the tensor and must outlive the schedule.
  WorkerSchedule(const JobShape& shape, uint32_t aggregator_index, const CollectiveSpec& spec,
                 uint32_t element_size, std::span<const uint8_t> block_flags);

  // Starts one slot: its announce frame in `*frame`, or false when the slot has no block. The flags of the slot's
  // blocks (layout().ForEachRun) must be final. Each slot is started once; the schedule is done only when all
  // were started.
  bool StartSlot(uint32_t slot, OutgoingFrame* frame);

  // Checks a RESULT on `slot` and advances. On success, `*next` receives the frame to send on the slot in the
  // following round, or is left empty when this worker contributes nothing to it (or the slot finished). The
  // caller then copies the data of `entries` into the tensor. A non-ok status is a protocol violation by the
  // aggregator.
  Status OnResult(uint32_t slot, std::span<const EntryView> entries, OutgoingFrame* next, bool* has_next);

  bool done() const { return started_slots_ == slots_.size() && active_slots_ == 0; }
  const ColumnLayout& layout() const { return layout_; }

 private:
  struct Lane {
    uint64_t cur = 0;      // block the aggregator aggregates next (END: finished)
    uint64_t my_next = 0;  // own next nonzero block not yet sent
  };
  struct Slot {
    uint32_t lanes = 0;
    uint32_t round = 0;
    uint32_t active_lanes = 0;
    bool awaiting_result = false;
    std::vector<Lane> lane;
  };

  uint64_t NextNonzero(uint64_t from) const;  // first nonzero block >= from in from's column, or END
  void BuildContribution(Slot& slot, uint32_t s, OutgoingFrame* out, bool* has_next);

  JobShape shape_;
  uint32_t aggregator_;
  ColumnLayout layout_;
  uint32_t element_size_;
  codec::WireFormat download_;
  std::span<const uint8_t> flags_;
  std::vector<Slot> slots_;
  uint32_t active_slots_ = 0;
  uint32_t started_slots_ = 0;
};

}  // namespace sparsereduce
