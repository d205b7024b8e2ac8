#include "protocol/column_engine.h"

#include <algorithm>
#include <cstring>

#include "codec/ternary.h"
#include "protocol/frame_format.h"

namespace sparsereduce {

ColumnEngine::ColumnEngine(const JobShape& shape, uint32_t aggregator_index, uint64_t job, uint64_t seq,
                           const CollectiveSpec& spec, std::shared_ptr<BufferPool> pool,
                           codec::ErrorMemory* error_memory)
    : shape_(shape),
      aggregator_(aggregator_index),
      job_(job),
      seq_(seq),
      spec_(spec),
      kernels_(FindReduceKernels(spec.dtype, spec.op)),
      element_size_(FindDType(spec.dtype)->size),
      layout_(shape, spec.element_count, spec.block_size, element_size_),
      pool_(std::move(pool)),
      upload_(UploadFormat(spec.codec)),
      download_(DownloadFormat(spec.codec)),
      decodes_(upload_ != codec::WireFormat::kRaw || download_ != codec::WireFormat::kRaw),
      error_memory_(error_memory),
      slots_(shape.slots),
      place_(layout_.PlacesOf(aggregator_)) {
  if (decodes_) {
    sum_scratch_.resize(spec.block_size);
    trit_scratch_.resize(spec.block_size);
  }
  const uint32_t W = shape_.world_size;
  for (uint32_t s = 0; s < shape_.slots; ++s) {
    Slot& slot = slots_[s];
    slot.lanes = layout_.NonEmptyLanes(aggregator_, s);
    if (slot.lanes == 0) continue;
    ++active_slots_;
    slot.active_lanes = slot.lanes;
    slot.announces_missing = W;
    slot.cur.assign(slot.lanes, 0);
    slot.missing.assign(slot.lanes, 0);
    slot.expect.assign(size_t{slot.lanes} * W, kEndOfColumn);
    slot.queue_head.assign(size_t{slot.lanes} * W, kNone);
    slot.queue_tail.assign(size_t{slot.lanes} * W, kNone);
    slot.streams.resize(W);
  }
}

static_assert(sizeof(EntryView) + 8 <= ColumnEngine::kHeldBlockOverhead,
              "a queue node is an EntryView and two indices");

uint64_t ColumnEngine::MemoryBound(const JobShape& shape, uint64_t columns, uint64_t block_bytes,
                                   const ColumnLayout& layout) {
  const uint64_t entry = kEntrySize + Pad8(block_bytes);
  const uint64_t W = shape.world_size;
  const uint64_t places = layout.num_places() * sizeof(ColumnLayout::Place);
  return W * shape.window * columns * (entry + kHeldBlockOverhead) + columns * entry + W * columns * 16 + places;
}

uint64_t ColumnEngine::MaxResultBufferBytes(const JobShape& shape, uint64_t wire_block_bytes) {
  return 2 * (kFrameHeaderSize + MaxDataPayloadFor(shape.blocks_per_message, wire_block_bytes));
}

uint64_t ColumnEngine::ResultMemoryBound(const JobShape& shape, uint64_t owned_blocks, uint64_t columns,
                                         uint64_t wire_block_bytes) {
  const uint64_t frames = owned_blocks * (kFrameHeaderSize + kEntrySize + Pad8(wire_block_bytes)) +
                          columns * kEntrySize + uint64_t{shape.slots} * kFrameHeaderSize;
  return 4 * frames;
}

uint64_t ColumnEngine::MaxContributionPayload(uint32_t slot) const {
  return MaxDataPayloadFor(SlotColumns(slot), codec::MaxWireBytes(upload_, spec_.block_size, element_size_));
}

std::vector<uint32_t> ColumnEngine::AwaitedRanks() const {
  const uint32_t W = shape_.world_size;
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < W; ++r) {
    bool awaited = false;
    for (const Slot& slot : slots_) {
      if (slot.active_lanes == 0) continue;
      if (!slot.replied) {
        awaited = !slot.streams[r].announced;
      } else {
        for (uint32_t lane = 0; lane < slot.lanes && !awaited; ++lane) {
          const size_t i = size_t{lane} * W + r;
          awaited = slot.cur[lane] != kEndOfColumn && slot.queue_head[i] == kNone && slot.expect[i] == slot.cur[lane];
        }
      }
      if (awaited) break;
    }
    if (awaited) ranks.push_back(r);
  }
  return ranks;
}

