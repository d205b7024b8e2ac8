// Everything a worker does for one collective except I/O: scans the tensor, runs one WorkerSchedule per
// aggregator, encodes CONTRIBUTIONs, checks RESULTs and writes them into the tensor, and finally writes all-zero
// bits into blocks that no RESULT carried. The real worker and the protocol simulation tests share this class.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "codec/tensor_codec.h"
#include "core/byte_buffer.h"
#include "core/status.h"
#include "protocol/frame.h"
#include "protocol/layout.h"
#include "protocol/worker_schedule.h"

namespace sparsereduce {

// What a collective with a codec needs from the worker: the key's state and the rank (DIANA's random choices).
struct CodecContext {
  codec::KeyState* state = nullptr;
  uint32_t rank = 0;
  uint64_t seed = 0;
};

// Memory one collective hands on to the next, so that a steady training loop does not allocate, and fault in,
// per-tensor buffers every step (glibc gives the freed pages of a thread's arena back to the kernel).
struct CollectiveScratch {
  ByteBuffer backup_data;               // Restore()'s copies of overwritten blocks
  std::vector<uint64_t> backup_blocks;  // which blocks those are
  std::vector<uint8_t> flags;           // one per block
};

class WorkerCollective {
 public:
  // `tensor` holds spec.element_count elements of spec.dtype and is reduced in place; it must stay valid and
  // untouched by the caller until the collective is done. `spec` must have passed ValidateSpec.
  // `scratch` is memory the caller recycles across collectives (see ReleaseScratch); its contents do not matter.
  // With a codec (spec.codec), `codec` must hold the key's state, which the collective advances in Finish only.
  // `restorable` false: no block is saved, and Restore leaves the tensor as the failure left it.
  WorkerCollective(const JobShape& shape, uint64_t job, uint64_t seq, const CollectiveSpec& spec,
                   std::span<std::byte> tensor, CollectiveScratch scratch = {}, CodecContext codec = {},
                   bool restorable = true);

  WorkerCollective(const WorkerCollective&) = delete;
  WorkerCollective& operator=(const WorkerCollective&) = delete;

  uint64_t seq() const { return seq_; }
  uint64_t num_blocks() const { return flags_.size(); }
  uint64_t nonzero_blocks() const { return nonzero_blocks_; }  // the blocks this worker sends (of started slots)
  // Bytes of all-zero blocks StartSlot has scanned so far (0 with a codec): the scan reads those whole, while a
  // nonzero block costs it only up to its first nonzero element.
  uint64_t zero_bytes_scanned() const { return zero_bytes_scanned_; }
  uint64_t selected_blocks() const { return encoder_ ? encoder_->selected_blocks() : 0; }

  // The first frames (announce and the window's CONTRIBUTIONs) of every slot of `aggregator`.
  std::vector<OutgoingFrame> Start(uint32_t aggregator);
  // Scans the blocks of one slot of `aggregator` (without a codec; a codec has chosen every block up front) and
  // appends its announce and first CONTRIBUTIONs to `*frames`, or returns false when the slot has no block.
  // Starting the slots one by one lets the first ones travel while the rest of the tensor is still being scanned.
  // Every slot is started once.
  bool StartSlot(uint32_t aggregator, uint32_t slot, std::vector<OutgoingFrame>* frames);

  // A RESULT frame from `aggregator`, taken in two steps so that its data can be read straight into the tensor.
  // BeginResult takes the header and the entry table (the first kEntrySize · header.entry_count payload bytes):
  // it checks them, advances the schedule (appending to `*frames` the CONTRIBUTIONs to send next on the slot,
  // often none), saves what Restore needs and fills `*targets` with where the rest of the payload goes, in order:
  // the tensor's blocks themselves, or, with a codec's wire format, a buffer to decode from. The caller reads
  // exactly the rest of the payload into the targets, then calls EndResult, which checks padding and decodes.
  // Until then done() is false. A non-ok status is a protocol violation by the aggregator; after one, or when the
  // data cannot be read, the collective fails. The blocks the table names may then hold part of the RESULT (its
  // padding is checked only after its data landed); Restore puts them back like every other overwritten block.
  Status BeginResult(uint32_t aggregator, const FrameHeader& header, std::span<const std::byte> table,
                     std::vector<OutgoingFrame>* frames, std::vector<std::span<std::byte>>* targets);
  Status EndResult(uint32_t aggregator);
  // Both steps on a whole payload in memory.
  Status OnResult(uint32_t aggregator, const FrameHeader& header, std::span<const std::byte> payload,
                  std::vector<OutgoingFrame>* frames);

