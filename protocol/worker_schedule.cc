#include "protocol/worker_schedule.h"

#include <algorithm>

#include "core/block_scan.h"
#include "protocol/frame_format.h"

namespace sparsereduce {

WorkerSchedule::WorkerSchedule(const JobShape& shape, uint32_t aggregator_index, const CollectiveSpec& spec,
                               uint32_t element_size, std::span<const uint8_t> block_flags,
                               std::span<const ColumnLayout::ColumnPlace> places)
    : shape_(shape),
      aggregator_(aggregator_index),
      layout_(shape, spec.element_count, spec.block_size, element_size),
      element_size_(element_size),
      download_(DownloadFormat(spec.codec)),
      flags_(block_flags),
      slots_(shape.slots),
      places_(places) {}

uint64_t WorkerSchedule::NextNonzero(uint64_t from) const {
  const uint64_t stride = layout_.num_columns();
  for (uint64_t b = from; b < layout_.num_blocks(); b += stride) {
    if (flags_[b] & kBlockNonzero) return b;
  }
  return kEndOfColumn;
}

bool WorkerSchedule::StartSlot(uint32_t s, std::vector<OutgoingFrame>* frames) {
  ++started_slots_;
  Slot& slot = slots_[s];
  slot.lanes = layout_.NonEmptyLanes(aggregator_, s);
  if (slot.lanes == 0) return false;
  ++active_slots_;
  slot.active_lanes = slot.lanes;
  slot.lane.resize(slot.lanes);
  slot.column.resize(slot.lanes);
  OutgoingFrame& announce = frames->emplace_back();
  announce.slot = s;
  announce.entries.reserve(slot.lanes);
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    const uint64_t column = layout_.Column(aggregator_, s, k);
    slot.column[k] = column;
    slot.lane[k].cur = column;
    slot.lane[k].my_next = NextNonzero(column);
    announce.entries.push_back(Entry{column, slot.lane[k].my_next, 0});
  }
  SendBlocks(slot, s, frames);
  return true;
}

void WorkerSchedule::SendBlocks(Slot& slot, uint32_t s, std::vector<OutgoingFrame>* frames) {
  const uint64_t columns = layout_.num_columns();
  const uint32_t K = shape_.blocks_per_message;
  while (!slot.all_sent && slot.held_frames < shape_.window) {
    OutgoingFrame frame;
    frame.slot = s;
    frame.entries.reserve(K);
    while (frame.entries.size() < K) {
      const uint64_t row_start = slot.send_row * columns;
      if (row_start >= layout_.num_blocks()) {
        slot.all_sent = true;
        break;
      }
      // Columns grow with the lane, so a block past the tensor ends the (last) row.
      const uint64_t block = row_start + slot.column[slot.send_lane];
      if (block >= layout_.num_blocks() || ++slot.send_lane == slot.lanes) {
        slot.send_lane = 0;
        ++slot.send_row;
      }
      if (block >= layout_.num_blocks() || !(flags_[block] & kBlockNonzero)) continue;
      frame.entries.push_back(Entry{block, NextNonzero(block + columns), layout_.BlockBytes(block)});
    }
    if (frame.entries.empty()) break;
    slot.frame_first.push_back(frame.entries.front().block);
    slot.any_sent = true;
    slot.last_sent = frame.entries.back().block;
    slot.frame_waiting.push_back(static_cast<uint32_t>(frame.entries.size()));
    ++slot.held_frames;
    frames->push_back(std::move(frame));
  }
}

size_t WorkerSchedule::frame_records() const {
  size_t records = 0;
  for (const Slot& slot : slots_) records += slot.frame_first.size();
  return records;
}

void WorkerSchedule::Aggregated(Slot& slot, uint64_t block) {
  const auto it = std::upper_bound(slot.frame_first.begin(), slot.frame_first.end(), block);
  const size_t f = static_cast<size_t>(it - slot.frame_first.begin()) - 1;  // a sent block lies in a held frame
  if (--slot.frame_waiting[f] != 0) return;
  --slot.held_frames;
  while (!slot.frame_waiting.empty() && slot.frame_waiting.front() == 0) {
    slot.frame_waiting.pop_front();
    slot.frame_first.pop_front();
  }
}

