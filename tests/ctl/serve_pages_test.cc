#include "ctl/serve_pages.h"

#include <optional>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace stepwatch::ctl {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kHostileJob[] = "<script>alert(\"x\")</script>/run 1&'";
constexpr char kHostileNode[] = "node-<img src=x onerror=alert(1)>";

TEST(PercentEncodingTest, EveryNameIsOneSegmentAndRoundTrips) {
  EXPECT_EQ(PercentEncode("train-1.a_b~"), "train-1.a_b~");
  EXPECT_EQ(PercentEncode("a/b c?#%"), "a%2Fb%20c%3F%23%25");
  const std::string encoded = PercentEncode(kHostileJob);
  EXPECT_EQ(encoded.find_first_of("<>\"'&/ "), std::string::npos) << encoded;
  EXPECT_EQ(PercentDecode(encoded), kHostileJob);
  EXPECT_EQ(PercentDecode(PercentEncode("gpu-\xc3\xa9t\xc3\xa9")), "gpu-\xc3\xa9t\xc3\xa9");
}

TEST(PercentEncodingTest, DecodesEitherCaseAndKeepsOtherBytes) {
  EXPECT_EQ(PercentDecode("a%2fb%2Fc"), "a/b/c");
  EXPECT_EQ(PercentDecode("a+b"), "a+b");  // a path, not a form: '+' is itself
  EXPECT_EQ(PercentDecode(""), "");
}

TEST(PercentEncodingTest, RefusesMalformedEscapesNulAndNonUtf8) {
  for (const char* bad : {"%", "a%", "a%2", "%zz", "%2g", "a%00b", "%FF", "%C3", "%C0%AF"}) {
    EXPECT_EQ(PercentDecode(bad), std::nullopt) << bad;
  }
}

TEST(RouteTest, PagesMethodsAndUnknownPaths) {
  EXPECT_EQ(RouteRequest("GET", "/").kind, PageKind::kJobList);
  EXPECT_EQ(RouteRequest("HEAD", "/index.html").kind, PageKind::kJobList);
  for (const char* method : {"POST", "PUT", "DELETE", "PATCH", "OPTIONS", "get"}) {
    EXPECT_EQ(RouteRequest(method, "/").kind, PageKind::kMethodNotAllowed) << method;
    EXPECT_EQ(RouteRequest(method, "/jobs/a").kind, PageKind::kMethodNotAllowed) << method;
  }
  for (const char* path :
       {"/jobs", "/jobs/", "/jobs/%zz", "/jobs/%00", "/metrics", "/job/a", "//jobs/a", ""}) {
    EXPECT_EQ(RouteRequest("GET", path).kind, PageKind::kNotFound) << path;
  }
}

TEST(RouteTest, JobNamesAreDecoded) {
  Route route = RouteRequest("GET", "/jobs/" + PercentEncode(kHostileJob));
  EXPECT_EQ(route.kind, PageKind::kJob);
  EXPECT_EQ(route.job, kHostileJob);
  // A '/' sent as it is belongs to the name too.
  route = RouteRequest("GET", "/jobs/team/run-1");
  EXPECT_EQ(route.kind, PageKind::kJob);
  EXPECT_EQ(route.job, "team/run-1");
  EXPECT_EQ(JobPath("a/b"), "/jobs/a%2Fb");
  EXPECT_EQ(FindingPath("a/b", 3), "/jobs/a%2Fb#finding-3");
  EXPECT_EQ(FindingPath("a/b", -1), "/jobs/a%2Fb");
}

TEST(ListenTest, OnlyLoopbackIsLoopback) {
  for (const char* ok :
       {"127.0.0.1:9470", "127.1.2.3:0", "[::1]:9470", "localhost:80", "LOCALHOST:80"}) {
    EXPECT_TRUE(IsLoopbackListen(ok)) << ok;
  }
  for (const char* no : {":9470", "0.0.0.0:9470", "[::]:9470", "10.0.0.1:9470", "example:1",
                         "127.0.0.1", "garbage"}) {
    EXPECT_FALSE(IsLoopbackListen(no)) << no;
  }
}

v1::Finding MakeFinding(const std::string& job, const std::string& kind, int rank,
                        const std::string& node, int64_t since, int64_t until = -1) {
  v1::Finding f;
  f.set_job(job);
  f.set_kind(kind);
  f.set_rank(rank);
  f.set_node(node);
  f.set_gpu(rank);
  f.set_stage(-1);
  f.set_since_step(since);
  f.set_until_step(until);
  f.set_severity("warning");
  f.set_cause("more_work");
  f.set_summary("rank " + std::to_string(rank) + " on " + node + ": compute +60% vs median");
  return f;
}

v1::JobReport ReportWith(const std::string& job, std::vector<v1::Finding> findings) {
  v1::JobReport r;
  r.set_job(job);
  for (v1::Finding& f : findings) *r.add_findings() = std::move(f);
  return r;
}

TEST(FindingIndexTest, MatchesSubjectAndStartElseTheActiveRow) {
  const v1::JobReport report = ReportWith(
      "j",
      {MakeFinding("j", "straggler", 1, "n0", 10, 20), MakeFinding("j", "stall", -1, "", 5),
       MakeFinding("j", "straggler", 1, "n0", 40), MakeFinding("j", "straggler", 2, "n0", 40)});
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 1, "n0", 40), report), 2);
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 1, "n0", 10), report), 0);
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 2, "n0", 40), report), 3);
  // Another replica saw it start two steps later: the row still active.
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 1, "n0", 42), report), 2);
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 3, "n0", 40), report), -1);
  EXPECT_EQ(FindingIndexInReport(MakeFinding("j", "straggler", 1, "n1", 40), report), -1);
}

