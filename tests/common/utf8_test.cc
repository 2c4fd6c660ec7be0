#include "common/utf8.h"

#include <string>

#include "gtest/gtest.h"

namespace stepwatch {
namespace {

TEST(Utf8Test, DecodesEachLength) {
  const std::string text = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80";  // a é € 😀
  Utf8Sequence s = DecodeUtf8At(text, 0);
  EXPECT_EQ(s.length, 1u);
  EXPECT_EQ(s.code_point, 0x61u);
  s = DecodeUtf8At(text, 1);
  EXPECT_EQ(s.length, 2u);
  EXPECT_EQ(s.code_point, 0xE9u);
  s = DecodeUtf8At(text, 3);
  EXPECT_EQ(s.length, 3u);
  EXPECT_EQ(s.code_point, 0x20ACu);
  s = DecodeUtf8At(text, 6);
  EXPECT_EQ(s.length, 4u);
  EXPECT_EQ(s.code_point, 0x1F600u);
}

TEST(Utf8Test, RejectsMalformedSequences) {
  for (const std::string& bad : {
           std::string("\x80"),              // a continuation byte first
           std::string("\xC0\xAF"),          // overlong
           std::string("\xE0\x80\xAF"),      // overlong
           std::string("\xED\xA0\x80"),      // a surrogate
           std::string("\xF4\x90\x80\x80"),  // over U+10FFFF
           std::string("\xF5\x80\x80\x80"),  // never a lead byte
           std::string("\xC3\x28"),          // not a continuation byte
       }) {
    const Utf8Sequence s = DecodeUtf8At(bad, 0);
    EXPECT_EQ(s.length, 0u) << testing::PrintToString(bad);
    EXPECT_FALSE(s.truncated) << testing::PrintToString(bad);
  }
}

TEST(Utf8Test, TellsTruncatedFromMalformed) {
  const Utf8Sequence s = DecodeUtf8At("\xE2\x82", 0);
  EXPECT_EQ(s.length, 0u);
  EXPECT_TRUE(s.truncated);
}

TEST(Utf8Test, EncodesWhatItDecodes) {
  for (const uint32_t cp : {0x24u, 0xA2u, 0x7FFu, 0x800u, 0x20ACu, 0xFFFFu, 0x10000u, 0x10FFFFu}) {
    std::string out;
    AppendUtf8(cp, &out);
    const Utf8Sequence s = DecodeUtf8At(out, 0);
    EXPECT_EQ(s.length, out.size()) << cp;
    EXPECT_EQ(s.code_point, cp);
  }
}

}  // namespace
}  // namespace stepwatch
