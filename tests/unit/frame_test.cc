// Frame encoding and decoding (protocol/frame.h, docs/PROTOCOL.md §3).
#include "protocol/frame.h"

#include <array>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "protocol/coding.h"

namespace sparsereduce {
namespace {

using Bytes = std::vector<std::byte>;

Bytes B(std::initializer_list<int> values) {
  Bytes out;
  out.reserve(values.size());
  for (int v : values) out.push_back(std::byte(static_cast<uint8_t>(v)));
  return out;
}

Bytes Copy(std::span<const std::byte> s) { return Bytes(s.begin(), s.end()); }

std::array<std::byte, kFrameHeaderSize> HeaderBytes(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderSize> out;
  EncodeFrameHeader(h, out.data());
  return out;
}

FrameHeader DataHeader(FrameType type = FrameType::kContribution) {
  FrameHeader h;
  h.type = type;
  h.slot = 2;
  h.job = 0x1122334455667788;
  h.seq = 42;
  return h;
}

// Deterministic, nonzero-ish filler bytes.
Bytes Pattern(size_t n, uint8_t seed) {
  Bytes out(n);
  for (size_t i = 0; i < n; ++i) out[i] = std::byte(static_cast<uint8_t>(seed + 31 * i + 1));
  return out;
}

bool Contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A data frame plus what went into it.
struct TestFrame {
  FrameHeader header;
  std::vector<Entry> entries;
  std::vector<Bytes> data;  // one per entry (empty when data_bytes == 0)
  Bytes frame;

  std::span<const std::byte> payload() const { return std::span(frame).subspan(kFrameHeaderSize); }
};

TestFrame MakeFrame(FrameHeader header, const std::vector<std::pair<uint64_t, uint32_t>>& blocks_and_sizes) {
  TestFrame f;
  f.header = header;
  std::vector<std::span<const std::byte>> spans;
  uint8_t seed = 7;
  for (auto [block, size] : blocks_and_sizes) {
    f.entries.push_back(Entry{block, block + 100, size});
    f.data.push_back(Pattern(size, seed));
    seed = static_cast<uint8_t>(seed + 13);
  }
  for (const Bytes& d : f.data) {
    if (!d.empty()) spans.push_back(d);
  }
  ByteBuffer encoded = EncodeDataFrame(header, f.entries, spans);
  f.frame = Copy(encoded.span());
  f.header.payload_length = static_cast<uint32_t>(DataPayloadLength(f.entries));
  f.header.entry_count = static_cast<uint32_t>(f.entries.size());
  return f;
}

// Checks the structural promises of a successful DecodeDataPayload.
void ExpectWellFormed(const FrameHeader& h, std::span<const std::byte> payload, const std::vector<EntryView>& views) {
  ASSERT_EQ(views.size(), h.entry_count);
  ASSERT_EQ(payload.size(), h.payload_length);
  uint64_t offset = uint64_t{kEntrySize} * h.entry_count;
  for (const EntryView& v : views) {
    if (v.data.empty()) continue;
    ASSERT_LE(offset + v.data.size(), payload.size());
    EXPECT_EQ(v.data.data(), payload.data() + offset);
    for (uint64_t pad = v.data.size(); pad < Pad8(v.data.size()); ++pad) {
      EXPECT_EQ(payload[offset + pad], std::byte{0});
    }
    offset += Pad8(v.data.size());
  }
  EXPECT_EQ(offset, payload.size());
}

// ---------------------------------------------------------------------------------------------------------------
// Header

TEST(FrameHeaderTest, RoundTripsAllTypes) {
  FrameHeader control;
  control.type = FrameType::kControl;
  control.payload_length = kMaxControlPayload;  // the limit itself is allowed
  {
    auto bytes = HeaderBytes(control);
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->type, FrameType::kControl);
    EXPECT_EQ(r->payload_length, kMaxControlPayload);
    EXPECT_EQ(r->slot, 0u);
    EXPECT_EQ(r->job, 0u);
    EXPECT_EQ(r->seq, 0u);
    EXPECT_EQ(r->entry_count, 0u);
  }
  for (FrameType type : {FrameType::kContribution, FrameType::kResult}) {
    for (uint32_t entry_count : {0u, 1u, 3u}) {
      FrameHeader h;
      h.type = type;
      h.entry_count = entry_count;
      h.payload_length = std::numeric_limits<uint32_t>::max();
      h.slot = std::numeric_limits<uint32_t>::max();
      h.job = std::numeric_limits<uint64_t>::max();
      h.seq = 0x0102030405060708;
      auto bytes = HeaderBytes(h);
      Result<FrameHeader> r = DecodeFrameHeader(bytes);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(r->type, type);
      EXPECT_EQ(r->payload_length, h.payload_length);
      EXPECT_EQ(r->slot, h.slot);
      EXPECT_EQ(r->job, h.job);
      EXPECT_EQ(r->seq, h.seq);
      EXPECT_EQ(r->entry_count, entry_count);
    }
  }
}

TEST(FrameHeaderTest, IgnoresBytesAfterTheHeader) {
  FrameHeader h = DataHeader();
  h.entry_count = 1;
  h.payload_length = kEntrySize;
  Bytes bytes(kFrameHeaderSize + 100, std::byte{0xEE});
  EncodeFrameHeader(h, bytes.data());
  Result<FrameHeader> r = DecodeFrameHeader(bytes);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->entry_count, 1u);
}

