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

  // Largest CONTRIBUTION payload this collective allows (a frame above it is rejected before it is read).
  uint64_t MaxContributionPayload() const;

  // A CONTRIBUTION from `rank` (header already decoded; `payload` holds header.payload_length bytes). The engine
  // keeps the payload until the slot's round completes, so that ranks are summed in ascending order whatever the
  // arrival order. Appends the RESULT frames that became ready to `out`. A non-ok status is a protocol violation
  // by `rank`; the engine's state is then unspecified and the collective must be aborted.
  Status OnContribution(uint32_t rank, const FrameHeader& header, ByteBuffer payload, std::vector<Broadcast>* out);

  // All slots finished.
  bool done() const { return active_slots_ == 0; }

  // Ranks whose contribution some slot's current round still waits for (ascending).
  std::vector<uint32_t> AwaitedRanks() const;

  // Statistics.
  uint64_t blocks_aggregated() const { return blocks_aggregated_; }
  uint64_t owned_blocks() const { return layout_.BlocksOf(aggregator_); }

 private:
  struct Pending {
    ByteBuffer payload;
    std::vector<EntryView> entries;
  };
  struct Slot {
    uint32_t lanes = 0;            // non-empty lanes (a prefix)
    uint32_t round = 0;
    uint32_t active_lanes = 0;     // lanes whose cur != END
    uint32_t awaited = 0;          // contributions still missing in this round
    std::vector<uint64_t> cur;     // per lane
    std::vector<uint64_t> next;    // [lane * W + rank]: the rank's announced next block
    std::vector<uint8_t> expected;  // per rank: must send in this round and has not yet
    std::vector<Pending> pending;  // per rank
  };

  Status ValidateAnnounce(uint32_t rank, Slot& slot, uint32_t s, const std::vector<EntryView>& entries) const;
  Status ValidateRound(uint32_t rank, Slot& slot, uint32_t s, const std::vector<EntryView>& entries) const;
  void CompleteRound(Slot& slot, uint32_t s, std::vector<Broadcast>* out);
  void AnnounceReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out);
  // One aggregation round over the slot's active lanes, in lane order: `combine(cur, contributions, new_cur)`
  // gets each lane's block, its contributors' entries in ascending rank order and the lane's next block (END
  // when it finishes); the lane then moves on.
  template <typename Combine>
  void AggregateLanes(Slot& slot, Combine&& combine);
  void AggregateReply(Slot& slot, uint32_t s, std::vector<Broadcast>* out);
  // Codecs: contributions decoded and summed in fp32, the sum encoded in the download format.
  void AggregateDecoded(Slot& slot, uint32_t s, std::vector<Broadcast>* out);
  // Encodes one summed block into `out` (at least MaxWireBytes of the download format); returns the bytes.
  uint32_t EncodeResult(uint64_t block, float* sum, uint32_t n, std::byte* out);
  void ComputeExpected(Slot& slot);
  std::string Where(uint32_t rank, uint32_t s) const;

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
  std::vector<std::byte> result_scratch_;  // a slot's encoded results before they are framed
  std::vector<Slot> slots_;
  uint32_t active_slots_ = 0;
  uint64_t blocks_aggregated_ = 0;
};

}  // namespace sparsereduce
