// The collective spec on the control plane: which codec fields count, and how a spec prints.
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "protocol/control.h"
#include "protocol/frame.h"

namespace sparsereduce {
namespace {

proto::CollectiveSpec WithCodec(const proto::CodecSpec& codec) {
  proto::CollectiveSpec p = SpecToProto(CollectiveSpec{1000, DType::kFloat32, ReduceOp::kSum, 256});
  *p.mutable_codec() = codec;
  return p;
}

// A peer that is not this library (any protobuf client) sends the fields a codec does not use as proto3 defaults,
// i.e. 0: they are neither checked nor compared. They used to be: a CodecSpec{codec: NONE} was refused because
// its sparsity 0 is outside 3LC's [1, 2).
TEST(ControlSpec, FieldsACodecDoesNotUseAreIgnored) {
  proto::CodecSpec none;
  none.set_codec(proto::NONE);
  Result<CollectiveSpec> spec = SpecFromProto(WithCodec(none));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->codec, CodecSpec{});

  proto::CodecSpec topk;
  topk.set_codec(proto::TOPK);
  topk.set_fraction(0.25f);
  spec = SpecFromProto(WithCodec(topk));
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_EQ(spec->codec.fraction, 0.25f);

  // Two 3LC specs that differ only in a top-k field are the same spec.
  proto::CodecSpec a;
  a.set_codec(proto::THREE_LC);
  a.set_key(3);
  a.set_sparsity(1.5f);
  proto::CodecSpec b = a;
  b.set_fraction(0.5f);
  Result<CollectiveSpec> sa = SpecFromProto(WithCodec(a)), sb = SpecFromProto(WithCodec(b));
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(*sa, *sb);

  // A field the codec uses is still checked.
  a.set_sparsity(0.0f);
  EXPECT_EQ(SpecFromProto(WithCodec(a)).status().code(), StatusCode::kInvalidArgument);
  // An unknown codec is refused as before.
  proto::CodecSpec unknown;
  unknown.set_codec(static_cast<proto::Codec>(99));
  EXPECT_EQ(SpecFromProto(WithCodec(unknown)).status().code(), StatusCode::kUnsupported);
}

// The key travels and compares without a codec too (it tells collectives issued in different orders apart): a
// spec of NONE with key 5 survives the round trip, differs from key 6 and prints it; key 0 sends no codec at all.
TEST(ControlSpec, TheKeyCountsWithoutACodec) {
  CollectiveSpec keyed{1000, DType::kFloat32, ReduceOp::kSum, 256, CodecSpec{Codec::kNone, 5}};
  const proto::CollectiveSpec p = SpecToProto(keyed);
  ASSERT_TRUE(p.has_codec());
  Result<CollectiveSpec> back = SpecFromProto(p);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, keyed);
  CollectiveSpec other = keyed;
  other.codec.key = 6;
  EXPECT_NE(*back, other);
  EXPECT_EQ(keyed.codec.ToString(), "none(key=5)");
  EXPECT_FALSE(SpecToProto(CollectiveSpec{1000, DType::kFloat32, ReduceOp::kSum, 256}).has_codec());
  EXPECT_EQ(CodecSpec{}.ToString(), "none");
}

// Two specs that differ print differently: the SPEC_MISMATCH error shows both, and used to show
// "3lc(key=0 s=1.500000)" twice for sparsities 1.5 and the next float.
TEST(ControlSpec, SpecsThatDifferPrintDifferently) {
  CodecSpec a{Codec::kThreeLC, 0, 1.5f};
  CodecSpec b = a;
  b.sparsity = std::nextafter(1.5f, 2.0f);
  EXPECT_NE(a.ToString(), b.ToString());
  EXPECT_EQ(a.ToString(), "3lc(key=0 s=1.5)");
}

}  // namespace
}  // namespace sparsereduce