std::string ColumnEngine::Where(uint32_t rank, uint32_t s) const {
  return "rank " + std::to_string(rank) + ", collective " + std::to_string(seq_) + ", slot " + std::to_string(s);
}

uint64_t ColumnEngine::Head(const Slot& slot, uint32_t lane, uint32_t rank) const {
  const size_t i = size_t{lane} * shape_.world_size + rank;
  const uint32_t node = slot.queue_head[i];
  return node == kNone ? slot.expect[i] : slot.streams[rank].nodes[node].entry.block;
}

Status ColumnEngine::OnContribution(uint32_t rank, const FrameHeader& header, ByteBuffer payload,
                                    std::vector<Broadcast>* out) {
  const uint32_t s = header.slot;
  if (rank >= shape_.world_size) return ProtocolError("rank " + std::to_string(rank) + " out of range");
  if (header.type != FrameType::kContribution || header.job != job_ || header.seq != seq_) {
    return ProtocolError(Where(rank, s) + ": frame of type " + FrameTypeName(header.type) + " for job " +
                         std::to_string(header.job) + " collective " + std::to_string(header.seq) +
                         " given to job " + std::to_string(job_) + " collective " + std::to_string(seq_));
  }
  if (s >= slots_.size()) {
    return ProtocolError(Where(rank, s) + ": slot out of range (slots=" + std::to_string(slots_.size()) + ")");
  }
  Slot& slot = slots_[s];
  if (payload.on_loan() && upload_ != codec::WireFormat::kRaw) payload = CopyOf(payload);
  if (slot.lanes == 0) return ProtocolError(Where(rank, s) + ": contribution for a slot with no blocks");
  if (slot.active_lanes == 0) return ProtocolError(Where(rank, s) + ": contribution after the slot finished");
  std::vector<uint32_t>& ready = scratch_ready_;
  ready.clear();
  Status st = slot.streams[rank].announced ? OnBlocks(rank, slot, s, header, std::move(payload), &ready)
                                           : OnAnnounce(rank, slot, s, header, payload);
  if (!st.ok()) return st;
  if (!slot.replied) {
    if (slot.announces_missing > 0) return Status::Ok();
    AnnounceReply(slot, s, out);
    for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
      if (slot.cur[lane] != kEndOfColumn && slot.missing[lane] == 0) ready.push_back(lane);
    }
  }
  for (uint32_t lane : ready) AggregateLane(slot, s, lane, out);
  FlushResult(s, out);
  if (slot.active_lanes == 0) {
    --active_slots_;
    std::vector<Stream>().swap(slot.streams);
  }
  return Status::Ok();
}

Status ColumnEngine::OnAnnounce(uint32_t rank, Slot& slot, uint32_t s, const FrameHeader& header,
                                const ByteBuffer& payload) {
  std::vector<EntryView>& entries = scratch_entries_;
  if (Status st = Decode(header, payload, &entries); !st.ok()) return st.WithContext(Where(rank, s));
  if (entries.size() != slot.lanes) {
    return ProtocolError(Where(rank, s) + ", announce: " + std::to_string(entries.size()) +
                         " entries, expected one per non-empty column (" + std::to_string(slot.lanes) + ")");
  }
  const uint32_t W = shape_.world_size;
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const EntryView& e = entries[lane];
    const uint64_t column = layout_.Column(aggregator_, s, lane);
    if (e.block != column || !e.data.empty()) {
      return ProtocolError(Where(rank, s) + ", announce, lane " + std::to_string(lane) + ": entry must be (block " +
                           std::to_string(column) + ", no data), got block " + std::to_string(e.block) + " with " +
                           std::to_string(e.data.size()) + " data bytes");
    }
    if (!layout_.IsValidNext(e.next, column, column, /*inclusive=*/true)) {
      return ProtocolError(Where(rank, s) + ", announce: next index " + std::to_string(e.next) +
                           " is not a block of column " + std::to_string(column));
    }
  }
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) slot.expect[size_t{lane} * W + rank] = entries[lane].next;
  slot.streams[rank].announced = true;
  --slot.announces_missing;
  return Status::Ok();
}