  bool AggregatorDone(uint32_t aggregator) const {
    return schedules_[aggregator].done() && !pending_[aggregator].active;
  }
  bool done() const;
  // Call once when done(): blocks that no RESULT carried are zero on every worker; write them as +0.
  void Finish();
  // After a failure (instead of Finish): puts back every block a RESULT overwrote, so the tensor holds exactly
  // the caller's input again. Costs a copy of each block that was sent raw (saved as its frame is handed out) or
  // overwritten while not all-zero bits (saved before it is overwritten; with a codec every block is saved this
  // way, as what it sends is not the block): at most the tensor's nonzero blocks. Does nothing when the
  // collective is not restorable (nothing was saved).
  void Restore();
  uint64_t saved_blocks() const { return backup_blocks_.size(); }  // blocks Restore would put back from its copies
  // Hands the collective's memory on to the next one; this collective is unusable afterwards.
  CollectiveScratch ReleaseScratch() {
    return {std::move(backup_data_), std::move(backup_blocks_), std::move(flags_)};
  }

  // Largest RESULT payload this collective allows.
  uint64_t MaxResultPayload() const;
  // Block data of contributions as they go on the wire (entries' data_bytes), after the schedule built them.
  void SetWireSizes(OutgoingFrame* frame) const;

  // Frame header and entry table of `frame` (the data follows, see BlockData and PaddingFor).
  ByteBuffer EncodePrefix(const OutgoingFrame& frame) const;
  std::span<const std::byte> BlockData(uint64_t block) const;
  // The whole frame, contiguous (copies block data).
  ByteBuffer EncodeFrame(const OutgoingFrame& frame) const;

  // Zero bytes to append after a block's data (data_bytes rounded up to 8).
  static std::span<const std::byte> PaddingFor(uint32_t data_bytes);

 private:
  // Wire sizes of a codec's blocks, or (without a codec) the backups of the blocks the frames carry.
  void PrepareOutgoing(std::span<OutgoingFrame> frames);
  // Saves the block's original bytes for Restore (once per block).
  void Backup(uint64_t block);
  void GrowBackup(uint64_t at_least);

  JobShape shape_;
  uint64_t job_;
  uint64_t seq_;
  CollectiveSpec spec_;
  std::span<std::byte> tensor_;
  ColumnLayout layout_;
  std::vector<uint8_t> flags_;  // ScanBlocks flags plus kBlockReceived and kBlockBackedUp
  uint64_t nonzero_blocks_ = 0;
  uint64_t zero_bytes_scanned_ = 0;
  bool restorable_;
  std::vector<ColumnLayout::ColumnPlace> places_;  // layout_.AllPlaces(), the schedules' one lookup table
  std::vector<WorkerSchedule> schedules_;
  // Original bytes of sent blocks and of overwritten blocks that were not all-zero bits, in the order they were
  // saved (see Restore).
  std::vector<uint64_t> backup_blocks_;
  ByteBuffer backup_data_;  // grown by doubling as blocks are saved (see GrowBackup)
  // A RESULT between BeginResult and EndResult. Each aggregator connection reads its frames in order, but the
  // connections interleave: one per aggregator.
  struct PendingResult {
    bool active = false;
    uint32_t slot = 0;
    std::vector<Entry> entries;
    std::vector<std::byte> padding;  // every entry's padding bytes, checked to be zero
    ByteBuffer wire;                 // with a codec's wire format: the data, decoded by EndResult
  };
  std::vector<PendingResult> pending_;                 // per aggregator
  std::vector<std::span<std::byte>> scratch_targets_;  // OnResult's
  // With a codec: it chose the blocks to send and holds their wire bytes; results are decoded into the tensor.
  std::unique_ptr<codec::TensorEncoder> encoder_;
  codec::WireFormat download_ = codec::WireFormat::kRaw;
};

}  // namespace sparsereduce
