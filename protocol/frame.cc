#include "protocol/frame.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "protocol/coding.h"

namespace sparsereduce {

const char* FrameTypeName(FrameType type) {
  switch (type) {
    case FrameType::kControl: return "CONTROL";
    case FrameType::kContribution: return "CONTRIBUTION";
    case FrameType::kResult: return "RESULT";
  }
  return "UNKNOWN";
}

void EncodeFrameHeader(const FrameHeader& h, std::byte* out) {
  EncodeFixed32(out + 0, kFrameMagic);
  out[4] = std::byte{kProtocolVersion};
  out[5] = std::byte{static_cast<uint8_t>(h.type)};
  EncodeFixed16(out + 6, 0);
  EncodeFixed32(out + 8, h.payload_length);
  EncodeFixed32(out + 12, h.slot);
  EncodeFixed64(out + 16, h.job);
  EncodeFixed64(out + 24, h.seq);
  EncodeFixed32(out + 32, h.entry_count);
  EncodeFixed32(out + 36, 0);
}

Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes) {
  if (bytes.size() < kFrameHeaderSize) {
    return ProtocolError("truncated frame header: " + std::to_string(bytes.size()) + " of " +
                         std::to_string(kFrameHeaderSize) + " bytes");
  }
  const std::byte* p = bytes.data();
  const uint32_t magic = DecodeFixed32(p);
  if (magic != kFrameMagic) {
    // The first bytes as text where they are printable: "SSH-", "HTTP" name the service at that port.
    std::string text;
    for (int i = 0; i < 4; ++i) {
      const auto c = std::to_integer<unsigned char>(p[i]);
      text += c >= 0x20 && c < 0x7f ? static_cast<char>(c) : '.';
    }
    char hex[16];
    std::snprintf(hex, sizeof hex, "%08x", magic);
    return ProtocolError("bad frame magic 0x" + std::string(hex) + " (\"" + text +
                         "\"): the peer does not speak the sparsereduce protocol (the wrong host or port?)");
  }
  const auto version = std::to_integer<uint8_t>(p[4]);
  if (version != kProtocolVersion) {
    return Status(StatusCode::kVersionMismatch,
                  "frame version " + std::to_string(version) + ", expected " + std::to_string(kProtocolVersion) +
                      ": workers and aggregators must run sparsereduce releases of the same protocol version");
  }
  const auto type = std::to_integer<uint8_t>(p[5]);
  if (type < 1 || type > 3) return ProtocolError("unknown frame type " + std::to_string(type));
  if (DecodeFixed16(p + 6) != 0) return ProtocolError("nonzero frame flags");
  if (DecodeFixed32(p + 36) != 0) return ProtocolError("nonzero reserved header field");

  FrameHeader h;
  h.type = static_cast<FrameType>(type);
  h.payload_length = DecodeFixed32(p + 8);
  h.slot = DecodeFixed32(p + 12);
  h.job = DecodeFixed64(p + 16);
  h.seq = DecodeFixed64(p + 24);
  h.entry_count = DecodeFixed32(p + 32);
  if (h.type == FrameType::kControl) {
    if (h.slot != 0 || h.job != 0 || h.seq != 0 || h.entry_count != 0) {
      return ProtocolError("CONTROL frame with nonzero slot/job/seq/entry_count");
    }
    if (h.payload_length > kMaxControlPayload) {
      return ProtocolError("CONTROL payload of " + std::to_string(h.payload_length) + " bytes exceeds the limit of " +
                           std::to_string(kMaxControlPayload));
    }
  } else if (uint64_t{h.entry_count} * kEntrySize > h.payload_length) {
    return ProtocolError(std::string(FrameTypeName(h.type)) + " frame with " + std::to_string(h.entry_count) +
                         " entries but a payload of only " + std::to_string(h.payload_length) + " bytes");
  }
  return h;
}

uint64_t DataPayloadLength(std::span<const Entry> entries) {
  uint64_t length = uint64_t{kEntrySize} * entries.size();
  for (const Entry& e : entries) length += Pad8(e.data_bytes);
  return length;
}

void EncodeEntryTable(std::span<const Entry> entries, std::byte* out) {
  for (const Entry& e : entries) {
    EncodeFixed64(out, e.block);
    EncodeFixed64(out + 8, e.next);
    EncodeFixed32(out + 16, e.data_bytes);
    EncodeFixed32(out + 20, 0);
    out += kEntrySize;
  }
}

namespace {

// Decodes entry `i` at `p` and checks that its padded data fits the `room` bytes of the data region left.
Status DecodeEntry(const std::byte* p, uint32_t i, uint64_t room, Entry* e) {
  e->block = DecodeFixed64(p);
  e->next = DecodeFixed64(p + 8);
  e->data_bytes = DecodeFixed32(p + 16);
  if (DecodeFixed32(p + 20) != 0) return ProtocolError("entry " + std::to_string(i) + ": nonzero reserved field");
  if (Pad8(e->data_bytes) > room) {
    return ProtocolError("entry " + std::to_string(i) + " (block " + std::to_string(e->block) + "): " +
                         std::to_string(e->data_bytes) + " data bytes run past the end of the payload");
  }
  return Status::Ok();
}

Status TrailingBytes(uint64_t n) {
  return ProtocolError("payload has " + std::to_string(n) + " trailing bytes after the last entry's data");
}

}  // namespace

