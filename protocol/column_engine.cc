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
      slots_(shape.slots) {
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
    slot.cur.assign(slot.lanes, 0);
    slot.next.assign(size_t{slot.lanes} * W, kEndOfColumn);
    slot.expected.assign(W, 1);  // round 0: everyone announces
    slot.awaited = W;
    slot.pending.resize(W);
  }
}

uint64_t ColumnEngine::MaxContributionPayload() const {
  return MaxDataPayloadFor(shape_.blocks_per_message, codec::MaxWireBytes(upload_, spec_.block_size, element_size_));
}

std::vector<uint32_t> ColumnEngine::AwaitedRanks() const {
  std::vector<uint32_t> ranks;
  for (uint32_t r = 0; r < shape_.world_size; ++r) {
    for (const Slot& slot : slots_) {
      if (slot.active_lanes > 0 && slot.expected[r]) {
        ranks.push_back(r);
        break;
      }
    }
  }
  return ranks;
}

std::string ColumnEngine::Where(uint32_t rank, uint32_t s) const {
  return "rank " + std::to_string(rank) + ", collective " + std::to_string(seq_) + ", slot " + std::to_string(s);
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
  if (slot.lanes == 0) return ProtocolError(Where(rank, s) + ": contribution for a slot with no blocks");
  if (slot.active_lanes == 0) return ProtocolError(Where(rank, s) + ": contribution after the slot finished");
  if (!slot.expected[rank]) {
    return ProtocolError(Where(rank, s) + ", round " + std::to_string(slot.round) +
                         ": unexpected contribution (already sent, or nothing to contribute in this round)");
  }

  Pending& pending = slot.pending[rank];
  if (Status st = DecodeDataPayload(header, payload.span(), &pending.entries); !st.ok()) {
    return st.WithContext(Where(rank, s));
  }
  Status st = slot.round == 0 ? ValidateAnnounce(rank, slot, s, pending.entries)
                              : ValidateRound(rank, slot, s, pending.entries);
  if (!st.ok()) return st;
  pending.payload = std::move(payload);
  slot.expected[rank] = 0;
  if (--slot.awaited == 0) CompleteRound(slot, s, out);
  return Status::Ok();
}

Status ColumnEngine::ValidateAnnounce(uint32_t rank, Slot& slot, uint32_t s,
                                      const std::vector<EntryView>& entries) const {
  if (entries.size() != slot.lanes) {
    return ProtocolError(Where(rank, s) + ", round 0: " + std::to_string(entries.size()) +
                         " announce entries, expected one per non-empty column (" + std::to_string(slot.lanes) + ")");
  }
  const uint32_t W = shape_.world_size;
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const EntryView& e = entries[lane];
    const uint64_t column = layout_.Column(aggregator_, s, lane);
    if (e.block != column || !e.data.empty()) {
      return ProtocolError(Where(rank, s) + ", round 0, lane " + std::to_string(lane) + ": announce entry must be (block " +
                           std::to_string(column) + ", no data), got block " + std::to_string(e.block) + " with " +
                           std::to_string(e.data.size()) + " data bytes");
    }
    if (!layout_.IsValidNext(e.next, column, column, /*inclusive=*/true)) {
      return ProtocolError(Where(rank, s) + ", round 0: next index " + std::to_string(e.next) +
                           " is not a block of column " + std::to_string(column));
    }
  }
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) slot.next[size_t{lane} * W + rank] = entries[lane].next;
  return Status::Ok();
}

