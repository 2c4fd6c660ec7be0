#include "common/text.h"

#include "gtest/gtest.h"

namespace stepwatch {
namespace {

TEST(EscapeControlCharactersTest, ShowsControlsAndKeepsText) {
  EXPECT_EQ(EscapeControlCharacters("job\x1b[2Jx"), "job\\x1b[2Jx");
  EXPECT_EQ(EscapeControlCharacters("a\rb\x7f"), "a\\x0db\\x7f");
  EXPECT_EQ(EscapeControlCharacters("csi \xc2\x9b"
                                    "31m"),
            "csi \\u009b31m");
  EXPECT_EQ(EscapeControlCharacters("line 1\n\tline 2"), "line 1\n\tline 2");
  EXPECT_EQ(EscapeControlCharacters("modèle ✓ 100%"), "modèle ✓ 100%");
}

}  // namespace
}  // namespace stepwatch