TEST(FrameHeaderTest, RejectsEveryTruncatedPrefix) {
  FrameHeader h = DataHeader();
  auto full = HeaderBytes(h);
  for (size_t n = 0; n < kFrameHeaderSize; ++n) {
    Bytes prefix(full.begin(), full.begin() + n);  // exact-size buffer: ASan sees any overread
    Result<FrameHeader> r = DecodeFrameHeader(prefix);
    ASSERT_FALSE(r.ok()) << n;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), "truncated")) << r.status().message();
  }
}

TEST(FrameHeaderTest, RejectsBadMagic) {
  auto good = HeaderBytes(DataHeader());
  for (size_t i = 0; i < 4; ++i) {
    auto bytes = good;
    bytes[i] ^= std::byte{0x20};
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_FALSE(r.ok()) << i;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), "magic")) << r.status().message();
  }
}

TEST(FrameHeaderTest, RejectsWrongVersion) {
  for (int version : {0, 1, 2, 4, 0x81, 0xFF}) {
    auto bytes = HeaderBytes(DataHeader());
    bytes[4] = std::byte(static_cast<uint8_t>(version));
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_FALSE(r.ok()) << version;
    EXPECT_EQ(r.status().code(), StatusCode::kVersionMismatch);
    EXPECT_TRUE(Contains(r.status().message(), "version " + std::to_string(version))) << r.status().message();
  }
}

TEST(FrameHeaderTest, RejectsUnknownType) {
  for (int type : {0, 4, 0x80, 0xFF}) {
    auto bytes = HeaderBytes(DataHeader());
    bytes[5] = std::byte(static_cast<uint8_t>(type));
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_FALSE(r.ok()) << type;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), "type " + std::to_string(type))) << r.status().message();
  }
}

TEST(FrameHeaderTest, RejectsNonzeroFlags) {
  for (size_t i : {6, 7}) {
    for (int bit = 0; bit < 8; ++bit) {
      auto bytes = HeaderBytes(DataHeader());
      bytes[i] = std::byte(static_cast<uint8_t>(1 << bit));
      Result<FrameHeader> r = DecodeFrameHeader(bytes);
      ASSERT_FALSE(r.ok()) << i << " " << bit;
      EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
      EXPECT_TRUE(Contains(r.status().message(), "flags")) << r.status().message();
    }
  }
}

TEST(FrameHeaderTest, RejectsNonzeroReserved) {
  for (FrameType type : {FrameType::kControl, FrameType::kContribution, FrameType::kResult}) {
    for (size_t i = 36; i < 40; ++i) {
      FrameHeader h;
      h.type = type;
      auto bytes = HeaderBytes(h);
      bytes[i] = std::byte{0x01};
      Result<FrameHeader> r = DecodeFrameHeader(bytes);
      ASSERT_FALSE(r.ok()) << i;
      EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
      EXPECT_TRUE(Contains(r.status().message(), "reserved")) << r.status().message();
    }
  }
}

TEST(FrameHeaderTest, RejectsControlWithDataFields) {
  auto check = [](FrameHeader h, const char* what) {
    h.type = FrameType::kControl;
    auto bytes = HeaderBytes(h);
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), "CONTROL")) << r.status().message();
  };
  FrameHeader h;
  h.payload_length = 100;
  FrameHeader s = h;
  s.slot = 1;
  check(s, "slot");
  FrameHeader j = h;
  j.job = uint64_t{1} << 63;
  check(j, "job");
  FrameHeader q = h;
  q.seq = 1;
  check(q, "seq");
  FrameHeader e = h;
  e.entry_count = 1;
  check(e, "entry_count");
}

