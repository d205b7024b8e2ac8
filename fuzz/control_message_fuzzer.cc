// Fuzzes the control plane at the protocol level (protocol/control.h, protocol/layout.h; docs/PROTOCOL.md §5).
//
// Input: 4 bytes that choose a small JobShape (world_size 1..16, aggregators 1..8, slots 1..16,
// blocks_per_message 1..256), then a CONTROL payload (a serialized ControlMessage) for DecodeControl.
//
// Checked, on whatever DecodeControl accepts:
//  - EncodeControl -> DecodeFrameHeader -> DecodeControl round-trips the message;
//  - CollectiveBegin: SpecFromProto keeps every field, SpecToProto inverts it; ValidateSpec (also on the raw,
//    unconverted values) and ValidateFrameSize never crash, and agree with an independent computation of the frame
//    size limit; for a spec that passes both (what the aggregator's Job does before building the engine), the
//    ColumnLayout arithmetic is consistent and a ColumnEngine can be built whose MaxContributionPayload is within
//    kMaxDataPayload;
//  - Hello: the protocol-level checks the aggregator's ValidateHello builds on (ValidateShape, rank and aggregator
//    ranges; aggregator/session.cc is not linked here) never crash, and a Hello shape that passes them gives a
//    consistent ColumnLayout (and, when small enough to allocate, a ColumnEngine);
//  - Error: the error-code mapping round-trips for every code it knows.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

#include <google/protobuf/stubs/logging.h>

#include "core/byte_buffer.h"
#include "fuzz/fuzz_common.h"
#include "protocol/column_engine.h"
#include "protocol/control.h"
#include "protocol/frame.h"
#include "protocol/layout.h"

using namespace sparsereduce;

