#include "collector/job_timeline.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace stepwatch::collector {
namespace {

constexpr int64_t kSecond = 1'000'000'000;
constexpr int64_t kT0 = 1'700'000'000 * kSecond;

// Options with these bounds (first interval one second).
JobTimelineOptions Options(int max_columns, int max_rank_rows = 1024,
                           int64_t max_section_cells = 200'000) {
  JobTimelineOptions o;
  o.max_columns = max_columns;
  o.max_rank_rows = max_rank_rows;
  o.max_section_cells = max_section_cells;
  o.initial_sample_interval_nanos = kSecond;
  return o;
}

analysis::JobSnapshot Job(int64_t last_step, std::vector<std::string> sections = {}) {
  analysis::JobSnapshot j;
  j.job = "job";
  j.world_size = 4;
  j.last_step = last_step;
  j.median_step_seconds = 0.5;
  j.section_names = std::move(sections);
  return j;
}

analysis::RankSnapshot Rank(int rank, double busy, bool flagged = false,
                            const std::string& node = "node-0") {
  analysis::RankSnapshot r;
  r.rank = rank;
  r.node = node;
  r.gpu = rank;
  r.busy_seconds = busy;
  r.straggler = flagged;
  return r;
}

v1::ReportTimeline Proto(const JobTimeline& t) {
  v1::ReportTimeline p;
  t.ToProto(&p);
  return p;
}

// Feeds one sample per interval (each a step further), every rank with busy `busy_of(i)`.
struct Feeder {
  JobTimeline* timeline;
  int64_t step = 0;
  int64_t now = kT0;
  int taken = 0;