Status ColumnEngine::ValidateRound(uint32_t rank, Slot& slot, uint32_t s,
                                   const std::vector<EntryView>& entries) const {
  const uint32_t W = shape_.world_size;
  size_t i = 0;
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t cur = slot.cur[lane];
    if (cur == kEndOfColumn || slot.next[size_t{lane} * W + rank] != cur) continue;
    // The context string is built only on the error path: this loop runs for every block aggregated.
    auto where = [&] {
      return Where(rank, s) + ", round " + std::to_string(slot.round) + ", block " + std::to_string(cur);
    };
    if (i >= entries.size()) return ProtocolError(where() + ": missing entry for the block being aggregated");
    const EntryView& e = entries[i++];
    if (e.block != cur) {
      return ProtocolError(where() + ": entry names block " + std::to_string(e.block) + " instead");
    }
    const uint32_t elements = static_cast<uint32_t>(layout_.BlockElements(cur));
    if (Status st = codec::CheckWireBlock(upload_, elements, element_size_, e.data); !st.ok()) {
      return st.WithContext(where());
    }
    if (!layout_.IsValidNext(e.next, layout_.ColumnOf(cur), cur, /*inclusive=*/false)) {
      return ProtocolError(where() + ": next index " + std::to_string(e.next) + " is not a later block of the column");
    }
  }
  if (i != entries.size()) {
    return ProtocolError(Where(rank, s) + ", round " + std::to_string(slot.round) + ": " +
                         std::to_string(entries.size() - i) + " entries for blocks not being aggregated");
  }
  return Status::Ok();
}

void ColumnEngine::CompleteRound(Slot& slot, uint32_t s, std::vector<Broadcast>* out) {
  if (slot.round == 0) {
    AnnounceReply(slot, s, out);
  } else {
    AggregateReply(slot, s, out);
  }
  for (Pending& p : slot.pending) {
    p.payload = ByteBuffer();
    p.entries.clear();
  }
  ++slot.round;
  if (slot.active_lanes == 0) {
    --active_slots_;
    std::vector<Pending>().swap(slot.pending);
    return;
  }
  ComputeExpected(slot);
}

void ColumnEngine::ComputeExpected(Slot& slot) {
  const uint32_t W = shape_.world_size;
  slot.awaited = 0;
  std::fill(slot.expected.begin(), slot.expected.end(), 0);
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t cur = slot.cur[lane];
    if (cur == kEndOfColumn) continue;
    const uint64_t* next = &slot.next[size_t{lane} * W];
    for (uint32_t r = 0; r < W; ++r) {
      if (next[r] == cur && !slot.expected[r]) {
        slot.expected[r] = 1;
        ++slot.awaited;
      }
    }
  }
}

void ColumnEngine::AnnounceReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out) {
  const uint32_t W = shape_.world_size;
  std::vector<Entry> entries(slot.lanes);
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t* next = &slot.next[size_t{lane} * W];
    const uint64_t cur = *std::min_element(next, next + W);
    slot.cur[lane] = cur;
    if (cur == kEndOfColumn) --slot.active_lanes;
    entries[lane] = Entry{layout_.Column(aggregator_, s, lane), cur, 0};
  }
  FrameHeader header{FrameType::kResult, 0, s, job_, seq_, 0};
  out->push_back({s, std::make_shared<const ByteBuffer>(EncodeDataFrame(header, entries, {}))});
}

template <typename Combine>
void ColumnEngine::AggregateLanes(Slot& slot, Combine&& combine) {
  const uint32_t W = shape_.world_size;
  // Each contributor's entries are in lane order, so one cursor per rank finds its entry for the lane.
  std::vector<uint32_t> cursor(W, 0);
  std::vector<const EntryView*> contributions;
  contributions.reserve(W);
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t cur = slot.cur[lane];
    if (cur == kEndOfColumn) continue;
    uint64_t* next = &slot.next[size_t{lane} * W];
    contributions.clear();
    uint64_t new_cur = kEndOfColumn;
    for (uint32_t r = 0; r < W; ++r) {
      if (next[r] == cur) {
        contributions.push_back(&slot.pending[r].entries[cursor[r]++]);
        next[r] = contributions.back()->next;
      }
      new_cur = std::min(new_cur, next[r]);
    }
    // cur is the smallest announced next, so the lane has at least one contributor.
    combine(cur, std::span<const EntryView* const>(contributions), new_cur);
    slot.cur[lane] = new_cur;
    if (new_cur == kEndOfColumn) --slot.active_lanes;
    ++blocks_aggregated_;
  }
}

