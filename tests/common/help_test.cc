// The --help text every binary prints (common/help.h): dashed flag names, defaults, wrapped help,
// only the main file's flags, and no source path.
#include "common/help.h"

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gtest/gtest.h"

ABSL_FLAG(int32_t, max_test_jobs, 1000, "Most jobs; see --other_test_flag for the rest.");
ABSL_FLAG(std::string, other_test_flag, "",
          "A long help text that must be wrapped because it is far longer than one line of the "
          "terminal can hold, so that it stays readable at a hundred columns.");
ABSL_FLAG(bool, test_switch, false, "A switch.");
ABSL_DECLARE_FLAG(std::string, shared_test_listen);

namespace stepwatch {
namespace {

FlagsSpec Spec(const std::string& main_file) {
  FlagsSpec spec;
  spec.program = "stepwatch-test";
  spec.usage = "tests the help.";
  spec.main_file = main_file;
  return spec;
}

TEST(FormatFlagsHelpTest, NamesFlagsWithDashesAndNoSourcePath) {
  const std::string help = FormatFlagsHelp(Spec("tests/common/help_test.cc"));
  EXPECT_NE(help.find("stepwatch-test: tests the help."), std::string::npos) << help;
  EXPECT_NE(help.find("  --max-test-jobs=INT  (default: 1000)\n"), std::string::npos) << help;
  EXPECT_NE(help.find("  --other-test-flag=TEXT  (default: \"\")\n"), std::string::npos) << help;
  EXPECT_NE(help.find("  --test-switch  (default: false)\n"), std::string::npos) << help;
  // Names inside help texts too.
  EXPECT_NE(help.find("see --other-test-flag for the rest"), std::string::npos) << help;
  EXPECT_EQ(help.find("max_test_jobs"), std::string::npos) << help;
  EXPECT_EQ(help.find("other_test_flag"), std::string::npos) << help;
  // Abseil's help says "Flags from /abs/path/help_test.cc": ours names no file.
  EXPECT_EQ(help.find("help_test.cc"), std::string::npos) << help;
  EXPECT_EQ(help.find('/'), std::string::npos) << help;
  // Sorted, and the underscore spelling still documented as accepted.
  EXPECT_LT(help.find("--max-test-jobs"), help.find("--other-test-flag"));
  EXPECT_NE(help.find("underscores work too, --flag_name"), std::string::npos) << help;
}

TEST(FormatFlagsHelpTest, WrapsLongHelpAndKeepsEveryWord) {
  const std::string help = FormatFlagsHelp(Spec("tests/common/help_test.cc"));
  size_t start = 0;
  while (start < help.size()) {
    const size_t end = help.find('\n', start);
    const size_t len = (end == std::string::npos ? help.size() : end) - start;
    EXPECT_LE(len, 100u) << help.substr(start, len);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  EXPECT_NE(help.find("A long help text"), std::string::npos);
  EXPECT_NE(help.find("readable at a hundred columns."), std::string::npos) << help;
}

TEST(FormatFlagsHelpTest, OnlyTheMainFilesFlags) {
  const std::string help = FormatFlagsHelp(Spec("agent/main.cc"));
  EXPECT_EQ(help.find("--max-test-jobs"), std::string::npos) << help;
  EXPECT_NE(help.find("--help"), std::string::npos) << help;
}

TEST(FormatFlagsHelpTest, ListsSharedFlagFilesWithTheBinarysDefault) {
  FlagsSpec spec = Spec("tests/common/help_test.cc");
  EXPECT_EQ(FormatFlagsHelp(spec).find("--shared-test-listen"), std::string::npos);
  spec.shared_flag_files = {"tests/common/help_shared_flags.cc"};
  // ParseFlagsOrExit sets FlagsSpec::defaults before parsing, as here.
  absl::SetFlag(&FLAGS_shared_test_listen, "0.0.0.0:9464");
  const std::string help = FormatFlagsHelp(spec);
  EXPECT_NE(help.find("  --shared-test-listen=TEXT  (default: \"0.0.0.0:9464\")\n"),
            std::string::npos)
      << help;
  EXPECT_NE(help.find("--max-test-jobs"), std::string::npos) << help;
  EXPECT_TRUE(ListsFlagsOf(spec, "/src/tests/common/help_shared_flags.cc"));
  EXPECT_FALSE(ListsFlagsOf(spec, "/src/agent/main.cc"));
}

}  // namespace
}  // namespace stepwatch