Status ColumnEngine::UnexpectedBlock(uint32_t rank, const Slot& slot, uint32_t s, uint64_t block) const {
  const std::string where = Where(rank, s) + ", block " + std::to_string(block);
  if (block >= layout_.num_blocks()) {
    return ProtocolError(where + ": beyond the tensor's " + std::to_string(layout_.num_blocks()) + " blocks");
  }
  const uint64_t column = layout_.ColumnOf(block);
  if (place_[column].slot != s) {
    return ProtocolError(where + ": not a block of this slot of aggregator " + std::to_string(aggregator_));
  }
  const uint64_t expected = slot.expect[size_t{place_[column].lane} * shape_.world_size + rank];
  if (expected != block) {
    return ProtocolError(where + ": the rank announced " +
                         (expected == kEndOfColumn ? std::string("no further block")
                                                   : "block " + std::to_string(expected)) +
                         " as its next one in column " + std::to_string(column));
  }
  return ProtocolError(where + ": blocks must come in increasing order, after block " +
                       std::to_string(slot.streams[rank].last_block));
}

Status ColumnEngine::WindowRoom(uint32_t rank, const Slot& slot, uint32_t s) const {
  const Stream& stream = slot.streams[rank];
  if (stream.held_frames < shape_.window) return Status::Ok();
  uint64_t oldest = kEndOfColumn;  // the smallest block still waiting, to find the frames in a log
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint32_t n = slot.queue_head[size_t{lane} * shape_.world_size + rank];
    if (n != kNone) oldest = std::min(oldest, stream.nodes[n].entry.block);
  }
  return ProtocolError(Where(rank, s) + ": a frame beyond the window: " + std::to_string(shape_.window) +
                       " frames of this rank already wait for aggregation (the oldest waiting block is " +
                       std::to_string(oldest) + ")");
}

Status ColumnEngine::CheckWindow(uint32_t rank, uint32_t s) const {
  if (rank >= shape_.world_size || s >= slots_.size()) return Status::Ok();  // OnContribution names these
  const Slot& slot = slots_[s];
  // (A finished slot has given its streams up; OnContribution refuses frames for it.)
  if (slot.streams.empty() || !slot.streams[rank].announced) return Status::Ok();
  return WindowRoom(rank, slot, s);
}

