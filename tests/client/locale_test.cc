// Numbers in step events do not depend on the process locale: under a comma-decimal LC_NUMERIC
// (de_DE) the C++ client formats the same event, and common/json and the agent's parser read the
// same values, as under the C locale. Training processes often set a locale of their own.
#include <clocale>
#include <cstdlib>
#include <cstring>
#include <string>

#include "agent/step_event_parser.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "stepwatch/client.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch {
namespace {

// Switches the whole process to a comma-decimal locale for one test; back to "C" afterwards.
class CommaDecimalLocale {
 public:
  CommaDecimalLocale() {
    if (TrySystemLocales()) return;
#ifdef STEPWATCH_TEST_LOCPATH
    // None installed: the one the build compiled with localedef, if it could.
    ::setenv("LOCPATH", STEPWATCH_TEST_LOCPATH, 1);
    TrySystemLocales();
#endif
  }
  ~CommaDecimalLocale() { std::setlocale(LC_ALL, "C"); }
  CommaDecimalLocale(const CommaDecimalLocale&) = delete;
  CommaDecimalLocale& operator=(const CommaDecimalLocale&) = delete;

  // The locale in force, or "" when no comma-decimal locale could be set.
  const std::string& name() const { return name_; }

 private:
  bool TrySystemLocales() {
    for (const char* candidate : {"de_DE.UTF-8", "de_DE.utf8", "de_DE", "fr_FR.UTF-8", "fr_FR.utf8",
                                  "nl_NL.UTF-8", "es_ES.UTF-8", "it_IT.UTF-8"}) {
      if (std::setlocale(LC_ALL, candidate) != nullptr &&
          std::strcmp(std::localeconv()->decimal_point, ",") == 0) {
        name_ = candidate;
        return true;
      }
    }
    std::setlocale(LC_ALL, "C");
    return false;
  }

  std::string name_;
};

// One event with fractional seconds in every number field the client writes.
std::string EncodeEvent() {
  ReporterOptions o;
  o.use_environment = false;
  o.background = false;
  o.warn_on_stderr = false;
  o.socket_path = "/nonexistent/stepwatch-locale-test.sock";
  o.job = "locale-job";
  o.rank = 1;
  o.world_size = 2;
  Reporter reporter(o);
  EXPECT_TRUE(reporter.ok()) << reporter.error();
  StepRecord r;
  r.step = 12;
  r.step_s = 0.25;
  r.data_s = 1e-05;
  r.compute_s = 0.125;
  r.comm_s = 1234.5;
  r.samples = 1024;
  r.SetSection(reporter.SectionId("forward"), 0.0625);
  char buf[4096];
  const size_t n = reporter.Encode(r, buf, sizeof(buf), /*dropped=*/3);
  EXPECT_GT(n, 0u);
  return std::string(buf, n);
}

TEST(ClientLocaleTest, EventsAndParsingIgnoreACommaDecimalLocale) {
  const std::string in_c_locale = EncodeEvent();
  ASSERT_EQ(in_c_locale,
            "{\"job\":\"locale-job\",\"rank\":1,\"world_size\":2,\"step\":12,\"step_s\":0.25,"
            "\"data_s\":1e-05,\"compute_s\":0.125,\"comm_s\":1234.5,\"samples\":1024,"
            "\"sections\":{\"forward\":0.0625},\"dropped\":3}");

  CommaDecimalLocale locale;
  if (locale.name().empty()) {
    GTEST_SKIP() << "no comma-decimal locale (de_DE, fr_FR, ...) is installed and localedef "
                    "could not build one: the locale independence of numbers is not checked";
  }
  ASSERT_STREQ(std::localeconv()->decimal_point, ",") << locale.name();
  // Sanity: the C library's own formatting does follow it.
  char printed[16];
  std::snprintf(printed, sizeof(printed), "%.2f", 0.25);
  ASSERT_STREQ(printed, "0,25") << locale.name();

  EXPECT_EQ(EncodeEvent(), in_c_locale) << locale.name();

  absl::StatusOr<json::Value> doc = json::Parse(in_c_locale);
  ASSERT_OK(doc);
  EXPECT_EQ(doc->Find("step_s")->as_double(), 0.25);
  EXPECT_EQ(doc->Find("data_s")->as_double(), 1e-05);
  EXPECT_EQ(doc->Find("comm_s")->as_double(), 1234.5);
  EXPECT_EQ(doc->Find("sections")->Find("forward")->as_double(), 0.0625);
  absl::StatusOr<json::Value> exponents = json::Parse("[-2.5e3, 1E-2, 0.5, 7]");
  ASSERT_OK(exponents);
  EXPECT_EQ(exponents->as_array()[0].as_double(), -2500);
  EXPECT_EQ(exponents->as_array()[1].as_double(), 0.01);
  EXPECT_EQ(exponents->as_array()[2].as_double(), 0.5);
  EXPECT_EQ(exponents->as_array()[3].as_int64(), 7);

  // The agent reads the same values, on its fast path and through the general parser.
  for (const bool fast : {true, false}) {
    v1::StepEvent e;
    const std::optional<agent::Rejection> rejected =
        fast ? agent::ParseStepEvent(in_c_locale, &e)
             : agent::ParseStepEventWithoutFastPath(in_c_locale, &e);
    ASSERT_FALSE(rejected.has_value()) << fast << ": " << rejected->detail;
    EXPECT_EQ(e.step_seconds(), 0.25) << fast;
    EXPECT_EQ(e.data_seconds(), 1e-05) << fast;
    EXPECT_EQ(e.comm_seconds(), 1234.5) << fast;
    EXPECT_EQ(e.sections().at("forward"), 0.0625) << fast;
  }
}

}  // namespace
}  // namespace stepwatch
