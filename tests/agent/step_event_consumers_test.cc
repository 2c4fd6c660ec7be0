// The other holders of the step-event rules against the shared table of edge cases
// (tests/data/step_event_cases.json): the analysis library's ValidateStepEvent (what the collector
// checks on batches from agents) and the simulator's datagram encoder.
#include <climits>

#include "agent/step_event_parser.h"
#include "analysis/engine.h"
#include "gtest/gtest.h"
#include "sim/driver.h"
#include "tests/data/step_event_cases.h"

namespace stepwatch {
namespace {

// The case as an analysis::StepEvent; false when its ints cannot hold the values.
bool ToSample(const test::StepEventCase& c, analysis::StepEvent* s) {
  step_event::Fields f;
  if (!test::ToFields(c, &f)) return false;
  auto fits = [](int64_t v) { return v >= INT_MIN && v <= INT_MAX; };
  for (int64_t v : {f.rank, f.world_size}) {
    if (!fits(v)) return false;
  }
  for (const auto& v : {f.local_rank, f.gpu, f.dp_rank, f.pp_stage, f.tp_rank}) {
    if (v && !fits(*v)) return false;
  }
  s->job = std::string(f.job);
  s->rank = static_cast<int>(f.rank);
  s->world_size = static_cast<int>(f.world_size);
  s->step = f.step;
  s->step_seconds = f.step_seconds;
  s->data_seconds = f.data_seconds;
  s->compute_seconds = f.compute_seconds;
  s->comm_seconds = f.comm_seconds;
  s->samples = f.samples;
  auto narrow = [](std::optional<int64_t> v) {
    return v ? std::optional<int>(static_cast<int>(*v)) : std::nullopt;
  };
  s->local_rank = narrow(f.local_rank);
  s->gpu = narrow(f.gpu);
  s->dp_rank = narrow(f.dp_rank);
  s->pp_stage = narrow(f.pp_stage);
  s->tp_rank = narrow(f.tp_rank);
  s->sections.assign(f.sections.begin(), f.sections.end());
  return true;
}

TEST(StepEventConsumersTest, AnalysisAndSimulatorFollowTheRules) {
  const std::vector<test::StepEventCase> cases = test::LoadStepEventCases();
  ASSERT_GE(cases.size(), 70u);
  int checked = 0;
  for (const test::StepEventCase& c : cases) {
    SCOPED_TRACE(c.name);
    analysis::StepEvent sample;
    if (!ToSample(c, &sample)) continue;
    ++checked;
    const absl::Status valid = analysis::ValidateStepEvent(sample);
    EXPECT_EQ(valid.ok(), c.accept) << valid;
    if (!valid.ok()) {
      EXPECT_EQ(valid.message().rfind(c.field, 0), 0u) << valid.message();
    }

    // The simulator writes what a client writes: the agent's verdict is the table's.
    const std::string datagram = sim::EncodeStepEvent(sample);
    v1::StepEvent e;
    const std::optional<agent::Rejection> r = agent::ParseStepEvent(datagram, &e);
    EXPECT_EQ(!r.has_value(), c.accept) << datagram << (r ? ": " + r->detail : "");
    if (!r) {
      EXPECT_EQ(e.job(), sample.job);
      EXPECT_EQ(e.rank(), sample.rank);
      EXPECT_EQ(e.step(), sample.step);
      EXPECT_NEAR(e.step_seconds(), sample.step_seconds, sample.step_seconds * 1e-8);
      EXPECT_EQ(e.has_pp_stage(), sample.pp_stage.has_value());
      ASSERT_EQ(static_cast<size_t>(e.sections_size()), sample.sections.size());
      for (const auto& [name, seconds] : sample.sections) {
        EXPECT_NEAR(e.sections().at(name), seconds, seconds * 1e-8) << name;
      }
    }
  }
  EXPECT_GE(checked, static_cast<int>(cases.size()) - 4);
}

}  // namespace
}  // namespace stepwatch
