#include "tools/common/json_output.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tools/common/temp_dir.h"

namespace sparsereduce::tools {
namespace {

namespace fs = std::filesystem;

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

ino_t Inode(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return st.st_ino;
}

// The check before a run neither creates nor truncates the file: a run that fails before its first write leaves an
// earlier document as it was (opening it for the check truncated it).
TEST(CheckJsonOutput, LeavesTheFileAsItIsAndRefusesWhatCannotBeWritten) {
  auto dir = TempDir::Create("sr-json-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string existing = dir->File("old.json");
  std::ofstream(existing) << "{\"old\":1}\n";
  EXPECT_TRUE(CheckJsonOutput(existing).ok());
  EXPECT_EQ(Slurp(existing), "{\"old\":1}\n");
  const std::string fresh = dir->File("new.json");
  EXPECT_TRUE(CheckJsonOutput(fresh).ok());
  EXPECT_FALSE(fs::exists(fresh)) << "the check created the file";
  const Status missing_dir = CheckJsonOutput(dir->File("no/such/dir.json"));
  EXPECT_FALSE(missing_dir.ok());
  EXPECT_NE(missing_dir.message().find("cannot open for writing"), std::string::npos) << missing_dir.message();
}

TEST(JsonRewriter, ARegularFileIsReplacedWholeByRename) {
  auto dir = TempDir::Create("sr-json-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string path = dir->File("out.json");
  ASSERT_TRUE(CheckJsonOutput(path).ok());
  JsonRewriter json("test", path);
  json.Write("{\"rows\":[1,2,3]}\n");
  const ino_t before = Inode(path);
  json.Write("{\"rows\":[1]}\n");  // shorter: nothing of the longer document may remain
  EXPECT_FALSE(json.failed());
  EXPECT_EQ(Slurp(path), "{\"rows\":[1]}\n");
  // A new inode is what rename gives: a reader that opened the old file still reads a whole old document.
  EXPECT_NE(Inode(path), before);
  size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir->path())) ++entries;
  EXPECT_EQ(entries, 1u) << "a temporary file was left beside " << path;
}

TEST(JsonRewriter, ASymlinkIsWrittenThroughNotReplaced) {
  auto dir = TempDir::Create("sr-json-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string target = dir->File("target.json");
  const std::string link = dir->File("link.json");
  std::ofstream(target) << "old\n";
  fs::create_symlink(target, link);
  JsonRewriter json("test", link);
  json.Write("{}\n");
  EXPECT_FALSE(json.failed());
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(Slurp(target), "{}\n");
}

TEST(JsonRewriter, AFailedWriteIsReportedOnceAndEndsTheWriting) {
  auto dir = TempDir::Create("sr-json-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string path = dir->File("gone/out.json");  // its directory does not exist
  JsonRewriter json("test", path);
  testing::internal::CaptureStderr();
  json.Write("{}\n");
  json.Write("{}\n");
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(json.failed());
  EXPECT_EQ(err, "test: --json " + path + ": writing failed\n");
}

TEST(JsonRewriter, AnEmptyPathWritesNothing) {
  JsonRewriter json("test", "");
  json.Write("{}\n");
  EXPECT_FALSE(json.failed());
}

}  // namespace
}  // namespace sparsereduce::tools