TEST(FrameHeaderTest, RejectsOversizedControlPayload) {
  for (uint32_t length : {kMaxControlPayload + 1, uint32_t{1} << 24, std::numeric_limits<uint32_t>::max()}) {
    FrameHeader h;
    h.type = FrameType::kControl;
    h.payload_length = length;
    auto bytes = HeaderBytes(h);
    Result<FrameHeader> r = DecodeFrameHeader(bytes);
    ASSERT_FALSE(r.ok()) << length;
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), std::to_string(length))) << r.status().message();
    EXPECT_TRUE(Contains(r.status().message(), "exceeds")) << r.status().message();
  }
}

TEST(FrameHeaderTest, RejectsEntryTableLargerThanPayload) {
  for (FrameType type : {FrameType::kContribution, FrameType::kResult}) {
    FrameHeader h = DataHeader(type);
    h.entry_count = 2;
    h.payload_length = 2 * kEntrySize;
    EXPECT_TRUE(DecodeFrameHeader(HeaderBytes(h)).ok());
    h.payload_length = 2 * kEntrySize - 1;
    Result<FrameHeader> r = DecodeFrameHeader(HeaderBytes(h));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(r.status().message(), "2 entries")) << r.status().message();

    h.entry_count = 1;
    h.payload_length = 0;
    EXPECT_FALSE(DecodeFrameHeader(HeaderBytes(h)).ok());

    // 24 * 0x0AAAAAAB = 0x1'0000'0008: a 32-bit product would wrap to 8 and pass.
    h.entry_count = 0x0AAAAAAB;
    h.payload_length = 8;
    EXPECT_FALSE(DecodeFrameHeader(HeaderBytes(h)).ok());
    h.entry_count = std::numeric_limits<uint32_t>::max();
    h.payload_length = std::numeric_limits<uint32_t>::max();
    EXPECT_FALSE(DecodeFrameHeader(HeaderBytes(h)).ok());
  }
}

TEST(FrameHeaderTest, TypeNames) {
  EXPECT_STREQ(FrameTypeName(FrameType::kControl), "CONTROL");
  EXPECT_STREQ(FrameTypeName(FrameType::kContribution), "CONTRIBUTION");
  EXPECT_STREQ(FrameTypeName(FrameType::kResult), "RESULT");
  EXPECT_STREQ(FrameTypeName(static_cast<FrameType>(9)), "UNKNOWN");
}

// ---------------------------------------------------------------------------------------------------------------
// Golden bytes: docs/PROTOCOL.md §3 written out by hand, so the document and the code cannot drift apart.

