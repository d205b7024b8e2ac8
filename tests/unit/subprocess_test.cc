// tools::Subprocess with real programs (/bin/cat, /bin/sh): stdout captured, stdin written, exit statuses, a
// program that cannot be started, and a write to a child that is gone (EPIPE, not a SIGPIPE that ends the test).
#include "tools/common/subprocess.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <string>
#include <thread>

namespace sparsereduce::tools {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kBound(30000);

TEST(Subprocess, StdinIsPipedThroughToStdoutUntilClosed) {
  auto cat = Subprocess::Spawn({"/bin/cat"}, {.capture_stdout = true, .pipe_stdin = true});
  ASSERT_TRUE(cat.ok()) << cat.status().ToString();
  const std::string big(1 << 20, 'x');  // more than a pipe holds: cat must drain it while the write goes on
  std::string out;
  std::thread reader([&] {
    auto read = (*cat)->ReadStdout(kBound);
    out = read.ok() ? *read : read.status().ToString();
  });
  EXPECT_TRUE((*cat)->WriteStdin("first line\n").ok());
  EXPECT_TRUE((*cat)->WriteStdin(big).ok());
  (*cat)->CloseStdin();  // cat sees the end of its input and exits, which ends its output
  reader.join();
  EXPECT_EQ(out, "first line\n" + big);
  auto status = (*cat)->Wait(kBound);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(DescribeExit(*status), "exit code 0");
  EXPECT_EQ((*cat)->WriteStdin("x").code(), StatusCode::kInvalidArgument) << "stdin was closed";
}

TEST(Subprocess, WritingToAChildThatIsGoneFailsWithoutSignal) {
  auto child = Subprocess::Spawn({"/bin/sh", "-c", "exit 3"}, {.pipe_stdin = true});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  auto status = (*child)->Wait(kBound);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(DescribeExit(*status), "exit code 3");
  Status written = (*child)->WriteStdin("anyone there?\n");
  EXPECT_FALSE(written.ok());
  EXPECT_NE(written.ToString().find("Broken pipe"), std::string::npos) << written.ToString();
}

TEST(Subprocess, WithoutAPipeStdinCannotBeWritten) {
  auto child = Subprocess::Spawn({"/bin/true"}, /*capture_stdout=*/false);
  ASSERT_TRUE(child.ok());
  EXPECT_EQ((*child)->WriteStdin("x").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*child)->ReadStdout(kBound).status().code(), StatusCode::kInvalidArgument);
}

TEST(Subprocess, AProgramThatCannotBeStartedIsAnErrorNamingIt) {
  auto child = Subprocess::Spawn({"/nonexistent/program"}, {.capture_stdout = true, .pipe_stdin = true});
  ASSERT_FALSE(child.ok());
  EXPECT_NE(child.status().ToString().find("cannot start /nonexistent/program: No such file"), std::string::npos)
      << child.status().ToString();
}

}  // namespace
}  // namespace sparsereduce::tools