void ColumnEngine::AggregateReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out) {
  if (decodes_) return AggregateDecoded(slot, s, out);
  std::vector<Entry> entries;
  entries.reserve(slot.active_lanes);
  for (uint32_t lane = 0; lane < slot.lanes; ++lane) {
    const uint64_t cur = slot.cur[lane];
    if (cur != kEndOfColumn) entries.push_back(Entry{cur, 0, layout_.BlockBytes(cur)});
  }
  const size_t frame_size = kFrameHeaderSize + DataPayloadLength(entries);
  auto frame = std::make_shared<ByteBuffer>(pool_ ? pool_->Acquire(frame_size) : ByteBuffer(frame_size));

  // Sum straight into the outgoing frame.
  std::byte* data = frame->data() + kFrameHeaderSize + uint64_t{kEntrySize} * entries.size();
  size_t e = 0;
  AggregateLanes(slot, [&](uint64_t cur, std::span<const EntryView* const> contributions, uint64_t new_cur) {
    const uint32_t bytes = layout_.BlockBytes(cur);
    const size_t count = bytes / element_size_;
    kernels_->first(data, contributions[0]->data.data(), count);
    for (size_t i = 1; i < contributions.size(); ++i) {
      kernels_->accumulate(data, contributions[i]->data.data(), count);
    }
    std::memset(data + bytes, 0, Pad8(bytes) - bytes);
    data += Pad8(bytes);
    entries[e++].next = new_cur;
  });
  // Header and table last: the next indices are known only now.
  EncodeDataPrefix({FrameType::kResult, 0, s, job_, seq_, 0}, entries, frame->data());
  out->push_back({s, std::move(frame)});
}

uint32_t ColumnEngine::EncodeResult(uint64_t block, float* sum, uint32_t n, std::byte* out) {
  if (download_ != codec::WireFormat::kTernary) return codec::EncodeFloats(download_, sum, n, out);
  // 3LC on the result: per-block scale, error feedback per block of this aggregator for the collective's key.
  float* error = error_memory_->Block(layout_.LocalBlock(block));
  const float scale = codec::MaxAbsWithError(sum, error, n) * spec_.codec.sparsity;
  codec::QuantizeWithError(sum, error, n, scale, trit_scratch_.data());
  return static_cast<uint32_t>(codec::EncodeTernary(trit_scratch_.data(), n, scale, out));
}

void ColumnEngine::AggregateDecoded(Slot& slot, uint32_t s, std::vector<Broadcast>* out) {
  // Decode and sum every lane's block in fp32, encode each sum into a slot scratch, then frame them: ternary sizes
  // are known only once encoded.
  const uint32_t max_bytes = codec::MaxWireBytes(download_, spec_.block_size, element_size_);
  result_scratch_.resize(size_t{slot.active_lanes} * Pad8(max_bytes));
  std::vector<Entry> entries;
  entries.reserve(slot.active_lanes);
  uint64_t data_length = 0;
  AggregateLanes(slot, [&](uint64_t cur, std::span<const EntryView* const> contributions, uint64_t new_cur) {
    const uint32_t n = static_cast<uint32_t>(layout_.BlockElements(cur));
    for (size_t i = 0; i < contributions.size(); ++i) {
      // Checked whole when the frame arrived (ValidateRound), so decoding cannot fail here.
      (void)codec::DecodeFloats(upload_, contributions[i]->data, n, sum_scratch_.data(), i > 0);
    }
    const uint32_t bytes = EncodeResult(cur, sum_scratch_.data(), n, result_scratch_.data() + data_length);
    std::memset(result_scratch_.data() + data_length + bytes, 0, Pad8(bytes) - bytes);
    data_length += Pad8(bytes);
    entries.push_back(Entry{cur, new_cur, bytes});
  });
  const size_t prefix = kFrameHeaderSize + uint64_t{kEntrySize} * entries.size();
  auto frame = std::make_shared<ByteBuffer>(pool_ ? pool_->Acquire(prefix + data_length) : ByteBuffer(prefix + data_length));
  EncodeDataPrefix({FrameType::kResult, 0, s, job_, seq_, 0}, entries, frame->data());
  std::memcpy(frame->data() + prefix, result_scratch_.data(), data_length);
  out->push_back({s, std::move(frame)});
}

}  // namespace sparsereduce
