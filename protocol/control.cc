#include "protocol/control.h"

#include "protocol/frame.h"

namespace sparsereduce {

ByteBuffer EncodeControl(const proto::ControlMessage& message) {
  const std::string bytes = message.SerializeAsString();
  return EncodeControlFrame(std::as_bytes(std::span(bytes.data(), bytes.size())));
}

Result<proto::ControlMessage> DecodeControl(std::span<const std::byte> payload) {
  proto::ControlMessage message;
  if (!message.ParseFromArray(payload.data(), static_cast<int>(payload.size()))) {
    return ProtocolError("CONTROL payload of " + std::to_string(payload.size()) + " bytes is not a ControlMessage");
  }
  if (message.body_case() == proto::ControlMessage::BODY_NOT_SET) {
    return ProtocolError("CONTROL message holds no known message");
  }
  return message;
}

proto::CollectiveSpec SpecToProto(const CollectiveSpec& spec) {
  proto::CollectiveSpec p;
  p.set_element_count(spec.element_count);
  p.set_dtype(static_cast<proto::DType>(spec.dtype));
  p.set_op(static_cast<proto::ReduceOp>(spec.op));
  p.set_block_size(spec.block_size);
  if (spec.codec.codec != Codec::kNone || spec.codec.key != 0) {
    proto::CodecSpec* c = p.mutable_codec();
    c->set_codec(static_cast<proto::Codec>(spec.codec.codec));
    c->set_key(spec.codec.key);
    c->set_sparsity(spec.codec.sparsity);
    c->set_result_fp32(spec.codec.result_fp32);
    c->set_fraction(spec.codec.fraction);
    c->set_alpha(spec.codec.alpha);
    c->set_diana_l2(spec.codec.diana_l2);
    c->set_tensor_scale(spec.codec.tensor_scale);
  }
  return p;
}

Result<CollectiveSpec> SpecFromProto(const proto::CollectiveSpec& p) {
  if (FindDType(static_cast<uint32_t>(p.dtype())) == nullptr) {
    return Status(StatusCode::kUnsupported, "unknown dtype value " + std::to_string(p.dtype()));
  }
  if (!IsKnownReduceOp(static_cast<uint32_t>(p.op()))) {
    return Status(StatusCode::kUnsupported, "unknown reduction op value " + std::to_string(p.op()));
  }
  CollectiveSpec spec;
  spec.element_count = p.element_count();
  spec.dtype = static_cast<DType>(p.dtype());
  spec.op = static_cast<ReduceOp>(p.op());
  spec.block_size = p.block_size();
  if (p.has_codec()) {
    const proto::CodecSpec& c = p.codec();
    spec.codec.codec = static_cast<Codec>(c.codec());
    spec.codec.key = c.key();
    spec.codec.sparsity = c.sparsity();
    spec.codec.result_fp32 = c.result_fp32();
    spec.codec.fraction = c.fraction();
    spec.codec.alpha = c.alpha();
    spec.codec.diana_l2 = c.diana_l2();
    spec.codec.tensor_scale = c.tensor_scale();
    if (Status st = ValidateCodec(spec.codec); st.code() == StatusCode::kUnsupported) return st;  // unknown codec
    // Only the fields the codec uses are checked and compared between ranks (proto3 sends the others as 0).
    spec.codec = WithoutUnusedFields(spec.codec);
    if (Status st = ValidateCodec(spec.codec); !st.ok()) return st;
  }
  return spec;
}

proto::ErrorCode ToProtoCode(StatusCode code) {
  switch (code) {
    case StatusCode::kProtocolViolation: return proto::PROTOCOL_VIOLATION;
    case StatusCode::kVersionMismatch: return proto::VERSION_MISMATCH;
    case StatusCode::kInvalidArgument: return proto::INVALID_ARGUMENT;
    case StatusCode::kJobConfigMismatch: return proto::JOB_CONFIG_MISMATCH;
    case StatusCode::kDuplicateRank: return proto::DUPLICATE_RANK;
    case StatusCode::kJobFull: return proto::JOB_FULL;
    case StatusCode::kSpecMismatch: return proto::SPEC_MISMATCH;
    case StatusCode::kUnsupported: return proto::UNSUPPORTED;
    case StatusCode::kPeerLeft: return proto::PEER_LEFT;
    case StatusCode::kResourceExhausted: return proto::RESOURCE_EXHAUSTED;
    case StatusCode::kShuttingDown: return proto::SHUTTING_DOWN;
    case StatusCode::kDeadlineExceeded: return proto::DEADLINE_EXCEEDED;
    case StatusCode::kAborted: return proto::ABORTED;
    case StatusCode::kUnauthenticated: return proto::UNAUTHENTICATED;
    case StatusCode::kPermissionDenied: return proto::PERMISSION_DENIED;
    case StatusCode::kUnavailable: return proto::UNAVAILABLE;
    default: return proto::ERROR_CODE_UNSPECIFIED;
  }
}

StatusCode FromProtoCode(proto::ErrorCode code) {
  switch (code) {
    case proto::PROTOCOL_VIOLATION: return StatusCode::kProtocolViolation;
    case proto::VERSION_MISMATCH: return StatusCode::kVersionMismatch;
    case proto::INVALID_ARGUMENT: return StatusCode::kInvalidArgument;
    case proto::JOB_CONFIG_MISMATCH: return StatusCode::kJobConfigMismatch;
    case proto::DUPLICATE_RANK: return StatusCode::kDuplicateRank;
    case proto::JOB_FULL: return StatusCode::kJobFull;
    case proto::SPEC_MISMATCH: return StatusCode::kSpecMismatch;
    case proto::UNSUPPORTED: return StatusCode::kUnsupported;
    case proto::PEER_LEFT: return StatusCode::kPeerLeft;
    case proto::RESOURCE_EXHAUSTED: return StatusCode::kResourceExhausted;
    case proto::SHUTTING_DOWN: return StatusCode::kShuttingDown;
    case proto::DEADLINE_EXCEEDED: return StatusCode::kDeadlineExceeded;
    case proto::ABORTED: return StatusCode::kAborted;
    case proto::UNAUTHENTICATED: return StatusCode::kUnauthenticated;
    case proto::PERMISSION_DENIED: return StatusCode::kPermissionDenied;
    case proto::UNAVAILABLE: return StatusCode::kUnavailable;
    default: return StatusCode::kInternal;
  }
}

}  // namespace sparsereduce
