// The column engine and the worker schedule reject protocol violations with a reason instead of misbehaving.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "codec/tensor_codec.h"
#include "codec/three_lc.h"
#include "codec/wire.h"
#include "core/buffer_pool.h"
#include "protocol/column_engine.h"
#include "protocol/worker_collective.h"

namespace sparsereduce {
namespace {

// W=2, A=1, S=1, K=2, N=10, B=2: the worked example of docs/PROTOCOL.md §4.
const JobShape kShape{2, 1, 1, 2};
const CollectiveSpec kSpec{10, DType::kFloat32, ReduceOp::kSum, 2};

struct Sent {
  FrameHeader header;
  ByteBuffer payload;
};

Sent Contribution(uint32_t slot, std::vector<Entry> entries, uint64_t job = 1, uint64_t seq = 1) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<std::span<const std::byte>> data;
  for (const Entry& e : entries) {
    if (e.data_bytes) {
      storage.emplace_back(e.data_bytes, std::byte{1});
      data.push_back(storage.back());
    }
  }
  ByteBuffer frame = EncodeDataFrame({FrameType::kContribution, 0, slot, job, seq, 0}, entries, data);
  Result<FrameHeader> header = DecodeFrameHeader(frame.span());
  EXPECT_TRUE(header.ok());
  ByteBuffer payload(frame.size() - kFrameHeaderSize);
  if (payload.size()) std::memcpy(payload.data(), frame.data() + kFrameHeaderSize, payload.size());
  return {*header, std::move(payload)};
}

Status Feed(ColumnEngine& engine, uint32_t rank, Sent sent, std::vector<ColumnEngine::Broadcast>* out) {
  return engine.OnContribution(rank, sent.header, std::move(sent.payload), out);
}

std::vector<EntryView> Decode(const ColumnEngine::Broadcast& b) {
  std::vector<EntryView> entries;
  auto header = DecodeFrameHeader(b.frame->span());
  EXPECT_TRUE(header.ok());
  EXPECT_TRUE(DecodeDataPayload(*header, b.frame->span().subspan(kFrameHeaderSize), &entries).ok());
  return entries;
}

TEST(ColumnEngine, WorkedExampleFromProtocolDoc) {
  ColumnEngine engine(kShape, 0, 1, 1, kSpec);
  std::vector<ColumnEngine::Broadcast> out;
  // Rank 1 streams its announce and both its blocks (one frame of K = 2) before rank 0 has said anything.
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{2, 4, 8}, {4, kEndOfColumn, 8}}), &out).ok());
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(engine.AwaitedRanks(), (std::vector<uint32_t>{0}));
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  std::vector<EntryView> entries = Decode(out[0]);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].next, 2u);
  EXPECT_EQ(entries[1].next, 3u);
  EXPECT_EQ(engine.AwaitedRanks(), (std::vector<uint32_t>{0}));  // blocks 2 and 3 wait for rank 0

  // Rank 0's blocks complete block 2 and block 3; block 4 (rank 1's, already here) follows in the same RESULT.
  out.clear();
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}}), &out).ok());
  ASSERT_EQ(out.size(), 2u);  // K = 2 entries per RESULT
  entries = Decode(out[0]);
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].block, 2u);
  EXPECT_EQ(entries[0].next, 4u);
  EXPECT_EQ(entries[1].block, 4u);
  EXPECT_EQ(entries[1].next, kEndOfColumn);
  entries = Decode(out[1]);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].block, 3u);
  EXPECT_EQ(entries[0].next, kEndOfColumn);
  EXPECT_TRUE(engine.done());

  // The slot is finished: anything more is a violation.
  out.clear();
  Status st = Feed(engine, 0, Contribution(0, {{4, kEndOfColumn, 8}}), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("after the slot finished"), std::string::npos) << st.message();
}

struct Violation {
  const char* name;
  std::vector<Entry> round0_rank0;
  const char* expect;
};

