// Conversions between the control-plane protobuf messages and the core types, and CONTROL frame helpers.
#pragma once

#include <span>

#include "core/byte_buffer.h"
#include "core/status.h"
#include "proto/control.pb.h"
#include "protocol/layout.h"

namespace sparsereduce {

// Serializes `message` into a complete CONTROL frame.
ByteBuffer EncodeControl(const proto::ControlMessage& message);
// Parses a CONTROL payload; fails on bytes that are not a ControlMessage or that hold none of its messages.
Result<proto::ControlMessage> DecodeControl(std::span<const std::byte> payload);

proto::CollectiveSpec SpecToProto(const CollectiveSpec& spec);
// Fails with UNSUPPORTED for dtype/op values this version does not know.
Result<CollectiveSpec> SpecFromProto(const proto::CollectiveSpec& spec);

proto::ErrorCode ToProtoCode(StatusCode code);
StatusCode FromProtoCode(proto::ErrorCode code);

}  // namespace sparsereduce
