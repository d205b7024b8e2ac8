// Block layout arithmetic (protocol/layout.h, docs/PROTOCOL.md §2).
#include "protocol/layout.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "protocol/frame_format.h"

namespace sparsereduce {
namespace {

struct Combo {
  JobShape shape;
  uint64_t n;
  uint32_t b;
};

std::string Describe(const Combo& c) {
  return "A=" + std::to_string(c.shape.num_aggregators) + " S=" + std::to_string(c.shape.slots) +
         " K=" + std::to_string(c.shape.blocks_per_message) + " N=" + std::to_string(c.n) + " B=" + std::to_string(c.b);
}

std::vector<Combo> AllCombos() {
  std::vector<Combo> out;
  for (uint32_t a = 1; a <= 4; ++a) {
    for (uint32_t s = 1; s <= 3; ++s) {
      for (uint32_t k : {1u, 2u, 3u, 4u, 6u}) {
        for (uint32_t b : {1u, 2u, 3u, 7u, 256u}) {
          for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{b - 1}, uint64_t{b}, uint64_t{b + 1}, uint64_t{1000}}) {
            JobShape shape;
            shape.world_size = 2;
            shape.num_aggregators = a;
            shape.slots = s;
            shape.blocks_per_message = k;
            out.push_back(Combo{shape, n, b});
          }
        }
      }
    }
  }
  return out;
}

TEST(LayoutTest, EveryBlockHasExactlyOneHome) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    const uint32_t A = c.shape.num_aggregators, S = c.shape.slots, K = c.shape.blocks_per_message;
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    const uint64_t C = uint64_t{A} * S * K;
    ASSERT_EQ(layout.num_columns(), C);
    ASSERT_EQ(layout.num_blocks(), (c.n + c.b - 1) / c.b);
    EXPECT_EQ(layout.slots(), S);
    EXPECT_EQ(layout.lanes_per_slot(), K);

    // (a, s, k) -> column is a bijection onto [0, C), and agrees with §2: run r = c div L, a = r mod A,
    // s = (r div A) mod S, k = (r div (A·S))·L + c mod L.
    const uint64_t L = layout.run_length();
    ASSERT_EQ(K % L, 0u);
    std::vector<int> hits(C, 0);
    for (uint32_t a = 0; a < A; ++a) {
      for (uint32_t s = 0; s < S; ++s) {
        for (uint32_t k = 0; k < K; ++k) {
          const uint64_t col = layout.Column(a, s, k);
          ASSERT_LT(col, C);
          ++hits[col];
          EXPECT_EQ(layout.AggregatorOf(col), a);
          EXPECT_EQ(layout.SlotOf(col), s);
          EXPECT_EQ(layout.LaneOf(col), k);
          EXPECT_EQ(col / L % A, a);
          EXPECT_EQ(col / L / A % S, s);
          EXPECT_EQ(col / L / (A * S) * L + col % L, k);
        }
      }
    }
    for (uint64_t col = 0; col < C; ++col) EXPECT_EQ(hits[col], 1) << "column " << col;

    // Every block: exactly one (a, s, k) whose column is b % C.
    for (uint64_t block = 0; block < layout.num_blocks(); ++block) {
      EXPECT_EQ(layout.ColumnOf(block), block % C);
      int homes = 0;
      for (uint32_t a = 0; a < A; ++a)
        for (uint32_t s = 0; s < S; ++s)
          for (uint32_t k = 0; k < K; ++k) homes += layout.Column(a, s, k) == block % C;
      EXPECT_EQ(homes, 1) << "block " << block;
    }
  }
}

