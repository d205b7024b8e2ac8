// Where every block lives: column, aggregator, slot and lane (docs/PROTOCOL.md §2). Pure arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "codec/codec_spec.h"

namespace sparsereduce {

// Job-wide parameters fixed at job formation.
struct JobShape {
  uint32_t world_size = 1;
  uint32_t num_aggregators = 1;
  uint32_t slots = 1;               // S
  uint32_t blocks_per_message = 1;  // K
  // D: CONTRIBUTION frames per slot a worker may have sent whose blocks are not all aggregated yet (§4).
  uint32_t window = 1;

  bool operator==(const JobShape&) const = default;
  std::string ToString() const;
};

// What one collective reduces.
struct CollectiveSpec {
  uint64_t element_count = 0;
  DType dtype = DType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  uint32_t block_size = 256;
  CodecSpec codec;

  bool operator==(const CollectiveSpec&) const = default;
  std::string ToString() const;
};

// Checks that the spec is well-formed and supported (dtype/op kernels exist, block_size >= 1, the block's byte
// size fits the wire's 32-bit length, a codec only with fp32 sums).
Status ValidateSpec(const CollectiveSpec& spec);
Status ValidateShape(const JobShape& shape);
// Checks the spec (ValidateSpec), then that the largest data frame of this job and spec, K·(24 + pad8(B·elem_size)),
// fits kMaxDataPayload.
Status ValidateFrameSize(const JobShape& shape, const CollectiveSpec& spec);

class ColumnLayout {
 public:
  ColumnLayout(const JobShape& shape, uint64_t element_count, uint32_t block_size, uint32_t element_size);

  uint64_t num_blocks() const { return num_blocks_; }
  uint64_t num_columns() const { return num_columns_; }
  uint32_t slots() const { return shape_.slots; }
  uint32_t lanes_per_slot() const { return shape_.blocks_per_message; }

  // Blocks in a run: consecutive columns (and so consecutive blocks of a row) of one aggregator's slot. K when the
  // tensor fills at least one row, less for smaller tensors so that every slot of every aggregator still gets
  // blocks; always divides K (docs/PROTOCOL.md §2).
  uint32_t run_length() const { return run_length_; }

  uint64_t ColumnOf(uint64_t block) const { return block % num_columns_; }
  uint32_t AggregatorOf(uint64_t column) const {
    return static_cast<uint32_t>(column / run_length_ % shape_.num_aggregators);
  }
  uint32_t SlotOf(uint64_t column) const {
    return static_cast<uint32_t>(column / run_length_ % pairs_ / shape_.num_aggregators);
  }
  uint32_t LaneOf(uint64_t column) const {
    return static_cast<uint32_t>(column / run_length_ / pairs_ * run_length_ + column % run_length_);
  }
  // Global column index of (aggregator, slot, lane).
  uint64_t Column(uint32_t aggregator, uint32_t slot, uint32_t lane) const {
    const uint64_t run = lane / run_length_ * pairs_ + uint64_t{slot} * shape_.num_aggregators + aggregator;
    return run * run_length_ + lane % run_length_;
  }
  // Calls fn(first_block, block_count) for each run of consecutive blocks of (aggregator, slot), in order.
  template <typename Fn>
  void ForEachRun(uint32_t aggregator, uint32_t slot, Fn&& fn) const {
    for (uint64_t row_start = 0; row_start < num_blocks_; row_start += num_columns_) {
      ForEachRunInRow(row_start, aggregator, slot, fn);
    }
  }
  // Where `column` stands among the columns of its aggregator, in increasing order (row 0's share of LocalBlock).
  uint64_t ServedIndex(uint64_t column) const {
    const uint64_t run = column / run_length_;
    return run / shape_.num_aggregators * run_length_ + column % run_length_;
  }
  // Slot and lane of every column below min(C, NB) that `aggregator` serves, at its ServedIndex (slot kNotServed
  // where no column of a block lands): one lookup instead of the divisions of SlotOf and LaneOf where every block
  // received needs its lane. Indexed by ServedIndex rather than by column, so that a worker's A tables, one per
  // aggregator, hold about C entries in all and not A·C.
  static constexpr uint32_t kNotServed = ~uint32_t{0};
  struct Place {
    uint32_t slot = kNotServed;
    uint32_t lane = 0;
  };
  std::vector<Place> PlacesOf(uint32_t aggregator) const;
  // Entries of PlacesOf (the same for every aggregator): ServedIndex of every column below min(C, NB) fits.
  uint64_t places_per_aggregator() const {
    const uint64_t cycle = uint64_t{run_length_} * shape_.num_aggregators;
    return (std::min(num_columns_, num_blocks_) + cycle - 1) / cycle * run_length_;
  }
  // The place of `column` (below num_columns) in `places` = PlacesOf(aggregator), or nullptr when another aggregator
  // serves it or it holds no block.
  const Place* FindPlace(const std::vector<Place>& places, uint32_t aggregator, uint64_t column) const {
    const uint64_t run = column / run_length_;
    if (run % shape_.num_aggregators != aggregator) return nullptr;
    const uint64_t index = run / shape_.num_aggregators * run_length_ + column % run_length_;
    if (index >= places.size() || places[index].slot == kNotServed) return nullptr;
    return &places[index];
  }
  // Blocks in the columns of `aggregator` (what it aggregates when every block is nonzero).
  uint64_t BlocksOf(uint32_t aggregator) const;
  // Lanes 0..n-1 of a slot hold non-empty columns (columns grow with the lane, so they form a prefix).
  uint32_t NonEmptyLanes(uint32_t aggregator, uint32_t slot) const;