TEST(FrameGoldenTest, DataFrameMatchesDocumentedLayout) {
  FrameHeader h;
  h.type = FrameType::kContribution;
  h.slot = 1;
  h.job = 0x1122334455667788;
  h.seq = 3;
  const std::vector<Entry> entries = {
      Entry{5, 9, 4},
      Entry{6, kEndOfColumn, 0},
      Entry{0x0102030405060708, kEndOfColumn - 1, 3},
  };
  const Bytes d0 = B({0xDE, 0xAD, 0xBE, 0xEF});
  const Bytes d2 = B({0x01, 0x02, 0x03});
  const std::vector<std::span<const std::byte>> data = {d0, d2};
  ByteBuffer frame = EncodeDataFrame(h, entries, data);

  const Bytes expected = B({
      // header
      0x53, 0x52, 0x44, 0x46,                          // magic "SRDF"
      0x03,                                            // version
      0x02,                                            // type CONTRIBUTION
      0x00, 0x00,                                      // flags
      0x58, 0x00, 0x00, 0x00,                          // payload_length = 3*24 + 8 + 8 = 88
      0x01, 0x00, 0x00, 0x00,                          // slot
      0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11,  // job
      0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // seq
      0x03, 0x00, 0x00, 0x00,                          // entry_count
      0x00, 0x00, 0x00, 0x00,                          // reserved
      // entry 0
      0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // block
      0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // next
      0x04, 0x00, 0x00, 0x00,                          // data_bytes
      0x00, 0x00, 0x00, 0x00,                          // reserved
      // entry 1
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // block
      0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,  // next = END
      0x00, 0x00, 0x00, 0x00,                          // data_bytes
      0x00, 0x00, 0x00, 0x00,                          // reserved
      // entry 2
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // block
      0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,  // next
      0x03, 0x00, 0x00, 0x00,                          // data_bytes
      0x00, 0x00, 0x00, 0x00,                          // reserved
      // data region: entry 0, pad8, entry 2, pad8
      0xDE, 0xAD, 0xBE, 0xEF, 0x00, 0x00, 0x00, 0x00,  //
      0x01, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00,  //
  });
  ASSERT_EQ(frame.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(std::to_integer<int>(frame.data()[i]), std::to_integer<int>(expected[i])) << "byte " << i;
  }

  // And the hand-written bytes decode to the same frame.
  Result<FrameHeader> r = DecodeFrameHeader(expected);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, FrameType::kContribution);
  EXPECT_EQ(r->payload_length, 88u);
  EXPECT_EQ(r->slot, 1u);
  EXPECT_EQ(r->job, 0x1122334455667788u);
  EXPECT_EQ(r->seq, 3u);
  EXPECT_EQ(r->entry_count, 3u);
  std::vector<EntryView> views;
  Status s = DecodeDataPayload(*r, std::span(expected).subspan(kFrameHeaderSize), &views);
  ASSERT_TRUE(s.ok()) << s.ToString();
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0].block, 5u);
  EXPECT_EQ(views[0].next, 9u);
  EXPECT_EQ(Copy(views[0].data), d0);
  EXPECT_EQ(views[1].block, 6u);
  EXPECT_EQ(views[1].next, kEndOfColumn);
  EXPECT_TRUE(views[1].data.empty());
  EXPECT_EQ(views[2].block, 0x0102030405060708u);
  EXPECT_EQ(views[2].next, kEndOfColumn - 1);
  EXPECT_EQ(Copy(views[2].data), d2);
}

TEST(FrameGoldenTest, ResultHeaderTypeByte) {
  FrameHeader h;
  h.type = FrameType::kResult;
  auto bytes = HeaderBytes(h);
  EXPECT_EQ(bytes[5], std::byte{0x03});
}

TEST(FrameGoldenTest, ControlFrameMatchesDocumentedLayout) {
  const Bytes message = B({0x0A, 0x0B, 0x0C});
  ByteBuffer frame = EncodeControlFrame(message);
  Bytes expected = B({0x53, 0x52, 0x44, 0x46, 0x03, 0x01, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00});
  expected.resize(kFrameHeaderSize, std::byte{0});  // slot, job, seq, entry_count, reserved: all zero
  expected.insert(expected.end(), message.begin(), message.end());
  EXPECT_EQ(Copy(frame.span()), expected);

  Result<FrameHeader> r = DecodeFrameHeader(frame.span());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->type, FrameType::kControl);
  EXPECT_EQ(r->payload_length, 3u);

  ByteBuffer empty = EncodeControlFrame({});
  ASSERT_EQ(empty.size(), kFrameHeaderSize);
  EXPECT_TRUE(DecodeFrameHeader(empty.span()).ok());
}

// ---------------------------------------------------------------------------------------------------------------
// Data payload

TEST(DataPayloadTest, PayloadLengthAndEntryTable) {
  const std::vector<Entry> entries = {Entry{1, 2, 0}, Entry{3, 4, 1}, Entry{5, 6, 8}, Entry{7, 8, 9}};
  EXPECT_EQ(DataPayloadLength(entries), 4u * kEntrySize + 0 + 8 + 8 + 16);
  EXPECT_EQ(DataPayloadLength({}), 0u);
  EXPECT_EQ(DataPayloadLength(std::vector<Entry>{Entry{0, 0, 0xFFFFFFFF}}), kEntrySize + 0x100000000ull);

  Bytes table(entries.size() * kEntrySize, std::byte{0xCC});
  EncodeEntryTable(entries, table.data());
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::byte* e = table.data() + i * kEntrySize;
    EXPECT_EQ(DecodeFixed64(e), entries[i].block);
    EXPECT_EQ(DecodeFixed64(e + 8), entries[i].next);
    EXPECT_EQ(DecodeFixed32(e + 16), entries[i].data_bytes);
    EXPECT_EQ(DecodeFixed32(e + 20), 0u) << "reserved field must be written as zero";
  }
}

