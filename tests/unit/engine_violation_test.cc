// The column engine and the worker schedule reject protocol violations with a reason instead of misbehaving.
#include <gtest/gtest.h>

#include <array>
#include <cstring>

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
  EXPECT_EQ(engine.MaxContributionPayload(), 2u * (kEntrySize + 8));
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
