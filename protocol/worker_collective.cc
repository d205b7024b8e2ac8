#include "protocol/worker_collective.h"

#include <algorithm>
#include <cstring>

#include "core/block_scan.h"
#include "protocol/frame_format.h"

namespace sparsereduce {
namespace {

constexpr uint8_t kBlockReceived = 4;
constexpr std::byte kZeros[8] = {};

}  // namespace

WorkerCollective::WorkerCollective(const JobShape& shape, uint64_t job, uint64_t seq, const CollectiveSpec& spec,
                                   std::span<std::byte> tensor, CollectiveScratch scratch, CodecContext codec)
    : shape_(shape),
      job_(job),
      seq_(seq),
      spec_(spec),
      tensor_(tensor),
      layout_(shape, spec.element_count, spec.block_size, FindDType(spec.dtype)->size),
      flags_(std::move(scratch.flags)),
      backup_blocks_(std::move(scratch.backup_blocks)),
      backup_data_(std::move(scratch.backup_data)) {
  flags_.assign(layout_.num_blocks(), 0);
  backup_blocks_.clear();
  if (spec.codec.codec != Codec::kNone) {
    // The codec decides what to send (its wire bytes, not the tensor's); any block may come back changed, so
    // any block may need a backup.
    download_ = DownloadFormat(spec.codec);
    encoder_ = codec::MakeEncoder(spec.codec, spec.block_size, *codec.state, codec.rank, shape.world_size, codec.seed);
    const std::span<const float> values(reinterpret_cast<const float*>(tensor.data()), spec.element_count);
    nonzero_blocks_ = encoder_->Prepare(values, flags_);
    for (uint8_t& f : flags_) f = f ? kBlockNonzero : 0;
  }
  // Without a codec the blocks are scanned slot by slot as the slots start (StartSlot).
  const uint32_t element_size = FindDType(spec.dtype)->size;
  schedules_.reserve(shape.num_aggregators);
  for (uint32_t a = 0; a < shape.num_aggregators; ++a) {
    schedules_.emplace_back(shape, a, spec, element_size, flags_);
  }
}

std::vector<OutgoingFrame> WorkerCollective::Start(uint32_t aggregator) {
  std::vector<OutgoingFrame> frames;
  for (uint32_t s = 0; s < shape_.slots; ++s) StartSlot(aggregator, s, &frames);
  return frames;
}

bool WorkerCollective::StartSlot(uint32_t aggregator, uint32_t slot, std::vector<OutgoingFrame>* frames) {
  if (!encoder_) {
    const DTypeInfo& dtype = *FindDType(spec_.dtype);
    layout_.ForEachRun(aggregator, slot, [&](uint64_t first, uint64_t count) {
      const uint64_t first_element = first * spec_.block_size;
      const uint64_t elements = std::min<uint64_t>(count * spec_.block_size, spec_.element_count - first_element);
      nonzero_blocks_ += ScanBlocks(tensor_.data() + first_element * dtype.size, elements, spec_.block_size, dtype,
                                    std::span(flags_).subspan(first, count));
    });
  }
  const size_t first = frames->size();
  if (!schedules_[aggregator].StartSlot(slot, frames)) return false;
  for (size_t i = first; i < frames->size(); ++i) SetWireSizes(&(*frames)[i]);
  return true;
}

bool WorkerCollective::done() const {
  for (const WorkerSchedule& s : schedules_) {
    if (!s.done()) return false;
  }
  return true;
}

uint64_t WorkerCollective::MaxResultPayload() const {
  const uint32_t element_size = FindDType(spec_.dtype)->size;
  return MaxDataPayloadFor(shape_.blocks_per_message, codec::MaxWireBytes(download_, spec_.block_size, element_size));
}

void WorkerCollective::SetWireSizes(OutgoingFrame* frame) const {
  if (!encoder_) return;
  for (Entry& e : frame->entries) {
    if (e.data_bytes > 0) e.data_bytes = static_cast<uint32_t>(encoder_->Block(e.block).size());
  }
}

Status WorkerCollective::OnResult(uint32_t aggregator, const FrameHeader& header,
                                  std::span<const std::byte> payload, std::vector<OutgoingFrame>* frames) {
  if (header.type != FrameType::kResult) {
    return ProtocolError(std::string("expected a RESULT frame, got ") + FrameTypeName(header.type));
  }
  if (header.job != job_ || header.seq != seq_) {
    return ProtocolError("RESULT for job " + std::to_string(header.job) + " collective " +
                         std::to_string(header.seq) + ", expected job " + std::to_string(job_) + " collective " +
                         std::to_string(seq_));
  }
  if (Status st = DecodeDataPayload(header, payload, &scratch_entries_); !st.ok()) return st;
  const size_t first = frames->size();
  if (Status st = schedules_[aggregator].OnResult(header.slot, scratch_entries_, frames); !st.ok()) return st;
  for (size_t i = first; i < frames->size(); ++i) SetWireSizes(&(*frames)[i]);
  for (const EntryView& e : scratch_entries_) {
    if (e.data.empty()) continue;
    std::byte* block = tensor_.data() + layout_.BlockByteOffset(e.block);
    const uint32_t block_bytes = layout_.BlockBytes(e.block);
    const bool keep = encoder_ ? (OrReduce(block, block_bytes, 0) != 0)  // not all-zero bits
                               : (flags_[e.block] & (kBlockNonzero | kBlockHasNegativeZero)) != 0;
    if (keep) {
      // Only the first time: every block is carried by at most one RESULT.
      const uint64_t used = backup_blocks_.size() * layout_.MaxBlockBytes();
      if (backup_data_.size() < used + layout_.MaxBlockBytes()) GrowBackup(used + layout_.MaxBlockBytes());
      std::memcpy(backup_data_.data() + used, block, block_bytes);
      backup_blocks_.push_back(e.block);
    }
    if (download_ == codec::WireFormat::kRaw) {
      std::memcpy(block, e.data.data(), e.data.size());
    } else {
      // Checked by the schedule (CheckWireBlock): cannot fail.
      (void)codec::DecodeFloats(download_, e.data, block_bytes / 4, reinterpret_cast<float*>(block), false);
    }
    flags_[e.block] |= kBlockReceived;
  }
  return Status::Ok();
}

void WorkerCollective::GrowBackup(uint64_t at_least) {
  // Doubling keeps the copies below the final size; the buffer is handed on to the next collective, so a steady
  // loop stops growing after its first step.
  const uint64_t size = std::max({at_least, 2 * uint64_t{backup_data_.size()}, 64 * uint64_t{layout_.MaxBlockBytes()}});
  ByteBuffer grown(size);
  const uint64_t used = backup_blocks_.size() * layout_.MaxBlockBytes();
  if (used > 0) std::memcpy(grown.data(), backup_data_.data(), used);
  backup_data_ = std::move(grown);
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
  if (encoder_) {
    // What no RESULT carried sums to zero, whatever the tensor held there (the codec may have sent none of it).
    for (uint64_t b = 0; b < flags_.size(); ++b) {
      if (!(flags_[b] & kBlockReceived)) std::memset(tensor_.data() + layout_.BlockByteOffset(b), 0, layout_.BlockBytes(b));
    }
    encoder_->Finish(std::span(reinterpret_cast<float*>(tensor_.data()), spec_.element_count));
    return;
  }
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
  if (encoder_) return encoder_->Block(block);
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