TEST(DataPayloadTest, RoundTrip) {
  const std::vector<std::vector<std::pair<uint64_t, uint32_t>>> cases = {
      {},
      {{0, 0}},
      {{0, 4}},
      {{3, 1}},
      {{3, 0}, {4, 0}, {5, 0}},
      {{10, 1}, {11, 2}, {12, 3}, {13, 5}, {14, 7}, {15, 8}, {16, 9}, {17, 15}, {18, 16}, {19, 17}},
      {{7, 1024}, {8, 0}, {9, 1020}, {kEndOfColumn - 1, 12}},
  };
  for (FrameType type : {FrameType::kContribution, FrameType::kResult}) {
    for (const auto& c : cases) {
      TestFrame f = MakeFrame(DataHeader(type), c);
      ASSERT_EQ(f.frame.size(), kFrameHeaderSize + DataPayloadLength(f.entries));
      Result<FrameHeader> h = DecodeFrameHeader(f.frame);
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      EXPECT_EQ(h->type, type);
      EXPECT_EQ(h->slot, 2u);
      EXPECT_EQ(h->job, 0x1122334455667788u);
      EXPECT_EQ(h->seq, 42u);
      EXPECT_EQ(h->entry_count, c.size());
      EXPECT_EQ(h->payload_length, DataPayloadLength(f.entries));

      // Stale contents must be cleared.
      std::vector<EntryView> views(3);
      Status s = DecodeDataPayload(*h, f.payload(), &views);
      ASSERT_TRUE(s.ok()) << s.ToString();
      ExpectWellFormed(*h, f.payload(), views);
      ASSERT_EQ(views.size(), c.size());
      for (size_t i = 0; i < c.size(); ++i) {
        EXPECT_EQ(views[i].block, f.entries[i].block);
        EXPECT_EQ(views[i].next, f.entries[i].next);
        EXPECT_EQ(Copy(views[i].data), f.data[i]) << "entry " << i;
        // Data of every entry starts 8-byte aligned within the payload.
        if (!views[i].data.empty()) {
          EXPECT_EQ((views[i].data.data() - f.payload().data()) % 8, 0);
        }
      }
    }
  }
}

TEST(DataPayloadTest, RejectsPayloadSizeMismatchWithHeader) {
  TestFrame f = MakeFrame(DataHeader(), {{1, 4}});
  Bytes longer = Copy(f.payload());
  longer.push_back(std::byte{0});
  std::vector<EntryView> views;
  Status s = DecodeDataPayload(f.header, longer, &views);
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(views.empty());
}

TEST(DataPayloadTest, RejectsEveryTruncatedPrefix) {
  const std::vector<std::vector<std::pair<uint64_t, uint32_t>>> cases = {
      {{0, 0}},
      {{0, 5}},
      {{1, 0}, {2, 8}, {3, 3}, {4, 0}},
      {{9, 17}, {10, 1}},
  };
  for (const auto& c : cases) {
    TestFrame f = MakeFrame(DataHeader(), c);
    const auto full = f.payload();
    for (size_t n = 0; n < full.size(); ++n) {
      Bytes prefix(full.begin(), full.begin() + n);  // exact size, so ASan catches reads past it
      std::vector<EntryView> views;

      // (a) The header still claims the full length.
      Status a = DecodeDataPayload(f.header, prefix, &views);
      EXPECT_FALSE(a.ok()) << "full-length header, prefix " << n;

      // (b) The header agrees with the shortened payload; the entries no longer do.
      FrameHeader shortened = f.header;
      shortened.payload_length = static_cast<uint32_t>(n);
      Status b = DecodeDataPayload(shortened, prefix, &views);
      EXPECT_FALSE(b.ok()) << "matching header, prefix " << n;
      EXPECT_EQ(b.code(), StatusCode::kProtocolViolation);

      // A shortened header that passes header validation must still fail payload validation.
      Result<FrameHeader> h = DecodeFrameHeader(HeaderBytes(shortened));
      if (h.ok()) {
        EXPECT_FALSE(DecodeDataPayload(*h, prefix, &views).ok()) << n;
      }
    }
  }
}

