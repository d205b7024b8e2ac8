#include "protocol/layout.h"

#include <algorithm>
#include <limits>

#include "core/reduce_kernels.h"
#include "protocol/frame_format.h"

namespace sparsereduce {

std::string JobShape::ToString() const {
  return "world_size=" + std::to_string(world_size) + " aggregators=" + std::to_string(num_aggregators) +
         " slots=" + std::to_string(slots) +  " blocks_per_message=" + std::to_string(blocks_per_message) +
         " window=" + std::to_string(window);
}

std::string CollectiveSpec::ToString() const {
  const DTypeInfo* info = FindDType(dtype);
  return "{count=" + std::to_string(element_count) + " dtype=" +
         (info ? info->name : "#" + std::to_string(static_cast<uint32_t>(dtype))) + " op=" + ReduceOpName(op) +
         " block_size=" + std::to_string(block_size) + (codec == CodecSpec{} ? "" : " codec=" + codec.ToString()) +
         "}";
}

Status ValidateSpec(const CollectiveSpec& spec) {
  const DTypeInfo* info = FindDType(spec.dtype);
  if (info == nullptr) {
    return Status(StatusCode::kUnsupported, "unknown dtype " + std::to_string(static_cast<uint32_t>(spec.dtype)));
  }
  if (FindReduceKernels(spec.dtype, spec.op) == nullptr) {
    return Status(StatusCode::kUnsupported,
                  std::string("reduction ") + ReduceOpName(spec.op) + " over " + info->name + " is not supported");
  }
  if (spec.block_size == 0) return InvalidArgument("block_size must be at least 1");
  // A block's bytes travel in a 32-bit data_bytes field and frames must stay well below 4 GiB.
  if (uint64_t{spec.block_size} * info->size > (uint64_t{1} << 24)) {
    return InvalidArgument("block of " + std::to_string(spec.block_size) + " elements exceeds 16 MiB");
  }
  if (spec.element_count > std::numeric_limits<uint64_t>::max() / 8) {
    return InvalidArgument("element_count " + std::to_string(spec.element_count) + " is too large");
  }
  if (Status st = ValidateCodec(spec.codec); !st.ok()) return st;
  if (spec.codec.codec != Codec::kNone && (spec.dtype != DType::kFloat32 || spec.op != ReduceOp::kSum)) {
    return Status(StatusCode::kUnsupported, std::string("codec ") + CodecName(spec.codec.codec) +
                                                " needs float32 sums, not " + info->name + " " + ReduceOpName(spec.op));
  }
  return Status::Ok();
}

Status ValidateShape(const JobShape& s) {
  if (s.world_size == 0) return InvalidArgument("world_size must be at least 1");
  if (s.num_aggregators == 0) return InvalidArgument("num_aggregators must be at least 1");
  if (s.slots == 0) return InvalidArgument("slots must be at least 1");
  if (s.blocks_per_message == 0) return InvalidArgument("blocks_per_message must be at least 1");
  if (s.window == 0) return InvalidArgument("window must be at least 1");
  return Status::Ok();
}

Status ValidateFrameSize(const JobShape& shape, const CollectiveSpec& spec) {
  // MaxWireBytes is 32-bit: it takes the block sizes ValidateSpec lets through (at most 16 MiB), no others.
  if (Status st = ValidateSpec(spec); !st.ok()) return st;
  const uint32_t element_size = FindDType(spec.dtype)->size;
  const uint64_t block_bytes = std::max(codec::MaxWireBytes(UploadFormat(spec.codec), spec.block_size, element_size),
                                        codec::MaxWireBytes(DownloadFormat(spec.codec), spec.block_size, element_size));
  const uint64_t largest = MaxDataPayloadFor(shape.blocks_per_message, block_bytes);
  if (largest > kMaxDataPayload) {
    return InvalidArgument("blocks_per_message " + std::to_string(shape.blocks_per_message) + " x block of " +
                           std::to_string(block_bytes) + " bytes makes frames of " + std::to_string(largest) +
                           " bytes, above the limit of " + std::to_string(kMaxDataPayload));
  }
  return Status::Ok();
}

ColumnLayout::ColumnLayout(const JobShape& shape, uint64_t element_count, uint32_t block_size,
                           uint32_t element_size)
    : shape_(shape),
      element_count_(element_count),
      block_size_(block_size),
      element_size_(element_size),
      num_blocks_((element_count + block_size - 1) / block_size),
      num_columns_(uint64_t{shape.num_aggregators} * shape.slots * shape.blocks_per_message),
      pairs_(uint64_t{shape.num_aggregators} * shape.slots),
      run_length_(shape.blocks_per_message) {
  if (num_blocks_ >= num_columns_) return;
  // Less than one row: the largest divisor of K that still gives every (aggregator, slot) pair a run.
  const uint64_t fair_share = std::max<uint64_t>(1, num_blocks_ / pairs_);
  for (uint32_t d = 1; d <= shape.blocks_per_message; ++d) {
    if (shape.blocks_per_message % d == 0 && d <= fair_share) run_length_ = d;
  }
}

uint64_t ColumnLayout::BlocksOf(uint32_t aggregator) const {
  // In closed form: visiting the runs took one step per row, 2^32 of them for a tensor of 2^32 blocks of one
  // element, on the I/O thread that admits the collective. Column c holds NB / C blocks, one more when
  // c < NB % C, and the aggregator serves the columns with c / L % A == aggregator (AggregatorOf).
  const uint64_t cycle = uint64_t{run_length_} * shape_.num_aggregators;
  const uint64_t first = uint64_t{aggregator} * run_length_;
  auto served_below = [&](uint64_t columns) {  // columns of `aggregator` among 0 .. columns - 1
    const uint64_t tail = columns % cycle;
    return columns / cycle * run_length_ + (tail > first ? std::min<uint64_t>(tail - first, run_length_) : 0);
  };
  return num_blocks_ / num_columns_ * served_below(num_columns_) + served_below(num_blocks_ % num_columns_);
}

uint32_t ColumnLayout::NonEmptyLanes(uint32_t aggregator, uint32_t slot) const {
  // Column(a, s, k) grows with k: the non-empty lanes are the blocks of the slot's runs in the first row.
  uint64_t lanes = 0;
  auto count = [&](uint64_t, uint64_t blocks) { lanes += blocks; };
  ForEachRunInRow(0, aggregator, slot, count);
  return static_cast<uint32_t>(lanes);
}

std::vector<ColumnLayout::Place> ColumnLayout::PlacesOf(uint32_t aggregator) const {
  std::vector<Place> places(num_places());
  for (uint32_t s = 0; s < shape_.slots; ++s) {
    const uint32_t lanes = NonEmptyLanes(aggregator, s);
    for (uint32_t lane = 0; lane < lanes; ++lane) places[Column(aggregator, s, lane)] = Place{s, lane};
  }
  return places;
}

std::vector<ColumnLayout::ColumnPlace> ColumnLayout::AllPlaces() const {
  std::vector<ColumnPlace> places(num_places());
  for (uint32_t a = 0; a < shape_.num_aggregators; ++a) {
    for (uint32_t s = 0; s < shape_.slots; ++s) {
      const uint32_t lanes = NonEmptyLanes(a, s);
      for (uint32_t lane = 0; lane < lanes; ++lane) places[Column(a, s, lane)] = ColumnPlace{a, s, lane};
    }
  }
  return places;
}

bool ColumnLayout::IsValidNext(uint64_t index, uint64_t column, uint64_t after, bool inclusive) const {
  if (index == kEndOfColumn) return true;
  if (index >= num_blocks_ || index % num_columns_ != column) return false;
  return inclusive ? index >= after : index > after;
}

uint64_t ColumnLayout::BlockElements(uint64_t block) const {
  const uint64_t start = block * block_size_;
  return element_count_ - start < block_size_ ? element_count_ - start : block_size_;
}

}  // namespace sparsereduce