TEST(ColumnEngine, RejectsBadAnnounces) {
  const std::vector<Violation> cases = {
      {"too few entries", {{0, 2, 0}}, "expected one per non-empty column"},
      {"too many entries", {{0, 2, 0}, {1, 3, 0}, {1, 3, 0}}, "expected one per non-empty column"},
      {"wrong block", {{1, 2, 0}, {1, 3, 0}}, "entry must be"},
      {"data in the announce", {{0, 2, 8}, {1, 3, 0}}, "entry must be"},
      {"next in another column", {{0, 3, 0}, {1, 3, 0}}, "not a block of column"},
      {"next past the tensor", {{0, 6, 0}, {1, 3, 0}}, "not a block of column"},
  };
  for (const Violation& v : cases) {
    SCOPED_TRACE(v.name);
    ColumnEngine engine(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    Status st = Feed(engine, 0, Contribution(0, v.round0_rank0), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_NE(st.message().find(v.expect), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  }
}

TEST(ColumnEngine, RejectsBadBlocks) {
  auto engine_after_announce = [] {
    auto engine = std::make_unique<ColumnEngine>(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    EXPECT_TRUE(Feed(*engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
    EXPECT_TRUE(Feed(*engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
    return engine;
  };
  // Rank 0 announced block 2 (column 0) and block 3 (column 1).
  const std::vector<std::pair<std::vector<Entry>, const char*>> cases = {
      {{}, "without entries"},
      {{{3, kEndOfColumn, 8}, {2, kEndOfColumn, 8}}, "increasing order"},
      {{{3, kEndOfColumn, 8}}, "block 2 (column 0) has not come yet"},     // skips block 2 of column 0
      {{{2, kEndOfColumn, 8}, {5, 7, 8}}, "beyond the tensor"},
      {{{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}, {4, kEndOfColumn, 8}}, "more than the 2 blocks per message"},
      {{{4, kEndOfColumn, 8}}, "announced block 2"},                       // skips its own block 2
      {{{2, kEndOfColumn, 4}}, "data bytes"},                              // short block
      {{{2, kEndOfColumn, 0}}, "without data"},
      {{{2, 2, 8}}, "not a later block"},                                  // next not after block
      {{{2, 3, 8}}, "not a later block"},                                  // next in the other column
      {{{2, kEndOfColumn, 8}, {4, kEndOfColumn, 8}}, "no further block"},  // column 0 ended with block 2
  };
  for (const auto& [entries, expect] : cases) {
    SCOPED_TRACE(expect);
    auto engine = engine_after_announce();
    std::vector<ColumnEngine::Broadcast> out;
    Status st = Feed(*engine, 0, Contribution(0, entries), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  }
  // A block sent twice.
  auto engine = engine_after_announce();
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(*engine, 1, Contribution(0, {{2, kEndOfColumn, 8}}), &out).ok());
  EXPECT_EQ(Feed(*engine, 1, Contribution(0, {{2, kEndOfColumn, 8}}), &out).code(), StatusCode::kProtocolViolation);
}

TEST(ColumnEngine, RejectsBlocksOfAnotherSlotOrAggregator) {
  // A = 2, K = 1: aggregator 0 owns column 0 (blocks 0, 2, 4), aggregator 1 column 1.
  ColumnEngine engine({2, 2, 1, 1}, 0, 1, 1, kSpec);
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{0, 2, 0}}), &out).ok());
  Status st = Feed(engine, 0, Contribution(0, {{1, kEndOfColumn, 8}}), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("not a block of this slot of aggregator 0"), std::string::npos) << st.message();
}

TEST(ColumnEngine, RejectsAFrameBeyondTheWindow) {
  // Window of one frame (the shape's default): rank 1's block 2 waits for rank 0's, so a second frame is too many.
  ColumnEngine engine(kShape, 0, 1, 1, kSpec);
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{2, 4, 8}}), &out).ok());
  Status st = Feed(engine, 1, Contribution(0, {{4, kEndOfColumn, 8}}), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("beyond the window"), std::string::npos) << st.message();

  // With a window of two frames the same sequence is fine, and the engine holds the early block until rank 0's
  // block 2 arrives.
  JobShape wide = kShape;
  wide.window = 2;
  ColumnEngine engine2(wide, 0, 1, 1, kSpec);
  out.clear();
  ASSERT_TRUE(Feed(engine2, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine2, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine2, 1, Contribution(0, {{2, 4, 8}}), &out).ok());
  ASSERT_TRUE(Feed(engine2, 1, Contribution(0, {{4, kEndOfColumn, 8}}), &out).ok());
  EXPECT_EQ(out.size(), 1u);  // only the announce reply
  ASSERT_TRUE(Feed(engine2, 0, Contribution(0, {{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}}), &out).ok());
  EXPECT_TRUE(engine2.done());
}

TEST(ColumnEngine, RejectsSlotOutOfRangeAndEmptySlot) {
  ColumnEngine engine({2, 1, 3, 2}, 0, 1, 1, {2, DType::kFloat32, ReduceOp::kSum, 2});  // one block, slot 0 only
  std::vector<ColumnEngine::Broadcast> out;
  EXPECT_NE(Feed(engine, 0, Contribution(5, {}), &out).message().find("slot out of range"), std::string::npos);
  EXPECT_NE(Feed(engine, 0, Contribution(1, {}), &out).message().find("no blocks"), std::string::npos);
}