// §2's run length: K once the tensor fills a row; below that the largest divisor of K that is at most NB / (A·S)
// (at least 1), so that a small tensor still reaches every aggregator and slot.
TEST(LayoutTest, PlaceTablesAgreeWithTheArithmetic) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    const uint32_t A = c.shape.num_aggregators;
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    const uint64_t holding = std::min(layout.num_columns(), layout.num_blocks());  // columns that hold a block
    const std::vector<ColumnLayout::ColumnPlace> all = layout.AllPlaces();
    ASSERT_EQ(all.size(), holding);
    for (uint32_t a = 0; a < A; ++a) {
      const std::vector<ColumnLayout::Place> mine = layout.PlacesOf(a);
      ASSERT_EQ(mine.size(), holding);
      for (uint64_t column = 0; column < holding; ++column) {
        EXPECT_EQ(all[column].aggregator, layout.AggregatorOf(column)) << "column " << column;
        EXPECT_EQ(all[column].slot, layout.SlotOf(column)) << "column " << column;
        EXPECT_EQ(all[column].lane, layout.LaneOf(column)) << "column " << column;
        if (layout.AggregatorOf(column) == a) {
          EXPECT_EQ(mine[column].slot, layout.SlotOf(column));
          EXPECT_EQ(mine[column].lane, layout.LaneOf(column));
        } else {
          EXPECT_EQ(mine[column].slot, ColumnLayout::kNotServed) << "aggregator " << a << ", column " << column;
        }
      }
    }
  }
}

TEST(LayoutTest, RunLengthIsKOrTheLargestFairDivisor) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    const uint32_t A = c.shape.num_aggregators, S = c.shape.slots, K = c.shape.blocks_per_message;
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    uint32_t want = K;
    if (layout.num_blocks() < layout.num_columns()) {
      const uint64_t share = std::max<uint64_t>(1, layout.num_blocks() / (uint64_t{A} * S));
      for (uint32_t d = 1; d <= K; ++d) {
        if (K % d == 0 && d <= share) want = d;
      }
    }
    EXPECT_EQ(layout.run_length(), want);
  }
  JobShape shape;
  shape.num_aggregators = 4;
  shape.slots = 8;
  shape.blocks_per_message = 128;
  EXPECT_EQ(ColumnLayout(shape, 64 << 20, 256, 4).run_length(), 128u);  // 64 Mi elements: 16 rows
  EXPECT_EQ(ColumnLayout(shape, 1 << 18, 256, 4).run_length(), 32u);    // 1024 blocks: 32 per (a, s)
  EXPECT_EQ(ColumnLayout(shape, 20 * 256, 256, 4).run_length(), 1u);    // 20 blocks: fewer than A·S
}

// ForEachRun(a, s) visits exactly the blocks of (a, s)'s columns, each once, in increasing order, in runs of
// consecutive blocks: what a worker scans before it announces that slot.
TEST(LayoutTest, ForEachRunVisitsExactlyTheSlotsBlocks) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    std::vector<int> visits(layout.num_blocks(), 0);
    for (uint32_t a = 0; a < c.shape.num_aggregators; ++a) {
      for (uint32_t s = 0; s < c.shape.slots; ++s) {
        uint64_t last_end = 0;
        layout.ForEachRun(a, s, [&](uint64_t first, uint64_t count) {
          EXPECT_GE(first, last_end);
          EXPECT_GE(count, 1u);
          EXPECT_LE(count, layout.run_length());
          ASSERT_LE(first + count, layout.num_blocks());
          for (uint64_t b = first; b < first + count; ++b) {
            ++visits[b];
            EXPECT_EQ(layout.AggregatorOf(layout.ColumnOf(b)), a) << "block " << b;
            EXPECT_EQ(layout.SlotOf(layout.ColumnOf(b)), s) << "block " << b;
          }
          last_end = first + count;
        });
      }
    }
    for (uint64_t b = 0; b < visits.size(); ++b) EXPECT_EQ(visits[b], 1) << "block " << b;
  }
}

