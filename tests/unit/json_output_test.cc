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

TEST(JsonRewriter, ARegularFileIsReplacedWholeByRename) {
  auto dir = TempDir::Create("sr-json-test-");
  ASSERT_TRUE(dir.ok()) << dir.status().ToString();
  const std::string path = dir->File("out.json");
  std::ofstream probe;
  ASSERT_TRUE(OpenJsonOutput(path, probe).ok());
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