TEST(DataPayloadTest, RejectsOversizedDataBytesWithoutOverreading) {
  // One entry whose data_bytes claims far more than the payload holds. Pad8 of these overflows 32 bits.
  for (uint32_t data_bytes : {0xFFFFFFFFu, 0xFFFFFFF9u, 0xFFFFFFF8u, 0x80000000u, 17u, 9u}) {
    Bytes payload(kEntrySize + 8, std::byte{0});
    EncodeEntryTable(std::vector<Entry>{Entry{0, kEndOfColumn, data_bytes}}, payload.data());
    FrameHeader h = DataHeader();
    h.entry_count = 1;
    h.payload_length = static_cast<uint32_t>(payload.size());
    std::vector<EntryView> views;
    Status s = DecodeDataPayload(h, payload, &views);
    ASSERT_FALSE(s.ok()) << data_bytes;
    EXPECT_EQ(s.code(), StatusCode::kProtocolViolation);
    EXPECT_TRUE(Contains(s.message(), std::to_string(data_bytes))) << s.message();
  }
  // The data fits but its padding does not: a payload that ends inside the pad8 region.
  for (uint32_t data_bytes : {1u, 3u, 7u}) {
    Bytes payload(kEntrySize + data_bytes, std::byte{0});
    EncodeEntryTable(std::vector<Entry>{Entry{0, kEndOfColumn, data_bytes}}, payload.data());
    FrameHeader h = DataHeader();
    h.entry_count = 1;
    h.payload_length = static_cast<uint32_t>(payload.size());
    std::vector<EntryView> views;
    Status s = DecodeDataPayload(h, payload, &views);
    ASSERT_FALSE(s.ok()) << data_bytes;
    EXPECT_TRUE(Contains(s.message(), "past the end")) << s.message();
  }
  // The second entry overruns after the first consumed part of the data region.
  {
    Bytes payload(2 * kEntrySize + 16, std::byte{0});
    EncodeEntryTable(std::vector<Entry>{Entry{0, 2, 8}, Entry{1, 3, 0xFFFFFFFF}}, payload.data());
    FrameHeader h = DataHeader();
    h.entry_count = 2;
    h.payload_length = static_cast<uint32_t>(payload.size());
    std::vector<EntryView> views;
    Status s = DecodeDataPayload(h, payload, &views);
    ASSERT_FALSE(s.ok());
    EXPECT_TRUE(Contains(s.message(), "entry 1")) << s.message();
  }
}

TEST(DataPayloadTest, RejectsEntryTableLargerThanPayload) {
  // DecodeDataPayload must not trust that DecodeFrameHeader ran first.
  FrameHeader h = DataHeader();
  h.entry_count = 2;
  h.payload_length = kEntrySize;
  Bytes payload(kEntrySize, std::byte{0});
  std::vector<EntryView> views;
  EXPECT_FALSE(DecodeDataPayload(h, payload, &views).ok());
  h.entry_count = 0x0AAAAAAB;  // 24 * count wraps to 8 in 32 bits
  h.payload_length = 8;
  Bytes eight(8, std::byte{0});
  EXPECT_FALSE(DecodeDataPayload(h, eight, &views).ok());
}

TEST(DataPayloadTest, RejectsNonzeroPadding) {
  TestFrame f = MakeFrame(DataHeader(), {{1, 3}, {2, 8}, {3, 1}});
  // Data region: entry 0 at [72, 80) with padding [75, 80); entry 1 at [80, 88); entry 2 at [88, 96), padding [89, 96).
  const size_t table = 3 * kEntrySize;
  std::vector<size_t> padding;
  for (size_t i = table + 3; i < table + 8; ++i) padding.push_back(i);
  for (size_t i = table + 17; i < table + 24; ++i) padding.push_back(i);
  for (size_t offset : padding) {
    Bytes payload = Copy(f.payload());
    ASSERT_EQ(payload[offset], std::byte{0});
    payload[offset] = std::byte{0x01};
    std::vector<EntryView> views;
    Status s = DecodeDataPayload(f.header, payload, &views);
    ASSERT_FALSE(s.ok()) << offset;
    EXPECT_TRUE(Contains(s.message(), "padding")) << s.message();
  }
}