TEST(LayoutTest, BlocksOfCountsEachAggregatorsBlocks) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    std::vector<uint64_t> expected(c.shape.num_aggregators, 0);
    for (uint64_t block = 0; block < layout.num_blocks(); ++block) {
      ++expected[layout.AggregatorOf(layout.ColumnOf(block))];
    }
    for (uint32_t a = 0; a < c.shape.num_aggregators; ++a) EXPECT_EQ(layout.BlocksOf(a), expected[a]) << "a=" << a;
    // LocalBlock numbers each aggregator's blocks 0 .. BlocksOf - 1 (the aggregator's per-block state).
    std::vector<std::vector<int>> local(c.shape.num_aggregators);
    for (uint32_t a = 0; a < c.shape.num_aggregators; ++a) local[a].assign(expected[a], 0);
    for (uint64_t block = 0; block < layout.num_blocks(); ++block) {
      const uint32_t a = layout.AggregatorOf(layout.ColumnOf(block));
      ASSERT_LT(layout.LocalBlock(block), expected[a]) << "block " << block;
      ++local[a][layout.LocalBlock(block)];
    }
    for (const auto& l : local) EXPECT_EQ(std::count(l.begin(), l.end(), 1), static_cast<long>(l.size()));
  }
}

TEST(LayoutTest, NonEmptyLanesFormAPrefix) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    const uint32_t A = c.shape.num_aggregators, S = c.shape.slots, K = c.shape.blocks_per_message;
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    uint64_t total_nonempty = 0;
    for (uint32_t a = 0; a < A; ++a) {
      for (uint32_t s = 0; s < S; ++s) {
        uint32_t brute = 0;
        bool prefix = true;
        bool seen_empty = false;
        for (uint32_t k = 0; k < K; ++k) {
          const bool nonempty = layout.Column(a, s, k) < layout.num_blocks();
          if (nonempty) {
            ++brute;
            if (seen_empty) prefix = false;
          } else {
            seen_empty = true;
          }
        }
        EXPECT_TRUE(prefix) << "a=" << a << " s=" << s;
        EXPECT_EQ(layout.NonEmptyLanes(a, s), brute) << "a=" << a << " s=" << s;
        total_nonempty += brute;
      }
    }
    EXPECT_EQ(total_nonempty, std::min<uint64_t>(layout.num_blocks(), layout.num_columns()));
  }
}

TEST(LayoutTest, BlockElementsSumToN) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    for (uint32_t elem : {1u, 2u, 4u, 8u}) {
      ColumnLayout layout(c.shape, c.n, c.b, elem);
      uint64_t sum = 0;
      uint64_t bytes = 0;
      for (uint64_t block = 0; block < layout.num_blocks(); ++block) {
        const uint64_t e = layout.BlockElements(block);
        EXPECT_GE(e, 1u);
        EXPECT_LE(e, c.b);
        if (block + 1 < layout.num_blocks()) {
          EXPECT_EQ(e, c.b);
        }
        EXPECT_EQ(layout.BlockBytes(block), e * elem);
        EXPECT_EQ(layout.BlockByteOffset(block), bytes);
        sum += e;
        bytes += e * elem;
      }
      EXPECT_EQ(sum, c.n);
      EXPECT_EQ(layout.MaxBlockBytes(), c.b * elem);
    }
  }
}