namespace {

// The aggregator's default Hello limits (aggregator/server_options.h).
constexpr uint32_t kMaxWorldSize = 4096;
constexpr uint32_t kMaxSlots = 1024;
constexpr uint32_t kMaxBlocksPerMessage = 4096;
// Build a ColumnEngine only when its per-lane, per-rank state stays small (slots * K * W announced-next words).
constexpr uint64_t kMaxEngineWords = uint64_t{1} << 20;

void CheckLayout(const JobShape& shape, const CollectiveSpec& spec) {
  const uint32_t es = FindDType(spec.dtype)->size;
  const ColumnLayout layout(shape, spec.element_count, spec.block_size, es);
  const uint64_t nb = spec.element_count / spec.block_size + (spec.element_count % spec.block_size != 0);
  const uint64_t columns = uint64_t{shape.num_aggregators} * shape.slots * shape.blocks_per_message;
  FUZZ_CHECK(layout.num_blocks() == nb, "num_blocks %llu, expected %llu",
             static_cast<unsigned long long>(layout.num_blocks()), static_cast<unsigned long long>(nb));
  FUZZ_CHECK(layout.num_columns() == columns, "num_columns");
  FUZZ_CHECK(layout.MaxBlockBytes() == uint64_t{spec.block_size} * es, "MaxBlockBytes");
  FUZZ_CHECK(layout.IsValidNext(kEndOfColumn, 0, 0, false), "END must always be a valid next");
  FUZZ_CHECK(!layout.IsValidNext(nb, nb % columns, 0, true), "a block index past the end is valid");
  if (nb > 0) {
    const uint64_t last = nb - 1;
    const uint64_t elems = layout.BlockElements(last);
    FUZZ_CHECK(elems >= 1 && elems <= spec.block_size && elems == spec.element_count - last * spec.block_size,
               "BlockElements(last) = %llu", static_cast<unsigned long long>(elems));
    FUZZ_CHECK(layout.BlockBytes(last) == elems * es && layout.BlockBytes(last) <= layout.MaxBlockBytes(),
               "BlockBytes(last)");
    FUZZ_CHECK(layout.BlockByteOffset(last) + layout.BlockBytes(last) == spec.element_count * es,
               "the last block does not end at the tensor's end");
    if (nb > 1) FUZZ_CHECK(layout.BlockElements(0) == spec.block_size, "BlockElements(0)");
  }
  // Slot/lane arithmetic of §2, for a bounded number of (aggregator, slot) pairs.
  for (uint32_t a = 0; a < shape.num_aggregators && a < 16; ++a) {
    for (uint32_t s = 0; s < shape.slots && s < 16; ++s) {
      const uint32_t lanes = layout.NonEmptyLanes(a, s);
      FUZZ_CHECK(lanes <= shape.blocks_per_message, "NonEmptyLanes > K");
      for (uint32_t k : {0u, lanes ? lanes - 1 : 0u, lanes}) {
        if (k >= shape.blocks_per_message) continue;
        const uint64_t c = layout.Column(a, s, k);
        FUZZ_CHECK(c < columns && layout.AggregatorOf(c) == a && layout.ColumnOf(c) == c, "Column(%u,%u,%u)", a, s, k);
        FUZZ_CHECK((k < lanes) == (c < nb), "lane %u of (a=%u, s=%u) is %s but column %llu vs %llu blocks", k, a, s,
                   k < lanes ? "non-empty" : "empty", static_cast<unsigned long long>(c),
                   static_cast<unsigned long long>(nb));
      }
    }
  }
}

void MaybeBuildEngine(const JobShape& shape, uint32_t aggregator, const CollectiveSpec& spec) {
  if (uint64_t{shape.slots} * shape.blocks_per_message * shape.world_size > kMaxEngineWords) return;
  ColumnEngine engine(shape, aggregator, /*job=*/1, /*seq=*/1, spec);
  for (uint32_t s = 0; s < shape.slots; ++s) {
    FUZZ_CHECK(engine.MaxContributionPayload(s) <= kMaxDataPayload, "MaxContributionPayload %llu above the limit",
               static_cast<unsigned long long>(engine.MaxContributionPayload(s)));
  }
  // Slot 0 holds the aggregator's lowest column, so it is empty only when all of them are.
  const ColumnLayout layout(shape, spec.element_count, spec.block_size, FindDType(spec.dtype)->size);
  FUZZ_CHECK(engine.done() == (layout.NonEmptyLanes(aggregator, 0) == 0),
             "a fresh engine is done iff it serves no block");
}

void CheckCollectiveBegin(const JobShape& shape, uint32_t aggregator, const proto::CollectiveBegin& begin) {
  const proto::CollectiveSpec& p = begin.spec();
  // ValidateSpec on the raw values, including dtype/op values SpecFromProto would reject.
  CollectiveSpec raw{p.element_count(), static_cast<DType>(p.dtype()), static_cast<ReduceOp>(p.op()), p.block_size()};
  if (p.has_codec()) {
    const proto::CodecSpec& c = p.codec();
    raw.codec = {static_cast<Codec>(c.codec()), c.key(), c.sparsity(), c.result_fp32(), c.fraction(), c.alpha(),
                 c.diana_l2(), c.tensor_scale()};
    // The fields a known codec does not use are ignored (proto3 peers send them as 0).
    if (ValidateCodec(raw.codec).code() != StatusCode::kUnsupported) raw.codec = WithoutUnusedFields(raw.codec);
  }
  const Status raw_valid = ValidateSpec(raw);
  const Status raw_codec_valid = ValidateCodec(raw.codec);
  (void)raw.ToString();

  Result<CollectiveSpec> spec = SpecFromProto(p);
  if (!spec.ok()) {
    // Unknown enum values are UNSUPPORTED; codec parameters out of range are what ValidateCodec says.
    const bool expected = spec.status().code() == StatusCode::kUnsupported ||
                          (!raw_codec_valid.ok() && spec.status().code() == raw_codec_valid.code());
    FUZZ_CHECK(expected, "SpecFromProto: %s", spec.status().ToString().c_str());
    FUZZ_CHECK(!raw_valid.ok(), "ValidateSpec accepts a spec SpecFromProto rejects");
    return;
  }
  FUZZ_CHECK(raw_codec_valid.ok(), "SpecFromProto accepts a codec ValidateCodec rejects");
  FUZZ_CHECK(*spec == raw, "SpecFromProto changed a field");
  Result<CollectiveSpec> again = SpecFromProto(SpecToProto(*spec));
  FUZZ_CHECK(again.ok() && *again == *spec, "SpecFromProto(SpecToProto(spec)) != spec");
  const Status valid = ValidateSpec(*spec);
  FUZZ_CHECK(valid.ok() == raw_valid.ok(), "ValidateSpec differs between equal specs");
  if (!valid.ok()) return;
  const uint32_t es = FindDType(spec->dtype)->size;
  FUZZ_CHECK(spec->block_size >= 1 && uint64_t{spec->block_size} * es <= (uint64_t{1} << 24),
             "ValidateSpec accepted block_size %u", spec->block_size);
  const Status frame = ValidateFrameSize(shape, *spec);
  const uint64_t largest = uint64_t{shape.blocks_per_message} * (kEntrySize + Pad8(uint64_t{spec->block_size} * es));
  FUZZ_CHECK(frame.ok() == (largest <= kMaxDataPayload), "ValidateFrameSize says %s for frames of %llu bytes",
             frame.ok() ? "ok" : "too large", static_cast<unsigned long long>(largest));
  if (!frame.ok()) return;
  CheckLayout(shape, *spec);
  MaybeBuildEngine(shape, aggregator, *spec);
}

void CheckHello(const proto::Hello& h, uint32_t element_count, uint32_t block_size) {
  // The protocol-level part of the aggregator's ValidateHello (aggregator/session.cc), in its order.
  if (h.protocol_version() != kProtocolVersion) return;
  const JobShape shape{h.world_size(), h.num_aggregators(), h.slots(), h.blocks_per_message()};
  const Status st = ValidateShape(shape);
  FUZZ_CHECK(st.ok() == (shape.world_size && shape.num_aggregators && shape.slots && shape.blocks_per_message),
             "ValidateShape: %s", st.ToString().c_str());
  (void)shape.ToString();
  if (!st.ok()) return;
  if (h.rank() >= h.world_size() || h.aggregator_index() >= h.num_aggregators()) return;
  if (h.world_size() > kMaxWorldSize || h.slots() > kMaxSlots || h.blocks_per_message() > kMaxBlocksPerMessage) {
    return;
  }
  // A shape the aggregator accepts: it must support the layout of any valid spec.
  const CollectiveSpec spec{element_count, DType::kFloat32, ReduceOp::kSum, block_size};
  if (!ValidateSpec(spec).ok() || !ValidateFrameSize(shape, spec).ok()) return;
  CheckLayout(shape, spec);
  MaybeBuildEngine(shape, h.aggregator_index(), spec);
}

void CheckError(const proto::Error& e) {
  const StatusCode code = FromProtoCode(e.code());
  if (code != StatusCode::kInternal) {
    FUZZ_CHECK(ToProtoCode(code) == e.code(), "error code %d does not round-trip", static_cast<int>(e.code()));
  }
  (void)Status(code, e.message()).ToString();
  (void)StatusCodeName(code);
}

}  // namespace

