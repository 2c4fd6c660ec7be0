#include "collector/report_store.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "collector/state.h"
#include "common/clock.h"
#include "common/file.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using ::stepwatch::test::StatusIs;

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kT0 = 1'700'000'000 * kSecond;

analysis::JobSnapshot Snap(const std::string& job, int64_t last_step, bool split_known = false) {
  analysis::JobSnapshot s;
  s.job = job;
  s.world_size = 8;
  s.last_step = last_step;
  s.median_step_seconds = 0.5;
  s.split_known = split_known;
  if (split_known) {
    s.efficiency_ratio = 0.8;
    s.breakdown = {0.6, 0.2, 0.1, 0.05, 0.05};
    s.whatif = {1.25, 1.1, 1.05};
  }
  return s;
}

analysis::Finding Straggler(const std::string& job, int rank, int64_t since_step,
                            const std::string& summary = "slow") {
  analysis::Finding f;
  f.kind = analysis::FindingKind::kStraggler;
  f.job = job;
  f.rank = rank;
  f.node = "node-0";
  f.since_step = since_step;
  f.since_unix_nanos = kT0 + since_step * kSecond;
  f.cause = analysis::Cause::kThermalThrottling;
  f.causes = {analysis::Cause::kThermalThrottling};
  f.summary = summary;
  return f;
}

// A fresh directory under the test's temporary directory.
std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/stepwatch-report-test-",
                                 ::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                 "-", name, "-", getpid());
  std::filesystem::remove_all(dir);
  return dir;
}

v1::JobReport MustGet(const ReportStore& store, const std::string& job) {
  absl::StatusOr<v1::JobReport> r = store.Get(job);
  EXPECT_OK(r);
  return r.ok() ? *r : v1::JobReport();
}

// A view holding `job` at `last_step`: ranks 0..3 on node-0 (rank 2 slow and flagged), whose
// GPUs read 75% utilization, as a tick publishes it.
PublishedState TimelineView(const std::string& job, int64_t last_step) {
  PublishedState view;
  view.snapshot.jobs.push_back(Snap(job, last_step));
  auto rows = std::make_shared<std::vector<analysis::RankSnapshot>>();
  for (int rank = 0; rank < 4; ++rank) {
    analysis::RankSnapshot& r = rows->emplace_back();
    r.rank = rank;
    r.node = "node-0";
    r.gpu = rank;
    r.busy_seconds = rank == 2 ? 0.14 : 0.1;
    r.straggler = rank == 2;
  }
  view.ranks[job] = rows;
  NodeSnapshot& node = view.snapshot.nodes.emplace_back();
  node.node = "node-0";
  node.gpus.emplace_back().set_utilization_gpu_ratio(0.75);
  return view;
}

// The report of `job` as a tick leaves it at `last_step`, `at` seconds after kT0.
void TickJob(ReportStore* store, const std::string& job, int64_t last_step, int at) {
  store->Observe(Snap(job, last_step), {}, {0, kT0}, kT0 + at * kSecond);
  store->SampleTimelines(TimelineView(job, last_step), kT0 + at * kSecond);
}