TEST(LayoutTest, IsValidNext) {
  for (const Combo& c : AllCombos()) {
    SCOPED_TRACE(Describe(c));
    ColumnLayout layout(c.shape, c.n, c.b, 4);
    const uint64_t C = layout.num_columns();
    const uint64_t NB = layout.num_blocks();
    for (uint64_t col = 0; col < C; ++col) {
      for (bool inclusive : {false, true}) {
        // END is always acceptable.
        EXPECT_TRUE(layout.IsValidNext(kEndOfColumn, col, col, inclusive));
        EXPECT_TRUE(layout.IsValidNext(kEndOfColumn, col, kEndOfColumn - 1, inclusive));
        // The first index past the column's range, and far beyond.
        uint64_t past = col;
        while (past < NB) past += C;
        EXPECT_FALSE(layout.IsValidNext(past, col, col, inclusive)) << past;
        EXPECT_FALSE(layout.IsValidNext(past + 1000 * C, col, col, inclusive));
        EXPECT_FALSE(layout.IsValidNext(kEndOfColumn - 1, col, col, inclusive));

        for (uint64_t after = col; after < NB; after += C) {
          // Later blocks of the same column: the next few, and the column's last block.
          for (uint64_t index = after + C; index < NB && index <= after + 8 * C; index += C) {
            EXPECT_TRUE(layout.IsValidNext(index, col, after, inclusive)) << index << " after " << after;
          }
          if (past - C > after) {
            EXPECT_TRUE(layout.IsValidNext(past - C, col, after, inclusive)) << past - C;
          }
          // Equal index: only when inclusive.
          EXPECT_EQ(layout.IsValidNext(after, col, after, inclusive), inclusive) << after;
          // Earlier blocks of the same column.
          for (uint64_t index = (after >= 8 * C ? after - 8 * C : col); index < after; index += C) {
            EXPECT_FALSE(layout.IsValidNext(index, col, after, inclusive)) << index << " after " << after;
          }
          // Blocks of other columns, both sides of `after`.
          if (C > 1) {
            for (uint64_t index = (after >= C ? after - C + 1 : 0); index < NB && index < after + 2 * C; ++index) {
              if (index % C == col) continue;
              EXPECT_FALSE(layout.IsValidNext(index, col, after, inclusive)) << index << " after " << after;
            }
          }
        }
      }
    }
  }
}