Status ColumnEngine::OnBlocks(uint32_t rank, Slot& slot, uint32_t s, const FrameHeader& header, ByteBuffer payload,
                              std::vector<uint32_t>* ready) {
  const uint32_t W = shape_.world_size;
  Stream& stream = slot.streams[rank];
  if (Status room = WindowRoom(rank, slot, s); !room.ok()) return room;
  // Held before decoding, so that the entries point into the kept payload.
  uint32_t f;
  if (stream.free_frames.empty()) {
    f = static_cast<uint32_t>(stream.frames.size());
    stream.frames.emplace_back();
  } else {
    f = stream.free_frames.back();
    stream.free_frames.pop_back();
  }
  HeldFrame& frame = stream.frames[f];
  frame.payload = std::move(payload);
  frame.waiting = 0;
  std::vector<EntryView>& entries = scratch_entries_;
  if (Status st = Decode(header, frame.payload, &entries); !st.ok()) {
    return st.WithContext(Where(rank, s));
  }
  if (entries.empty()) return ProtocolError(Where(rank, s) + ": a CONTRIBUTION after the announce without entries");
  if (entries.size() > shape_.blocks_per_message) {
    return ProtocolError(Where(rank, s) + ": " + std::to_string(entries.size()) + " entries, more than the " +
                         std::to_string(shape_.blocks_per_message) + " blocks per message");
  }
  for (const EntryView& e : entries) {
    const uint64_t column = e.block < layout_.num_blocks() ? layout_.ColumnOf(e.block) : 0;
    if (e.block >= layout_.num_blocks() || place_[column].slot != s) return UnexpectedBlock(rank, slot, s, e.block);
    const uint32_t lane = place_[column].lane;
    const size_t i = size_t{lane} * W + rank;
    if (slot.expect[i] != e.block || (stream.any_block && e.block <= stream.last_block)) {
      return UnexpectedBlock(rank, slot, s, e.block);
    }
    // The context string is built only on the error path: this loop runs for every block received.
    auto where = [&] { return Where(rank, s) + ", block " + std::to_string(e.block); };
    if (e.data.empty()) return ProtocolError(where() + ": entry without data");
    if (Status st = codec::CheckWireBlock(upload_, static_cast<uint32_t>(layout_.BlockElements(e.block)),
                                          element_size_, e.data);
        !st.ok()) {
      return st.WithContext(where());
    }
    if (!layout_.IsLaterInColumn(e.next, e.block)) {
      return ProtocolError(where() + ": next index " + std::to_string(e.next) + " is not a later block of the column");
    }
    uint32_t n;
    if (stream.free_nodes.empty()) {
      n = static_cast<uint32_t>(stream.nodes.size());
      stream.nodes.emplace_back();
    } else {
      n = stream.free_nodes.back();
      stream.free_nodes.pop_back();
    }
    stream.nodes[n] = Queued{e, f, kNone};
    if (slot.queue_tail[i] == kNone) {
      slot.queue_head[i] = n;
      // The lane waited for exactly this block.
      if (slot.replied && slot.cur[lane] == e.block && --slot.missing[lane] == 0) ready->push_back(lane);
    } else {
      stream.nodes[slot.queue_tail[i]].next = n;
    }
    slot.queue_tail[i] = n;
    slot.expect[i] = e.next;
    stream.last_block = e.block;
    stream.any_block = true;
    ++frame.waiting;
  }
  ++stream.held_frames;
  // Blocks come in increasing order, so a column whose next block lies below the last one received was skipped:
  // that block can never come. Checked once per frame rather than per block.
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t expected = slot.expect[size_t{lane} * W + rank];
    if (expected < stream.last_block) {
      return ProtocolError(Where(rank, s) + ", block " + std::to_string(stream.last_block) +
                           ": blocks must come in increasing order, and the rank's block " + std::to_string(expected) +
                           " (column " + std::to_string(layout_.ColumnOf(expected)) + ") has not come yet");
    }
  }
  return Status::Ok();
}

uint32_t ColumnEngine::CountMissing(const Slot& slot, uint32_t lane) const {
  const uint32_t W = shape_.world_size;
  uint32_t missing = 0;
  for (uint32_t r = 0; r < W; ++r) {
    const size_t i = size_t{lane} * W + r;
    if (slot.queue_head[i] == kNone && slot.expect[i] == slot.cur[lane]) ++missing;
  }
  return missing;
}

void ColumnEngine::Release(Slot& slot, uint32_t lane, uint32_t rank) {
  const size_t i = size_t{lane} * shape_.world_size + rank;
  Stream& stream = slot.streams[rank];
  const uint32_t n = slot.queue_head[i];
  slot.queue_head[i] = stream.nodes[n].next;
  if (slot.queue_head[i] == kNone) slot.queue_tail[i] = kNone;
  stream.free_nodes.push_back(n);
  HeldFrame& frame = stream.frames[stream.nodes[n].frame];
  if (--frame.waiting == 0) {
    frame.payload = ByteBuffer();
    stream.free_frames.push_back(stream.nodes[n].frame);
    --stream.held_frames;
  }
}

Status ColumnEngine::Decode(const FrameHeader& header, const ByteBuffer& payload, std::vector<EntryView>* entries) {
  if (!payload.on_loan()) return DecodeDataPayload(header, payload.span(), entries);
  const uint64_t table_bytes = std::min<uint64_t>(uint64_t{header.entry_count} * kEntrySize, payload.size());
  scratch_table_.assign(payload.data(), payload.data() + table_bytes);
  return DecodeDataPayload(header, scratch_table_, payload.span(), entries);
}