Status WorkerSchedule::OnResult(uint32_t s, std::span<const Entry> entries, std::vector<OutgoingFrame>* frames) {
  if (s >= slots_.size()) return ProtocolError("RESULT for slot " + std::to_string(s) + " out of range");
  Slot& slot = slots_[s];
  auto where = [&] { return "slot " + std::to_string(s); };
  if (slot.active_lanes == 0) return ProtocolError(where() + ": RESULT when none is due");
  if (!slot.replied) return OnAnnounceReply(slot, s, entries, frames);
  if (entries.empty()) return ProtocolError(where() + ": RESULT without entries");
  if (entries.size() > shape_.blocks_per_message) {
    return ProtocolError(where() + ": RESULT with " + std::to_string(entries.size()) + " entries, more than the " +
                         std::to_string(shape_.blocks_per_message) + " blocks per message");
  }

  // Entries are checked and applied one by one: a lane may advance more than once in one RESULT.
  const uint64_t columns = layout_.num_columns();
  for (const Entry& e : entries) {
    auto what = [&] { return where() + ", block " + std::to_string(e.block); };
    // A block below NB has its column below places_.size().
    const ColumnLayout::ColumnPlace* place =
        e.block < layout_.num_blocks() ? &places_[layout_.ColumnOf(e.block)] : nullptr;
    if (place == nullptr || place->aggregator != aggregator_ || place->slot != s) {
      return ProtocolError(what() + ": RESULT for a block that is not one of this slot's");
    }
    Lane& lane = slot.lane[place->lane];
    if (e.block != lane.cur) {
      return ProtocolError(what() + ": RESULT for a block other than its column's current one (" +
                           (lane.cur == kEndOfColumn ? std::string("finished") : std::to_string(lane.cur)) + ")");
    }
    const uint32_t elements = static_cast<uint32_t>(layout_.BlockElements(lane.cur));
    if (Status st = codec::CheckWireBytes(download_, elements, element_size_, e.data_bytes); !st.ok()) {
      return st.WithContext(what() + ": RESULT");
    }
    // After this block, this worker's next block to aggregate in the column; the new cur cannot lie beyond it.
    uint64_t my_next = lane.my_next;
    if (lane.cur == my_next) {
      if (!slot.any_sent || lane.cur > slot.last_sent) {
        return ProtocolError(what() + ": RESULT for a block of this worker that it has not sent yet");
      }
      my_next = NextNonzero(lane.cur + columns);
    }
    if (!layout_.IsLaterInColumn(e.next, lane.cur) || e.next > my_next) {
      return ProtocolError(what() + ": RESULT next index " + std::to_string(e.next) +
                           " is not a block of the column between the current one and this worker's own next (" +
                           std::to_string(my_next) + ")");
    }
    if (lane.cur == lane.my_next) Aggregated(slot, lane.cur);
    lane.my_next = my_next;
    lane.cur = e.next;
    if (lane.cur == kEndOfColumn && --slot.active_lanes == 0) --active_slots_;
  }
  if (slot.active_lanes > 0) SendBlocks(slot, s, frames);
  return Status::Ok();
}

Status WorkerSchedule::OnAnnounceReply(Slot& slot, uint32_t s, std::span<const Entry> entries,
                                       std::vector<OutgoingFrame>* frames) {
  // Validate everything before changing any state.
  auto where = [&] { return "slot " + std::to_string(s) + ", announce reply"; };
  if (entries.size() != slot.lanes) {
    return ProtocolError(where() + ": " + std::to_string(entries.size()) + " entries, expected one per column (" +
                         std::to_string(slot.lanes) + ")");
  }
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    const Lane& lane = slot.lane[k];
    const Entry& e = entries[k];
    auto what = [&] { return where() + ", block " + std::to_string(lane.cur); };
    if (e.block != lane.cur) return ProtocolError(what() + ": RESULT entry names block " + std::to_string(e.block));
    if (e.data_bytes != 0) return ProtocolError(what() + ": carries " + std::to_string(e.data_bytes) + " data bytes");
    if (!layout_.IsValidNext(e.next, lane.cur, lane.cur, /*inclusive=*/true) || e.next > lane.my_next) {
      return ProtocolError(what() + ": RESULT next index " + std::to_string(e.next) +
                           " is not a block of the column between the current one and this worker's own next (" +
                           std::to_string(lane.my_next) + ")");
    }
  }
  slot.replied = true;
  for (uint32_t k = 0; k < slot.lanes; ++k) {
    slot.lane[k].cur = entries[k].next;
    if (slot.lane[k].cur == kEndOfColumn) --slot.active_lanes;
  }
  if (slot.active_lanes == 0) {
    --active_slots_;
    return Status::Ok();
  }
  SendBlocks(slot, s, frames);
  return Status::Ok();
}

}  // namespace sparsereduce
