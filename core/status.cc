#include "core/status.h"

namespace sparsereduce {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kProtocolViolation: return "PROTOCOL_VIOLATION";
    case StatusCode::kVersionMismatch: return "VERSION_MISMATCH";
    case StatusCode::kJobConfigMismatch: return "JOB_CONFIG_MISMATCH";
    case StatusCode::kDuplicateRank: return "DUPLICATE_RANK";
    case StatusCode::kJobFull: return "JOB_FULL";
    case StatusCode::kSpecMismatch: return "SPEC_MISMATCH";
    case StatusCode::kUnsupported: return "UNSUPPORTED";
    case StatusCode::kPeerLeft: return "PEER_LEFT";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kShuttingDown: return "SHUTTING_DOWN";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kInternal: return "INTERNAL";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(StatusCodeName(code_)) + ": " + message_;
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return Status(code_, context + ": " + message_);
}

}  // namespace sparsereduce
