#include "protocol/worker_collective.h"

#include <algorithm>
#include <cstring>

#include "core/block_scan.h"
#include "core/streaming_copy.h"
#include "protocol/frame_format.h"

namespace sparsereduce {
namespace {

constexpr uint8_t kBlockReceived = 4;
constexpr uint8_t kBlockBackedUp = 8;  // its original bytes are in the backup
constexpr std::byte kZeros[8] = {};

}  // namespace

WorkerCollective::WorkerCollective(const JobShape& shape, uint64_t job, uint64_t seq, const CollectiveSpec& spec,
                                   std::span<std::byte> tensor, CollectiveScratch scratch, CodecContext codec,
                                   bool restorable)
    : shape_(shape),
      job_(job),
      seq_(seq),
      spec_(spec),
      tensor_(tensor),
      layout_(shape, spec.element_count, spec.block_size, FindDType(spec.dtype)->size),
      flags_(std::move(scratch.flags)),
      restorable_(restorable),
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
  pending_.resize(shape.num_aggregators);
  places_ = layout_.AllPlaces();
  schedules_.reserve(shape.num_aggregators);
  for (uint32_t a = 0; a < shape.num_aggregators; ++a) {
    schedules_.emplace_back(shape, a, spec, element_size, flags_, places_);
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
      const uint64_t nonzero = ScanBlocks(tensor_.data() + first_element * dtype.size, elements, spec_.block_size,
                                          dtype, std::span(flags_).subspan(first, count));
      nonzero_blocks_ += nonzero;
      const uint64_t run_bytes = elements * dtype.size, full_bytes = count * spec_.block_size * dtype.size;
      uint64_t nonzero_bytes = nonzero * spec_.block_size * dtype.size;
      if (flags_[first + count - 1] & kBlockNonzero) nonzero_bytes -= full_bytes - run_bytes;  // a partial last block
      zero_bytes_scanned_ += run_bytes - nonzero_bytes;
    });
  }
  const size_t first = frames->size();
  if (!schedules_[aggregator].StartSlot(slot, frames)) return false;
  PrepareOutgoing(std::span(*frames).subspan(first));
  return true;
}

