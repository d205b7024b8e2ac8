// Fuzzes the frame codec (protocol/frame.h, docs/PROTOCOL.md §3): the input is one frame as it arrives on a
// connection, a 40-byte header followed by the payload. Each input is checked twice: as is, and with the header's
// payload_length replaced by the actual payload size (so mutations of the payload reach the entry checks).
//
// Checked:
//  - DecodeFrameHeader never accepts fewer than 40 bytes, and an accepted header re-encodes (EncodeFrameHeader) to
//    exactly the 40 input bytes (every field is either preserved or checked to be zero);
//  - DecodeDataPayload and DecodeControl never crash or read outside the payload (ASan: the payload is copied into
//    a buffer of exactly its size), whatever the header type says;
//  - a data payload that decodes re-encodes (EncodeDataFrame from the decoded entries) to exactly the input bytes,
//    and its entries point inside the payload;
//  - a CONTROL payload that decodes survives EncodeControl -> DecodeFrameHeader -> DecodeControl unchanged.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <google/protobuf/stubs/logging.h>

#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/control.h"
#include "protocol/frame.h"

using namespace sparsereduce;

namespace {

void CheckDataPayload(const FrameHeader& header, std::span<const std::byte> input, const ByteBuffer& payload) {
  std::vector<EntryView> entries;
  if (!DecodeDataPayload(header, payload.span(), &entries).ok()) return;
  FUZZ_CHECK(entries.size() == header.entry_count, "%zu entries decoded, header says %u", entries.size(),
             header.entry_count);
  std::vector<Entry> plain;
  std::vector<std::span<const std::byte>> data;
  const std::byte* begin = payload.data();
  const std::byte* end = payload.data() + payload.size();
  for (const EntryView& e : entries) {
    if (!e.data.empty()) {
      FUZZ_CHECK(e.data.data() >= begin + uint64_t{kEntrySize} * entries.size() && e.data.data() <= end &&
                     e.data.size() <= static_cast<size_t>(end - e.data.data()),
                 "entry data outside the payload's data region");
      data.push_back(e.data);
    }
    plain.push_back(Entry{e.block, e.next, static_cast<uint32_t>(e.data.size())});
  }
  FUZZ_CHECK(DataPayloadLength(plain) == header.payload_length, "DataPayloadLength %llu != payload_length %u",
             static_cast<unsigned long long>(DataPayloadLength(plain)), header.payload_length);
  const ByteBuffer frame = EncodeDataFrame(header, plain, data);
  FUZZ_CHECK(frame.size() == input.size(), "re-encoded frame has %zu bytes, input %zu", frame.size(), input.size());
  FUZZ_CHECK(std::memcmp(frame.data(), input.data(), input.size()) == 0, "re-encoded frame differs from the input");
}

void CheckControlPayload(const FrameHeader& header, std::span<const std::byte> input, const ByteBuffer& payload) {
  Result<proto::ControlMessage> message = DecodeControl(payload.span());
  if (!message.ok()) return;
  FUZZ_CHECK(message->body_case() != proto::ControlMessage::BODY_NOT_SET, "DecodeControl accepted an empty body");
  if (header.type == FrameType::kControl && payload.size() == header.payload_length) {
    // The frame header is a pure function of the payload size for CONTROL frames.
    const ByteBuffer frame = EncodeControlFrame(payload.span());
    FUZZ_CHECK(frame.size() == input.size() && std::memcmp(frame.data(), input.data(), input.size()) == 0,
               "EncodeControlFrame does not reproduce the input CONTROL frame");
  }
  // Re-serialization is canonical, not byte-identical to the input; it must round-trip through the codec.
  const ByteBuffer again = EncodeControl(*message);
  Result<FrameHeader> h = DecodeFrameHeader(again.span());
  if (again.size() - kFrameHeaderSize > kMaxControlPayload) {
    FUZZ_CHECK(!h.ok(), "a CONTROL frame above the payload limit decoded");
    return;
  }
  FUZZ_CHECK(h.ok(), "EncodeControl produced a bad header: %s", h.status().ToString().c_str());
  FUZZ_CHECK(h->type == FrameType::kControl && h->payload_length == again.size() - kFrameHeaderSize,
             "EncodeControl header fields");
  Result<proto::ControlMessage> reparsed = DecodeControl(again.span().subspan(kFrameHeaderSize));
  FUZZ_CHECK(reparsed.ok(), "re-encoded control message does not decode: %s",
             reparsed.status().ToString().c_str());
  FUZZ_CHECK(reparsed->SerializeAsString() == message->SerializeAsString(),
             "control message changed across a round trip");
}

void CheckFrame(std::span<const std::byte> input) {
  // The header decoder sees at most the 40 header bytes, like the transport's fixed-size header read.
  ByteBuffer header_bytes(std::min<size_t>(input.size(), kFrameHeaderSize));
  if (header_bytes.size()) std::memcpy(header_bytes.data(), input.data(), header_bytes.size());
  Result<FrameHeader> header = DecodeFrameHeader(header_bytes.span());
  if (input.size() < kFrameHeaderSize) {
    FUZZ_CHECK(!header.ok(), "a header of %zu bytes decoded", input.size());
    return;
  }
  if (!header.ok()) return;

  std::byte reencoded[kFrameHeaderSize];
  EncodeFrameHeader(*header, reencoded);
  FUZZ_CHECK(std::memcmp(reencoded, input.data(), kFrameHeaderSize) == 0, "header does not re-encode to the input");
  if (header->type == FrameType::kControl) {
    FUZZ_CHECK(header->payload_length <= kMaxControlPayload && header->slot == 0 && header->job == 0 &&
                   header->seq == 0 && header->entry_count == 0,
               "CONTROL header constraints");
  } else {
    FUZZ_CHECK(uint64_t{header->entry_count} * kEntrySize <= header->payload_length, "entry table exceeds payload");
  }

  // The payload in a buffer of exactly its size, so that ASan sees any read past either end.
  ByteBuffer payload(input.size() - kFrameHeaderSize);
  if (payload.size()) std::memcpy(payload.data(), input.data() + kFrameHeaderSize, payload.size());

  // Both decoders on every header type: a receiver picks the decoder from the type, but neither may rely on it.
  CheckDataPayload(*header, input, payload);
  CheckControlPayload(*header, input, payload);
}

}  // namespace

// libprotobuf logs every string field with invalid UTF-8 it refuses; keep the fuzzer's output readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  CheckFrame(input);
  // The same frame with payload_length set to the actual payload size: most payload checks are only reached when
  // the two agree, and a mutation rarely keeps them in step.
  if (size >= kFrameHeaderSize && size - kFrameHeaderSize <= UINT32_MAX) {
    std::vector<std::byte> fixed(input.begin(), input.end());
    const uint64_t n = size - kFrameHeaderSize;
    for (int i = 0; i < 4; ++i) fixed[8 + i] = std::byte(n >> (8 * i));
    if (std::memcmp(fixed.data() + 8, data + 8, 4) != 0) CheckFrame(fixed);
  }
  return 0;
}