TEST(DataPayloadTest, RejectsNonzeroEntryReserved) {
  TestFrame f = MakeFrame(DataHeader(), {{1, 3}, {2, 0}});
  for (size_t entry = 0; entry < 2; ++entry) {
    for (size_t i = 20; i < 24; ++i) {
      Bytes payload = Copy(f.payload());
      payload[entry * kEntrySize + i] = std::byte{0x80};
      std::vector<EntryView> views;
      Status s = DecodeDataPayload(f.header, payload, &views);
      ASSERT_FALSE(s.ok()) << entry << " " << i;
      EXPECT_TRUE(Contains(s.message(), "reserved")) << s.message();
      EXPECT_TRUE(Contains(s.message(), "entry " + std::to_string(entry))) << s.message();
    }
  }
}

TEST(DataPayloadTest, RejectsTrailingBytes) {
  for (size_t extra : {1, 7, 8, 24}) {
    for (const auto& c : std::vector<std::vector<std::pair<uint64_t, uint32_t>>>{{}, {{1, 0}}, {{1, 4}}}) {
      TestFrame f = MakeFrame(DataHeader(), c);
      Bytes payload = Copy(f.payload());
      payload.resize(payload.size() + extra, std::byte{0});
      FrameHeader h = f.header;
      h.payload_length = static_cast<uint32_t>(payload.size());
      std::vector<EntryView> views;
      Status s = DecodeDataPayload(h, payload, &views);
      ASSERT_FALSE(s.ok()) << extra;
      EXPECT_TRUE(Contains(s.message(), "trailing")) << s.message();
    }
  }
}