  void Next(const std::vector<analysis::RankSnapshot>& ranks,
            const std::vector<NodeSnapshot>& nodes = {}) {
    step += 10;
    now += timeline->sample_interval_nanos();
    ASSERT_TRUE(timeline->Sample(Job(step), ranks, nodes, now, /*job_first_step=*/0, kT0))
        << "sample " << taken;
    ++taken;
  }
};

TEST(JobTimelineTest, MergesKeepTheColumnLimitWithSampleWeightedMeans) {
  JobTimeline t(Options(4));
  Feeder f{&t};
  // Busy 1, 2, 3, 4: four columns of one sample each.
  for (int i = 1; i <= 4; ++i) f.Next({Rank(0, i)});
  ASSERT_EQ(t.columns(), 4);
  // The fifth merges pairs first: [1.5 (2), 3.5 (2)] + [5].
  f.Next({Rank(0, 5)});
  v1::ReportTimeline p = Proto(t);
  ASSERT_EQ(p.columns_size(), 3);
  EXPECT_EQ(p.columns(0).samples(), 2);
  EXPECT_EQ(p.columns(2).samples(), 1);
  EXPECT_FLOAT_EQ(p.ranks(0).busy_seconds(0), 1.5f);
  EXPECT_FLOAT_EQ(p.ranks(0).busy_seconds(1), 3.5f);
  EXPECT_FLOAT_EQ(p.ranks(0).busy_seconds(2), 5.0f);
  // [1.5, 3.5, 5, 7] merge into [2.5 (4), 6 (2)] + [9]; then [2.5, 6, 9, 11] into
  // [(2.5 * 4 + 6 * 2) / 6 (6), 10 (2)] + [13]: weights, not a mean of means.
  for (double busy : {7.0, 9.0, 11.0, 13.0}) f.Next({Rank(0, busy)});
  p = Proto(t);
  ASSERT_EQ(p.columns_size(), 3);
  EXPECT_EQ(p.columns(0).samples(), 6);
  EXPECT_EQ(p.columns(1).samples(), 2);
  EXPECT_NEAR(p.ranks(0).busy_seconds(0), 22.0 / 6, 1e-5);
  EXPECT_FLOAT_EQ(p.ranks(0).busy_seconds(1), 10.0f);
  EXPECT_FLOAT_EQ(p.ranks(0).busy_seconds(2), 13.0f);
  EXPECT_EQ(p.samples(), 9);
  // Never more than the limit, whatever the number of samples.
  for (int i = 0; i < 200; ++i) {
    f.Next({Rank(0, 1)});
    ASSERT_LE(t.columns(), 4);
  }
  p = Proto(t);
  int64_t samples = 0;
  for (const v1::TimelineColumn& c : p.columns()) samples += c.samples();
  EXPECT_EQ(samples, p.samples());
}

TEST(JobTimelineTest, ColumnsCoverTheWholeJobInOrder) {
  JobTimeline t(Options(8));
  Feeder f{&t};
  for (int i = 0; i < 100; ++i) f.Next({Rank(0, 1), Rank(1, 1)});
  const v1::ReportTimeline p = Proto(t);
  ASSERT_GE(p.columns_size(), 4);
  EXPECT_EQ(p.columns(0).first_step(), 0);
  EXPECT_EQ(p.columns(0).start_unix_nanos(), kT0);
  EXPECT_EQ(p.columns(p.columns_size() - 1).last_step(), f.step);
  EXPECT_EQ(p.columns(p.columns_size() - 1).end_unix_nanos(), f.now);
  for (int c = 1; c < p.columns_size(); ++c) {
    EXPECT_EQ(p.columns(c).first_step(), p.columns(c - 1).last_step() + 1) << c;
    EXPECT_EQ(p.columns(c).start_unix_nanos(), p.columns(c - 1).end_unix_nanos()) << c;
    EXPECT_LE(p.columns(c).first_step(), p.columns(c).last_step()) << c;
  }
  EXPECT_DOUBLE_EQ(p.columns(0).step_seconds(), 0.5);
  EXPECT_FALSE(p.columns(0).has_efficiency_ratio());
  EXPECT_TRUE(p.columns(0).time_ratio().empty());
  // The job ended some steps after the last sample: the last column holds them.
  t.Close(f.step + 7, f.now + kSecond);
  const v1::ReportTimeline closed = Proto(t);
  EXPECT_EQ(closed.columns(closed.columns_size() - 1).last_step(), f.step + 7);
  EXPECT_EQ(closed.columns(closed.columns_size() - 1).end_unix_nanos(), f.now + kSecond);
}

TEST(JobTimelineTest, FlaggedSurvivesMerges) {
  JobTimeline t(Options(4));
  Feeder f{&t};
  int64_t flagged_step = -1;
  for (int i = 0; i < 40; ++i) {
    const bool flagged = i == 13;
    f.Next({Rank(0, 1), Rank(2, 2, flagged)});
    if (flagged) flagged_step = f.step;
  }
  const v1::ReportTimeline p = Proto(t);
  ASSERT_EQ(p.ranks_size(), 2);
  int flagged_columns = 0;
  for (int c = 0; c < p.columns_size(); ++c) {
    const bool holds =
        p.columns(c).first_step() <= flagged_step && flagged_step <= p.columns(c).last_step();
    EXPECT_EQ(p.ranks(1).flagged(c), holds) << c;
    EXPECT_FALSE(p.ranks(0).flagged(c)) << c;
    flagged_columns += p.ranks(1).flagged(c) ? 1 : 0;
  }
  EXPECT_EQ(flagged_columns, 1);
}

TEST(JobTimelineTest, ARankThatJoinsLateOrLeavesHasMinusOneWhereItDidNotReport) {
  JobTimeline t;
  Feeder f{&t};
  f.Next({Rank(0, 1)});
  f.Next({Rank(0, 1)});
  f.Next({Rank(0, 1), Rank(3, 2, false, "node-1")});
  f.Next({Rank(0, 1)});
  const v1::ReportTimeline p = Proto(t);
  ASSERT_EQ(p.columns_size(), 4);
  ASSERT_EQ(p.ranks_size(), 2);
  EXPECT_EQ(p.ranks(1).rank(), 3);
  EXPECT_EQ(p.ranks(1).node(), "node-1");
  EXPECT_EQ(p.ranks(1).gpu(), 3);
  EXPECT_EQ(std::vector<float>(p.ranks(1).busy_seconds().begin(), p.ranks(1).busy_seconds().end()),
            (std::vector<float>{-1, -1, 2, -1}));
  ASSERT_EQ(p.nodes_size(), 2);
  EXPECT_EQ(p.nodes(1).node(), "node-1");
  EXPECT_EQ(std::vector<float>(p.nodes(1).busy_seconds().begin(), p.nodes(1).busy_seconds().end()),
            (std::vector<float>{-1, -1, 2, -1}));
  // A merge of a known and an unknown value keeps the known one.
  JobTimeline small(Options(2));
  Feeder g{&small};
  g.Next({Rank(0, 1)});
  g.Next({Rank(0, 1), Rank(1, 4)});
  g.Next({Rank(0, 1), Rank(1, 6)});
  const v1::ReportTimeline q = Proto(small);
  ASSERT_EQ(q.columns_size(), 2);
  EXPECT_FLOAT_EQ(q.ranks(1).busy_seconds(0), 4.0f);
  EXPECT_FLOAT_EQ(q.ranks(1).busy_seconds(1), 6.0f);
}

TEST(JobTimelineTest, RowLimitCountsOmittedRanksWhoseNodesStillMeanThemAll) {
  JobTimeline t(Options(100, 2));
  Feeder f{&t};
  NodeSnapshot n0;
  n0.node = "node-0";
  for (double util : {0.9, 0.7}) {
    v1::GpuSample& g = n0.gpus.emplace_back();
    g.set_utilization_gpu_ratio(util);
  }
  n0.gpus[0].set_sm_activity_ratio(0.5);
  NodeSnapshot n1;  // no GPU readings
  n1.node = "node-1";
  // Ranks 0 and 2 on node-0, 1 and 3 on node-1, busy rank + 1; given out of order.
  f.Next({Rank(3, 4, false, "node-1"), Rank(2, 3, false, "node-0"), Rank(1, 2, false, "node-1"),
          Rank(0, 1, false, "node-0")},
         {n0, n1});
  const v1::ReportTimeline p = Proto(t);
  ASSERT_EQ(p.ranks_size(), 2);
  EXPECT_EQ(p.ranks(0).rank(), 0);
  EXPECT_EQ(p.ranks(1).rank(), 1);
  EXPECT_EQ(p.ranks_omitted(), 2);
  ASSERT_EQ(p.nodes_size(), 2);
  EXPECT_EQ(p.nodes(0).node(), "node-0");
  EXPECT_EQ(p.nodes(0).ranks(), 2);
  EXPECT_FLOAT_EQ(p.nodes(0).busy_seconds(0), 2.0f);  // (1 + 3) / 2
  EXPECT_FLOAT_EQ(p.nodes(1).busy_seconds(0), 3.0f);  // (2 + 4) / 2
  EXPECT_NEAR(p.nodes(0).gpu_utilization_ratio(0), 0.8, 1e-6);
  EXPECT_NEAR(p.nodes(0).sm_active_ratio(0), 0.5, 1e-6);
  EXPECT_FLOAT_EQ(p.nodes(1).gpu_utilization_ratio(0), -1.0f);
  EXPECT_FLOAT_EQ(p.nodes(1).sm_active_ratio(0), -1.0f);
}

TEST(JobTimelineTest, SamplesNeedAnAdvanceAndTheIntervalWhichDoublesAtEachMerge) {
  JobTimeline t(Options(4));
  EXPECT_FALSE(t.Due(-1, kT0)) << "no step yet";
  ASSERT_TRUE(t.Sample(Job(5), {Rank(0, 1)}, {}, kT0));
  EXPECT_FALSE(t.Due(5, kT0 + 10 * kSecond)) << "no advance";
  EXPECT_FALSE(t.Due(6, kT0 + kSecond - 1)) << "too soon";
  EXPECT_TRUE(t.Due(6, kT0 + kSecond));
  EXPECT_FALSE(t.Sample(Job(6), {Rank(0, 1)}, {}, kT0 + kSecond / 2));
  Feeder f{&t, 5, kT0, 1};
  for (int i = 0; i < 3; ++i) f.Next({Rank(0, 1)});
  EXPECT_EQ(t.sample_interval_nanos(), kSecond);
  f.Next({Rank(0, 1)});  // merges
  EXPECT_EQ(t.sample_interval_nanos(), 2 * kSecond);
  EXPECT_FALSE(t.Due(f.step + 1, f.now + kSecond));
  EXPECT_TRUE(t.Due(f.step + 1, f.now + 2 * kSecond));
  for (int i = 0; i < 2; ++i) f.Next({Rank(0, 1)});  // merges again
  EXPECT_EQ(t.sample_interval_nanos(), 4 * kSecond);
  EXPECT_EQ(Proto(t).sample_interval_nanos(), 4 * kSecond);
}

TEST(JobTimelineTest, SectionsAreSectionMajorAndDroppedWhenTheJobIsTooLarge) {
  JobTimeline t;
  analysis::RankSnapshot r = Rank(0, 1);
  r.sections = {{"fwd", 0.25}, {"bwd", 0.5}};
  ASSERT_TRUE(t.Sample(Job(1, {"fwd", "bwd"}), {r}, {}, kT0));
  r.sections = {{"bwd", 0.75}};
  ASSERT_TRUE(t.Sample(Job(2, {"fwd", "bwd"}), {r}, {}, kT0 + kSecond));
  v1::ReportTimeline p = Proto(t);
  ASSERT_EQ(p.section_names_size(), 2);
  EXPECT_EQ(p.section_names(0), "fwd");
  EXPECT_EQ(
      std::vector<float>(p.ranks(0).section_seconds().begin(), p.ranks(0).section_seconds().end()),
      (std::vector<float>{0.25f, -1.0f, 0.5f, 0.75f}));

  // 4 ranks x 2 sections x 100 columns is over a bound of 500 cells: no section rows at all.
  JobTimeline big(Options(100, 1024, 500));
  std::vector<analysis::RankSnapshot> ranks;
  for (int i = 0; i < 4; ++i) {
    ranks.push_back(Rank(i, 1));
    ranks.back().sections = {{"fwd", 0.25}, {"bwd", 0.5}};
  }
  ASSERT_TRUE(big.Sample(Job(1, {"fwd", "bwd"}), ranks, {}, kT0));
  p = Proto(big);
  EXPECT_EQ(p.section_names_size(), 0);
  for (const v1::RankSeries& s : p.ranks()) EXPECT_EQ(s.section_seconds_size(), 0);
}

TEST(JobTimelineTest, BytesGrowAndAreBounded) {
  JobTimelineOptions options{.max_columns = 16, .max_rank_rows = 64};
  JobTimeline t(options);
  const int64_t empty = t.bytes();
  std::vector<analysis::RankSnapshot> ranks;
  for (int i = 0; i < 200; ++i) {
    ranks.push_back(Rank(i, 1, false, absl::StrCat("node-", i / 8)));
    ranks.back().sections = {{"fwd", 0.25}, {"bwd", 0.5}};
  }
  Feeder f{&t};
  f.Next(ranks);
  const int64_t one = t.bytes();
  EXPECT_GT(one, empty);
  // 64 rows (not 200) and 25 nodes, each with room for 16 columns, two sections.
  EXPECT_GT(one, 64 * 16 * (4 + 1 + 2 * 4));
  int64_t peak = one;
  for (int i = 1; i < 16; ++i) {
    f.Next(ranks);
    peak = std::max(peak, t.bytes());
  }
  for (int i = 0; i < 500; ++i) {
    f.Next(ranks);
    ASSERT_LE(t.bytes(), peak) << "sample " << f.taken;
  }
  EXPECT_LT(peak, 200'000);
}

// What the collector checks against its memory budget before a sample is at least what the
// sample then takes: new rows, new nodes, new sections, and the first sample of all.
TEST(JobTimelineTest, BytesWithASampleBoundWhatItTakes) {
  JobTimeline t(Options(8, 3));
  std::vector<analysis::RankSnapshot> ranks;
  int64_t now = kT0;
  for (int i = 0; i < 30; ++i) {
    // A rank, a node and (every third sample) a section more each time.
    ranks.push_back(Rank(i, 1, false, absl::StrCat("a-node-with-a-long-name-", i)));
    std::vector<std::string> sections;
    for (int s = 0; s <= i / 3 && s < 16; ++s) sections.push_back(absl::StrCat("section-", s));
    for (analysis::RankSnapshot& r : ranks) {
      r.sections.clear();
      for (const std::string& name : sections) r.sections.push_back({name, 0.1});
    }
    now += t.sample_interval_nanos();
    const TimelineSample s = MakeTimelineSample(Job(i + 1, sections), ranks, {}, 3, now);
    const int64_t before = t.bytes();
    const int64_t bound = t.BytesWith(s);
    t.Add(s, 0, kT0);
    EXPECT_GE(bound, t.bytes()) << "sample " << i;
    EXPECT_GE(bound, before) << "sample " << i;
  }
  // Nothing new: no growth.
  now += t.sample_interval_nanos();
  const TimelineSample same = MakeTimelineSample(Job(100), ranks, {}, 3, now);
  const int64_t steady = t.BytesWith(same);
  EXPECT_LE(steady - t.bytes(), 0);
}

TEST(JobTimelineTest, ContinuesFromItsProto) {
  JobTimeline t(Options(4));
  Feeder f{&t};
  for (int i = 0; i < 6; ++i) f.Next({Rank(0, i), Rank(1, 1, i == 2)});
  const v1::ReportTimeline saved = Proto(t);
  JobTimeline back = JobTimeline::FromProto(saved, Options(4));
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(Proto(back), saved))
      << Proto(back).DebugString() << "\n---\n"
      << saved.DebugString();
  EXPECT_EQ(back.sample_interval_nanos(), t.sample_interval_nanos());
  EXPECT_EQ(back.bytes(), t.bytes());
  // It goes on where it stopped: the same interval, the next column after the last step.
  EXPECT_FALSE(back.Due(f.step + 1, f.now + t.sample_interval_nanos() - 1));
  ASSERT_TRUE(back.Sample(Job(f.step + 50), {Rank(0, 9)}, {}, f.now + 60 * kSecond));
  const v1::ReportTimeline p = Proto(back);
  EXPECT_EQ(p.columns(p.columns_size() - 1).first_step(), f.step + 1);
  EXPECT_EQ(p.samples(), saved.samples() + 1);
  // A smaller limit than it was saved under: merged down to it.
  JobTimeline fewer = JobTimeline::FromProto(saved, Options(2));
  EXPECT_LE(fewer.columns(), 2);
  EXPECT_EQ(Proto(fewer).columns(0).first_step(), 0);
}

// What the largest job costs (100,000 ranks on 12,500 nodes, two sections): printed, not
// asserted, for docs/performance.md; the bounds alone are asserted.
TEST(JobTimelineTest, LargestJobCost) {
  std::vector<analysis::RankSnapshot> ranks;
  for (int i = 0; i < 100'000; ++i) {
    ranks.push_back(Rank(i, 0.1 + (i % 7) * 0.01, i == 77, absl::StrCat("node-", i / 8)));
    ranks.back().sections = {{"fwd", 0.25}, {"bwd", 0.5}};
  }
  std::vector<NodeSnapshot> nodes(12'500);
  for (int n = 0; n < 12'500; ++n) {
    nodes[n].node = absl::StrCat("node-", n);
    for (int g = 0; g < 8; ++g) nodes[n].gpus.emplace_back().set_utilization_gpu_ratio(0.9);
  }
  std::sort(nodes.begin(), nodes.end(),
            [](const NodeSnapshot& a, const NodeSnapshot& b) { return a.node < b.node; });
  JobTimeline t;
  analysis::JobSnapshot job = Job(0, {"fwd", "bwd"});
  int64_t now = kT0;
  double sample_ms = 0, add_ms = 0;
  const int samples = 101;  // one merge
  for (int i = 0; i < samples; ++i) {
    job.last_step += 10;
    now += t.sample_interval_nanos();
    const auto a = std::chrono::steady_clock::now();
    TimelineSample s = MakeTimelineSample(job, ranks, nodes, t.options().max_rank_rows, now);
    const auto b = std::chrono::steady_clock::now();
    t.Add(s, 0, kT0);
    const auto c = std::chrono::steady_clock::now();
    sample_ms += std::chrono::duration<double, std::milli>(b - a).count();
    add_ms += std::chrono::duration<double, std::milli>(c - b).count();
  }
  const auto p0 = std::chrono::steady_clock::now();
  const v1::ReportTimeline p = Proto(t);
  const auto p1 = std::chrono::steady_clock::now();
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(p, &json).ok());
  const auto p2 = std::chrono::steady_clock::now();
  std::printf(
      "largest job: sample %.1f ms, add %.2f ms (mean of %d); bytes() %.1f MB; ToProto %.1f ms, "
      "%.1f MB serialized; JSON %.1f MB in %.0f ms\n",
      sample_ms / samples, add_ms / samples, samples, t.bytes() / 1e6,
      std::chrono::duration<double, std::milli>(p1 - p0).count(), p.ByteSizeLong() / 1e6,
      json.size() / 1e6, std::chrono::duration<double, std::milli>(p2 - p1).count());
  EXPECT_LE(p.columns_size(), 100);
  EXPECT_EQ(p.ranks_size(), 1024);
  EXPECT_EQ(p.ranks_omitted(), 100'000 - 1024);
  EXPECT_EQ(p.nodes_size(), 12'500);
  EXPECT_EQ(p.section_names_size(), 0) << "1024 x 2 x 100 is over 200,000 values";
}

}  // namespace
}  // namespace stepwatch::collector