ByteBuffer ColumnEngine::CopyOf(const ByteBuffer& payload) {
  ByteBuffer copy = pool_ ? pool_->Acquire(payload.size()) : ByteBuffer(payload.size());
  // An empty buffer's data() may be null, which memcpy may not be given even for 0 bytes (no transport lends an
  // empty payload today; the fuzzer did).
  if (payload.size() > 0) std::memcpy(copy.data(), payload.data(), payload.size());
  return copy;
}

void ColumnEngine::ReturnLoans(uint32_t rank) {
  if (rank >= shape_.world_size) return;
  for (Slot& slot : slots_) {
    if (slot.streams.empty()) continue;  // finished
    Stream& stream = slot.streams[rank];
    for (uint32_t f = 0; f < stream.frames.size(); ++f) {
      HeldFrame& frame = stream.frames[f];
      if (frame.waiting == 0 || !frame.payload.on_loan()) continue;
      ByteBuffer copy = CopyOf(frame.payload);
      // The queued blocks of the frame point into it: move them over (a free node may still name the frame).
      const auto old_begin = reinterpret_cast<uintptr_t>(frame.payload.data());
      for (Queued& node : stream.nodes) {
        const auto data = reinterpret_cast<uintptr_t>(node.entry.data.data());
        if (node.frame != f || data < old_begin || data - old_begin >= frame.payload.size()) continue;
        node.entry.data = {copy.data() + (data - old_begin), node.entry.data.size()};
      }
      frame.payload = std::move(copy);
    }
  }
}

void ColumnEngine::AnnounceReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out) {
  const uint32_t W = shape_.world_size;
  std::vector<Entry> entries(slot.lanes);
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    uint64_t cur = kEndOfColumn;
    for (uint32_t r = 0; r < W; ++r) cur = std::min(cur, Head(slot, lane, r));
    slot.cur[lane] = cur;
    if (cur == kEndOfColumn) {
      --slot.active_lanes;
    } else {
      slot.missing[lane] = CountMissing(slot, lane);
    }
    entries[lane] = Entry{layout_.Column(aggregator_, s, lane), cur, 0};
  }
  slot.replied = true;
  FrameHeader header{FrameType::kResult, 0, s, job_, seq_, 0};
  out->push_back({s, std::make_shared<const ByteBuffer>(EncodeDataFrame(header, entries, {}))});
}

void ColumnEngine::AggregateLane(Slot& slot, uint32_t s, uint32_t lane, std::vector<Broadcast>* out) {
  const uint32_t W = shape_.world_size;
  std::vector<const EntryView*>& contributions = scratch_contributions_;
  std::vector<uint32_t>& contributors = scratch_contributors_;
  while (slot.cur[lane] != kEndOfColumn && slot.missing[lane] == 0) {
    const uint64_t cur = slot.cur[lane];
    contributions.clear();
    contributors.clear();
    uint64_t new_cur = kEndOfColumn;
    for (uint32_t r = 0; r < W; ++r) {
      const size_t i = size_t{lane} * W + r;
      const uint32_t n = slot.queue_head[i];
      const std::vector<Queued>& nodes = slot.streams[r].nodes;
      if (n != kNone && nodes[n].entry.block == cur) {
        contributions.push_back(&nodes[n].entry);
        contributors.push_back(r);
        const uint32_t following = nodes[n].next;
        new_cur = std::min(new_cur, following == kNone ? slot.expect[i] : nodes[following].entry.block);
      } else {
        new_cur = std::min(new_cur, Head(slot, lane, r));
      }
    }
    // cur is the smallest head and no rank whose head it is misses it, so the lane has at least one contributor;
    // they are in ascending rank order (§6).
    std::byte* data = ResultSpace(s, out);
    uint32_t bytes;
    if (!decodes_) {
      bytes = layout_.BlockBytes(cur);
      const size_t count = bytes / element_size_;
      kernels_->first(data, contributions[0]->data.data(), count);
      for (size_t c = 1; c < contributions.size(); ++c)
        kernels_->accumulate(data, contributions[c]->data.data(), count);
    } else {
      // Codecs: contributions decoded and summed in fp32, the sum encoded in the download format.
      const uint32_t n = static_cast<uint32_t>(layout_.BlockElements(cur));
      for (size_t c = 0; c < contributions.size(); ++c) {
        // Checked whole when the frame arrived (OnBlocks), so decoding cannot fail here.
        (void)codec::DecodeFloats(upload_, contributions[c]->data, n, sum_scratch_.data(), c > 0);
      }
      bytes = EncodeResult(cur, sum_scratch_.data(), n, data);
    }
    std::memset(data + bytes, 0, Pad8(bytes) - bytes);
    AddResult(Entry{cur, new_cur, bytes});
    for (uint32_t r : contributors) Release(slot, lane, r);
    slot.cur[lane] = new_cur;
    ++blocks_aggregated_;
    if (new_cur == kEndOfColumn) {
      --slot.active_lanes;
    } else {
      slot.missing[lane] = CountMissing(slot, lane);
    }
  }
}

