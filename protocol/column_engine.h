// The aggregator's side of one collective: lookahead aggregation over the columns one aggregator serves
// (docs/PROTOCOL.md §4, §6, §7). Pure logic: frames in, RESULT frames out, no I/O and no threads.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/buffer_pool.h"
#include "core/byte_buffer.h"
#include "codec/three_lc.h"
#include "core/reduce_kernels.h"
#include "core/status.h"
#include "protocol/frame.h"
#include "protocol/layout.h"

namespace sparsereduce {

class ColumnEngine {
 public:
  // A RESULT frame to send, unchanged, to every worker of the job.
  struct Broadcast {
    uint32_t slot;
    std::shared_ptr<const ByteBuffer> frame;
  };

  // `spec` must have passed ValidateSpec. RESULT frames are built in buffers from `pool` when one is given. A 3LC
  // collective with ternary results needs `error_memory` (BlocksOf(aggregator) blocks of the spec's block size),
  // the aggregator's error feedback for the spec's key, which outlives the engine.
  ColumnEngine(const JobShape& shape, uint32_t aggregator_index, uint64_t job, uint64_t seq,
               const CollectiveSpec& spec, std::shared_ptr<BufferPool> pool = nullptr,
               codec::ErrorMemory* error_memory = nullptr);

  ColumnEngine(const ColumnEngine&) = delete;
  ColumnEngine& operator=(const ColumnEngine&) = delete;

  // Largest CONTRIBUTION payload this collective allows on `slot` (< S): a frame above it is rejected before it is
  // read. A frame carries at most one entry per non-empty column of the slot (SlotColumns), each with one block.
  uint64_t MaxContributionPayload(uint32_t slot) const;
  // Before a CONTRIBUTION's payload is read: refuses a frame of a rank that already has D frames on `slot` waiting
  // for aggregation (§4), as OnContribution would once it is read. A valid frame never meets it: the worker sends
  // past a full window only after a RESULT, sent after the aggregation that made room.
  Status CheckWindow(uint32_t rank, uint32_t slot) const;
  // The non-empty columns of `slot` (< S) on this aggregator: the most entries a CONTRIBUTION on it may carry.
  uint32_t SlotColumns(uint32_t slot) const { return slots_[slot].lanes; }

  // Bookkeeping bytes counted per held block on top of its frame bytes (a queue node; checked in the .cc).
  static constexpr uint64_t kHeldBlockOverhead = 64;
  // The most an engine holds for `columns` non-empty columns of one aggregator, `block_bytes` per block: every
  // rank's window of D frames of K blocks per slot (bounded by its columns), with their bookkeeping, a RESULT per
  // slot, the per-(column, rank) tables (§4), and the table from every column of the layout to its lane (`layout`:
  // min(A x S x K, NB) entries, so A times its own columns). aggregator/job.cc admits a collective against it.
  static uint64_t MemoryBound(const JobShape& shape, uint64_t columns, uint64_t block_bytes,
                              const ColumnLayout& layout);
  // The largest buffer a RESULT of K entries of `wire_block_bytes` (the download format's largest block) can hold:
  // its frame, in a pool buffer of up to twice that (BufferPool::Acquire).
  static uint64_t MaxResultBufferBytes(const JobShape& shape, uint64_t wire_block_bytes);
  // All the RESULTs of one collective together, while they wait in members' send queues (a RESULT is shared by
  // all members): every one of the aggregator's `owned_blocks` once, in a frame of its own at worst, and one
  // announce reply per slot over its `columns`; a buffer holds at most four times its frame's bytes (FlushResult
  // keeps a buffer at most twice its content, the pool's at most twice what was asked).
  static uint64_t ResultMemoryBound(const JobShape& shape, uint64_t owned_blocks, uint64_t columns,
                                    uint64_t wire_block_bytes);

  // A CONTRIBUTION from `rank` (header already decoded; `payload` holds header.payload_length bytes). The engine
  // keeps the payload until every block in it is aggregated (a rank streams up to D frames per slot ahead, §4), so
  // that ranks are summed in ascending order whatever the arrival order. A payload on loan (memory the peer may
  // still write) is used in place when blocks travel raw: the entry table is decoded once, and the data is only
  // summed, so whatever the peer changes later only changes its own contribution; a codec's blocks are checked
  // and decoded later, so they are copied first. Appends the RESULT frames that became
  // ready to `out`. A non-ok status is a protocol violation by `rank`; the engine's state is then unspecified and
  // the collective must be aborted.
  Status OnContribution(uint32_t rank, const FrameHeader& header, ByteBuffer payload, std::vector<Broadcast>* out);

  // Copies every payload of `rank` the engine holds in memory lent by a transport (ByteBuffer::on_loan) into a
  // buffer of its own, so the transport gets its memory back (a shared-memory ring whose peer waits for room).
  void ReturnLoans(uint32_t rank);

  // All slots finished.
  bool done() const { return active_slots_ == 0; }

  // Ranks that some slot waits for (ascending): their announce, or the block a column aggregates next.
  std::vector<uint32_t> AwaitedRanks() const;