Status DecodeEntryTable(const FrameHeader& header, std::span<const std::byte> table, std::vector<Entry>* out) {
  out->clear();
  const uint64_t table_bytes = uint64_t{header.entry_count} * kEntrySize;
  if (table.size() != table_bytes || table_bytes > header.payload_length) {
    return ProtocolError("entry table of " + std::to_string(header.entry_count) +
                         " entries does not fit a payload of " + std::to_string(header.payload_length) + " bytes");
  }
  out->resize(header.entry_count);
  uint64_t room = header.payload_length - table_bytes;
  for (uint32_t i = 0; i < header.entry_count; ++i) {
    const std::byte* entry = table.data() + uint64_t{i} * kEntrySize;
    if (Status st = DecodeEntry(entry, i, room, &(*out)[i]); !st.ok()) return st;
    room -= Pad8((*out)[i].data_bytes);
  }
  if (room != 0) return TrailingBytes(room);
  return Status::Ok();
}

Status DecodeDataPayload(const FrameHeader& header, std::span<const std::byte> payload,
                         std::vector<EntryView>* out) {
  const uint64_t table_bytes = uint64_t{header.entry_count} * kEntrySize;
  return DecodeDataPayload(header, payload.first(std::min<uint64_t>(table_bytes, payload.size())), payload, out);
}

Status DecodeDataPayload(const FrameHeader& header, std::span<const std::byte> table,
                         std::span<const std::byte> payload, std::vector<EntryView>* out) {
  out->clear();
  if (payload.size() != header.payload_length) {
    return ProtocolError("payload of " + std::to_string(payload.size()) + " bytes, header says " +
                         std::to_string(header.payload_length));
  }
  const uint64_t table_bytes = uint64_t{header.entry_count} * kEntrySize;
  if (table_bytes > payload.size()) {
    return ProtocolError("entry table of " + std::to_string(header.entry_count) + " entries exceeds the payload");
  }
  if (table.size() != table_bytes) {
    return ProtocolError("entry table of " + std::to_string(table.size()) + " bytes given for " +
                         std::to_string(header.entry_count) + " entries");
  }
  out->reserve(header.entry_count);
  uint64_t data_offset = table_bytes;
  for (uint32_t i = 0; i < header.entry_count; ++i) {
    Entry e;
    const std::byte* entry = table.data() + uint64_t{i} * kEntrySize;
    if (Status st = DecodeEntry(entry, i, payload.size() - data_offset, &e); !st.ok()) return st;
    const std::byte* data = payload.data() + data_offset;
    for (uint64_t pad = e.data_bytes; pad < Pad8(e.data_bytes); ++pad) {
      if (data[pad] != std::byte{0}) return ProtocolError("entry " + std::to_string(i) + ": nonzero padding byte");
    }
    out->push_back(EntryView{e.block, e.next, {data, e.data_bytes}});
    data_offset += Pad8(e.data_bytes);
  }
  if (data_offset != payload.size()) return TrailingBytes(payload.size() - data_offset);
  return Status::Ok();
}

void EncodeDataPrefix(FrameHeader header, std::span<const Entry> entries, std::byte* out) {
  header.payload_length = static_cast<uint32_t>(DataPayloadLength(entries));
  header.entry_count = static_cast<uint32_t>(entries.size());
  EncodeFrameHeader(header, out);
  EncodeEntryTable(entries, out + kFrameHeaderSize);
}

ByteBuffer EncodeDataFrame(FrameHeader header, std::span<const Entry> entries,
                           std::span<const std::span<const std::byte>> data) {
  ByteBuffer frame(kFrameHeaderSize + DataPayloadLength(entries));
  EncodeDataPrefix(header, entries, frame.data());
  std::byte* out = frame.data() + kFrameHeaderSize + uint64_t{kEntrySize} * entries.size();
  size_t d = 0;
  for (const Entry& e : entries) {
    if (e.data_bytes == 0) continue;
    std::memcpy(out, data[d++].data(), e.data_bytes);
    std::memset(out + e.data_bytes, 0, Pad8(e.data_bytes) - e.data_bytes);
    out += Pad8(e.data_bytes);
  }
  return frame;
}

ByteBuffer EncodeControlFrame(std::span<const std::byte> message) {
  FrameHeader header;
  header.type = FrameType::kControl;
  header.payload_length = static_cast<uint32_t>(message.size());
  ByteBuffer frame(kFrameHeaderSize + message.size());
  EncodeFrameHeader(header, frame.data());
  if (!message.empty()) std::memcpy(frame.data() + kFrameHeaderSize, message.data(), message.size());
  return frame;
}

}  // namespace sparsereduce
