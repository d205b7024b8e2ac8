// Status and Result (core/status.h): the names every code prints as, and the messages built from them.
#include "core/status.h"

#include <gtest/gtest.h>

#include <string>

namespace sparsereduce {
namespace {

// The names are part of the wire and the logs (an Error frame carries the code, the CLI prints the name).
TEST(Status, EveryCodeHasItsOwnName) {
  const std::pair<StatusCode, const char*> names[] = {
      {StatusCode::kOk, "OK"},
      {StatusCode::kInvalidArgument, "INVALID_ARGUMENT"},
      {StatusCode::kProtocolViolation, "PROTOCOL_VIOLATION"},
      {StatusCode::kVersionMismatch, "VERSION_MISMATCH"},
      {StatusCode::kJobConfigMismatch, "JOB_CONFIG_MISMATCH"},
      {StatusCode::kDuplicateRank, "DUPLICATE_RANK"},
      {StatusCode::kJobFull, "JOB_FULL"},
      {StatusCode::kSpecMismatch, "SPEC_MISMATCH"},
      {StatusCode::kUnsupported, "UNSUPPORTED"},
      {StatusCode::kPeerLeft, "PEER_LEFT"},
      {StatusCode::kResourceExhausted, "RESOURCE_EXHAUSTED"},
      {StatusCode::kShuttingDown, "SHUTTING_DOWN"},
      {StatusCode::kUnavailable, "UNAVAILABLE"},
      {StatusCode::kDeadlineExceeded, "DEADLINE_EXCEEDED"},
      {StatusCode::kAborted, "ABORTED"},
      {StatusCode::kUnauthenticated, "UNAUTHENTICATED"},
      {StatusCode::kPermissionDenied, "PERMISSION_DENIED"},
      {StatusCode::kInternal, "INTERNAL"},
  };
  for (const auto& [code, name] : names) {
    EXPECT_STREQ(StatusCodeName(code), name);
    EXPECT_EQ(Status(code, "m").ToString(), code == StatusCode::kOk ? std::string("OK") : std::string(name) + ": m");
  }
  EXPECT_STREQ(StatusCodeName(static_cast<StatusCode>(18)), "UNKNOWN");  // a code from a newer peer
}

// WithContext prefixes the message and keeps the code; an ok status stays ok and without a message.
TEST(Status, WithContextPrefixesTheMessageAndKeepsTheCode) {
  const Status st = ProtocolError("bad frame").WithContext("rank 3").WithContext("aggregator 1");
  EXPECT_EQ(st.code(), StatusCode::kProtocolViolation);
  EXPECT_EQ(st.message(), "aggregator 1: rank 3: bad frame");
  EXPECT_EQ(st.ToString(), "PROTOCOL_VIOLATION: aggregator 1: rank 3: bad frame");
  const Status ok = Status::Ok().WithContext("rank 3");
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.message(), "");
  EXPECT_EQ(ok.ToString(), "OK");
  EXPECT_EQ(InvalidArgument("x").code(), StatusCode::kInvalidArgument);
}

TEST(Result, HoldsAValueOrAStatusThatIsNotOk) {
  Result<std::string> value(std::string("abc"));
  ASSERT_TRUE(value.ok());
  EXPECT_TRUE(value.status().ok());
  EXPECT_EQ(value->size(), 3u);
  EXPECT_EQ(std::move(value).value(), "abc");
  const Result<std::string> error(InvalidArgument("no"));
  EXPECT_FALSE(error.ok());
  EXPECT_EQ(error.status().ToString(), "INVALID_ARGUMENT: no");
}

}  // namespace
}  // namespace sparsereduce