TEST(LayoutTest, SixtyFourBitBlockIndices) {
  JobShape shape;
  const uint64_t n = 5'000'000'000;
  ColumnLayout layout(shape, n, 256, 4);
  EXPECT_EQ(layout.num_blocks(), 19'531'250u);  // 5e9 / 256, exactly
  const uint64_t last = layout.num_blocks() - 1;
  EXPECT_EQ(layout.BlockElements(last), 256u);
  EXPECT_EQ(layout.BlockByteOffset(last), uint64_t{19'531'249} * 256 * 4);
  EXPECT_EQ(layout.BlockByteOffset(last), 19'999'998'976u);  // > 2^32
  EXPECT_EQ(layout.BlockByteOffset(last) + layout.BlockBytes(last), n * 4);

  ColumnLayout partial(shape, n + 3, 256, 4);
  EXPECT_EQ(partial.num_blocks(), 19'531'251u);
  EXPECT_EQ(partial.BlockElements(partial.num_blocks() - 1), 3u);
  EXPECT_EQ(partial.BlockByteOffset(partial.num_blocks() - 1), n * 4);
  EXPECT_EQ(partial.BlockBytes(partial.num_blocks() - 1), 12u);

  // Block indices beyond 2^32, with B = 1.
  ColumnLayout fine(shape, n, 1, 8);
  EXPECT_EQ(fine.num_blocks(), n);
  EXPECT_EQ(fine.BlockByteOffset(n - 1), (n - 1) * 8);
  EXPECT_EQ(fine.BlockElements(n - 1), 1u);

  JobShape wide;
  wide.num_aggregators = 3;
  wide.slots = 2;
  wide.blocks_per_message = 4;
  ColumnLayout cols(wide, n, 1, 4);
  EXPECT_EQ(cols.ColumnOf(n - 1), (n - 1) % 24);
  EXPECT_EQ(cols.NonEmptyLanes(2, 1), 4u);
  EXPECT_TRUE(cols.IsValidNext(n - 1, (n - 1) % 24, (n - 1) - 24, false));
  EXPECT_FALSE(cols.IsValidNext(n - 1 + 24, (n - 1) % 24, (n - 1) - 24, false));
}

TEST(LayoutTest, WorkedExampleFromProtocolDoc) {
  // §4: A = 1, S = 1, K = 2, N = 10, B = 2 -> NB = 5, C = 2; column 0 = {0, 2, 4}, column 1 = {1, 3}.
  JobShape shape;
  shape.world_size = 2;
  shape.blocks_per_message = 2;
  ColumnLayout layout(shape, 10, 2, 4);
  EXPECT_EQ(layout.num_blocks(), 5u);
  EXPECT_EQ(layout.num_columns(), 2u);
  EXPECT_EQ(layout.Column(0, 0, 0), 0u);
  EXPECT_EQ(layout.Column(0, 0, 1), 1u);
  EXPECT_EQ(layout.NonEmptyLanes(0, 0), 2u);
  EXPECT_TRUE(layout.IsValidNext(2, 0, 0, false));
  EXPECT_TRUE(layout.IsValidNext(4, 0, 2, false));
  EXPECT_FALSE(layout.IsValidNext(5, 1, 3, false));
  EXPECT_TRUE(layout.IsValidNext(3, 1, 1, false));
}

TEST(ValidateSpecTest, AcceptsSupportedSpecs) {
  for (DType dtype : {DType::kFloat32, DType::kInt32}) {
    for (uint64_t n : {uint64_t{0}, uint64_t{1}, uint64_t{5'000'000'000}}) {
      for (uint32_t b : {1u, 256u, uint32_t{1} << 22}) {
        CollectiveSpec spec;
        spec.dtype = dtype;
        spec.op = ReduceOp::kSum;
        spec.element_count = n;
        spec.block_size = b;
        Status s = ValidateSpec(spec);
        EXPECT_TRUE(s.ok()) << spec.ToString() << ": " << s.ToString();
      }
    }
  }
}

TEST(ValidateSpecTest, RejectsBadSpecs) {
  CollectiveSpec good;
  good.element_count = 1000;

  CollectiveSpec zero_block = good;
  zero_block.block_size = 0;
  Status s = ValidateSpec(zero_block);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();

  CollectiveSpec unknown_dtype = good;
  unknown_dtype.dtype = static_cast<DType>(99);
  s = ValidateSpec(unknown_dtype);
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("99"), std::string::npos) << s.message();
  EXPECT_NE(unknown_dtype.ToString().find("#99"), std::string::npos) << unknown_dtype.ToString();

  CollectiveSpec zero_dtype = good;
  zero_dtype.dtype = static_cast<DType>(0);
  EXPECT_EQ(ValidateSpec(zero_dtype).code(), StatusCode::kUnsupported);

  for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin, ReduceOp::kAvg, static_cast<ReduceOp>(0),
                      static_cast<ReduceOp>(77)}) {
    CollectiveSpec bad_op = good;
    bad_op.op = op;
    s = ValidateSpec(bad_op);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << static_cast<uint32_t>(op) << ": " << s.ToString();
  }

  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kInt64, DType::kFloat64}) {
    CollectiveSpec no_kernels = good;
    no_kernels.dtype = dtype;
    s = ValidateSpec(no_kernels);
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  }

  // A block must fit the 16 MiB limit.
  CollectiveSpec huge_block = good;
  huge_block.block_size = (uint32_t{1} << 22) + 1;
  EXPECT_EQ(ValidateSpec(huge_block).code(), StatusCode::kInvalidArgument);
  huge_block.block_size = 0xFFFFFFFF;
  EXPECT_EQ(ValidateSpec(huge_block).code(), StatusCode::kInvalidArgument);

  CollectiveSpec huge_count = good;
  huge_count.element_count = ~uint64_t{0};
  EXPECT_EQ(ValidateSpec(huge_count).code(), StatusCode::kInvalidArgument);
}

TEST(ValidateShapeTest, RejectsZeros) {
  JobShape good;
  EXPECT_TRUE(ValidateShape(good).ok());
  JobShape s = good;
  s.world_size = 0;
  EXPECT_EQ(ValidateShape(s).code(), StatusCode::kInvalidArgument);
  s = good;
  s.num_aggregators = 0;
  EXPECT_EQ(ValidateShape(s).code(), StatusCode::kInvalidArgument);
  s = good;
  s.slots = 0;
  EXPECT_EQ(ValidateShape(s).code(), StatusCode::kInvalidArgument);
  s = good;
  s.blocks_per_message = 0;
  EXPECT_EQ(ValidateShape(s).code(), StatusCode::kInvalidArgument);
  // A window of zero frames would let no CONTRIBUTION out at all.
  s = good;
  s.window = 0;
  const Status st = ValidateShape(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "window must be at least 1");
}

