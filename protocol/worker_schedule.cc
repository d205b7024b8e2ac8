#include "protocol/worker_schedule.h"

#include "core/block_scan.h"
#include "protocol/frame_format.h"

namespace sparsereduce {

WorkerSchedule::WorkerSchedule(const JobShape& shape, uint32_t aggregator_index, const CollectiveSpec& spec,
                               uint32_t element_size, std::span<const uint8_t> block_flags)
    : shape_(shape),
      aggregator_(aggregator_index),
      layout_(shape, spec.element_count, spec.block_size, element_size),
      element_size_(element_size),
      download_(DownloadFormat(spec.codec)),
      flags_(block_flags),
      slots_(shape.slots) {}

uint64_t WorkerSchedule::NextNonzero(uint64_t from) const {
  const uint64_t stride = layout_.num_columns();
  for (uint64_t b = from; b < layout_.num_blocks(); b += stride) {
    if (flags_[b] & kBlockNonzero) return b;
  }
  return kEndOfColumn;
}

bool WorkerSchedule::StartSlot(uint32_t s, OutgoingFrame* frame) {
  ++started_slots_;
  Slot& slot = slots_[s];
  slot.lanes = layout_.NonEmptyLanes(aggregator_, s);
  if (slot.lanes == 0) return false;
  ++active_slots_;
  slot.active_lanes = slot.lanes;
  slot.awaiting_result = true;
  slot.lane.resize(slot.lanes);
  frame->slot = s;
  frame->entries.clear();
  frame->entries.reserve(slot.lanes);
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    const uint64_t column = layout_.Column(aggregator_, s, k);
    slot.lane[k].cur = column;
    slot.lane[k].my_next = NextNonzero(column);
    frame->entries.push_back(Entry{column, slot.lane[k].my_next, 0});
  }
  return true;
}

Status WorkerSchedule::OnResult(uint32_t s, std::span<const EntryView> entries, OutgoingFrame* next,
                                bool* has_next) {
  *has_next = false;
  if (s >= slots_.size()) return ProtocolError("RESULT for slot " + std::to_string(s) + " out of range");
  Slot& slot = slots_[s];
  auto where = [&] { return "slot " + std::to_string(s) + ", round " + std::to_string(slot.round); };
  if (!slot.awaiting_result) return ProtocolError(where() + ": RESULT when none is due");

  // Validate everything before changing any state.
  size_t i = 0;
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    const Lane& lane = slot.lane[k];
    if (lane.cur == kEndOfColumn) continue;
    if (i >= entries.size()) {
      return ProtocolError(where() + ": RESULT misses the entry for block " + std::to_string(lane.cur));
    }
    const EntryView& e = entries[i++];
    auto what = [&] { return where() + ", block " + std::to_string(lane.cur); };
    if (e.block != lane.cur) return ProtocolError(what() + ": RESULT entry names block " + std::to_string(e.block));
    if (slot.round == 0 && !e.data.empty()) {
      return ProtocolError(what() + ": round-0 RESULT carries " + std::to_string(e.data.size()) + " data bytes");
    }
    if (slot.round > 0) {
      const uint32_t elements = static_cast<uint32_t>(layout_.BlockElements(lane.cur));
      if (Status st = codec::CheckWireBlock(download_, elements, element_size_, e.data); !st.ok()) {
        return st.WithContext(what() + ": RESULT");
      }
    }
    const uint64_t column = layout_.ColumnOf(lane.cur);
    if (!layout_.IsValidNext(e.next, column, lane.cur, /*inclusive=*/slot.round == 0) || e.next > lane.my_next) {
      return ProtocolError(what() + ": RESULT next index " + std::to_string(e.next) +
                           " is not a block of the column between the current one and this worker's own next (" +
                           std::to_string(lane.my_next) + ")");
    }
  }
  if (i != entries.size()) {
    return ProtocolError(where() + ": RESULT has " + std::to_string(entries.size() - i) + " surplus entries");
  }

  i = 0;
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    Lane& lane = slot.lane[k];
    if (lane.cur == kEndOfColumn) continue;
    lane.cur = entries[i++].next;
    if (lane.cur == kEndOfColumn) --slot.active_lanes;
  }
  ++slot.round;
  slot.awaiting_result = false;
  if (slot.active_lanes == 0) {
    --active_slots_;
    return Status::Ok();
  }
  slot.awaiting_result = true;  // every round of an active slot ends with a RESULT, whether we send or not
  BuildContribution(slot, s, next, has_next);
  return Status::Ok();
}

void WorkerSchedule::BuildContribution(Slot& slot, uint32_t s, OutgoingFrame* out, bool* has_next) {
  out->slot = s;
  out->entries.clear();
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    Lane& lane = slot.lane[k];
    if (lane.cur == kEndOfColumn || lane.my_next != lane.cur) continue;
    const uint64_t following = NextNonzero(lane.cur + layout_.num_columns());
    out->entries.push_back(Entry{lane.cur, following, layout_.BlockBytes(lane.cur)});
    lane.my_next = following;
  }
  *has_next = !out->entries.empty();
}

}  // namespace sparsereduce