TEST(WorkerCollective, RejectsBadResults) {
  std::vector<float> tensor(10, 0.0f);
  tensor[4] = 1.0f;  // block 2
  tensor[6] = 1.0f;  // block 3
  auto make = [&] {
    auto wc = std::make_unique<WorkerCollective>(kShape, 1, 1, kSpec, std::as_writable_bytes(std::span(tensor)));
    EXPECT_EQ(wc->Start(0).size(), 2u);  // the announce and one frame with blocks 2 and 3
    return wc;
  };
  auto result = [](std::vector<Entry> entries, uint64_t job = 1, uint64_t seq = 1) {
    std::vector<std::vector<std::byte>> storage;
    std::vector<std::span<const std::byte>> data;
    for (const Entry& e : entries) {
      if (e.data_bytes) {
        storage.emplace_back(e.data_bytes, std::byte{0});
        data.push_back(storage.back());
      }
    }
    return EncodeDataFrame({FrameType::kResult, 0, 0, job, seq, 0}, entries, data);
  };
  auto feed = [](WorkerCollective& wc, const ByteBuffer& frame) {
    std::vector<OutgoingFrame> frames;
    auto header = DecodeFrameHeader(frame.span());
    EXPECT_TRUE(header.ok());
    return wc.OnResult(0, *header, frame.span().subspan(kFrameHeaderSize), &frames);
  };
  const ByteBuffer reply = result({{0, 2, 0}, {1, 3, 0}});
  const std::vector<std::pair<std::vector<ByteBuffer>, const char*>> cases = [&] {
    std::vector<std::pair<std::vector<ByteBuffer>, const char*>> v;
    auto one = [](ByteBuffer b) {
      std::vector<ByteBuffer> frames;
      frames.push_back(std::move(b));
      return frames;
    };
    auto after_reply = [&](ByteBuffer b) {
      std::vector<ByteBuffer> frames;
      frames.push_back(result({{0, 2, 0}, {1, 3, 0}}));
      frames.push_back(std::move(b));
      return frames;
    };
    v.emplace_back(one(result({{0, 2, 0}, {1, 3, 0}}, 9)), "expected job 1");
    v.emplace_back(one(result({{0, 2, 0}, {1, 3, 0}}, 1, 2)), "collective 2");
    v.emplace_back(one(result({{0, 2, 0}})), "expected one per column");
    v.emplace_back(one(result({{0, 4, 0}, {1, 3, 0}})), "worker's own next");  // skips our block 2
    v.emplace_back(one(result({{0, 2, 8}, {1, 3, 0}})), "data bytes");
    v.emplace_back(one(result({{0, 2, 0}, {1, 3, 0}, {1, 3, 0}})), "expected one per column");
    v.emplace_back(after_reply(result({})), "without entries");
    v.emplace_back(after_reply(result({{4, kEndOfColumn, 8}})), "other than its column's current one");
    v.emplace_back(after_reply(result({{2, kEndOfColumn, 4}})), "data bytes");
    v.emplace_back(after_reply(result({{2, 3, 8}})), "not a block of the column");
    v.emplace_back(after_reply(result({{2, kEndOfColumn, 8}, {2, kEndOfColumn, 8}})),
                   "other than its column's current one");
    v.emplace_back(after_reply(result({{12, kEndOfColumn, 8}})), "not one of this slot's");
    v.emplace_back(after_reply(result({{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}, {4, kEndOfColumn, 8}})),
                   "slot 0: RESULT with 3 entries, more than the 2 blocks per message");
    return v;
  }();
  for (const auto& [frames, expect] : cases) {
    SCOPED_TRACE(expect);
    auto wc = make();
    for (size_t i = 0; i + 1 < frames.size(); ++i) ASSERT_TRUE(feed(*wc, frames[i]).ok());
    Status st = feed(*wc, frames.back());
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.message();
  }
  // A correct announce reply and results for both blocks finish the collective.
  auto wc = make();
  EXPECT_TRUE(feed(*wc, reply).ok());
  EXPECT_TRUE(feed(*wc, result({{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}})).ok());
  EXPECT_TRUE(wc->done());
}

TEST(WorkerCollective, RejectsAResultForABlockNotSentYet) {
  // K = 2 and a window of one frame: blocks 0 and 1 go out first, blocks 2 and 3 only once both are aggregated.
  const JobShape shape{2, 1, 1, 2};
  std::vector<float> tensor(10, 0.0f);
  tensor[0] = 1.0f;  // block 0
  tensor[2] = 1.0f;  // block 1
  tensor[4] = 1.0f;  // block 2
  tensor[6] = 1.0f;  // block 3
  WorkerCollective wc(shape, 1, 1, kSpec, std::as_writable_bytes(std::span(tensor)));
  const std::vector<OutgoingFrame> first = wc.Start(0);
  ASSERT_EQ(first.size(), 2u);  // announce, blocks 0 and 1; blocks 2 and 3 wait for the window
  auto feed = [&](std::vector<Entry> entries) {
    std::vector<std::vector<std::byte>> storage;
    std::vector<std::span<const std::byte>> data;
    for (const Entry& e : entries) {
      if (e.data_bytes) {
        storage.emplace_back(e.data_bytes, std::byte{0});
        data.push_back(storage.back());
      }
    }
    ByteBuffer frame = EncodeDataFrame({FrameType::kResult, 0, 0, 1, 1, 0}, entries, data);
    std::vector<OutgoingFrame> frames;
    auto header = DecodeFrameHeader(frame.span());
    return wc.OnResult(0, *header, frame.span().subspan(kFrameHeaderSize), &frames);
  };
  ASSERT_TRUE(feed({{0, 0, 0}, {1, 1, 0}}).ok());
  ASSERT_TRUE(feed({{0, 2, 8}}).ok());  // block 0 done; the frame still waits for block 1
  Status st = feed({{2, kEndOfColumn, 8}});
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("has not sent yet"), std::string::npos) << st.message();
}

FrameHeader HeaderOf(const ByteBuffer& frame) {
  Result<FrameHeader> header = DecodeFrameHeader(frame.span());
  EXPECT_TRUE(header.ok()) << header.status().ToString();
  return header.ok() ? *header : FrameHeader{};
}