TEST(ReportStoreTest, KeepsEveryFindingWithTheStepsItStartedAndClearedAt) {
  ReportStore store({});
  store.Observe(Snap("j", 10), {Straggler("j", 3, 8, "first")}, {0, kT0}, kT0 + 10 * kSecond);
  // Other jobs' findings are ignored; a finding that lasts keeps one entry with the latest text.
  store.Observe(Snap("j", 20),
                {Straggler("j", 3, 8, "latest"), Straggler("j", 5, 19), Straggler("other", 1, 1)},
                {0, kT0}, kT0 + 20 * kSecond);
  store.Observe(Snap("j", 30), {Straggler("j", 5, 19)}, {0, kT0}, kT0 + 30 * kSecond);

  v1::JobReport r = MustGet(store, "j");
  EXPECT_EQ(r.state(), "running");
  EXPECT_EQ(r.world_size(), 8);
  EXPECT_EQ(r.first_step(), 0);
  EXPECT_EQ(r.last_step(), 30);
  EXPECT_EQ(r.start_unix_nanos(), kT0);
  EXPECT_EQ(r.end_unix_nanos(), 0);
  ASSERT_EQ(r.findings_size(), 2) << r.DebugString();
  EXPECT_EQ(r.finding_count(), 2);
  EXPECT_EQ(r.findings(0).rank(), 3);
  EXPECT_EQ(r.findings(0).summary(), "latest");
  EXPECT_EQ(r.findings(0).cause(), "thermal_throttling");
  EXPECT_EQ(r.findings(0).since_step(), 8);
  EXPECT_EQ(r.findings(0).until_step(), 30);
  EXPECT_EQ(r.findings(0).until_unix_nanos(), kT0 + 30 * kSecond);
  EXPECT_EQ(r.findings(1).rank(), 5);
  EXPECT_EQ(r.findings(1).until_step(), -1);
  EXPECT_THAT(store.Get("other"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store.Get("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ReportStoreTest, FindingThatComesBackIsANewEntry) {
  ReportStore store({});
  store.Observe(Snap("j", 10), {Straggler("j", 3, 10)}, {}, kT0);
  store.Observe(Snap("j", 20), {}, {}, kT0 + kSecond);
  store.Observe(Snap("j", 40), {Straggler("j", 3, 35)}, {}, kT0 + 2 * kSecond);
  v1::JobReport r = MustGet(store, "j");
  ASSERT_EQ(r.findings_size(), 2);
  EXPECT_EQ(r.findings(0).until_step(), 20);
  EXPECT_EQ(r.findings(1).since_step(), 35);
  EXPECT_EQ(r.findings(1).until_step(), -1);
}

TEST(ReportStoreTest, FinishClosesActiveFindingsAtTheLastStep) {
  ReportStore store({});
  store.Observe(Snap("j", 10), {Straggler("j", 3, 10)}, {5, kT0}, kT0 + kSecond);
  store.Finish(Snap("j", 99), {Straggler("j", 3, 10), Straggler("j", 4, 90)}, {5, kT0}, "exited",
               kT0 + 9 * kSecond);
  v1::JobReport r = MustGet(store, "j");
  EXPECT_EQ(r.state(), "finished");
  EXPECT_EQ(r.end_reason(), "exited");
  EXPECT_EQ(r.first_step(), 5);
  EXPECT_EQ(r.last_step(), 99);
  EXPECT_EQ(r.end_unix_nanos(), kT0 + 9 * kSecond);
  ASSERT_EQ(r.findings_size(), 2);
  for (const v1::Finding& f : r.findings()) EXPECT_EQ(f.until_step(), 99) << f.DebugString();
  // A job that finishes before it was ever observed still gets a report.
  store.Finish(Snap("short", 3), {}, {0, kT0}, "exited", kT0 + kSecond);
  EXPECT_EQ(MustGet(store, "short").state(), "finished");
}

TEST(ReportStoreTest, UnknownSplitStaysUnknownAndKnownValuesAreKept) {
  ReportStore store({});
  store.Observe(Snap("j", 1), {}, {}, kT0);
  v1::JobReport r = MustGet(store, "j");
  EXPECT_FALSE(r.has_efficiency_ratio());
  EXPECT_TRUE(r.time_ratio().empty());
  EXPECT_TRUE(r.whatif_speedup_ratio().empty());
  store.Observe(Snap("j", 2, /*split_known=*/true), {}, {}, kT0);
  store.Observe(Snap("j", 3, /*split_known=*/false), {}, {}, kT0);
  r = MustGet(store, "j");
  ASSERT_TRUE(r.has_efficiency_ratio());
  EXPECT_DOUBLE_EQ(r.efficiency_ratio(), 0.8);
  EXPECT_DOUBLE_EQ(r.time_ratio().at("imbalance"), 0.2);
  EXPECT_DOUBLE_EQ(r.whatif_speedup_ratio().at("stragglers"), 1.25);
  // What each what-if is, as the engine says (overlap is always an upper bound).
  EXPECT_EQ(r.whatif_kind().at("overlap"), "upper_bound");
  EXPECT_EQ(r.whatif_kind().at("stragglers"), "estimate");
  EXPECT_EQ(r.whatif_speedup_ratio().count("pipeline"), 0u) << "not a pipeline job";
}

TEST(ReportStoreTest, FindingsPerReportAreBoundedOldestClearedFirst) {
  ReportStoreOptions o;
  o.max_findings_per_report = 3;
  ReportStore store(o);
  // Rank 7 stays flagged throughout; rank 1 comes and goes 5 times.
  int64_t step = 0;
  for (int i = 0; i < 5; ++i) {
    ++step;
    store.Observe(Snap("j", step), {Straggler("j", 7, 1), Straggler("j", 1, step)}, {}, kT0);
    ++step;
    store.Observe(Snap("j", step), {Straggler("j", 7, 1)}, {}, kT0);
  }
  v1::JobReport r = MustGet(store, "j");
  ASSERT_EQ(r.findings_size(), 3);
  EXPECT_EQ(r.finding_count(), 6);
  EXPECT_EQ(r.findings_dropped(), 3);
  EXPECT_EQ(r.findings(0).rank(), 7);  // active: never dropped
  EXPECT_EQ(r.findings(0).until_step(), -1);
  EXPECT_EQ(r.findings(2).since_step(), 9);  // the newest of rank 1
  // Full of active findings: a new one is dropped, and counted once however long it lasts.
  for (int i = 0; i < 3; ++i) {
    store.Observe(
        Snap("j", ++step),
        {Straggler("j", 7, 1), Straggler("j", 2, 20), Straggler("j", 3, 20), Straggler("j", 4, 20)},
        {}, kT0);
  }
  r = MustGet(store, "j");
  EXPECT_EQ(r.findings_size(), 3);
  EXPECT_EQ(r.finding_count(), 9);
  EXPECT_EQ(r.findings_dropped(), 6);  // two cleared rank-1 entries and rank 4
}

TEST(ReportStoreTest, FinishedReportsAreBoundedInNumberAndAge) {
  ReportStoreOptions o;
  o.dir = TempDir("bounds");
  o.max_reports = 2;
  o.retention_nanos = 100 * kSecond;
  ReportStore store(o);
  ASSERT_OK(store.Load(kT0));
  store.Finish(Snap("a", 1), {}, {}, "exited", kT0 + 1 * kSecond);
  store.Finish(Snap("b", 1), {}, {}, "exited", kT0 + 3 * kSecond);
  EXPECT_EQ(store.Flush(), 0);
  EXPECT_TRUE(std::filesystem::exists(o.dir + "/a.json"));
  store.Finish(Snap("c", 1), {}, {}, "expired", kT0 + 2 * kSecond);
  EXPECT_EQ(store.Flush(), 0);
  // "a" ended first: dropped, file and all.
  EXPECT_THAT(store.Get("a"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/a.json"));
  EXPECT_TRUE(std::filesystem::exists(o.dir + "/c.json"));
  std::vector<v1::JobReport> list = store.List();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].job(), "b");  // newest first
  EXPECT_EQ(list[1].job(), "c");
  // Past the retention (counted from the end): gone.
  store.Prune(kT0 + 102 * kSecond + 1);
  EXPECT_THAT(store.Get("c"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_OK(store.Get("b"));
  EXPECT_EQ(store.Flush(), 0);
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/c.json"));
  std::filesystem::remove_all(o.dir);
}

TEST(ReportStoreTest, SavedReportsLoadBackAndCorruptFilesAreSkipped) {
  ReportStoreOptions o;
  o.dir = TempDir("roundtrip");
  v1::JobReport saved;
  {
    ReportStore store(o);
    ASSERT_OK(store.Load(kT0));
    store.Observe(Snap("slurm/1.0", 10, true), {Straggler("slurm/1.0", 3, 5)}, {0, kT0}, kT0);
    store.Finish(Snap("slurm/1.0", 50, true), {}, {0, kT0}, "exited", kT0 + 50 * kSecond);
    store.Finish(Snap("old", 5), {}, {0, kT0}, "exited", kT0 - 9 * 86400 * kSecond);
    saved = MustGet(store, "slurm/1.0");
    EXPECT_TRUE(saved.unsaved());  // not written before the next flush
    saved.set_unsaved(false);
  }  // destruction flushes
  ASSERT_OK(WriteFileAtomically(o.dir + "/garbage.json", "{not json"));
  ASSERT_TRUE(WriteFileAtomically(o.dir + "/renamed.json",
                                  R"({"job": "someone-else", "state": "finished"})")
                  .ok());
  ASSERT_OK(WriteFileAtomically(o.dir + "/notes.txt", "ignored"));

  ReportStore loaded(o);
  ASSERT_OK(loaded.Load(kT0 + 60 * kSecond));
  v1::JobReport back = MustGet(loaded, "slurm/1.0");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(saved, back))
      << saved.DebugString() << "\nvs\n"
      << back.DebugString();
  EXPECT_EQ(back.findings(0).until_step(), 50);
  EXPECT_THAT(loaded.Get("someone-else"), StatusIs(absl::StatusCode::kNotFound));
  // Older than the default 7-day retention: not loaded, and its file removed.
  EXPECT_THAT(loaded.Get("old"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_EQ(loaded.List().size(), 1u);
  EXPECT_EQ(loaded.Flush(), 0);
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/" + ReportStore::FileName("old")));
  EXPECT_TRUE(std::filesystem::exists(o.dir + "/garbage.json"));  // left for a person to look at
  std::filesystem::remove_all(o.dir);
}

// A job's sections and a section straggler's evidence are kept, written and loaded back.
TEST(ReportStoreTest, SectionsAndSectionFindingsAreKeptAndSaved) {
  ReportStoreOptions o;
  o.dir = TempDir("sections");
  analysis::JobSnapshot snap = Snap("j", 10, true);
  snap.section_names = {"forward", "backward"};
  snap.sections_folded = 3;
  analysis::Finding f = Straggler("j", 2, 8);
  f.evidence.section = "backward";
  f.evidence.section_vs_reference_ratio = 1.5;
  v1::JobReport saved;
  {
    ReportStore store(o);
    ASSERT_OK(store.Load(kT0));
    store.Observe(snap, {f}, {0, kT0}, kT0);
    // A later snapshot without sections (its ranks stopped reporting them) keeps the last known.
    store.Finish(Snap("j", 20, true), {}, {0, kT0}, "exited", kT0 + 20 * kSecond);
    saved = MustGet(store, "j");
    saved.set_unsaved(false);  // written when the store goes
    const std::vector<v1::JobReport> listed = store.List();
    ASSERT_EQ(listed.size(), 1u);
    EXPECT_EQ(listed[0].section_names_size(), 2);
    EXPECT_EQ(listed[0].sections_folded(), 3);
  }
  ASSERT_EQ(saved.section_names_size(), 2);
  EXPECT_EQ(saved.section_names(0), "forward");
  EXPECT_EQ(saved.section_names(1), "backward");
  EXPECT_EQ(saved.sections_folded(), 3);
  ASSERT_EQ(saved.findings_size(), 1);
  EXPECT_EQ(saved.findings(0).evidence().section(), "backward");
  EXPECT_DOUBLE_EQ(saved.findings(0).evidence().section_vs_reference_ratio(), 1.5);
  ReportStore loaded(o);
  ASSERT_OK(loaded.Load(kT0 + 30 * kSecond));
  v1::JobReport back = MustGet(loaded, "j");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(saved, back))
      << saved.DebugString() << "\nvs\n"
      << back.DebugString();
  std::filesystem::remove_all(o.dir);
}

TEST(ReportStoreTest, FileNamesAreSafeAndDistinctForAnyJobName) {
  const std::vector<std::string> names = {"llm-pretrain_4711",
                                          "",
                                          ".",
                                          "..",
                                          "../../etc/passwd",
                                          "a/b",
                                          "a%2Fb",
                                          "a b",
                                          std::string("nul\0byte", 8),
                                          "ünïcode",
                                          std::string(1000, 'x'),
                                          std::string(1000, 'x') + "y"};
  std::vector<std::string> files;
  for (const std::string& n : names) {
    const std::string f = ReportStore::FileName(n);
    EXPECT_LE(f.size(), 210u) << n;
    EXPECT_NE(f[0], '.') << n;
    EXPECT_EQ(f.find('/'), std::string::npos) << n;
    EXPECT_EQ(f.find('\0'), std::string::npos) << n;
    EXPECT_EQ(f.substr(f.size() - 5), ".json") << n;
    files.push_back(f);
  }
  EXPECT_EQ(ReportStore::FileName("llm-pretrain_4711"), "llm-pretrain_4711.json");
  std::sort(files.begin(), files.end());
  EXPECT_EQ(std::unique(files.begin(), files.end()), files.end());
}

TEST(ReportStoreTest, TimelineIsInGetNotInListAndStaysWithTheFinishedReport) {
  ReportStore store({});
  ASSERT_OK(store.Load(kT0));
  EXPECT_EQ(store.timeline_bytes(), 0);
  TickJob(&store, "job", 10, 1);
  TickJob(&store, "job", 20, 2);
  TickJob(&store, "job", 20, 3);  // no step since: no sample
  // A job of the view without a running report is left alone.
  store.SampleTimelines(TimelineView("unknown", 5), kT0 + 3 * kSecond);
  EXPECT_THAT(store.Get("unknown"), StatusIs(absl::StatusCode::kNotFound));

  v1::JobReport r = MustGet(store, "job");
  ASSERT_TRUE(r.has_timeline());
  const v1::ReportTimeline& t = r.timeline();
  ASSERT_EQ(t.columns_size(), 2);
  EXPECT_EQ(t.samples(), 2);
  EXPECT_EQ(t.columns(0).first_step(), 0);
  EXPECT_EQ(t.columns(1).first_step(), 11);
  EXPECT_EQ(t.columns(1).last_step(), 20);
  ASSERT_EQ(t.ranks_size(), 4);
  EXPECT_FLOAT_EQ(t.ranks(2).busy_seconds(1), 0.14f);
  EXPECT_TRUE(t.ranks(2).flagged(1));
  EXPECT_FALSE(t.ranks(1).flagged(1));
  ASSERT_EQ(t.nodes_size(), 1);
  EXPECT_EQ(t.nodes(0).ranks(), 4);
  EXPECT_FLOAT_EQ(t.nodes(0).gpu_utilization_ratio(0), 0.75f);
  const int64_t running_bytes = store.timeline_bytes();
  EXPECT_GT(running_bytes, 0);

  const std::vector<v1::JobReport> list = store.List();
  ASSERT_EQ(list.size(), 1u);
  EXPECT_FALSE(list[0].has_timeline());

  // It ends a few steps after the last sample: the last column extends to them.
  analysis::JobSnapshot last = Snap("job", 24);
  last.last_seen_unix_nanos = kT0 + 4 * kSecond;
  store.Finish(last, {}, {0, kT0}, "exited", kT0 + 5 * kSecond);
  r = MustGet(store, "job");
  EXPECT_EQ(r.state(), "finished");
  ASSERT_EQ(r.timeline().columns_size(), 2);
  EXPECT_EQ(r.timeline().columns(1).last_step(), 24);
  EXPECT_EQ(r.timeline().columns(1).end_unix_nanos(), kT0 + 4 * kSecond);
  EXPECT_EQ(r.timeline().ranks_size(), 4);
  EXPECT_FALSE(store.List()[0].has_timeline());
  // Still held, so still charged (no directory: nothing is unsaved).
  EXPECT_GT(store.timeline_bytes(), 0);
}

TEST(ReportStoreTest, ATimelineStartsOnlyWithRoomInTheBudget) {
  ReportStore store({});
  ASSERT_OK(store.Load(kT0));
  store.Observe(Snap("job", 10), {}, {0, kT0}, kT0 + kSecond);
  store.SampleTimelines(TimelineView("job", 10), kT0 + kSecond, /*room_bytes=*/1000);
  EXPECT_FALSE(MustGet(store, "job").has_timeline());
  EXPECT_EQ(store.timeline_bytes(), 0);
  // Room again (the budget freed): it starts, within the room it was given.
  store.SampleTimelines(TimelineView("job", 10), kT0 + kSecond, /*room_bytes=*/1 << 20);
  EXPECT_TRUE(MustGet(store, "job").has_timeline());
  EXPECT_GT(store.timeline_bytes(), 1000);
  EXPECT_LE(store.timeline_bytes(), 1 << 20);
  // Full: the steady timeline goes on (a sample takes no more room once its rows exist).
  store.Observe(Snap("job", 20), {}, {0, kT0}, kT0 + 2 * kSecond);
  store.SampleTimelines(TimelineView("job", 20), kT0 + 2 * kSecond, /*room_bytes=*/0);
  EXPECT_EQ(MustGet(store, "job").timeline().columns_size(), 2);
}

TEST(ReportStoreTest, AJobThatMovesAwayDropsItsTimeline) {
  ReportStore store({});
  ASSERT_OK(store.Load(kT0));
  TickJob(&store, "job", 10, 1);
  EXPECT_GT(store.timeline_bytes(), 0);
  store.Forget("job");
  EXPECT_EQ(store.timeline_bytes(), 0);
  EXPECT_THAT(store.Get("job"), StatusIs(absl::StatusCode::kNotFound));
}

TEST(ReportStoreTest, RunningReportContinuesItsTimelineAfterARestart) {
  ReportStoreOptions o;
  o.dir = TempDir("timeline");
  o.running_save_interval_nanos = kSecond;
  v1::ReportTimeline saved;
  {
    ReportStore store(o);
    ASSERT_OK(store.Load(kT0));
    for (int i = 1; i <= 3; ++i) TickJob(&store, "job", 10 * i, i);
    EXPECT_EQ(store.Flush(kT0 + 3 * kSecond), 0);
    saved = MustGet(store, "job").timeline();
  }
  ASSERT_EQ(saved.columns_size(), 3);
  ReportStore store(o);
  ASSERT_OK(store.Load(kT0 + 10 * kSecond));
  v1::JobReport r = MustGet(store, "job");
  EXPECT_EQ(r.state(), "running");
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(r.timeline(), saved))
      << r.timeline().DebugString();
  // The same timeline goes on: the steps of the gap fall in its next column.
  TickJob(&store, "job", 60, 11);
  r = MustGet(store, "job");
  ASSERT_EQ(r.timeline().columns_size(), 4);
  EXPECT_EQ(r.timeline().samples(), 4);
  EXPECT_EQ(r.timeline().columns(0).first_step(), 0);
  EXPECT_EQ(r.timeline().columns(3).first_step(), 31);
  EXPECT_EQ(r.timeline().columns(3).last_step(), 60);
  EXPECT_FLOAT_EQ(r.timeline().ranks(2).busy_seconds(3), 0.14f);
  store.Finish(Snap("job", 60), {}, {0, kT0}, "exited", kT0 + 12 * kSecond);
  EXPECT_EQ(store.Flush(kT0 + 12 * kSecond), 0);

  // The finished report's file holds it too.
  ReportStore again(o);
  ASSERT_OK(again.Load(kT0 + 20 * kSecond));
  r = MustGet(again, "job");
  EXPECT_EQ(r.state(), "finished");
  EXPECT_EQ(r.timeline().columns_size(), 4);
  EXPECT_GT(again.timeline_bytes(), 0);
  std::filesystem::remove_all(o.dir);
}

TEST(ReportStoreTest, WithoutADirectoryReportsLiveInMemory) {
  ReportStore store({});
  ASSERT_OK(store.Load(kT0));
  store.Finish(Snap("j", 1), {}, {}, "exited", kT0);
  EXPECT_EQ(store.Flush(), 0);
  EXPECT_EQ(MustGet(store, "j").state(), "finished");
}

// Through the collector's state: a straggler's job ends when its ranks exit, and its report
// outlives it.
TEST(ReportStoreTest, CollectorKeepsTheReportOfAFinishedJob) {
  SimulatedClock clock;
  CollectorState state({}, &clock);
  uint64_t seq = 0;
  for (int step = 0; step < 60; ++step) {
    v1::ReportBatch batch = testing::StepBatch("n0", ++seq, "job", 8, step, 0.1, 5, 0.16);
    for (v1::StepEvent& e : *batch.mutable_steps()) e.set_pid(100 + e.rank());
    ASSERT_OK(state.Apply(batch));
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  absl::StatusOr<v1::JobReport> running = state.reports().Get("job");
  ASSERT_OK(running);
  EXPECT_EQ(running->state(), "running");
  StateSnapshot before = state.Snapshot();
  ASSERT_EQ(before.jobs.size(), 1u);
  v1::ReportBatch exits = testing::EmptyBatch("n0", ++seq);
  for (int rank = 0; rank < 8; ++rank) {
    v1::RankExit* x = exits.add_rank_exits();
    x->set_job("job");
    x->set_rank(rank);
    x->set_pid(100 + rank);
  }
  ASSERT_OK(state.Apply(exits));
  state.Tick();
  EXPECT_EQ(state.Status().jobs_size(), 0);
  absl::StatusOr<v1::JobReport> r = state.reports().Get("job");
  ASSERT_OK(r);
  EXPECT_EQ(r->state(), "finished");
  EXPECT_EQ(r->end_reason(), "exited");
  EXPECT_EQ(r->world_size(), 8);
  EXPECT_EQ(r->first_step(), 0);
  EXPECT_EQ(r->last_step(), 59);
  // Known exactly when the engine knew how the job's steps split.
  EXPECT_EQ(r->has_efficiency_ratio(), before.jobs[0].split_known);
  EXPECT_EQ(r->time_ratio().empty(), !before.jobs[0].split_known);
  auto straggler = std::find_if(r->findings().begin(), r->findings().end(), [](const auto& f) {
    return f.kind() == "straggler" && f.rank() == 5;
  });
  ASSERT_NE(straggler, r->findings().end()) << r->DebugString();
  EXPECT_LT(straggler->since_step(), 59);
  EXPECT_EQ(straggler->until_step(), 59);

  // Its timeline: sampled at the ticks (every second of the 12 the job ran), rank 5 flagged
  // and slower in the columns since it was found, the whole job covered.
  ASSERT_TRUE(r->has_timeline());
  const v1::ReportTimeline& t = r->timeline();
  ASSERT_GE(t.columns_size(), 8);
  EXPECT_EQ(t.columns(0).first_step(), 0);
  EXPECT_EQ(t.columns(t.columns_size() - 1).last_step(), 59);
  ASSERT_EQ(t.ranks_size(), 8);
  const v1::RankSeries& slow = t.ranks(5);
  EXPECT_TRUE(slow.flagged(t.columns_size() - 1));
  for (int c = 0; c < t.columns_size(); ++c) {
    if (t.columns(c).first_step() <= straggler->since_step()) continue;
    EXPECT_TRUE(slow.flagged(c)) << c;
    EXPECT_GT(slow.busy_seconds(c), t.ranks(0).busy_seconds(c)) << c;
    EXPECT_FALSE(t.ranks(0).flagged(c)) << c;
  }
}

TEST(ReportStoreTest, CollectorReportsAnExpiredJobAsFinished) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.expire_nanos = 30 * kSecond;
  o.reports.dir = TempDir("expiry");
  {
    CollectorState state(o, &clock);
    for (int step = 10; step < 20; ++step) {
      ASSERT_OK(state.Apply(testing::StepBatch("n0", step, "quiet", 2, step, 0.1)));
      clock.AdvanceTime(absl::Milliseconds(200));
      state.Tick();
    }
    clock.AdvanceTime(absl::Seconds(31));
    state.Tick();  // expires the job, then writes its report
    EXPECT_EQ(state.Status().jobs_size(), 0);
    EXPECT_TRUE(std::filesystem::exists(o.reports.dir + "/quiet.json"));
  }
  // A new collector on the same directory still has it.
  CollectorState again(o, &clock);
  absl::StatusOr<v1::JobReport> r = again.reports().Get("quiet");
  ASSERT_OK(r);
  EXPECT_EQ(r->state(), "finished");
  EXPECT_EQ(r->end_reason(), "expired");
  EXPECT_EQ(r->world_size(), 2);
  EXPECT_EQ(r->first_step(), 10);
  EXPECT_EQ(r->last_step(), 19);
  std::filesystem::remove_all(o.reports.dir);
}

// A directory where the report file should go makes its write fail, as a full disk would.
TEST(ReportStoreTest, UnwritableReportStaysUnsavedAndIsRetriedWithBackoff) {
  ReportStoreOptions o;
  o.dir = TempDir("unsaved");
  o.running_save_interval_nanos = 0;
  o.retry_initial_nanos = kSecond;
  o.retry_max_nanos = 2 * kSecond;
  const std::string path = o.dir + "/" + ReportStore::FileName("job-a");
  {
    ReportStore store(o);
    ASSERT_OK(store.Load(kT0));
    ASSERT_TRUE(std::filesystem::create_directories(path + "/blocker"));
    store.Observe(Snap("job-a", 10), {Straggler("job-a", 3, 5)}, {0, kT0}, kT0);
    store.Finish(Snap("job-a", 20), {}, {0, kT0}, "exited", kT0 + kSecond);
    EXPECT_EQ(store.Flush(kT0 + kSecond), 1);
    EXPECT_TRUE(MustGet(store, "job-a").unsaved());
    ASSERT_EQ(store.List().size(), 1u);
    EXPECT_TRUE(store.List()[0].unsaved());
    EXPECT_EQ(store.unsaved_count(), 1);
    EXPECT_GT(store.unsaved_bytes(), 0);
    EXPECT_EQ(store.save_errors(), 1u);
    // Within the backoff nothing is tried; then it is, and the backoff doubles (to its cap).
    EXPECT_EQ(store.Flush(kT0 + kSecond + kSecond / 2), 0);
    EXPECT_EQ(store.Flush(kT0 + 2 * kSecond + kSecond / 10), 1);
    EXPECT_EQ(store.Flush(kT0 + 3 * kSecond), 0);
    EXPECT_EQ(store.Flush(kT0 + 4 * kSecond + kSecond / 5), 1);
    EXPECT_EQ(store.Flush(kT0 + 6 * kSecond), 0);
    EXPECT_EQ(store.save_errors(), 3u);
    // Readable all along, findings and all.
    EXPECT_EQ(MustGet(store, "job-a").findings_size(), 1);
    // The disk takes it again: written at the next try.
    std::filesystem::remove_all(path);
    EXPECT_EQ(store.Flush(kT0 + 6 * kSecond + kSecond / 2), 0);
    EXPECT_TRUE(std::filesystem::is_regular_file(path));
    EXPECT_FALSE(MustGet(store, "job-a").unsaved());
    EXPECT_EQ(store.unsaved_count(), 0);
    EXPECT_EQ(store.unsaved_bytes(), 0);
  }
  ReportStore loaded(o);
  ASSERT_OK(loaded.Load(kT0 + 10 * kSecond));
  v1::JobReport r = MustGet(loaded, "job-a");
  EXPECT_EQ(r.last_step(), 20);
  EXPECT_FALSE(r.unsaved());
  std::filesystem::remove_all(o.dir);
}

// A collector killed mid-job: the running report saved before continues in the next process,
// the stretch it missed recorded as a gap; the findings active then are closed where it ended.
TEST(ReportStoreTest, RunningReportIsSavedAndContinuedAfterARestartWithAGap) {
  ReportStoreOptions o;
  o.dir = TempDir("running");
  o.running_save_interval_nanos = 10 * kSecond;
  o.recovered_expire_nanos = 60 * kSecond;
  const std::string running = o.dir + "/running/" + ReportStore::FileName("job/1");
  const std::string killed = o.dir + "/killed.json";
  {
    ReportStore store(o);
    ASSERT_OK(store.Load(kT0));
    store.Observe(Snap("job/1", 10), {Straggler("job/1", 3, 5)}, {0, kT0}, kT0 + 10 * kSecond);
    store.Observe(Snap("quiet", 3), {}, {0, kT0}, kT0 + 10 * kSecond);
    EXPECT_EQ(store.Flush(kT0 + 10 * kSecond), 0);
    ASSERT_TRUE(std::filesystem::is_regular_file(running));
    // Not due again before the interval: the file keeps step 10.
    store.Observe(Snap("job/1", 20), {Straggler("job/1", 3, 5)}, {0, kT0}, kT0 + 15 * kSecond);
    EXPECT_EQ(store.Flush(kT0 + 15 * kSecond), 0);
    std::filesystem::copy_file(running, killed);
  }  // a SIGKILL leaves the file of the last periodic save: put it back
  std::filesystem::copy_file(killed, running, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::remove(killed);

  ReportStore store(o);
  ASSERT_OK(store.Load(kT0 + 30 * kSecond));
  v1::JobReport r = MustGet(store, "job/1");
  EXPECT_EQ(r.state(), "running");
  EXPECT_EQ(r.last_step(), 10);
  ASSERT_EQ(r.gaps_size(), 1);
  EXPECT_EQ(r.gaps(0).after_step(), 10);
  EXPECT_EQ(r.gaps(0).before_step(), -1);
  EXPECT_EQ(r.gaps(0).from_unix_nanos(), kT0 + 10 * kSecond);
  EXPECT_EQ(r.gaps(0).cause(), "collector_restart");
  ASSERT_EQ(r.findings_size(), 1);
  EXPECT_EQ(r.findings(0).until_step(), 10);

  // The job reports again from step 35 on, its straggler found again.
  store.Observe(Snap("job/1", 40), {Straggler("job/1", 3, 37)}, {35, kT0 + 31 * kSecond},
                kT0 + 31 * kSecond);
  r = MustGet(store, "job/1");
  EXPECT_EQ(r.first_step(), 0);
  EXPECT_EQ(r.start_unix_nanos(), kT0);
  EXPECT_EQ(r.last_step(), 40);
  ASSERT_EQ(r.gaps_size(), 1);
  EXPECT_EQ(r.gaps(0).before_step(), 35);
  EXPECT_EQ(r.gaps(0).to_unix_nanos(), kT0 + 31 * kSecond);
  ASSERT_EQ(r.findings_size(), 2);
  EXPECT_EQ(r.findings(1).since_step(), 37);
  EXPECT_EQ(r.findings(1).until_step(), -1);
  store.Finish(Snap("job/1", 50), {}, {35, kT0 + 31 * kSecond}, "exited", kT0 + 40 * kSecond);
  EXPECT_EQ(store.Flush(kT0 + 40 * kSecond), 0);
  EXPECT_FALSE(std::filesystem::exists(running));
  EXPECT_TRUE(std::filesystem::is_regular_file(o.dir + "/" + ReportStore::FileName("job/1")));

  // A job that never comes back is finished as expired once unseen for the expiry.
  store.Prune(kT0 + 80 * kSecond);
  EXPECT_EQ(MustGet(store, "quiet").state(), "running");
  store.Prune(kT0 + 91 * kSecond);
  v1::JobReport quiet = MustGet(store, "quiet");
  EXPECT_EQ(quiet.state(), "finished");
  EXPECT_EQ(quiet.end_reason(), "expired");
  ASSERT_EQ(quiet.gaps_size(), 1);
  EXPECT_EQ(quiet.gaps(0).before_step(), -1);
  EXPECT_EQ(store.Flush(kT0 + 91 * kSecond), 0);
  EXPECT_FALSE(std::filesystem::exists(o.dir + "/running/quiet.json"));

  ReportStore again(o);
  ASSERT_OK(again.Load(kT0 + 100 * kSecond));
  r = MustGet(again, "job/1");
  EXPECT_EQ(r.state(), "finished");
  ASSERT_EQ(r.gaps_size(), 1);
  EXPECT_EQ(r.gaps(0).before_step(), 35);
  EXPECT_EQ(r.findings_size(), 2);
  EXPECT_EQ(MustGet(again, "quiet").end_reason(), "expired");
  std::filesystem::remove_all(o.dir);
}

// Each running report write is a file and an fsync: at most max_running_writes_per_flush per
// Flush, those saved longest ago (or never) first, each at most once per interval.
TEST(ReportStoreTest, RunningReportWritesAreBoundedPerFlush) {
  ReportStoreOptions o;
  o.dir = TempDir("bounded");
  o.running_save_interval_nanos = 10 * kSecond;
  o.max_running_writes_per_flush = 4;
  ReportStore store(o);
  ASSERT_OK(store.Load(kT0));
  auto files = [&o] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator(o.dir + "/running"))
      n += e.is_regular_file();
    return n;
  };
  for (int i = 0; i < 10; ++i) store.Observe(Snap(absl::StrCat("job-", i), 1), {}, {0, kT0}, kT0);
  EXPECT_EQ(store.Flush(kT0), 0);
  EXPECT_EQ(files(), 4);
  EXPECT_EQ(store.Flush(kT0 + kSecond), 0);
  EXPECT_EQ(files(), 8);
  EXPECT_EQ(store.Flush(kT0 + 2 * kSecond), 0);
  EXPECT_EQ(files(), 10);
  // Changed again, but saved less than an interval ago: not yet.
  for (int i = 0; i < 10; ++i) {
    store.Observe(Snap(absl::StrCat("job-", i), 2), {}, {0, kT0}, kT0 + 3 * kSecond);
  }
  const std::string first = o.dir + "/running/job-0.json";
  const auto written = std::filesystem::last_write_time(first);
  EXPECT_EQ(store.Flush(kT0 + 5 * kSecond), 0);
  EXPECT_EQ(std::filesystem::last_write_time(first), written);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(store.Flush(kT0 + (10 + i) * kSecond), 0);
  absl::StatusOr<std::string> data = ReadFile(first, 1 << 20);
  ASSERT_OK(data);
  EXPECT_NE(data->find("\"last_step\":\"2\""), std::string::npos) << *data;
  std::filesystem::remove_all(o.dir);
}

// What a periodic save of running reports costs: 16 jobs of 8 ranks with 200 findings each (one
// file and one fsync per job). Printed for docs/reliability.md; asserts only that it succeeded.
TEST(ReportStoreTest, RunningSaveCost) {
  ReportStoreOptions o;
  o.dir = TempDir("cost");
  ReportStore store(o);
  ASSERT_OK(store.Load(kT0));
  constexpr int kJobs = 16;
  for (int j = 0; j < kJobs; ++j) {
    const std::string job = absl::StrCat("llm-pretrain-", j);
    // Each finding clears at the next call: 200 entries in the report.
    for (int f = 0; f < 200; ++f) {
      store.Observe(Snap(job, f, true), {Straggler(job, f % 8, f)}, {0, kT0}, kT0 + f);
    }
  }
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(store.Flush(kT0 + kSecond), 0);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const uintmax_t bytes = std::filesystem::file_size(o.dir + "/running/llm-pretrain-0.json");
  std::printf("running reports: %d written in %.1f ms (%.2f ms each, %ju bytes each) in %s\n",
              kJobs, ms, ms / kJobs, bytes, o.dir.c_str());
  std::filesystem::remove_all(o.dir);
}

// Unsaved reports count against the memory budget until they are written.
TEST(ReportStoreTest, CollectorChargesUnsavedReportsUntilWritten) {
  SimulatedClock clock;
  CollectorStateOptions o;
  o.reports.dir = TempDir("charged");
  o.reports.retry_initial_nanos = kSecond;
  CollectorState state(o, &clock);
  const std::string path = o.reports.dir + "/" + ReportStore::FileName("job");
  ASSERT_TRUE(std::filesystem::create_directories(path + "/blocker"));
  uint64_t seq = 0;
  for (int step = 0; step < 5; ++step) {
    v1::ReportBatch batch = testing::StepBatch("n0", ++seq, "job", 2, step, 0.1);
    for (v1::StepEvent& e : *batch.mutable_steps()) e.set_pid(100 + e.rank());
    ASSERT_OK(state.Apply(batch));
    clock.AdvanceTime(absl::Milliseconds(200));
    state.Tick();
  }
  v1::ReportBatch exits = testing::EmptyBatch("n0", ++seq);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RankExit* x = exits.add_rank_exits();
    x->set_job("job");
    x->set_rank(rank);
    x->set_pid(100 + rank);
  }
  // The running job's timeline was charged at the last tick.
  const int64_t running_timeline = state.reports().timeline_bytes();
  EXPECT_GT(running_timeline, 0);
  ASSERT_OK(state.Apply(exits));
  const int64_t without = state.MemoryAccountedBytes() - running_timeline;
  state.Tick();
  StateSnapshot s = state.Snapshot();
  EXPECT_EQ(s.reports_unsaved, 1);
  EXPECT_GT(s.reports_unsaved_bytes, 0);
  EXPECT_GE(s.report_save_errors, 1u);
  // The unsaved report's bytes hold its timeline: not charged twice.
  EXPECT_EQ(state.reports().timeline_bytes(), 0);
  EXPECT_EQ(state.MemoryAccountedBytes(), without + s.reports_unsaved_bytes);
  std::filesystem::remove_all(path);
  clock.AdvanceTime(absl::Seconds(2));
  state.Tick();
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
  EXPECT_EQ(state.Snapshot().reports_unsaved, 0);
  // Written: only the finished report's timeline stays charged (it stays in memory).
  const int64_t finished_timeline = state.reports().timeline_bytes();
  EXPECT_GT(finished_timeline, 0);
  EXPECT_LT(finished_timeline, s.reports_unsaved_bytes * 4);
  EXPECT_EQ(state.MemoryAccountedBytes(), without + finished_timeline);
  std::filesystem::remove_all(o.reports.dir);
}

}  // namespace
}  // namespace stepwatch::collector
