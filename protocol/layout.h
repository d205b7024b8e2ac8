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
  // Slot and lane of every column below min(C, NB) that `aggregator` serves (slot kNotServed for the others'):
  // one lookup instead of the divisions of SlotOf and LaneOf where every block received needs its lane (the
  // aggregator's engine, per block of every CONTRIBUTION).
  static constexpr uint32_t kNotServed = ~uint32_t{0};
  struct Place {
    uint32_t slot = kNotServed;
    uint32_t lane = 0;
  };
  std::vector<Place> PlacesOf(uint32_t aggregator) const;
  // Entries of PlacesOf and AllPlaces: every column that holds a block, whichever aggregator serves it.
  uint64_t num_places() const { return std::min(num_columns_, num_blocks_); }
  // Aggregator, slot and lane of every column below min(C, NB): a worker's one table for all its aggregators (a
  // PlacesOf per aggregator held A·C entries in all, 34 MB per collective with A = 64, S = 8, K = 128 and B = 1).
  struct ColumnPlace {
    uint32_t aggregator = 0;
    uint32_t slot = 0;
    uint32_t lane = 0;
  };
  std::vector<ColumnPlace> AllPlaces() const;
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
    const uint64_t column = block % num_columns_;
    return block / num_columns_ * shape_.slots * shape_.blocks_per_message +
           column / run_length_ / shape_.num_aggregators * run_length_ + column % run_length_;
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
