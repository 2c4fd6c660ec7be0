#include "common/file.h"

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch {
namespace {

using test::StatusIs;
using test::TempDir;

TEST(FileTest, WriteAtomicallyThenReadBackReplacingTheOldContent) {
  TempDir dir("stepwatch-file");
  const std::string path = dir.File("state");
  ASSERT_OK(WriteFileAtomically(path, "first version"));
  ASSERT_OK(WriteFileAtomically(path, "second"));
  absl::StatusOr<std::string> read = ReadFile(path);
  ASSERT_OK(read);
  EXPECT_EQ(*read, "second");
}

TEST(FileTest, MissingFileIsNotFound) {
  TempDir dir("stepwatch-file");
  EXPECT_THAT(ReadFile(dir.File("absent")), StatusIs(absl::StatusCode::kNotFound));
}

TEST(FileTest, ReadsAtMostMaxBytes) {
  TempDir dir("stepwatch-file");
  const std::string path = dir.File("big");
  ASSERT_OK(WriteFileAtomically(path, std::string(200000, 'x')));
  absl::StatusOr<std::string> read = ReadFile(path, 1000);
  ASSERT_OK(read);
  EXPECT_EQ(read->size(), 1000u);
  EXPECT_EQ(ReadFile(path)->size(), 200000u);
}

TEST(FileTest, ReadsProcFilesThatReportSizeZero) {
  absl::StatusOr<std::string> read = ReadFile("/proc/self/status");
  ASSERT_OK(read);
  EXPECT_NE(read->find("Pid:"), std::string::npos);
}

TEST(FileTest, WriteIntoMissingDirectoryFails) {
  TempDir dir("stepwatch-file");
  EXPECT_THAT(WriteFileAtomically(dir.File("no/such/dir/file"), "x"), ::testing::Not(test::IsOk()));
}

}  // namespace
}  // namespace stepwatch
