// Frame encoding and decoding (docs/PROTOCOL.md §3). Pure functions over byte spans; decoders distrust their input
// and return a reasoned error instead of reading past it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/byte_buffer.h"
#include "core/status.h"
#include "protocol/frame_format.h"

namespace sparsereduce {

struct FrameHeader {
  FrameType type = FrameType::kControl;
  uint32_t payload_length = 0;
  uint32_t slot = 0;
  uint64_t job = 0;
  uint64_t seq = 0;
  uint32_t entry_count = 0;
};

// One entry of a data frame, as encoded.
struct Entry {
  uint64_t block = 0;
  uint64_t next = kEndOfColumn;
  uint32_t data_bytes = 0;
};

// A decoded entry; `data` points into the frame payload (empty when data_bytes == 0).
struct EntryView {
  uint64_t block = 0;
  uint64_t next = kEndOfColumn;
  std::span<const std::byte> data;
};

void EncodeFrameHeader(const FrameHeader& header, std::byte* out);  // writes kFrameHeaderSize bytes

// Checks everything a header can say on its own: magic, version, type, flags, reserved, and that CONTROL frames
// have zero data fields and data frames have a payload at least as large as their entry table.
Result<FrameHeader> DecodeFrameHeader(std::span<const std::byte> bytes);

// Payload length of a data frame with these entries.
uint64_t DataPayloadLength(std::span<const Entry> entries);

// Writes the entry table (kEntrySize bytes per entry) to `out`.
void EncodeEntryTable(std::span<const Entry> entries, std::byte* out);

// Writes a data frame's header, with entry_count and payload_length derived from `entries`, followed by its entry
// table: kFrameHeaderSize + kEntrySize · entries.size() bytes at `out`. The data region is the caller's.
void EncodeDataPrefix(FrameHeader header, std::span<const Entry> entries, std::byte* out);

// Decodes the entry table of a data frame: the first kEntrySize · header.entry_count bytes of its payload
// (DecodeFrameHeader has checked that they fit). `out` is cleared first. Fails on a nonzero reserved field and on
// entries whose padded data does not fill the rest of the payload exactly, so that a reader may place each entry's
// data before it has read it (docs/PROTOCOL.md §3.2).
Status DecodeEntryTable(const FrameHeader& header, std::span<const std::byte> table, std::vector<Entry>* out);

// Decodes a data payload. `out` is cleared first. Fails on a payload whose length does not match its entries,
// nonzero reserved or padding bytes.
Status DecodeDataPayload(const FrameHeader& header, std::span<const std::byte> payload,
                         std::vector<EntryView>* out);
// The same, with the entry table decoded from `table`, a copy of the payload's first entry_count · kEntrySize
// bytes, for a payload in memory that another process may still write (an entry's fields are then read from the
// copy only, once; the data spans point into `payload`).
Status DecodeDataPayload(const FrameHeader& header, std::span<const std::byte> table,
                         std::span<const std::byte> payload, std::vector<EntryView>* out);

// A complete frame (header + entry table + data, contiguous). Used for RESULT frames and in tests.
ByteBuffer EncodeDataFrame(FrameHeader header, std::span<const Entry> entries,
                           std::span<const std::span<const std::byte>> data);

// A complete CONTROL frame around an already serialized control message.
ByteBuffer EncodeControlFrame(std::span<const std::byte> message);

const char* FrameTypeName(FrameType type);

}  // namespace sparsereduce