  // True if `index` is END or a block of `column` that is > `after` (>= when `inclusive`) and < num_blocks.
  bool IsValidNext(uint64_t index, uint64_t column, uint64_t after, bool inclusive) const;
  // IsValidNext(index, ColumnOf(block), block, false), with one division instead of two (a per-block hot path).
  bool IsLaterInColumn(uint64_t index, uint64_t block) const {
    return index == ~uint64_t{0} || (index > block && index < num_blocks_ && (index - block) % num_columns_ == 0);
  }

  uint64_t BlockElements(uint64_t block) const;
  // Position of `block` among the blocks of its aggregator's columns (0 .. BlocksOf(aggregator)), row by row: where
  // an aggregator keeps per-block state (3LC error memory).
  uint64_t LocalBlock(uint64_t block) const {
    // Within a row, the aggregator's columns in increasing order: a partial last row fills a prefix.
    return block / num_columns_ * shape_.slots * shape_.blocks_per_message + ServedIndex(block % num_columns_);
  }
  uint32_t BlockBytes(uint64_t block) const { return static_cast<uint32_t>(BlockElements(block) * element_size_); }
  uint64_t BlockByteOffset(uint64_t block) const { return block * block_size_ * element_size_; }
  uint32_t MaxBlockBytes() const { return block_size_ * element_size_; }

 private:
  // ForEachRun within the row starting at block `row_start`.
  template <typename Fn>
  void ForEachRunInRow(uint64_t row_start, uint32_t aggregator, uint32_t slot, Fn& fn) const {
    for (uint64_t run = uint64_t{slot} * shape_.num_aggregators + aggregator; run * run_length_ < num_columns_;
         run += pairs_) {
      const uint64_t first = row_start + run * run_length_;
      if (first >= num_blocks_) return;
      fn(first, std::min<uint64_t>(run_length_, num_blocks_ - first));
    }
  }

  JobShape shape_;
  uint64_t element_count_;
  uint64_t block_size_;
  uint64_t element_size_;
  uint64_t num_blocks_;
  uint64_t num_columns_;
  uint64_t pairs_;  // A·S: (aggregator, slot) pairs
  uint32_t run_length_;
};

}  // namespace sparsereduce