JobListPage HostilePage() {
  JobListPage page;
  v1::JobStatus* j = page.status.add_jobs();
  j->set_job(kHostileJob);
  j->set_world_size(4);
  j->set_ranks_reporting(4);
  j->set_last_step(1234);
  j->set_step_seconds(0.165);
  j->set_efficiency_ratio(0.61);
  *page.findings.add_findings() = MakeFinding(kHostileJob, "straggler", 1, kHostileNode, 40);
  page.reports.push_back(
      ReportWith(kHostileJob, {MakeFinding(kHostileJob, "stall", -1, "", 3, 9),
                               MakeFinding(kHostileJob, "straggler", 1, kHostileNode, 40)}));
  page.answered = {"127.0.0.1:7070"};
  page.failed = {{"127.0.0.1:7071<b>", "cannot reach collector at 127.0.0.1:7071<b>: refused"}};
  page.refresh_seconds = 5;
  return page;
}

TEST(JobListHtmlTest, EscapesEverythingFromCollectors) {
  const std::string html = RenderJobListHtml(HostilePage());
  EXPECT_THAT(html, Not(HasSubstr("<script>")));
  EXPECT_THAT(html, Not(HasSubstr("<img")));
  EXPECT_THAT(html, Not(HasSubstr("7071<b>")));
  EXPECT_THAT(html, HasSubstr("&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;/run 1&amp;&#39;"));
  EXPECT_THAT(html, HasSubstr("node-&lt;img src=x onerror=alert(1)&gt;"));
}

TEST(JobListHtmlTest, ListsJobsWithFindingsLinkedToTheirRows) {
  const std::string html = RenderJobListHtml(HostilePage());
  const std::string path = JobPath(kHostileJob);
  EXPECT_THAT(html, HasSubstr("<a class=\"job-link\" href=\"" + path + "\">"));
  // The straggler is the report's second finding.
  EXPECT_THAT(html, HasSubstr("href=\"" + path + "#finding-1\""));
  EXPECT_THAT(html, HasSubstr("data-kind=\"straggler\" data-rank=\"1\""));
  // The report's cleared finding is not on the list: only what Findings answered.
  EXPECT_THAT(html, Not(HasSubstr("data-kind=\"stall\"")));
  EXPECT_THAT(html, HasSubstr("<td class=\"num last-step\">1234</td>"));
  EXPECT_THAT(html, HasSubstr("<td class=\"num efficiency\">61%</td>"));
  EXPECT_THAT(html, HasSubstr("<meta http-equiv=\"refresh\" content=\"5\">"));
  EXPECT_THAT(html, HasSubstr("cause <span class=\"cause\">more_work</span>"));
  EXPECT_THAT(html, HasSubstr("cannot reach collector at 127.0.0.1:7071&lt;b&gt;: refused"));
}

TEST(JobListHtmlTest, WithoutTheReportFindingsLinkToThePage) {
  JobListPage page = HostilePage();
  page.reports.clear();
  page.refresh_seconds = 0;
  const std::string html = RenderJobListHtml(page);
  EXPECT_THAT(html, HasSubstr("href=\"" + JobPath(kHostileJob) + "\"><b>straggler</b>"));
  EXPECT_THAT(html, Not(HasSubstr("#finding-")));
  EXPECT_THAT(html, Not(HasSubstr("http-equiv=\"refresh\"")));
}

TEST(JobListHtmlTest, FindingsOfJobsNoLongerListedStillShow) {
  JobListPage page;
  *page.findings.add_findings() = MakeFinding("gone", "straggler", 2, "n1", 7);
  const std::string html = RenderJobListHtml(page);
  EXPECT_THAT(html, HasSubstr("No running jobs."));
  EXPECT_THAT(html, HasSubstr("id=\"other-findings\""));
  EXPECT_THAT(html, HasSubstr("href=\"/jobs/gone\"><b>straggler</b>"));
}

TEST(CollectorBannerTest, GoesAtTheTopOfTheBody) {
  const std::vector<CollectorProblem> failed = {{"10.0.0.9:7070", "<down>"}};
  const std::string page = WithCollectorBanner("<html><body class=\"x\"><h1>r</h1>", failed);
  EXPECT_THAT(page, HasSubstr("<body class=\"x\"><div class=\"problems\""));
  EXPECT_THAT(page, HasSubstr("10.0.0.9:7070</code>: &lt;down&gt;"));
  EXPECT_EQ(WithCollectorBanner("<body>x", {}), "<body>x");
}

TEST(ErrorHtmlTest, EscapesTheMessage) {
  const std::string html = RenderErrorHtml(404, "No such job", "no job named \"<x>\"");
  EXPECT_THAT(html, HasSubstr("<h1>404 No such job</h1>"));
  EXPECT_THAT(html, HasSubstr("no job named &quot;&lt;x&gt;&quot;"));
  EXPECT_THAT(html, Not(HasSubstr("http-equiv=\"refresh\"")));
  EXPECT_THAT(RenderErrorHtml(502, "No collector answered", "down", {{"a:1", "refused"}}, 7),
              HasSubstr("<meta http-equiv=\"refresh\" content=\"7\">"));
}

}  // namespace
}  // namespace stepwatch::ctl
