// The collective spec on the control plane: which codec fields count, and how a spec prints.
#include <gtest/gtest.h>

#include <cmath>

#include "protocol/control.h"

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
