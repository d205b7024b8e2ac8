#include "protocol/worker_collective.h"

#include <cstring>

#include "core/block_scan.h"
#include "protocol/frame_format.h"

namespace sparsereduce {
namespace {

constexpr uint8_t kBlockReceived = 4;
constexpr std::byte kZeros[8] = {};

}  // namespace

WorkerCollective::WorkerCollective(const JobShape& shape, uint64_t job, uint64_t seq, const CollectiveSpec& spec,
                                   std::span<std::byte> tensor, ByteBuffer backup_storage)
    : shape_(shape),
      job_(job),
      seq_(seq),
      spec_(spec),
      tensor_(tensor),
      layout_(shape, spec.element_count, spec.block_size, FindDType(spec.dtype)->size),
      backup_data_(std::move(backup_storage)) {
  flags_.resize(layout_.num_blocks());
  nonzero_blocks_ = ScanBlocks(tensor.data(), spec.element_count, spec.block_size, *FindDType(spec.dtype), flags_);
  backup_capacity_blocks_ = nonzero_blocks_;
  for (uint8_t f : flags_) backup_capacity_blocks_ += (f & kBlockHasNegativeZero) ? 1 : 0;
  const uint32_t element_size = FindDType(spec.dtype)->size;
  schedules_.reserve(shape.num_aggregators);
  for (uint32_t a = 0; a < shape.num_aggregators; ++a) {
    schedules_.emplace_back(shape, a, spec, element_size, flags_);
  }
}

std::vector<OutgoingFrame> WorkerCollective::Start(uint32_t aggregator) { return schedules_[aggregator].Start(); }

bool WorkerCollective::done() const {
  for (const WorkerSchedule& s : schedules_) {
    if (!s.done()) return false;
  }
  return true;
}

uint64_t WorkerCollective::MaxResultPayload() const {
  return uint64_t{shape_.blocks_per_message} * (kEntrySize + Pad8(layout_.MaxBlockBytes()));
}

Status WorkerCollective::OnResult(uint32_t aggregator, const FrameHeader& header,
                                  std::span<const std::byte> payload, OutgoingFrame* next, bool* has_next) {
  *has_next = false;
  if (header.type != FrameType::kResult) {
    return ProtocolError(std::string("expected a RESULT frame, got ") + FrameTypeName(header.type));
  }
  if (header.job != job_ || header.seq != seq_) {
    return ProtocolError("RESULT for job " + std::to_string(header.job) + " collective " +
                         std::to_string(header.seq) + ", expected job " + std::to_string(job_) + " collective " +
                         std::to_string(seq_));
  }
  if (Status st = DecodeDataPayload(header, payload, &scratch_entries_); !st.ok()) return st;
  if (Status st = schedules_[aggregator].OnResult(header.slot, scratch_entries_, next, has_next); !st.ok()) {
    return st;
  }
  for (const EntryView& e : scratch_entries_) {
    if (e.data.empty()) continue;
    std::byte* block = tensor_.data() + layout_.BlockByteOffset(e.block);
    if (flags_[e.block] & (kBlockNonzero | kBlockHasNegativeZero)) {
      // Only the first time: every block is carried by at most one RESULT.
      if (backup_blocks_.empty() && backup_data_.size() < backup_capacity_blocks_ * layout_.MaxBlockBytes()) {
        backup_data_ = ByteBuffer(backup_capacity_blocks_ * layout_.MaxBlockBytes());
      }
      std::memcpy(backup_data_.data() + backup_blocks_.size() * layout_.MaxBlockBytes(), block, e.data.size());
      backup_blocks_.push_back(e.block);
    }
    std::memcpy(block, e.data.data(), e.data.size());
    flags_[e.block] |= kBlockReceived;
  }
  return Status::Ok();
}

void WorkerCollective::Restore() {
  for (uint64_t b = 0; b < flags_.size(); ++b) {
    if (flags_[b] & kBlockReceived) {
      std::memset(tensor_.data() + layout_.BlockByteOffset(b), 0, layout_.BlockBytes(b));  // was all-zero bits
      flags_[b] &= static_cast<uint8_t>(~kBlockReceived);
    }
  }
  for (size_t i = 0; i < backup_blocks_.size(); ++i) {
    const uint64_t b = backup_blocks_[i];
    std::memcpy(tensor_.data() + layout_.BlockByteOffset(b), backup_data_.data() + i * layout_.MaxBlockBytes(),
                layout_.BlockBytes(b));
  }
  backup_blocks_.clear();
}

void WorkerCollective::Finish() {
  // Own nonzero blocks are always in the union and therefore received; a zero block holds only +0 and -0
  // elements, and only the ones with a -0 (kBlockHasNegativeZero) need rewriting.
  for (uint64_t b = 0; b < flags_.size(); ++b) {
    if ((flags_[b] & (kBlockHasNegativeZero | kBlockReceived)) == kBlockHasNegativeZero) {
      std::memset(tensor_.data() + layout_.BlockByteOffset(b), 0, layout_.BlockBytes(b));
    }
  }
}

ByteBuffer WorkerCollective::EncodePrefix(const OutgoingFrame& frame) const {
  FrameHeader header;
  header.type = FrameType::kContribution;
  header.slot = frame.slot;
  header.job = job_;
  header.seq = seq_;
  ByteBuffer prefix(kFrameHeaderSize + uint64_t{kEntrySize} * frame.entries.size());
  EncodeDataPrefix(header, frame.entries, prefix.data());
  return prefix;
}

std::span<const std::byte> WorkerCollective::BlockData(uint64_t block) const {
  return {tensor_.data() + layout_.BlockByteOffset(block), layout_.BlockBytes(block)};
}

std::span<const std::byte> WorkerCollective::PaddingFor(uint32_t data_bytes) {
  return {kZeros, Pad8(data_bytes) - data_bytes};
}

ByteBuffer WorkerCollective::EncodeFrame(const OutgoingFrame& frame) const {
  std::vector<std::span<const std::byte>> data;
  for (const Entry& e : frame.entries) {
    if (e.data_bytes) data.push_back(BlockData(e.block));
  }
  FrameHeader header;
  header.type = FrameType::kContribution;
  header.slot = frame.slot;
  header.job = job_;
  header.seq = seq_;
  return EncodeDataFrame(header, frame.entries, data);
}

}  // namespace sparsereduce