namespace sparsereduce {
namespace {

std::vector<std::byte> Bytes(std::initializer_list<int> values) {
  std::vector<std::byte> out;
  for (int v : values) out.push_back(std::byte(static_cast<uint8_t>(v)));
  return out;
}

// EncodeControl makes a whole CONTROL frame whose payload DecodeControl gives back field for field.
TEST(ControlMessage, EncodeControlMakesAFrameThatDecodesToTheSameMessage) {
  proto::ControlMessage message;
  proto::Error* error = message.mutable_error();
  error->set_code(proto::PEER_LEFT);
  error->set_message("rank 3 left");
  error->set_seq(17);
  error->add_ranks(3);
  const ByteBuffer frame = EncodeControl(message);
  Result<FrameHeader> header = DecodeFrameHeader(frame.span());
  ASSERT_TRUE(header.ok()) << header.status().ToString();
  EXPECT_EQ(header->type, FrameType::kControl);
  ASSERT_EQ(header->payload_length, frame.size() - kFrameHeaderSize);
  Result<proto::ControlMessage> back = DecodeControl(frame.span().subspan(kFrameHeaderSize));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->SerializeAsString(), message.SerializeAsString());
  EXPECT_EQ(back->error().message(), "rank 3 left");
  EXPECT_EQ(back->error().ranks(0), 3u);
}

// A CONTROL payload from the wire that is not a protobuf, or one that holds none of the messages this version
// knows (empty, or only a field a newer peer might add), is a protocol violation, not a message with no body.
TEST(ControlMessage, DecodeControlRefusesGarbageAndMessagesWithoutABody) {
  const std::vector<std::byte> garbage = Bytes({0xFF});  // field 31 with wire type 7, which does not exist
  Result<proto::ControlMessage> r = DecodeControl(garbage);
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(r.status().message(), "CONTROL payload of 1 bytes is not a ControlMessage");

  const std::vector<std::byte> truncated = Bytes({0x2A, 0x05, 0x08});  // Error (field 5) of 5 bytes, 1 present
  r = DecodeControl(truncated);
  EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(r.status().message(), "CONTROL payload of 3 bytes is not a ControlMessage");

  for (const std::vector<std::byte>& no_body : {std::vector<std::byte>{}, Bytes({0x98, 0x06, 0x01})}) {  // field 99
    r = DecodeControl(no_body);
    EXPECT_EQ(r.status().code(), StatusCode::kProtocolViolation);
    EXPECT_EQ(r.status().message(), "CONTROL message holds no known message");
  }
}

// A spec from the wire with a dtype or reduction value this version does not know is UNSUPPORTED and says which.
TEST(ControlSpec, UnknownDTypeOrOpValuesAreUnsupported) {
  proto::CollectiveSpec p = SpecToProto(CollectiveSpec{1000, DType::kFloat32, ReduceOp::kSum, 256});
  for (int dtype : {0, 99}) {
    proto::CollectiveSpec bad = p;
    bad.set_dtype(static_cast<proto::DType>(dtype));
    Result<CollectiveSpec> r = SpecFromProto(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_EQ(r.status().message(), "unknown dtype value " + std::to_string(dtype));
  }
  for (int op : {0, 77}) {
    proto::CollectiveSpec bad = p;
    bad.set_op(static_cast<proto::ReduceOp>(op));
    Result<CollectiveSpec> r = SpecFromProto(bad);
    EXPECT_EQ(r.status().code(), StatusCode::kUnsupported);
    EXPECT_EQ(r.status().message(), "unknown reduction op value " + std::to_string(op));
  }
  Result<CollectiveSpec> good = SpecFromProto(p);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(*good, (CollectiveSpec{1000, DType::kFloat32, ReduceOp::kSum, 256}));
}

// An Error sent over the control plane keeps its code: every status code but OK and INTERNAL has a wire value of
// its own and comes back as itself; the wire's UNSPECIFIED and values from a newer peer read as INTERNAL.
TEST(ControlMessage, EveryErrorCodeSurvivesTheWire) {
  std::set<int> wire_values;
  for (int c = static_cast<int>(StatusCode::kInvalidArgument); c < static_cast<int>(StatusCode::kInternal); ++c) {
    const auto code = static_cast<StatusCode>(c);
    const proto::ErrorCode wire = ToProtoCode(code);
    EXPECT_NE(wire, proto::ERROR_CODE_UNSPECIFIED) << StatusCodeName(code);
    EXPECT_EQ(FromProtoCode(wire), code) << StatusCodeName(code);
    wire_values.insert(wire);
  }
  EXPECT_EQ(wire_values.size(), static_cast<size_t>(StatusCode::kInternal) - 1);  // no two codes share a value
  for (int w = proto::ErrorCode_MIN + 1; w <= proto::ErrorCode_MAX; ++w) {
    EXPECT_EQ(ToProtoCode(FromProtoCode(static_cast<proto::ErrorCode>(w))), w) << w;
  }
  EXPECT_EQ(ToProtoCode(StatusCode::kInternal), proto::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(ToProtoCode(StatusCode::kOk), proto::ERROR_CODE_UNSPECIFIED);
  EXPECT_EQ(FromProtoCode(proto::ERROR_CODE_UNSPECIFIED), StatusCode::kInternal);
  EXPECT_EQ(FromProtoCode(static_cast<proto::ErrorCode>(proto::ErrorCode_MAX + 1)), StatusCode::kInternal);
}

}  // namespace
}  // namespace sparsereduce
