// One job's life over time, for its report (JobReport.timeline): a bounded number of columns of
// consecutive steps, each the sample-weighted mean of the samples taken while its steps ran. A
// sample is every rank's recent-window medians (busy time, sections, flagged), the job's median
// step time and breakdown, and its nodes' mean busy time and GPU readings.
//
// Sampling and downsampling: a sample is taken when the job's last step advanced since the
// previous one and the sample interval (initially 1 s, the collector's default tick) has passed;
// each sample opens a new column, starting at the step after the previous column's last. When the
// columns reach max_columns, adjacent pairs are merged (sample-weighted means, flagged = OR, steps
// and times = min/max) and the interval doubles, so the columns keep spanning the whole job evenly.
//
// Bounds: max_columns columns; rows for the max_rank_rows lowest rank numbers (the others only
// count in their node's row and in ranks_omitted); per-section rows only while rows x sections x
// max_columns stays within max_section_cells; one row per node of the job. Rows take room for
// every column at their first sample, so bytes() stays put as the columns fill. Not thread-safe:
// its owner (ReportStore) locks.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "analysis/engine.h"
#include "collector/published_state.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::collector {

struct JobTimelineOptions {
  // False: no timelines are recorded (ReportStore samples none).
  bool enabled = true;
  // At least 2 (a merge must leave room for the next column).
  int max_columns = 100;
  int max_rank_rows = 1024;
  int64_t max_section_cells = 200'000;
  int64_t initial_sample_interval_nanos = 1'000'000'000;
};

// One sample of a job, built from the published state outside every lock (the pass over all of
// the job's ranks happens here), then recorded by JobTimeline::Add.
struct TimelineSample {
  struct Rank {
    int rank = 0;
    std::string node;
    int gpu = -1;
    int pp_stage = -1;
    float busy_seconds = 0;
    bool flagged = false;
    // By TimelineSample::section_names; -1 where the rank has no value.
    std::vector<float> section_seconds;
  };
  struct Node {
    std::string node;
    int ranks = 0;
    // Mean over the node's ranks (all of them); GPU readings' means, -1 when unknown.
    float busy_seconds = -1;
    float gpu_utilization_ratio = -1;
    float sm_active_ratio = -1;
  };
  int64_t unix_nanos = 0;
  int64_t last_step = -1;
  double step_seconds = 0;
  bool split_known = false;
  double efficiency_ratio = 0;
  analysis::TimeBreakdown breakdown;
  std::vector<std::string> section_names;
  // The max_rank_rows lowest-numbered ranks, by rank; ranks_total counts every rank.
  std::vector<Rank> ranks;
  int ranks_total = 0;
  // By node name.
  std::vector<Node> nodes;
};

// A sample of `job` from its rank rows and the nodes (`nodes` ordered by name, as
// StateSnapshot::nodes): each node's GPU readings are the means over its GPUs' last samples.
TimelineSample MakeTimelineSample(const analysis::JobSnapshot& job,
                                  const std::vector<analysis::RankSnapshot>& ranks,
                                  const std::vector<NodeSnapshot>& nodes, int max_rank_rows,
                                  int64_t now_unix_nanos);

class JobTimeline {
 public:
  JobTimeline() : JobTimeline(JobTimelineOptions{}) {}
  explicit JobTimeline(JobTimelineOptions options);
  // Continues a timeline saved in a report (a restarted collector), brought within `options`.
  static JobTimeline FromProto(const v1::ReportTimeline& saved, JobTimelineOptions options);

  // Whether a sample at `last_step` and `now` is due (the step advanced, the interval passed).
  bool Due(int64_t last_step, int64_t now_unix_nanos) const;
  // Records a due sample. The first column starts at `job_first_step` and `job_start_unix_nanos`
  // (when known), later ones where the previous column ended.
  void Add(const TimelineSample& sample, int64_t job_first_step, int64_t job_start_unix_nanos);
  // Due, then MakeTimelineSample and Add; true when a sample was taken.
  bool Sample(const analysis::JobSnapshot& job, const std::vector<analysis::RankSnapshot>& ranks,
              const std::vector<NodeSnapshot>& nodes, int64_t now_unix_nanos,
              int64_t job_first_step = -1, int64_t job_start_unix_nanos = 0);
  // The job ended: its last column extends to its last step and end time.
  void Close(int64_t last_step, int64_t end_unix_nanos);

  void ToProto(v1::ReportTimeline* out) const;
  bool empty() const { return columns_.empty(); }
  int columns() const { return static_cast<int>(columns_.size()); }
  int64_t samples() const { return samples_; }
  int64_t sample_interval_nanos() const { return interval_nanos_; }
  // Approximate memory held (charged against the collector's memory budget).
  int64_t bytes() const { return bytes_; }
  // At least bytes() once `sample` is added (its new rows and nodes take room for every column at
  // once): what is checked against the room left in the memory budget before adding it.
  int64_t BytesWith(const TimelineSample& sample) const;
  const JobTimelineOptions& options() const { return options_; }

 private:
  struct Column {
    int64_t first_step = 0;
    int64_t last_step = 0;
    int64_t start_unix_nanos = 0;
    int64_t end_unix_nanos = 0;
    int samples = 1;
    double step_seconds = 0;  // 0: unknown
    bool split_known = false;
    double efficiency_ratio = 0;
    analysis::TimeBreakdown breakdown;
  };
  struct RankRow {
    std::string node;
    int gpu = -1;
    int pp_stage = -1;
    std::vector<float> busy;
    std::vector<uint8_t> flagged;
    // section_seconds[s][c], s by section_names_.
    std::vector<std::vector<float>> sections;
  };
  struct NodeRow {
    int ranks = 0;
    std::vector<float> busy;
    std::vector<float> gpu_utilization;
    std::vector<float> sm_active;
  };

  // Merges adjacent column pairs (and every row's values alike) and doubles the interval.
  void MergePairs();
  // Rows for the sample's ranks (the lowest rank numbers win), and the sections' names.
  void AdmitRanks(const TimelineSample& sample);
  void AdmitSections(const TimelineSample& sample);
  // Pads every row to the columns (-1, not flagged) and recomputes bytes_.
  void PadRows();
  void Recount();

  JobTimelineOptions options_;
  std::vector<Column> columns_;
  std::map<int, RankRow> ranks_;
  std::map<std::string, NodeRow> nodes_;
  std::vector<std::string> section_names_;
  // Set once rows x sections x max_columns exceeded max_section_cells: stays off.
  bool sections_off_ = false;
  int ranks_omitted_ = 0;
  int64_t samples_ = 0;
  int64_t interval_nanos_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace stepwatch::collector