// A RESULT's data is read straight into the tensor (BeginResult names the targets, EndResult checks what came):
// adjacent blocks make one target, the collective is not done between the two steps, and a read that never ends
// leaves nothing that Restore cannot undo.
TEST(WorkerCollective, ResultDataGoesStraightIntoTheTensor) {
  std::vector<float> tensor(10, 0.0f);
  tensor[4] = 1.0f;  // block 2
  tensor[6] = 1.0f;  // block 3
  const std::vector<float> input = tensor;
  auto bytes = std::as_writable_bytes(std::span(tensor));
  for (bool finish : {true, false}) {
    SCOPED_TRACE(finish ? "read completes" : "read cut short");
    tensor = input;
    WorkerCollective wc(kShape, 1, 1, kSpec, bytes);
    ASSERT_EQ(wc.Start(0).size(), 2u);
    std::vector<OutgoingFrame> frames;
    std::vector<std::span<std::byte>> targets;
    const ByteBuffer reply =
        EncodeDataFrame({FrameType::kResult, 0, 0, 1, 1, 0}, std::vector<Entry>{{0, 2, 0}, {1, 3, 0}}, {});
    const FrameHeader reply_header = HeaderOf(reply);
    ASSERT_TRUE(wc.BeginResult(0, reply_header, reply.span().subspan(kFrameHeaderSize), &frames, &targets).ok());
    EXPECT_TRUE(targets.empty());
    ASSERT_TRUE(wc.EndResult(0).ok());

    const std::vector<Entry> entries{{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}};
    const float sums[4] = {2.0f, 0.5f, 3.0f, -0.0f};
    const std::span<const std::byte> data = std::as_bytes(std::span(sums));
    const std::array<std::span<const std::byte>, 2> parts{data.first(8), data.subspan(8)};
    const ByteBuffer result = EncodeDataFrame({FrameType::kResult, 0, 0, 1, 1, 0}, entries, parts);
    const FrameHeader header = HeaderOf(result);
    const uint64_t table_bytes = 2 * kEntrySize;
    ASSERT_TRUE(
        wc.BeginResult(0, header, result.span().subspan(kFrameHeaderSize, table_bytes), &frames, &targets).ok());
    ASSERT_EQ(targets.size(), 1u);  // blocks 2 and 3 are neighbours in the tensor
    EXPECT_EQ(targets[0].data(), bytes.data() + 4 * sizeof(float));
    EXPECT_EQ(targets[0].size(), 16u);
    EXPECT_FALSE(wc.done());
    if (finish) {
      std::memcpy(targets[0].data(), data.data(), 16);
      ASSERT_TRUE(wc.EndResult(0).ok());
      EXPECT_TRUE(wc.done());
      wc.Finish();
      EXPECT_EQ(std::memcmp(tensor.data() + 4, sums, sizeof sums), 0);
    } else {
      std::memset(targets[0].data(), 0x7f, 10);  // part of the data arrived, then the connection broke
      EXPECT_FALSE(wc.done());
      wc.Restore();
      EXPECT_EQ(std::memcmp(tensor.data(), input.data(), sizeof(float) * input.size()), 0);
    }
  }
}

TEST(WorkerCollective, NonzeroPaddingIsRefusedAndRestoreGivesTheInputBack) {
  // Blocks of 3 floats: 12 data bytes and 4 padding bytes each. One rank, K = 2, so blocks 0 and 1 go out at once.
  const JobShape shape{1, 1, 1, 2};
  const CollectiveSpec spec{9, DType::kFloat32, ReduceOp::kSum, 3};
  std::vector<float> tensor = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  const std::vector<float> input = tensor;
  WorkerCollective wc(shape, 1, 1, spec, std::as_writable_bytes(std::span(tensor)));
  ASSERT_EQ(wc.Start(0).size(), 2u);
  std::vector<OutgoingFrame> frames;
  const ByteBuffer reply =
      EncodeDataFrame({FrameType::kResult, 0, 0, 1, 1, 0}, std::vector<Entry>{{0, 0, 0}, {1, 1, 0}}, {});
  ASSERT_TRUE(wc.OnResult(0, HeaderOf(reply), reply.span().subspan(kFrameHeaderSize), &frames).ok());
  const std::vector<float> sums = {10, 20, 30, 40, 50, 60};
  const std::span<const std::byte> data = std::as_bytes(std::span(sums));
  const std::array<std::span<const std::byte>, 2> parts{data.first(12), data.subspan(12)};
  ByteBuffer result = EncodeDataFrame({FrameType::kResult, 0, 0, 1, 1, 0},
                                      std::vector<Entry>{{0, 2, 12}, {1, kEndOfColumn, 12}}, parts);
  result.data()[kFrameHeaderSize + 2 * kEntrySize + 16 + 12 + 3] = std::byte{1};  // block 1's last padding byte
  const Status st = wc.OnResult(0, HeaderOf(result), result.span().subspan(kFrameHeaderSize), &frames);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("padding"), std::string::npos) << st.message();
  wc.Restore();
  EXPECT_EQ(tensor, input);
}

}  // namespace
}  // namespace sparsereduce