bool WorkerCollective::done() const {
  for (const WorkerSchedule& s : schedules_) {
    if (!s.done()) return false;
  }
  for (const PendingResult& p : pending_) {
    if (p.active) return false;  // its data is still on the way into the tensor
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

Status WorkerCollective::BeginResult(uint32_t aggregator, const FrameHeader& header,
                                     std::span<const std::byte> table, std::vector<OutgoingFrame>* frames,
                                     std::vector<std::span<std::byte>>* targets) {
  targets->clear();
  if (header.type != FrameType::kResult) {
    return ProtocolError(std::string("expected a RESULT frame, got ") + FrameTypeName(header.type));
  }
  if (header.job != job_ || header.seq != seq_) {
    return ProtocolError("RESULT for job " + std::to_string(header.job) + " collective " +
                         std::to_string(header.seq) + ", expected job " + std::to_string(job_) + " collective " +
                         std::to_string(seq_));
  }
  PendingResult& pending = pending_[aggregator];
  if (pending.active) return ProtocolError("a RESULT began before the previous one ended");  // caller's bug
  if (Status st = DecodeEntryTable(header, table, &pending.entries); !st.ok()) return st;
  const size_t first = frames->size();
  if (Status st = schedules_[aggregator].OnResult(header.slot, pending.entries, frames); !st.ok()) return st;
  PrepareOutgoing(std::span(*frames).subspan(first));

  // Where the data goes. Without a codec's wire format, into the blocks themselves: adjacent blocks make one
  // target, so a RESULT of neighbouring blocks is one read.
  const bool raw = download_ == codec::WireFormat::kRaw;
  uint64_t padding_bytes = 0;
  uint64_t wire_bytes = 0;
  for (const Entry& e : pending.entries) {
    padding_bytes += Pad8(e.data_bytes) - e.data_bytes;
    wire_bytes += e.data_bytes;
  }
  pending.padding.resize(padding_bytes);
  if (!raw && pending.wire.size() < wire_bytes) {
    pending.wire = ByteBuffer(std::max<uint64_t>(wire_bytes, 2 * pending.wire.size()));
  }
  std::byte* padding = pending.padding.data();
  std::byte* wire = pending.wire.data();
  bool saved = false;
  auto add = [&](std::byte* at, uint64_t n) {
    if (n == 0) return;
    if (!targets->empty() && targets->back().data() + targets->back().size() == at) {
      targets->back() = {targets->back().data(), targets->back().size() + n};
    } else {
      targets->emplace_back(at, n);
    }
  };
  for (const Entry& e : pending.entries) {
    if (e.data_bytes == 0) continue;
    std::byte* block = tensor_.data() + layout_.BlockByteOffset(e.block);
    const uint32_t block_bytes = layout_.BlockBytes(e.block);
    // A block this worker sent raw was saved when it was sent; every block is carried by at most one RESULT.
    const bool keep = restorable_ && (encoder_ ? (OrReduce(block, block_bytes, 0) != 0)  // not all-zero bits
                                              : (flags_[e.block] & (kBlockNonzero | kBlockHasNegativeZero)) != 0);
    if (keep && !(flags_[e.block] & kBlockBackedUp)) {
      Backup(e.block);
      saved = true;
    }
    flags_[e.block] |= kBlockReceived;  // from here on Restore puts the block back, whatever lands in it
    if (raw) {
      add(block, e.data_bytes);  // CheckWireBytes (the schedule): data_bytes == block_bytes
    } else {
      add(wire, e.data_bytes);
      wire += e.data_bytes;
    }
    add(padding, Pad8(e.data_bytes) - e.data_bytes);
    padding += Pad8(e.data_bytes) - e.data_bytes;
  }
  if (saved) StreamingFence();  // the backups are ordered before what follows (non-temporal stores are weakly ordered)
  pending.active = true;
  pending.slot = header.slot;
  return Status::Ok();
}

Status WorkerCollective::EndResult(uint32_t aggregator) {
  PendingResult& pending = pending_[aggregator];
  if (!pending.active) return ProtocolError("a RESULT ended that did not begin");  // caller's bug
  pending.active = false;
  for (size_t i = 0; i < pending.padding.size(); ++i) {
    if (pending.padding[i] != std::byte{0}) return ProtocolError("RESULT with a nonzero padding byte");
  }
  if (download_ == codec::WireFormat::kRaw) return Status::Ok();
  const std::byte* wire = pending.wire.data();
  for (const Entry& e : pending.entries) {
    if (e.data_bytes == 0) continue;
    const std::span<const std::byte> data(wire, e.data_bytes);
    wire += e.data_bytes;
    const auto elements = static_cast<uint32_t>(layout_.BlockElements(e.block));
    if (Status st = codec::CheckWireBlock(download_, elements, 4, data); !st.ok()) {
      return st.WithContext("slot " + std::to_string(pending.slot) + ", block " + std::to_string(e.block) +
                            ": RESULT");
    }
    // Checked just above: cannot fail. Codecs are float only.
    (void)codec::DecodeFloats(download_, data, elements,
                              reinterpret_cast<float*>(tensor_.data() + layout_.BlockByteOffset(e.block)),
                              false);
  }
  return Status::Ok();
}

Status WorkerCollective::OnResult(uint32_t aggregator, const FrameHeader& header,
                                  std::span<const std::byte> payload, std::vector<OutgoingFrame>* frames) {
  if (payload.size() != header.payload_length) {
    return ProtocolError("payload of " + std::to_string(payload.size()) + " bytes, header says " +
                         std::to_string(header.payload_length));
  }
  const uint64_t table_bytes = uint64_t{header.entry_count} * kEntrySize;
  if (table_bytes > payload.size()) {
    return ProtocolError("entry table of " + std::to_string(header.entry_count) +
                         " entries exceeds the payload");
  }
  std::vector<std::span<std::byte>>& targets = scratch_targets_;
  Status st = BeginResult(aggregator, header, payload.first(table_bytes), frames, &targets);
  if (!st.ok()) return st;
  const std::byte* data = payload.data() + table_bytes;
  for (const std::span<std::byte>& t : targets) {
    std::memcpy(t.data(), data, t.size());
    data += t.size();
  }
  return EndResult(aggregator);
}

void WorkerCollective::PrepareOutgoing(std::span<OutgoingFrame> frames) {
  if (encoder_) {
    for (OutgoingFrame& f : frames) SetWireSizes(&f);
    return;
  }
  if (!restorable_) return;
  // The blocks are about to be copied out of the tensor for sending (into a ring, or by the kernel): saving them
  // now reads them from memory once for both, where saving them when their RESULT arrives reads them again.
  bool saved = false;
  for (const OutgoingFrame& f : frames) {
    for (const Entry& e : f.entries) {
      if (e.data_bytes == 0 || (flags_[e.block] & kBlockBackedUp)) continue;
      Backup(e.block);
      saved = true;
    }
  }
  if (saved) StreamingFence();
}

void WorkerCollective::Backup(uint64_t block) {
  const uint64_t used = backup_blocks_.size() * layout_.MaxBlockBytes();
  if (backup_data_.size() < used + layout_.MaxBlockBytes()) GrowBackup(used + layout_.MaxBlockBytes());
  // Read back only if the collective fails: stores that bypass the cache spare it the backup's lines.
  StreamingCopy(backup_data_.data() + used, tensor_.data() + layout_.BlockByteOffset(block), layout_.BlockBytes(block));
  backup_blocks_.push_back(block);
  flags_[block] |= kBlockBackedUp;
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
  if (!restorable_) return;
  for (uint64_t b = 0; b < flags_.size(); ++b) {
    if ((flags_[b] & (kBlockReceived | kBlockBackedUp)) == kBlockReceived) {
      std::memset(tensor_.data() + layout_.BlockByteOffset(b), 0, layout_.BlockBytes(b));  // was all-zero bits
    }
    flags_[b] &= static_cast<uint8_t>(~(kBlockReceived | kBlockBackedUp));
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
      if (!(flags_[b] & kBlockReceived))
        std::memset(tensor_.data() + layout_.BlockByteOffset(b), 0, layout_.BlockBytes(b));
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