// LevelDB-style corruption test: flip every byte of a small valid frame and decode. Each result must be either a
// clean error or a well-formed frame; fields the format pins down must always be rejected. Run under ASan to also
// catch reads past the buffer.
TEST(DataPayloadTest, EveryByteMutation) {
  TestFrame f = MakeFrame(DataHeader(FrameType::kResult), {{1, 4}, {2, 0}, {3, 3}});
  const size_t table = kFrameHeaderSize + 3 * kEntrySize;
  auto must_fail = [&](size_t i) {
    if (i < 5 || i == 6 || i == 7) return true;  // magic, version, flags (type 3^1 = 2 is valid)
    if (i >= 8 && i < 12) return true;                                     // payload_length vs. actual size
    if (i >= 32 && i < 40) return true;                                    // entry_count, reserved
    if (i >= kFrameHeaderSize && i < table) {
      const size_t in_entry = (i - kFrameHeaderSize) % kEntrySize;
      if (in_entry >= 20) return true;                                     // entry reserved
    }
    if (i >= table + 4 && i < table + 8) return true;                      // padding after entry 0
    if (i >= table + 11 && i < table + 16) return true;                    // padding after entry 2
    return false;
  };
  const std::vector<std::function<std::byte(std::byte)>> mutations = {
      [](std::byte b) { return b ^ std::byte{0x01}; },
      [](std::byte b) { return b ^ std::byte{0x80}; },
      [](std::byte) { return std::byte{0xFF}; },
      [](std::byte) { return std::byte{0x00}; },
  };
  int accepted = 0;
  int rejected = 0;
  for (size_t i = 0; i < f.frame.size(); ++i) {
    for (size_t m = 0; m < mutations.size(); ++m) {
      Bytes frame = f.frame;
      frame[i] = mutations[m](frame[i]);
      if (frame[i] == f.frame[i]) continue;  // not a mutation
      Result<FrameHeader> h = DecodeFrameHeader(frame);
      bool ok = h.ok();
      if (ok && h->type != FrameType::kControl) {
        Bytes payload(frame.begin() + kFrameHeaderSize, frame.end());
        std::vector<EntryView> views;
        Status s = DecodeDataPayload(*h, payload, &views);
        ok = s.ok();
        if (ok) {
          ExpectWellFormed(*h, payload, views);
        } else {
          EXPECT_FALSE(s.message().empty());
          EXPECT_TRUE(views.size() <= h->entry_count);
        }
      } else if (!ok) {
        EXPECT_FALSE(h.status().message().empty());
      }
      if (must_fail(i)) {
        EXPECT_FALSE(ok) << "byte " << i << " mutation " << m << " was accepted";
      }
      (ok ? accepted : rejected)++;
    }
  }
  // Both outcomes occur: block/next/slot/job/seq/data bytes are not checked by the decoder.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

// DecodeEntryTable, the reader that places data before reading it, agrees with DecodeDataPayload on every frame
// and on every single-byte mutation of one: same entries when both accept, and a table it accepts is refused by
// DecodeDataPayload only for a nonzero padding byte (which that reader checks after the data is read).
TEST(EntryTableTest, AgreesWithDecodeDataPayloadUnderMutation) {
  const std::vector<std::vector<std::pair<uint64_t, uint32_t>>> cases = {
      {},
      {{0, 0}},
      {{1, 0}, {2, 8}, {3, 3}, {4, 0}},
      {{9, 17}, {10, 1}, {11, 1024}},
  };
  int accepted = 0;
  int padding_only = 0;
  for (const auto& c : cases) {
    const TestFrame f = MakeFrame(DataHeader(FrameType::kResult), c);
    for (size_t i = kFrameHeaderSize; i < f.frame.size(); ++i) {
      for (uint8_t flip : {uint8_t{0}, uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
        if (flip == 0 && i != kFrameHeaderSize) continue;  // the unmutated frame once
        Bytes frame = f.frame;
        frame[i] ^= std::byte{flip};
        Result<FrameHeader> h = DecodeFrameHeader(frame);
        ASSERT_TRUE(h.ok());
        const std::span<const std::byte> payload = std::span(frame).subspan(kFrameHeaderSize);
        const uint64_t table_bytes = uint64_t{h->entry_count} * kEntrySize;
        std::vector<Entry> entries(2);  // stale contents are cleared
        const Status table = DecodeEntryTable(*h, payload.first(table_bytes), &entries);
        std::vector<EntryView> views;
        const Status whole = DecodeDataPayload(*h, payload, &views);
        if (whole.ok()) {
          ASSERT_TRUE(table.ok()) << table.ToString();
          ASSERT_EQ(entries.size(), views.size());
          for (size_t k = 0; k < views.size(); ++k) {
            EXPECT_EQ(entries[k].block, views[k].block);
            EXPECT_EQ(entries[k].next, views[k].next);
            EXPECT_EQ(entries[k].data_bytes, views[k].data.size());
          }
          ++accepted;
        } else if (table.ok()) {
          EXPECT_TRUE(Contains(whole.message(), "padding")) << whole.message();
          ++padding_only;
        } else {
          EXPECT_EQ(table.code(), StatusCode::kProtocolViolation);
        }
      }
    }
  }
  EXPECT_GT(accepted, 0);
  EXPECT_GT(padding_only, 0);
}

// The overload for lent payloads reads the entries from a copy of the table; a copy of another size than the
// header's entry_count x 24 bytes is refused (and decodes nothing) instead of being read past or short.
TEST(DataPayloadTest, TheCopiedEntryTableMustMatchTheEntryCount) {
  const TestFrame f = MakeFrame(DataHeader(), {{1, 8}, {2, 3}});
  const auto payload = f.payload();
  std::vector<EntryView> views;
  ASSERT_TRUE(DecodeDataPayload(f.header, payload.first(2 * kEntrySize), payload, &views).ok());
  ASSERT_EQ(views.size(), 2u);
  for (size_t table_bytes : {size_t{0}, size_t{kEntrySize}, size_t{2 * kEntrySize - 1}, size_t{2 * kEntrySize + 1}}) {
    SCOPED_TRACE(table_bytes);
    const Status st = DecodeDataPayload(f.header, payload.first(table_bytes), payload, &views);
    EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(st.message(), "entry table of " + std::to_string(table_bytes) + " bytes given for 2 entries");
    EXPECT_TRUE(views.empty());
  }
}

TEST(EntryTableTest, RefusesATableOfTheWrongSize) {
  const TestFrame f = MakeFrame(DataHeader(FrameType::kResult), {{1, 8}, {2, 8}});
  std::vector<Entry> entries;
  const auto payload = f.payload();
  EXPECT_FALSE(DecodeEntryTable(f.header, payload.first(kEntrySize), &entries).ok());
  EXPECT_FALSE(DecodeEntryTable(f.header, payload.first(3 * kEntrySize), &entries).ok());
  EXPECT_TRUE(DecodeEntryTable(f.header, payload.first(2 * kEntrySize), &entries).ok());
  FrameHeader lying = f.header;
  lying.entry_count = 3;  // more table than payload: DecodeEntryTable does not trust DecodeFrameHeader ran
  lying.payload_length = 2 * kEntrySize;
  Bytes table(3 * kEntrySize, std::byte{0});
  EXPECT_FALSE(DecodeEntryTable(lying, table, &entries).ok());
}

}  // namespace
}  // namespace sparsereduce