// Codecs decode to fp32 and sum there: a codec over int32, or with another reduction than a sum, is refused as
// UNSUPPORTED (the same spec without the codec is fine).
TEST(ValidateSpecTest, ACodecNeedsFloat32Sums) {
  CollectiveSpec spec{1000, DType::kInt32, ReduceOp::kSum, 256};
  ASSERT_TRUE(ValidateSpec(spec).ok());
  spec.codec.codec = Codec::kFloat16;
  Status st = ValidateSpec(spec);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(st.message(), "codec fp16 needs float32 sums, not int32 sum");
  spec.dtype = DType::kFloat32;
  EXPECT_TRUE(ValidateSpec(spec).ok());
  spec.codec = CodecSpec{Codec::kTopK, 0, 1.0f, false, 0.25f};
  EXPECT_TRUE(ValidateSpec(spec).ok()) << spec.ToString();
  spec.dtype = DType::kInt32;
  st = ValidateSpec(spec);
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_EQ(st.message(), "codec topk needs float32 sums, not int32 sum");
}

// The largest data frame, K x (24 + pad8(block bytes)), may be exactly kMaxDataPayload but not one padded block
// more; and the larger of the two directions' wire formats counts (a 3LC upload is small, its fp32 results not).
TEST(ValidateFrameSizeTest, TheLargestFrameMayReachTheLimitButNotPassIt) {
  const JobShape shape{2, 1, 1, 16};
  // 16 x (24 + 4 x 4194298) = 16 x 16 MiB = 256 MiB exactly.
  CollectiveSpec spec{1 << 30, DType::kFloat32, ReduceOp::kSum, 4194298};
  ASSERT_EQ(16 * (kEntrySize + Pad8(4ull * spec.block_size)), kMaxDataPayload);
  EXPECT_TRUE(ValidateFrameSize(shape, spec).ok());
  spec.block_size = 4194299;  // 16 777 196 bytes, padded to 16 777 200
  Status st = ValidateFrameSize(shape, spec);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "blocks_per_message 16 x block of 16777196 bytes makes frames of 268435584 bytes, above the limit of "
            "268435456");
  JobShape fewer = shape;
  fewer.blocks_per_message = 15;
  EXPECT_TRUE(ValidateFrameSize(fewer, spec).ok());

  // 3LC: ternary both ways is far below the limit; with fp32 results the download frames are the raw size again.
  spec.codec = CodecSpec{Codec::kThreeLC, 0, 1.5f};
  ASSERT_TRUE(ValidateSpec(spec).ok()) << ValidateSpec(spec).ToString();
  EXPECT_TRUE(ValidateFrameSize(shape, spec).ok());
  spec.codec.result_fp32 = true;
  ASSERT_TRUE(ValidateSpec(spec).ok());
  EXPECT_EQ(ValidateFrameSize(shape, spec).code(), StatusCode::kInvalidArgument);
  // fp16 both ways: half the bytes.
  spec.codec = CodecSpec{Codec::kFloat16};
  EXPECT_TRUE(ValidateFrameSize(shape, spec).ok());
}

TEST(ValidateFrameSizeTest, ChecksTheSpecItself) {
  // 2^30 int32 elements per block: 4 GiB, whose byte count wrapped to 0 in 32 bits and passed as a tiny frame.
  const JobShape shape{1, 1, 1, 1, 1};
  const Status huge = ValidateFrameSize(shape, CollectiveSpec{1, DType::kInt32, ReduceOp::kSum, 1u << 30});
  EXPECT_EQ(huge.code(), StatusCode::kInvalidArgument) << huge.ToString();
  const Status unknown = ValidateFrameSize(shape, CollectiveSpec{1, static_cast<DType>(99), ReduceOp::kSum, 256});
  EXPECT_EQ(unknown.code(), StatusCode::kUnsupported) << unknown.ToString();
}

}  // namespace
}  // namespace sparsereduce