namespace sparsereduce {
namespace {

// With a codec, data_bytes follows the wire format (ternary: variable, at most 4 + ceil(n/5)) and the body of every
// block is checked when its frame arrives, naming the rank; nothing malformed reaches the sum.
TEST(ColumnEngine, CodecBlocksAreCheckedOnArrival) {
  CollectiveSpec spec{10, DType::kFloat32, ReduceOp::kSum, 2};
  spec.codec.codec = Codec::kDiana;  // ternary up, fp32 down, no aggregator state
  ColumnEngine engine(kShape, 0, 1, 1, spec);
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  // A block of 2 values: scale (4 bytes) + one group byte. Six bytes, or a run byte standing for 2 groups, are wrong.
  EXPECT_EQ(engine.MaxContributionPayload(0), 2u * (kEntrySize + 8));
  Sent too_long = Contribution(0, {{2, kEndOfColumn, 6}});
  Status st = Feed(engine, 0, std::move(too_long), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("rank 0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("6 data bytes for a ternary block of 2 elements"), std::string::npos) << st.message();

  ColumnEngine engine2(kShape, 0, 1, 1, spec);
  ASSERT_TRUE(Feed(engine2, 0, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_TRUE(Feed(engine2, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  // Right length, wrong body: the filler byte 0x01 of Contribution() is a group, but 0xF3 is a run of 2 groups.
  Sent bad_body = Contribution(0, {{2, kEndOfColumn, 5}});
  bad_body.payload.data()[kEntrySize + 4] = std::byte{0xF3};
  st = Feed(engine2, 1, std::move(bad_body), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("rank 1"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("more than its 1 groups"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace sparsereduce

namespace sparsereduce {
namespace {

// A CONTRIBUTION is for one job and one collective: a frame of another job or collective, or a RESULT or CONTROL
// frame handed in by mistake, is refused with both sides' job and collective named, before it touches any state.
TEST(ColumnEngine, RefusesAFrameOfAnotherJobCollectiveOrType) {
  struct Case {
    uint64_t job, seq;
    FrameType type;
    const char* expect;
  };
  const std::vector<Case> cases = {
      {9, 1, FrameType::kContribution, "frame of type CONTRIBUTION for job 9 collective 1 given to job 1 collective 1"},
      {1, 2, FrameType::kContribution, "frame of type CONTRIBUTION for job 1 collective 2 given to job 1 collective 1"},
      {1, 1, FrameType::kResult, "frame of type RESULT for job 1 collective 1 given to job 1 collective 1"},
      {1, 1, FrameType::kControl, "frame of type CONTROL for job 1 collective 1 given to job 1 collective 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.expect);
    ColumnEngine engine(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    Sent sent = Contribution(0, {{0, 2, 0}, {1, 3, 0}}, c.job, c.seq);
    sent.header.type = c.type;
    const Status st = Feed(engine, 1, std::move(sent), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message(), std::string("rank 1, collective 1, slot 0: ") + c.expect);
    EXPECT_TRUE(out.empty());
  }
}

// A payload that DecodeFrameHeader let through but whose body is malformed (here a nonzero reserved field of an
// entry, or bytes after the last entry's data) is refused naming the rank, both as an announce and as blocks.
TEST(ColumnEngine, RefusesAMalformedPayloadNamingTheRank) {
  auto corrupt_reserved = [](Sent sent, uint32_t entry) {
    sent.payload.data()[uint64_t{entry} * kEntrySize + 20] = std::byte{1};
    return sent;
  };
  {
    ColumnEngine engine(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    const Status st = Feed(engine, 0, corrupt_reserved(Contribution(0, {{0, 2, 0}, {1, 3, 0}}), 1), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message(), "rank 0, collective 1, slot 0: entry 1: nonzero reserved field");
  }
  auto engine_after_announce = [] {
    auto engine = std::make_unique<ColumnEngine>(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    EXPECT_TRUE(Feed(*engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
    EXPECT_TRUE(Feed(*engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
    return engine;
  };
  {
    auto engine = engine_after_announce();
    std::vector<ColumnEngine::Broadcast> out;
    const Status st =
        Feed(*engine, 0, corrupt_reserved(Contribution(0, {{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}}), 0), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message(), "rank 0, collective 1, slot 0: entry 0: nonzero reserved field");
    EXPECT_TRUE(out.empty());
  }
  {
    // The header claims 8 bytes more than the entry's data: trailing bytes, which a reader could not place.
    auto engine = engine_after_announce();
    std::vector<ColumnEngine::Broadcast> out;
    Sent sent = Contribution(0, {{2, kEndOfColumn, 8}});
    sent.header.payload_length += 8;
    ByteBuffer longer(sent.payload.size() + 8);
    std::memset(longer.data(), 0, longer.size());
    std::memcpy(longer.data(), sent.payload.data(), sent.payload.size());
    sent.payload = std::move(longer);
    const Status st = Feed(*engine, 0, std::move(sent), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message(),
              "rank 0, collective 1, slot 0: payload has 8 trailing bytes after the last entry's data");
  }
}

ByteBuffer ResultFrame(std::vector<Entry> entries, FrameType type = FrameType::kResult) {
  std::vector<std::vector<std::byte>> storage;
  std::vector<std::span<const std::byte>> data;
  for (const Entry& e : entries) {
    if (e.data_bytes) {
      storage.emplace_back(e.data_bytes, std::byte{0});
      data.push_back(storage.back());
    }
  }
  return EncodeDataFrame({type, 0, 0, 1, 1, 0}, entries, data);
}

// Only RESULT frames go to a worker's collective: a CONTRIBUTION or CONTROL frame (a confused or hostile
// aggregator) is refused by type.
TEST(WorkerCollective, RefusesAFrameThatIsNotAResult) {
  std::vector<float> tensor(10, 0.0f);
  tensor[4] = 1.0f;
  WorkerCollective wc(kShape, 1, 1, kSpec, std::as_writable_bytes(std::span(tensor)));
  ASSERT_EQ(wc.Start(0).size(), 2u);
  std::vector<OutgoingFrame> frames;
  const ByteBuffer contribution = ResultFrame({{0, 2, 0}, {1, kEndOfColumn, 0}}, FrameType::kContribution);
  Status st = wc.OnResult(0, HeaderOf(contribution), contribution.span().subspan(kFrameHeaderSize), &frames);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(st.message(), "expected a RESULT frame, got CONTRIBUTION");
  FrameHeader control;  // zero fields, as DecodeFrameHeader requires of CONTROL
  st = wc.OnResult(0, control, {}, &frames);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(st.message(), "expected a RESULT frame, got CONTROL");
  EXPECT_TRUE(frames.empty());
  EXPECT_FALSE(wc.done());
  // The collective is still where it was: the real announce reply is accepted.
  const ByteBuffer reply = ResultFrame({{0, 2, 0}, {1, kEndOfColumn, 0}});
  EXPECT_TRUE(wc.OnResult(0, HeaderOf(reply), reply.span().subspan(kFrameHeaderSize), &frames).ok());
}

// OnResult takes a header and a payload from its caller: a payload of another length than the header says, or a
// header whose entry table does not fit its payload, is refused before any entry is read.
TEST(WorkerCollective, OnResultRefusesAPayloadThatDisagreesWithItsHeader) {
  std::vector<float> tensor(10, 0.0f);
  tensor[4] = 1.0f;
  WorkerCollective wc(kShape, 1, 1, kSpec, std::as_writable_bytes(std::span(tensor)));
  ASSERT_EQ(wc.Start(0).size(), 2u);
  std::vector<OutgoingFrame> frames;
  const ByteBuffer reply = ResultFrame({{0, 2, 0}, {1, kEndOfColumn, 0}});
  const FrameHeader header = HeaderOf(reply);
  const std::span<const std::byte> payload = reply.span().subspan(kFrameHeaderSize);
  ASSERT_EQ(payload.size(), 48u);
  Status st = wc.OnResult(0, header, payload.first(47), &frames);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(st.message(), "payload of 47 bytes, header says 48");
  FrameHeader lying = header;
  lying.entry_count = 3;  // 72 bytes of table in 48 bytes of payload
  st = wc.OnResult(0, lying, payload, &frames);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(st.message(), "entry table of 3 entries exceeds the payload");
  EXPECT_TRUE(wc.OnResult(0, header, payload, &frames).ok());
}

// 3LC sends ternary RESULTs: a block of the right length whose body is malformed (a zero run longer than the block)
// is refused when the RESULT ends, naming slot and block, and Restore gives the input back.
TEST(WorkerCollective, ACodecResultWithAMalformedBodyIsRefusedWhenItEnds) {
  CollectiveSpec spec = kSpec;
  spec.codec = CodecSpec{Codec::kThreeLC, 0, 1.5f};
  ASSERT_TRUE(ValidateSpec(spec).ok());
  std::vector<float> tensor = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const std::vector<float> input = tensor;
  codec::KeyState state;
  WorkerCollective wc(kShape, 1, 1, spec, std::as_writable_bytes(std::span(tensor)), {}, CodecContext{&state, 0, 1});
  const std::vector<OutgoingFrame> first = wc.Start(0);
  ASSERT_EQ(first.size(), 2u);  // the announce (next blocks 0 and 1) and blocks 0 and 1
  ASSERT_EQ(first[0].entries[0].next, 0u);
  std::vector<OutgoingFrame> frames;
  const ByteBuffer reply = ResultFrame({{0, 0, 0}, {1, 1, 0}});
  ASSERT_TRUE(wc.OnResult(0, HeaderOf(reply), reply.span().subspan(kFrameHeaderSize), &frames).ok());
  // Block 0 (2 values): a scale of 1.0 and one byte of 5 trits; 0xF3 is a run of 2 zero groups in a block of 1.
  ByteBuffer result = ResultFrame({{0, 2, 5}});
  const float scale = 1.0f;
  std::memcpy(result.data() + kFrameHeaderSize + kEntrySize, &scale, 4);
  for (uint8_t body : {uint8_t{175}, uint8_t{0xF3}}) {
    result.data()[kFrameHeaderSize + kEntrySize + 4] = std::byte{body};
    if (body == 175) {
      // The same frame with a well-formed body (trits 1, -1: 2·81 + 9 + 3 + 1) passes and lands in the tensor, so
      // only the body is at fault below.
      WorkerCollective good(kShape, 1, 1, spec, std::as_writable_bytes(std::span(tensor)), {},
                            CodecContext{&state, 0, 1});
      ASSERT_EQ(good.Start(0).size(), 2u);
      ASSERT_TRUE(good.OnResult(0, HeaderOf(reply), reply.span().subspan(kFrameHeaderSize), &frames).ok());
      ASSERT_TRUE(good.OnResult(0, HeaderOf(result), result.span().subspan(kFrameHeaderSize), &frames).ok());
      EXPECT_EQ(tensor[0], 1.0f);
      EXPECT_EQ(tensor[1], -1.0f);
      good.Restore();
      ASSERT_EQ(tensor, input);
      continue;
    }
    const Status st = wc.OnResult(0, HeaderOf(result), result.span().subspan(kFrameHeaderSize), &frames);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message().rfind("slot 0, block 0: RESULT: ", 0), 0u) << st.message();
    EXPECT_NE(st.message().find("more than its 1 groups"), std::string::npos) << st.message();
  }
  wc.Restore();
  EXPECT_EQ(tensor, input);
}

// The real worker sends a CONTRIBUTION as its prefix (header and entry table), each block's data in place and
// zero padding: together they are byte for byte the frame EncodeFrame builds, raw or in a codec's wire format.
TEST(WorkerCollective, PrefixDataAndPaddingMakeTheWholeFrame) {
  // Blocks of 3 floats: 12 raw bytes (4 of padding), or 6 fp16 bytes (2 of padding).
  const JobShape shape{1, 1, 1, 2};
  for (Codec c : {Codec::kNone, Codec::kFloat16}) {
    SCOPED_TRACE(CodecName(c));
    CollectiveSpec spec{9, DType::kFloat32, ReduceOp::kSum, 3};
    spec.codec.codec = c;
    std::vector<float> tensor = {1, 2, 3, 0, 0, 0, 7, 8, 9};
    codec::KeyState state;
    WorkerCollective wc(shape, 5, 6, spec, std::as_writable_bytes(std::span(tensor)), {}, CodecContext{&state, 0, 1});
    std::vector<OutgoingFrame> frames = wc.Start(0);
    ASSERT_EQ(frames.size(), 2u);  // the announce and blocks 0 and 2 (block 1 is zero)
    ASSERT_EQ(frames[1].entries.size(), 2u);
    const uint32_t wire_bytes = c == Codec::kNone ? 12 : 6;
    for (const OutgoingFrame& frame : frames) {
      std::vector<std::byte> pieces;
      const ByteBuffer prefix = wc.EncodePrefix(frame);
      pieces.insert(pieces.end(), prefix.span().begin(), prefix.span().end());
      for (const Entry& e : frame.entries) {
        if (e.data_bytes == 0) continue;
        EXPECT_EQ(e.data_bytes, wire_bytes);
        const std::span<const std::byte> data = wc.BlockData(e.block);
        ASSERT_EQ(data.size(), e.data_bytes);
        const std::span<const std::byte> padding = WorkerCollective::PaddingFor(e.data_bytes);
        EXPECT_EQ(padding.size(), Pad8(e.data_bytes) - e.data_bytes);
        pieces.insert(pieces.end(), data.begin(), data.end());
        pieces.insert(pieces.end(), padding.begin(), padding.end());
      }
      const ByteBuffer whole = wc.EncodeFrame(frame);
      ASSERT_EQ(pieces.size(), whole.size());
      EXPECT_EQ(std::memcmp(pieces.data(), whole.data(), whole.size()), 0);
      const FrameHeader header = HeaderOf(whole);
      EXPECT_EQ(header.type, FrameType::kContribution);
      EXPECT_EQ(header.job, 5u);
      EXPECT_EQ(header.seq, 6u);
      std::vector<EntryView> views;
      EXPECT_TRUE(DecodeDataPayload(header, whole.span().subspan(kFrameHeaderSize), &views).ok());
    }
    // Block 2's data is the block itself (raw) or its encoding, which decodes to it (7, 8, 9 are exact in fp16).
    float decoded[3];
    ASSERT_TRUE(codec::DecodeFloats(UploadFormat(spec.codec), wc.BlockData(2), 3, decoded, false).ok());
    EXPECT_EQ(std::vector<float>(decoded, decoded + 3), (std::vector<float>{7, 8, 9}));
    if (c == Codec::kNone) {
      EXPECT_EQ(wc.BlockData(2).data(), reinterpret_cast<const std::byte*>(&tensor[6]));
    }
    for (uint32_t n = 0; n < 16; ++n) EXPECT_EQ(WorkerCollective::PaddingFor(n).size(), Pad8(n) - n) << n;
  }
}

// The payload limits each side checks before reading a frame are tight: one worker and one aggregator run a
// collective whose RESULTs and CONTRIBUTIONs of K full blocks reach MaxResultPayload and MaxContributionPayload
// exactly, in the wire format of their direction (fp16 halves the block, 3LC-with-fp32-results is raw down only).
TEST(WorkerCollective, FullFramesReachThePayloadLimitsExactly) {
  const JobShape shape{1, 1, 1, 2};
  struct Case {
    CodecSpec codec;
    uint64_t up, down;  // K x (24 + pad8(wire bytes of a block of 3))
  };
  const std::vector<Case> cases = {
      {CodecSpec{}, 2 * (24 + 16), 2 * (24 + 16)},
      {CodecSpec{Codec::kFloat16}, 2 * (24 + 8), 2 * (24 + 8)},
      {CodecSpec{Codec::kThreeLC, 0, 1.5f, /*result_fp32=*/true}, 2 * (24 + 8), 2 * (24 + 16)},
  };
  for (const Case& c : cases) {
    CollectiveSpec spec{12, DType::kFloat32, ReduceOp::kSum, 3, c.codec};
    SCOPED_TRACE(spec.ToString());
    ASSERT_TRUE(ValidateSpec(spec).ok());
    std::vector<float> tensor = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    codec::KeyState state;
    WorkerCollective wc(shape, 1, 1, spec, std::as_writable_bytes(std::span(tensor)), {}, CodecContext{&state, 0, 1});
    codec::ErrorMemory memory(4, 3);
    ColumnEngine engine(shape, 0, 1, 1, spec, nullptr, &memory);
    EXPECT_EQ(engine.MaxContributionPayload(0), c.up);
    EXPECT_EQ(wc.MaxResultPayload(), c.down);
    uint64_t largest_up = 0, largest_down = 0;
    std::vector<OutgoingFrame> pending = wc.Start(0);
    while (!pending.empty()) {
      std::vector<OutgoingFrame> next;
      for (const OutgoingFrame& f : pending) {
        const ByteBuffer frame = wc.EncodeFrame(f);
        largest_up = std::max<uint64_t>(largest_up, frame.size() - kFrameHeaderSize);
        std::vector<ColumnEngine::Broadcast> out;
        ByteBuffer payload(frame.size() - kFrameHeaderSize);
        std::memcpy(payload.data(), frame.data() + kFrameHeaderSize, payload.size());
        ASSERT_TRUE(engine.OnContribution(0, HeaderOf(frame), std::move(payload), &out).ok());
        for (const ColumnEngine::Broadcast& b : out) {
          largest_down = std::max<uint64_t>(largest_down, b.frame->size() - kFrameHeaderSize);
          const Status st = wc.OnResult(0, HeaderOf(*b.frame), b.frame->span().subspan(kFrameHeaderSize), &next);
          ASSERT_TRUE(st.ok()) << st.ToString();
        }
      }
      pending = std::move(next);
    }
    EXPECT_TRUE(engine.done());
    EXPECT_TRUE(wc.done());
    EXPECT_EQ(largest_up, c.up);
    EXPECT_EQ(largest_down, c.down);
  }
}

}  // namespace
}  // namespace sparsereduce

namespace sparsereduce {
namespace {

// The aggregator builds RESULTs in recycled pool buffers, which hold whatever the last frame left: the frames it
// sends must still be byte for byte those built in fresh memory (padding zeroed, nothing stale), and sum exactly.
TEST(ColumnEngine, ResultsInRecycledPoolBuffersAreTheSameBytes) {
  // One rank, K = 128 blocks of 3 floats (12 data bytes, 4 of padding): a full RESULT of 5160 bytes is pooled.
  const JobShape shape{1, 1, 1, 128};
  const CollectiveSpec spec{3 * 300, DType::kFloat32, ReduceOp::kSum, 3};
  std::vector<float> input(spec.element_count);
  for (size_t i = 0; i < input.size(); ++i) input[i] = (i / 3) % 5 == 1 ? 0.0f : 0.25f * static_cast<float>(i);
  auto run = [&](std::shared_ptr<BufferPool> pool, std::vector<float>* tensor) {
    *tensor = input;
    std::vector<std::byte> sent;
    WorkerCollective wc(shape, 1, 1, spec, std::as_writable_bytes(std::span(*tensor)));
    ColumnEngine engine(shape, 0, 1, 1, spec, pool);
    std::vector<OutgoingFrame> pending = wc.Start(0);
    while (!pending.empty()) {
      std::vector<OutgoingFrame> next;
      for (const OutgoingFrame& f : pending) {
        const ByteBuffer frame = wc.EncodeFrame(f);
        ByteBuffer payload(frame.size() - kFrameHeaderSize);
        std::memcpy(payload.data(), frame.data() + kFrameHeaderSize, payload.size());
        std::vector<ColumnEngine::Broadcast> out;
        EXPECT_TRUE(engine.OnContribution(0, HeaderOf(frame), std::move(payload), &out).ok());
        for (const ColumnEngine::Broadcast& b : out) {
          sent.insert(sent.end(), b.frame->span().begin(), b.frame->span().end());
          const Status st = wc.OnResult(0, HeaderOf(*b.frame), b.frame->span().subspan(kFrameHeaderSize), &next);
          EXPECT_TRUE(st.ok()) << st.ToString();
        }
      }
      pending = std::move(next);
    }
    EXPECT_TRUE(engine.done());
    EXPECT_TRUE(wc.done());
    wc.Finish();
    return sent;
  };
  std::vector<float> fresh_sum, pooled_sum;
  const std::vector<std::byte> fresh = run(nullptr, &fresh_sum);
  auto pool = BufferPool::Create(1 << 20);
  for (int i = 0; i < 4; ++i) {  // dirty free buffers of the capacity a full RESULT gets
    ByteBuffer dirty = pool->Acquire(BufferPool::CapacityFor(5160));
    std::memset(dirty.data(), 0xA5, dirty.size());
  }
  const std::vector<std::byte> pooled = run(pool, &pooled_sum);
  EXPECT_GT(pool->reuses(), 0u);
  ASSERT_EQ(pooled.size(), fresh.size());
  EXPECT_EQ(std::memcmp(pooled.data(), fresh.data(), fresh.size()), 0);
  EXPECT_EQ(std::memcmp(pooled_sum.data(), input.data(), input.size() * sizeof(float)), 0);  // one rank: the input
}

}  // namespace
}  // namespace sparsereduce