std::byte* ColumnEngine::ResultSpace(uint32_t s, std::vector<Broadcast>* out) {
  const uint32_t K = shape_.blocks_per_message;
  if (result_entries_.size() == K) FlushResult(s, out);
  const uint64_t table_end = kFrameHeaderSize + uint64_t{kEntrySize} * K;
  if (!result_frame_) {
    const uint64_t size =
        kFrameHeaderSize + MaxDataPayloadFor(K, codec::MaxWireBytes(download_, spec_.block_size, element_size_));
    result_frame_ = std::make_shared<ByteBuffer>(pool_ ? pool_->Acquire(size) : ByteBuffer(size));
    result_data_bytes_ = 0;
  }
  return result_frame_->data() + table_end + result_data_bytes_;
}

void ColumnEngine::AddResult(const Entry& entry) {
  result_entries_.push_back(entry);
  result_data_bytes_ += Pad8(entry.data_bytes);
}

void ColumnEngine::FlushResult(uint32_t s, std::vector<Broadcast>* out) {
  if (result_entries_.empty()) return;
  const uint64_t table_end = kFrameHeaderSize + uint64_t{kEntrySize} * shape_.blocks_per_message;
  const uint64_t prefix = kFrameHeaderSize + uint64_t{kEntrySize} * result_entries_.size();
  const uint64_t size = prefix + result_data_bytes_;
  if (2 * size < result_frame_->size()) {
    // A RESULT may wait in the send queues of slow members; it should not hold the room of K blocks for a few.
    auto exact = std::make_shared<ByteBuffer>(pool_ ? pool_->Acquire(size) : ByteBuffer(size));
    std::memcpy(exact->data() + prefix, result_frame_->data() + table_end, result_data_bytes_);
    result_frame_ = std::move(exact);
  } else if (prefix != table_end) {
    std::memmove(result_frame_->data() + prefix, result_frame_->data() + table_end, result_data_bytes_);
  }
  EncodeDataPrefix({FrameType::kResult, 0, s, job_, seq_, 0}, result_entries_, result_frame_->data());
  result_frame_->Shrink(size);
  out->push_back({s, std::move(result_frame_)});
  result_frame_.reset();
  result_entries_.clear();
}

uint32_t ColumnEngine::EncodeResult(uint64_t block, float* sum, uint32_t n, std::byte* out) {
  if (download_ != codec::WireFormat::kTernary) return codec::EncodeFloats(download_, sum, n, out);
  // 3LC on the result: per-block scale, error feedback per block of this aggregator for the collective's key.
  float* error = error_memory_->Block(layout_.LocalBlock(block));
  // A sum that is not finite (a contribution was, or it overflowed) goes out as such and leaves E_b unchanged.
  const float scale = codec::ScaleOf(codec::MaxAbsWithError(sum, error, n), spec_.codec.sparsity);
  codec::QuantizeWithError(sum, error, n, scale, trit_scratch_.data());
  return static_cast<uint32_t>(codec::EncodeTernary(trit_scratch_.data(), n, scale, out));
}

}  // namespace sparsereduce
