// The step window: how rank samples become entries of a pending step, how a complete step is
// summarised for the job, and what the window of summaries says about where the time goes
// (breakdown, efficiency, what-ifs).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "analysis/engine.h"
#include "analysis/ring.h"

namespace stepwatch::analysis {

// One rank's contribution to one step, reduced to what the detectors need.
struct Entry {
  int rank = 0;
  int64_t group = -1;  // (pp_stage, tp_rank) peer group; -1: all ranks are peers
  int pp_stage = -1;
  double step_seconds = 0;
  double busy = 0;
  double compute = 0;
  double data = 0;
  double wait = 0;
  int64_t samples = -1;
  bool split = false;          // data_seconds or compute_seconds reported
  bool step_only = false;      // nothing but step_seconds: the GPU's SM activity may tell the split
  bool stale = false;          // split taken from a GPU reading already used: no new evidence
  bool unknown_split = false;  // step_only with no SM activity: busy is the step, not evidence
  bool forgotten = false;      // its rank was removed (RemoveNode) after it reported
  // Named sections: `sections_count` values of Pending::sections from `sections_begin`, ordered
  // by section index. Kept beside the entries, which stay small and cheap to sort.
  uint32_t sections_begin = 0;
  uint8_t sections_count = 0;
};

// One named section's value in one rank's step: its index in the job's section names.
struct EntrySection {
  uint8_t index = 0;
  float seconds = 0;
  bool operator<(const EntrySection& o) const { return index < o.index; }
};

// A step some ranks reported, not complete yet.
struct Pending {
  int64_t first_nanos = 0;
  int64_t last_nanos = 0;
  std::vector<Entry> entries;
  std::vector<EntrySection> sections;  // the entries' named sections (Entry::sections_begin)
};

// One rank's split of one complete step (its history, for RankSnapshot).
struct StepVals {
  float busy = 0, compute = 0, data = 0, comm = 0;
};

// One complete step of a job.
struct StepSummary {
  int64_t step = 0;
  int64_t nanos = 0;
  double step_seconds = 0;
  double med_busy = 0;
  double max_busy = 0;
  double exposed_comm = 0;
  double med_data = 0;
  double samples = -1;       // summed over ranks, -1 when not reported
  bool split_known = false;  // some rank's split was reported or inferred from SM activity
  // What-ifs of this step (FillWindowFigures sums them): how much earlier the step would end,
  // seconds, with the stragglers fixed, the collective hidden behind compute, no data waits, the
  // pipeline stages balanced. See WhatIfGains in window.cc.
  double gain_stragglers = 0;
  double gain_overlap = 0;
  double gain_data = 0;
  double gain_pipeline = 0;
  bool stragglers_bound = false;  // a peer group of 2: every rank as fast as the faster
  bool pipeline = false;          // ranks of two or more pipeline stages reported
};

// The entry of a valid sample; `pp_stage` is the rank's stage (-1 when none).
Entry MakeEntry(const StepEvent& s);

class RankTable;

// Summarises the entries of one complete step (non-empty) of a job of `world_size` ranks. With
// `ranks` (the job's, holding each rank's history before this step), the what-ifs tell a
// straggler from one step's noise by each rank's recent busy level (WhatIfGains in window.cc);
// without, by this step's busy times alone.
StepSummary Summarize(int64_t step, int64_t nanos, const std::vector<Entry>& es, int world_size,
                      std::vector<double>* scratch, const RankTable* ranks = nullptr);

// Fills the window figures of a snapshot: median step, rates, split_known, breakdown,
// efficiency and what-ifs.
void FillWindowFigures(const Ring<StepSummary>& summaries, JobSnapshot* s);

// The median step time over the window (0 when empty).
double MedianStep(const Ring<StepSummary>& summaries, std::vector<double>* scratch);

}  // namespace stepwatch::analysis