// libprotobuf logs every string field with invalid UTF-8 it refuses; keep the fuzzer's output readable.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  google::protobuf::SetLogHandler(nullptr);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::ByteReader in(data, size);
  const uint8_t b0 = in.U8(), b1 = in.U8(), b2 = in.U8(), b3 = in.U8();
  const JobShape shape{1u + b0 % 16u, 1u + b1 % 8u, 1u + b2 % 16u, 1u + b3};
  const uint32_t aggregator = (b0 >> 4) % shape.num_aggregators;

  const std::span<const uint8_t> rest = in.Rest();
  if (rest.size() > kMaxControlPayload) return 0;  // the transport rejects it before parsing
  ByteBuffer payload(rest.size());
  if (!rest.empty()) std::memcpy(payload.data(), rest.data(), rest.size());

  Result<proto::ControlMessage> message = DecodeControl(payload.span());
  if (!message.ok()) {
    FUZZ_CHECK(message.status().code() == StatusCode::kProtocolViolation, "DecodeControl: %s",
               message.status().ToString().c_str());
    return 0;
  }
  const ByteBuffer frame = EncodeControl(*message);
  Result<FrameHeader> header = DecodeFrameHeader(frame.span());
  if (frame.size() - kFrameHeaderSize <= kMaxControlPayload) {
    FUZZ_CHECK(header.ok() && header->type == FrameType::kControl, "EncodeControl frame header does not decode");
    Result<proto::ControlMessage> again = DecodeControl(frame.span().subspan(kFrameHeaderSize));
    FUZZ_CHECK(again.ok() && again->body_case() == message->body_case(), "EncodeControl frame does not decode");
  }

  switch (message->body_case()) {
    case proto::ControlMessage::kCollectiveBegin:
      CheckCollectiveBegin(shape, aggregator, message->collective_begin());
      break;
    case proto::ControlMessage::kHello:
      CheckHello(message->hello(), uint32_t{b0} << 8 | b1, 1u + b2 % 64u);
      break;
    case proto::ControlMessage::kError:
      CheckError(message->error());
      break;
    default:
      break;
  }
  return 0;
}
