#include "common/file.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"

namespace stepwatch {
namespace {

std::string TempDir() {
  std::string templ = ::testing::TempDir() + "stepwatch-file-XXXXXX";
  char* dir = mkdtemp(templ.data());
  EXPECT_NE(dir, nullptr);
  return templ;
}

TEST(FileTest, WriteAtomicallyThenReadBackReplacingTheOldContent) {
  const std::string path = TempDir() + "/state";
  ASSERT_TRUE(WriteFileAtomically(path, "first version").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  absl::StatusOr<std::string> read = ReadFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "second");
}

TEST(FileTest, MissingFileIsNotFound) {
  absl::StatusOr<std::string> read = ReadFile(TempDir() + "/absent");
  EXPECT_TRUE(absl::IsNotFound(read.status())) << read.status();
}

TEST(FileTest, ReadsAtMostMaxBytes) {
  const std::string path = TempDir() + "/big";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(200000, 'x')).ok());
  absl::StatusOr<std::string> read = ReadFile(path, 1000);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(read->size(), 1000u);
  EXPECT_EQ(ReadFile(path)->size(), 200000u);
}

TEST(FileTest, ReadsProcFilesThatReportSizeZero) {
  absl::StatusOr<std::string> read = ReadFile("/proc/self/status");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_NE(read->find("Pid:"), std::string::npos);
}

TEST(FileTest, WriteIntoMissingDirectoryFails) {
  EXPECT_FALSE(WriteFileAtomically(TempDir() + "/no/such/dir/file", "x").ok());
}

}  // namespace
}  // namespace stepwatch