  // Statistics.
  uint64_t blocks_aggregated() const { return blocks_aggregated_; }
  uint64_t owned_blocks() const { return layout_.BlocksOf(aggregator_); }

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};
  // A received block not yet aggregated: a node of its (lane, rank) queue.
  struct Queued {
    EntryView entry;
    uint32_t frame;  // index into Stream::frames
    uint32_t next;   // next node of the queue, or kNone
  };
  // A received frame, kept while some of its blocks wait.
  struct HeldFrame {
    ByteBuffer payload;
    uint32_t waiting = 0;  // its blocks not yet aggregated
  };
  // What one rank sent on one slot.
  struct Stream {
    bool announced = false;
    uint64_t last_block = 0;  // the last block received: blocks come in increasing order (§7)
    bool any_block = false;
    uint32_t held_frames = 0;  // frames with waiting > 0 (at most D)
    std::vector<HeldFrame> frames;
    std::vector<uint32_t> free_frames;
    std::vector<Queued> nodes;
    std::vector<uint32_t> free_nodes;
  };
  struct Slot {
    uint32_t lanes = 0;              // non-empty lanes (a prefix)
    uint32_t active_lanes = 0;       // lanes whose cur != END
    uint32_t announces_missing = 0;  // ranks that have not announced yet
    bool replied = false;            // the announce reply went out; lanes then advance one by one
    std::vector<uint64_t> cur;       // per lane
    std::vector<uint32_t> missing;   // per lane: ranks whose block `cur` the lane still waits for
    // [lane * W + rank]: the block the rank sends next in the lane (END: none left), and its queue of received,
    // not yet aggregated blocks (node indices into the rank's Stream).
    std::vector<uint64_t> expect;
    std::vector<uint32_t> queue_head;
    std::vector<uint32_t> queue_tail;
    std::vector<Stream> streams;     // per rank
  };

  // The rank's next block to aggregate in the lane: its oldest queued block, else the one it sends next.
  uint64_t Head(const Slot& slot, uint32_t lane, uint32_t rank) const;
  Status OnAnnounce(uint32_t rank, Slot& slot, uint32_t s, const FrameHeader& header, const ByteBuffer& payload);
  // Queues the blocks of a CONTRIBUTION; appends to `ready` the lanes whose current block it completed.
  Status OnBlocks(uint32_t rank, Slot& slot, uint32_t s, const FrameHeader& header, ByteBuffer payload,
                  std::vector<uint32_t>* ready);
  // Why `block` is not a block the rank may send next on slot `s`.
  Status UnexpectedBlock(uint32_t rank, const Slot& slot, uint32_t s, uint64_t block) const;
  void AnnounceReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out);
  // Aggregates the lane's current block (every rank whose head it is has sent it) into the RESULT being built, then
  // moves the lane on; repeats while the next block has arrived too.
  void AggregateLane(Slot& slot, uint32_t s, uint32_t lane, std::vector<Broadcast>* out);
  uint32_t CountMissing(const Slot& slot, uint32_t lane) const;
  void Release(Slot& slot, uint32_t lane, uint32_t rank);
  // A copy of `payload` in memory of the engine's own.
  ByteBuffer CopyOf(const ByteBuffer& payload);
  // DecodeDataPayload; from a copy of the entry table when the payload is on loan (its peer may still write it).
  Status Decode(const FrameHeader& header, const ByteBuffer& payload, std::vector<EntryView>* entries);
  // Encodes one summed block into `out` (at least MaxWireBytes of the download format); returns the bytes.
  uint32_t EncodeResult(uint64_t block, float* sum, uint32_t n, std::byte* out);
  // The RESULT being built: room for one more block's data (a full frame is sent first), then the entry.
  std::byte* ResultSpace(uint32_t s, std::vector<Broadcast>* out);
  void AddResult(const Entry& entry);
  void FlushResult(uint32_t s, std::vector<Broadcast>* out);
  std::string Where(uint32_t rank, uint32_t s) const;
  Status WindowRoom(uint32_t rank, const Slot& slot, uint32_t s) const;  // the window check, its message

  JobShape shape_;
  uint32_t aggregator_;
  uint64_t job_;
  uint64_t seq_;
  CollectiveSpec spec_;
  const ReduceKernels* kernels_;
  uint32_t element_size_;
  ColumnLayout layout_;
  std::shared_ptr<BufferPool> pool_;
  codec::WireFormat upload_, download_;
  bool decodes_;  // a codec's format in some direction: blocks are decoded, summed in fp32 and encoded
  codec::ErrorMemory* error_memory_;
  std::vector<float> sum_scratch_;       // one block, fp32
  std::vector<int8_t> trit_scratch_;     // one block's 3LC values
  std::vector<EntryView> scratch_entries_;
  std::vector<std::byte> scratch_table_;
  std::vector<uint32_t> scratch_ready_;
  std::vector<const EntryView*> scratch_contributions_;
  std::vector<uint32_t> scratch_contributors_;
  // The RESULT under construction: data is written at its place for K entries and moved up when it has fewer.
  std::shared_ptr<ByteBuffer> result_frame_;
  std::vector<Entry> result_entries_;
  uint64_t result_data_bytes_ = 0;
  std::vector<Slot> slots_;
  std::vector<ColumnLayout::Place> place_;  // layout_.PlacesOf(aggregator_): a received block's lane
  uint32_t active_slots_ = 0;
  uint64_t blocks_aggregated_ = 0;
};

}  // namespace sparsereduce
