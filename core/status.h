// Status and Result: the error type of every I/O and parse path (LevelDB's Status, plus the codes a
// network system needs). Cheap when ok; a code and a message otherwise.
#pragma once

#include <string>
#include <utility>
#include <variant>

namespace sparsereduce {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kProtocolViolation,
  kVersionMismatch,
  kJobConfigMismatch,
  kDuplicateRank,
  kJobFull,
  kSpecMismatch,
  kUnsupported,
  kPeerLeft,
  kResourceExhausted,
  kShuttingDown,
  kUnavailable,
  kDeadlineExceeded,
  kAborted,
  kUnauthenticated,
  kPermissionDenied,
  kInternal,
};

const char* StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "CODE_NAME: message", for logs and exceptions.
  std::string ToString() const;

  // Returns a copy whose message is "context: message" (keeps the code).
  Status WithContext(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ProtocolError(std::string message) {
  return Status(StatusCode::kProtocolViolation, std::move(message));
}
inline Status InvalidArgument(std::string message) {
  return Status(StatusCode::kInvalidArgument, std::move(message));
}

// A value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : state_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(state_);
  }
  T& value() & { return std::get<T>(state_); }
  const T& value() const& { return std::get<T>(state_); }
  T&& value() && { return std::get<T>(std::move(state_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> state_;
};

}  // namespace sparsereduce
