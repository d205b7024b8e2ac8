#include "tools/common/temp_dir.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

namespace sparsereduce::tools {
namespace {

namespace fs = std::filesystem;

TEST(TempDir, EachIsNewAndEmptyAndGoesWithEverythingInIt) {
  std::string first_path;
  {
    auto first = TempDir::Create("sr-tempdir-test-");
    auto second = TempDir::Create("sr-tempdir-test-");
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_NE(first->path(), second->path());
    EXPECT_TRUE(fs::is_directory(first->path()));
    EXPECT_TRUE(fs::is_empty(first->path()));
    EXPECT_EQ(fs::path(first->path()).parent_path(), fs::temp_directory_path());
    EXPECT_EQ(fs::path(first->path()).filename().string().rfind("sr-tempdir-test-", 0), 0u) << first->path();
    std::ofstream(first->File("port")) << "1234\n";
    fs::create_directories(first->File("nested/deeper"));
    first_path = first->path();
  }
  EXPECT_FALSE(fs::exists(first_path));
}

TEST(TempDir, OnlyTheLastOwnerRemovesIt) {
  auto created = TempDir::Create("sr-tempdir-test-");
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const std::string path = created->path();
  std::optional<TempDir> owner;
  {
    TempDir moved(std::move(*created));
    owner.emplace(std::move(moved));
  }
  EXPECT_TRUE(fs::is_directory(path)) << "removed by an object it was moved from";
  owner.reset();
  EXPECT_FALSE(fs::exists(path));
}

TEST(TempDir, AMissingTemporaryDirectoryIsAnError) {
  const char* saved = getenv("TMPDIR");
  const std::string saved_value = saved ? saved : "";
  setenv("TMPDIR", "/nonexistent/sparsereduce-tempdir-test", 1);
  auto dir = TempDir::Create("sr-tempdir-test-");
  if (saved) {
    setenv("TMPDIR", saved_value.c_str(), 1);
  } else {
    unsetenv("TMPDIR");
  }
  ASSERT_FALSE(dir.ok()) << dir->path();
  EXPECT_NE(dir.status().ToString().find("temporary directory"), std::string::npos) << dir.status().ToString();
}

}  // namespace
}  // namespace sparsereduce::tools
