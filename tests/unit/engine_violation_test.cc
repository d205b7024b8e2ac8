// The column engine and the worker schedule reject protocol violations with a reason instead of misbehaving.
#include <gtest/gtest.h>

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

TEST(ColumnEngine, WorkedExampleFromProtocolDoc) {
  ColumnEngine engine(kShape, 0, 1, 1, kSpec);
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
  EXPECT_TRUE(out.empty());
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
  ASSERT_EQ(out.size(), 1u);
  std::vector<EntryView> entries;
  auto header = DecodeFrameHeader(out[0].frame->span());
  ASSERT_TRUE(header.ok());
  ASSERT_TRUE(DecodeDataPayload(*header, out[0].frame->span().subspan(kFrameHeaderSize), &entries).ok());
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].next, 2u);
  EXPECT_EQ(entries[1].next, 3u);

  out.clear();
  EXPECT_EQ(engine.AwaitedRanks(), (std::vector<uint32_t>{0, 1}));
  ASSERT_TRUE(Feed(engine, 1, Contribution(0, {{2, 4, 8}}), &out).ok());
  EXPECT_EQ(engine.AwaitedRanks(), (std::vector<uint32_t>{0}));
  ASSERT_TRUE(Feed(engine, 0, Contribution(0, {{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}}), &out).ok());
  EXPECT_EQ(engine.AwaitedRanks(), (std::vector<uint32_t>{1}));  // round 2: only rank 1 owns block 4
  ASSERT_EQ(out.size(), 1u);
  header = DecodeFrameHeader(out[0].frame->span());
  ASSERT_TRUE(DecodeDataPayload(*header, out[0].frame->span().subspan(kFrameHeaderSize), &entries).ok());
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].block, 2u);
  EXPECT_EQ(entries[0].next, 4u);
  EXPECT_EQ(entries[1].block, 3u);
  EXPECT_EQ(entries[1].next, kEndOfColumn);

  // Round 2: only rank 1 contributes; rank 0 sending anything is a violation.
  out.clear();
  Status st = Feed(engine, 0, Contribution(0, {{4, kEndOfColumn, 8}}), &out);
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_NE(st.message().find("unexpected contribution"), std::string::npos) << st.message();
}

struct Violation {
  const char* name;
  std::vector<Entry> round0_rank0;
  const char* expect;
};

TEST(ColumnEngine, RejectsBadAnnounces) {
  const std::vector<Violation> cases = {
      {"too few entries", {{0, 2, 0}}, "announce entries"},
      {"too many entries", {{0, 2, 0}, {1, 3, 0}, {1, 3, 0}}, "announce entries"},
      {"wrong block", {{1, 2, 0}, {1, 3, 0}}, "announce entry must be"},
      {"data in round 0", {{0, 2, 8}, {1, 3, 0}}, "announce entry must be"},
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

TEST(ColumnEngine, RejectsBadRounds) {
  auto engine_after_announce = [] {
    auto engine = std::make_unique<ColumnEngine>(kShape, 0, 1, 1, kSpec);
    std::vector<ColumnEngine::Broadcast> out;
    EXPECT_TRUE(Feed(*engine, 0, Contribution(0, {{0, 2, 0}, {1, 3, 0}}), &out).ok());
    EXPECT_TRUE(Feed(*engine, 1, Contribution(0, {{0, 2, 0}, {1, kEndOfColumn, 0}}), &out).ok());
    return engine;
  };
  const std::vector<std::pair<std::vector<Entry>, const char*>> cases = {
      {{{2, kEndOfColumn, 8}}, "missing entry"},                            // rank 0 owes blocks 2 and 3
      {{{2, kEndOfColumn, 8}, {3, kEndOfColumn, 8}, {5, 7, 8}}, "not being aggregated"},
      {{{2, kEndOfColumn, 4}, {3, kEndOfColumn, 8}}, "data bytes"},        // short block
      {{{2, 2, 8}, {3, kEndOfColumn, 8}}, "not a later block"},            // next not after block
      {{{2, 3, 8}, {3, kEndOfColumn, 8}}, "not a later block"},            // next in the other column
      {{{3, kEndOfColumn, 8}, {2, kEndOfColumn, 8}}, "names block"},       // lane order
  };
  for (const auto& [entries, expect] : cases) {
    SCOPED_TRACE(expect);
    auto engine = engine_after_announce();
    std::vector<ColumnEngine::Broadcast> out;
    Status st = Feed(*engine, 0, Contribution(0, entries), &out);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.message();
  }
  // Duplicate contribution in one round.
  auto engine = engine_after_announce();
  std::vector<ColumnEngine::Broadcast> out;
  ASSERT_TRUE(Feed(*engine, 1, Contribution(0, {{2, 4, 8}}), &out).ok());
  EXPECT_EQ(Feed(*engine, 1, Contribution(0, {{2, 4, 8}}), &out).code(), StatusCode::kProtocolViolation);
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
    EXPECT_EQ(wc->Start(0).size(), 1u);
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
    OutgoingFrame next;
    bool has_next;
    auto header = DecodeFrameHeader(frame.span());
    EXPECT_TRUE(header.ok());
    return wc.OnResult(0, *header, frame.span().subspan(kFrameHeaderSize), &next, &has_next);
  };
  const std::vector<std::pair<ByteBuffer, const char*>> cases = [&] {
    std::vector<std::pair<ByteBuffer, const char*>> v;
    v.emplace_back(result({{0, 2, 0}, {1, 3, 0}}, 9), "expected job 1");
    v.emplace_back(result({{0, 2, 0}, {1, 3, 0}}, 1, 2), "collective 2");
    v.emplace_back(result({{0, 2, 0}}), "misses the entry");
    v.emplace_back(result({{0, 4, 0}, {1, 3, 0}}), "worker's own next");  // skips our block 2
    v.emplace_back(result({{0, 2, 8}, {1, 3, 0}}), "data bytes");
    v.emplace_back(result({{0, 2, 0}, {1, 3, 0}, {1, 3, 0}}), "surplus");
    return v;
  }();
  for (const auto& [frame, expect] : cases) {
    SCOPED_TRACE(expect);
    auto wc = make();
    Status st = feed(*wc, frame);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_NE(st.message().find(expect), std::string::npos) << st.message();
  }
  // A correct announce reply is accepted and yields our two blocks; a second reply before we sent is not due...
  auto wc = make();
  EXPECT_TRUE(feed(*wc, result({{0, 2, 0}, {1, 3, 0}})).ok());
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
