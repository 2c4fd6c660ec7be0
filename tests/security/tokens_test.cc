#include "security/tokens.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::security {
namespace {

using test::StatusIs;
using ::testing::HasSubstr;

constexpr char kAgentToken[] = "agent-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";

// A token file in a private temporary directory, written atomically as an operator would.
class TempFile {
 public:
  TempFile() { EXPECT_FALSE(dir_.path().empty()); }
  const std::string& path() const { return path_; }
  void Write(const std::string& text) const { ASSERT_OK(WriteFileAtomically(path_, text)); }

 private:
  const test::TempDir dir_{"stepwatch-tokens"};
  const std::string path_ = dir_.File("tokens");
};

TEST(ParseTokenFileTest, ReadsRolesCommentsAndBlankLines) {
  auto tokens = ParseTokenFile(absl::StrCat("# rotated 2026-11\n\nagent ", kAgentToken,
                                            "\n  reader\t", kReaderToken, "  \n"));
  ASSERT_OK(tokens);
  ASSERT_EQ(tokens->size(), 2u);
  EXPECT_EQ((*tokens)[0].role, Role::kAgent);
  EXPECT_EQ((*tokens)[0].token, kAgentToken);
  EXPECT_EQ((*tokens)[1].role, Role::kReader);
  EXPECT_EQ((*tokens)[1].token, kReaderToken);
}

TEST(ParseTokenFileTest, RefusesBadLinesNamingThem) {
  auto unknown_role = ParseTokenFile(absl::StrCat("agent ", kAgentToken, "\nadmin ", kAgentToken));
  EXPECT_THAT(unknown_role, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
  EXPECT_THAT(ParseTokenFile("agent short"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseTokenFile(absl::StrCat(kAgentToken)),
              StatusIs(absl::StatusCode::kInvalidArgument));  // no role
  EXPECT_THAT(ParseTokenFile("# nothing but comments\n"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      ParseTokenFile("agent \x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b\x0c\x0d\x0e\x0f\x10"),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(TokenStoreTest, ChecksTokenAndRole) {
  TempFile file;
  file.Write(absl::StrCat("agent ", kAgentToken, "\nreader ", kReaderToken, "\n"));
  auto store = TokenStore::Open(file.path());
  ASSERT_OK(store);
  EXPECT_OK((*store)->Check(absl::StrCat("Bearer ", kAgentToken), Role::kAgent));
  EXPECT_OK((*store)->Check(absl::StrCat("Bearer ", kReaderToken), Role::kReader));
  // An agent token cannot query, a reader token cannot report.
  EXPECT_THAT((*store)->Check(absl::StrCat("Bearer ", kAgentToken), Role::kReader),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT((*store)->Check(absl::StrCat("Bearer ", kReaderToken), Role::kAgent),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT((*store)->Check("", Role::kAgent), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT((*store)->Check(kAgentToken, Role::kAgent),
              StatusIs(absl::StatusCode::kUnauthenticated));  // no Bearer
  EXPECT_THAT((*store)->Check(absl::StrCat("Bearer ", kAgentToken, "x"), Role::kAgent),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(TokenStoreTest, ReloadsWhenTheFileChangesAndKeepsTokensWhenItBreaks) {
  TempFile file;
  file.Write(absl::StrCat("agent ", kAgentToken, "\n"));
  auto store = TokenStore::Open(file.path());
  ASSERT_OK(store);
  const std::string rotated = "agent-token-rotated-abcdef";
  file.Write(absl::StrCat("agent ", rotated, "\n"));  // atomic rename: a new inode
  EXPECT_OK((*store)->Check(absl::StrCat("Bearer ", rotated), Role::kAgent));
  EXPECT_THAT((*store)->Check(absl::StrCat("Bearer ", kAgentToken), Role::kAgent),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // A broken rewrite neither locks everyone out nor lets anyone in.
  file.Write("agent tooshort\n");
  EXPECT_OK((*store)->Check(absl::StrCat("Bearer ", rotated), Role::kAgent));
}

TEST(TokenStoreTest, OpenFailsOnMissingOrMalformedFile) {
  EXPECT_FALSE(TokenStore::Open("/nonexistent/stepwatch-tokens").ok());
  TempFile file;
  file.Write("reader abc\n");
  EXPECT_FALSE(TokenStore::Open(file.path()).ok());
}

TEST(TokenSourceTest, SendsTheFirstLineAndFollowsRotation) {
  TempFile file;
  file.Write(absl::StrCat("# for node-1\n", kAgentToken, "\n"));
  auto source = TokenSource::Open(file.path());
  ASSERT_OK(source);
  EXPECT_EQ((*source)->AuthorizationHeader(), absl::StrCat("Bearer ", kAgentToken));
  file.Write("agent-token-rotated-abcdef\n");
  EXPECT_EQ((*source)->AuthorizationHeader(), "Bearer agent-token-rotated-abcdef");
  file.Write("short\n");  // unusable: the last good token stays
  EXPECT_EQ((*source)->AuthorizationHeader(), "Bearer agent-token-rotated-abcdef");
}

}  // namespace
}  // namespace stepwatch::security
