#include "collector/job_timeline.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace stepwatch::collector {
namespace {

constexpr const char* kComponents[] = {"compute", "imbalance", "comm", "data", "other"};
// What a std::map node costs beside its value (pointers and colour), for bytes().
constexpr int64_t kMapNodeBytes = 32;

double* Component(analysis::TimeBreakdown* b, int i) {
  double* parts[] = {&b->compute, &b->imbalance, &b->comm, &b->data, &b->other};
  return parts[i];
}

// The sample-weighted mean of two values, either unknown (below zero, or not above it when
// `zero_unknown`): the known one alone.
double Mean(double a, int wa, double b, int wb, bool zero_unknown = false) {
  const bool known_a = zero_unknown ? a > 0 : a >= 0;
  const bool known_b = zero_unknown ? b > 0 : b >= 0;
  if (!known_a) return b;
  if (!known_b) return a;
  return (a * wa + b * wb) / (wa + wb);
}

// Pairs (2i, 2i+1) of `v` into i, weighted by the columns' samples `w`; an odd last stays.
template <typename T, typename Combine>
void MergeInPlace(const std::vector<int>& w, std::vector<T>* v, Combine combine) {
  const size_t n = v->size();
  for (size_t i = 0; 2 * i < n; ++i) {
    const size_t a = 2 * i;
    (*v)[i] = a + 1 < n ? combine((*v)[a], w[a], (*v)[a + 1], w[a + 1]) : (*v)[a];
  }
  v->resize((n + 1) / 2);
}

void MergeValues(const std::vector<int>& w, std::vector<float>* v) {
  MergeInPlace(w, v, [](float a, int wa, float b, int wb) {
    return static_cast<float>(Mean(a, wa, b, wb));
  });
}

template <typename T>
int64_t VectorBytes(const std::vector<T>& v) {
  return static_cast<int64_t>(sizeof(v) + v.capacity() * sizeof(T));
}

float MeanOrUnknown(double sum, int n) { return n > 0 ? static_cast<float>(sum / n) : -1.0f; }

}  // namespace

TimelineSample MakeTimelineSample(const analysis::JobSnapshot& job,
                                  const std::vector<analysis::RankSnapshot>& ranks,
                                  const std::vector<NodeSnapshot>& nodes, int max_rank_rows,
                                  int64_t now) {
  TimelineSample s;
  s.unix_nanos = now;
  s.last_step = job.last_step;
  s.step_seconds = job.median_step_seconds > 0 ? job.median_step_seconds : 0;
  s.split_known = job.split_known;
  s.efficiency_ratio = job.efficiency_ratio;
  s.breakdown = job.breakdown;
  s.section_names = job.section_names;
  s.ranks_total = static_cast<int>(ranks.size());

  std::vector<const analysis::RankSnapshot*> order;
  order.reserve(ranks.size());
  for (const analysis::RankSnapshot& r : ranks) order.push_back(&r);
  const size_t keep = std::min(order.size(), static_cast<size_t>(std::max(0, max_rank_rows)));
  std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                    [](const auto* a, const auto* b) { return a->rank < b->rank; });
  s.ranks.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    const analysis::RankSnapshot& r = *order[i];
    TimelineSample::Rank& out = s.ranks.emplace_back();
    out.rank = r.rank;
    out.node = r.node;
    out.gpu = r.gpu;
    out.pp_stage = r.pp_stage;
    out.busy_seconds = static_cast<float>(r.busy_seconds);
    out.flagged = r.straggler;
    out.section_seconds.assign(job.section_names.size(), -1.0f);
    for (size_t k = 0; k < job.section_names.size(); ++k) {
      // The rank's sections follow the job's order: the same position first, else by name.
      const std::string& name = job.section_names[k];
      auto found = k < r.sections.size() && r.sections[k].name == name
                       ? r.sections.begin() + k
                       : std::find_if(r.sections.begin(), r.sections.end(),
                                      [&name](const auto& m) { return m.name == name; });
      if (found != r.sections.end()) out.section_seconds[k] = static_cast<float>(found->seconds);
    }
  }

  // Every rank counts in its node's mean, rows or not.
  absl::flat_hash_map<absl::string_view, std::pair<int, double>> per_node;
  for (const analysis::RankSnapshot& r : ranks) {
    if (r.node.empty()) continue;
    auto& [count, busy] = per_node[r.node];
    ++count;
    busy += r.busy_seconds;
  }
  s.nodes.reserve(per_node.size());
  for (const auto& [name, totals] : per_node) {
    TimelineSample::Node& n = s.nodes.emplace_back();
    n.node = std::string(name);
    n.ranks = totals.first;
    n.busy_seconds = MeanOrUnknown(totals.second, totals.first);
  }
  std::sort(s.nodes.begin(), s.nodes.end(),
            [](const auto& a, const auto& b) { return a.node < b.node; });
  for (TimelineSample::Node& n : s.nodes) {
    auto it = std::lower_bound(
        nodes.begin(), nodes.end(), n.node,
        [](const NodeSnapshot& v, const std::string& key) { return v.node < key; });
    if (it == nodes.end() || it->node != n.node) continue;
    double util = 0, sm = 0;
    int util_n = 0, sm_n = 0;
    for (const v1::GpuSample& g : it->gpus) {
      if (g.has_utilization_gpu_ratio()) {
        util += g.utilization_gpu_ratio();
        ++util_n;
      }
      if (g.has_sm_activity_ratio()) {
        sm += g.sm_activity_ratio();
        ++sm_n;
      }
    }
    n.gpu_utilization_ratio = MeanOrUnknown(util, util_n);
    n.sm_active_ratio = MeanOrUnknown(sm, sm_n);
  }
  return s;
}

JobTimeline::JobTimeline(JobTimelineOptions options) : options_(options) {
  options_.max_columns = std::max(2, options_.max_columns);
  options_.max_rank_rows = std::max(0, options_.max_rank_rows);
  options_.initial_sample_interval_nanos =
      std::max<int64_t>(0, options_.initial_sample_interval_nanos);
  interval_nanos_ = options_.initial_sample_interval_nanos;
  Recount();
}

bool JobTimeline::Due(int64_t last_step, int64_t now) const {
  if (columns_.empty()) return last_step >= 0;
  const Column& last = columns_.back();
  return last_step > last.last_step && now - last.end_unix_nanos >= interval_nanos_;
}

bool JobTimeline::Sample(const analysis::JobSnapshot& job,
                         const std::vector<analysis::RankSnapshot>& ranks,
                         const std::vector<NodeSnapshot>& nodes, int64_t now,
                         int64_t job_first_step, int64_t job_start_unix_nanos) {
  if (!Due(job.last_step, now)) return false;
  Add(MakeTimelineSample(job, ranks, nodes, options_.max_rank_rows, now), job_first_step,
      job_start_unix_nanos);
  return true;
}

void JobTimeline::Add(const TimelineSample& s, int64_t job_first_step,
                      int64_t job_start_unix_nanos) {
  if (static_cast<int>(columns_.size()) >= options_.max_columns) MergePairs();
  if (columns_.capacity() < static_cast<size_t>(options_.max_columns)) {
    columns_.reserve(options_.max_columns);
  }
  Column c;
  if (columns_.empty()) {
    c.first_step =
        job_first_step >= 0 && job_first_step <= s.last_step ? job_first_step : s.last_step;
    c.start_unix_nanos = job_start_unix_nanos > 0 && job_start_unix_nanos <= s.unix_nanos
                             ? job_start_unix_nanos
                             : s.unix_nanos;
  } else {
    // Columns are contiguous: this one holds the steps since the previous sample.
    const Column& prev = columns_.back();
    c.first_step = std::min(prev.last_step + 1, s.last_step);
    c.start_unix_nanos = std::min(prev.end_unix_nanos, s.unix_nanos);
  }
  c.last_step = s.last_step;
  c.end_unix_nanos = s.unix_nanos;
  c.samples = 1;
  c.step_seconds = s.step_seconds;
  c.split_known = s.split_known;
  c.efficiency_ratio = s.efficiency_ratio;
  c.breakdown = s.breakdown;
  columns_.push_back(c);
  ++samples_;

  AdmitRanks(s);
  for (const TimelineSample::Node& n : s.nodes) nodes_.try_emplace(n.node);
  AdmitSections(s);
  PadRows();

  // The sample's section positions in section_names_.
  std::vector<int> section_at(s.section_names.size(), -1);
  for (size_t k = 0; k < s.section_names.size(); ++k) {
    auto it = std::find(section_names_.begin(), section_names_.end(), s.section_names[k]);
    if (it != section_names_.end()) section_at[k] = static_cast<int>(it - section_names_.begin());
  }
  int with_row = 0;
  for (const TimelineSample::Rank& r : s.ranks) {
    auto it = ranks_.find(r.rank);
    if (it == ranks_.end()) continue;
    ++with_row;
    RankRow& row = it->second;
    row.node = r.node;
    row.gpu = r.gpu;
    row.pp_stage = r.pp_stage;
    row.busy.back() = r.busy_seconds;
    row.flagged.back() = r.flagged ? 1 : 0;
    for (size_t k = 0; k < section_at.size() && k < r.section_seconds.size(); ++k) {
      if (section_at[k] >= 0) row.sections[section_at[k]].back() = r.section_seconds[k];
    }
  }
  ranks_omitted_ = std::max(0, s.ranks_total - with_row);
  for (const TimelineSample::Node& n : s.nodes) {
    NodeRow& row = nodes_.at(n.node);
    row.ranks = n.ranks;
    row.busy.back() = n.busy_seconds;
    row.gpu_utilization.back() = n.gpu_utilization_ratio;
    row.sm_active.back() = n.sm_active_ratio;
  }
  Recount();
}

void JobTimeline::AdmitRanks(const TimelineSample& s) {
  const size_t cap = static_cast<size_t>(options_.max_rank_rows);
  for (const TimelineSample::Rank& r : s.ranks) {
    if (ranks_.count(r.rank) > 0) continue;
    if (ranks_.size() >= cap) {
      // The lowest rank numbers keep rows: a lower one joining late takes the highest's.
      if (cap == 0 || std::prev(ranks_.end())->first < r.rank) continue;
      ranks_.erase(std::prev(ranks_.end()));
    }
    ranks_.try_emplace(r.rank);
  }
}

void JobTimeline::AdmitSections(const TimelineSample& s) {
  if (sections_off_) return;
  for (const std::string& name : s.section_names) {
    if (std::find(section_names_.begin(), section_names_.end(), name) == section_names_.end()) {
      section_names_.push_back(name);
    }
  }
  if (section_names_.empty()) return;
  const int64_t cells = static_cast<int64_t>(ranks_.size()) *
                        static_cast<int64_t>(section_names_.size()) * options_.max_columns;
  if (cells <= options_.max_section_cells) return;
  // Too large a job for per-section rows: none at all, rather than some of them.
  sections_off_ = true;
  section_names_.clear();
  for (auto& [rank, row] : ranks_) std::vector<std::vector<float>>().swap(row.sections);
}

void JobTimeline::PadRows() {
  const size_t n = columns_.size();
  // Room for every column at once: bytes() then stays put as the columns fill.
  const size_t cols = static_cast<size_t>(options_.max_columns);
  const auto pad = [n, cols](auto* v, auto fill) {
    if (v->capacity() < cols) v->reserve(cols);
    v->resize(n, fill);
  };
  for (auto& [rank, row] : ranks_) {
    pad(&row.busy, -1.0f);
    pad(&row.flagged, uint8_t{0});
    // Exactly as many as there are names (no doubling): what BytesWith counts.
    if (row.sections.capacity() < section_names_.size()) {
      row.sections.reserve(section_names_.size());
    }
    row.sections.resize(section_names_.size());
    for (std::vector<float>& v : row.sections) pad(&v, -1.0f);
  }
  for (auto& [name, row] : nodes_) {
    for (std::vector<float>* v : {&row.busy, &row.gpu_utilization, &row.sm_active}) pad(v, -1.0f);
  }
}

void JobTimeline::MergePairs() {
  std::vector<int> w(columns_.size());
  for (size_t i = 0; i < columns_.size(); ++i) w[i] = columns_[i].samples;
  MergeInPlace(w, &columns_, [](const Column& a, int wa, const Column& b, int wb) {
    Column m;
    m.first_step = std::min(a.first_step, b.first_step);
    m.last_step = std::max(a.last_step, b.last_step);
    m.start_unix_nanos = std::min(a.start_unix_nanos, b.start_unix_nanos);
    m.end_unix_nanos = std::max(a.end_unix_nanos, b.end_unix_nanos);
    m.samples = wa + wb;
    m.step_seconds = Mean(a.step_seconds, wa, b.step_seconds, wb, /*zero_unknown=*/true);
    m.split_known = a.split_known || b.split_known;
    if (a.split_known && b.split_known) {
      m.efficiency_ratio = (a.efficiency_ratio * wa + b.efficiency_ratio * wb) / (wa + wb);
      analysis::TimeBreakdown ab = a.breakdown, bb = b.breakdown;
      for (int i = 0; i < 5; ++i) {
        *Component(&m.breakdown, i) =
            (*Component(&ab, i) * wa + *Component(&bb, i) * wb) / (wa + wb);
      }
    } else {
      const Column& known = a.split_known ? a : b;
      m.efficiency_ratio = known.efficiency_ratio;
      m.breakdown = known.breakdown;
    }
    return m;
  });
  for (auto& [rank, row] : ranks_) {
    MergeValues(w, &row.busy);
    MergeInPlace(w, &row.flagged, [](uint8_t a, int, uint8_t b, int) -> uint8_t { return a | b; });
    for (std::vector<float>& v : row.sections) MergeValues(w, &v);
  }
  for (auto& [name, row] : nodes_) {
    MergeValues(w, &row.busy);
    MergeValues(w, &row.gpu_utilization);
    MergeValues(w, &row.sm_active);
  }
  // Half as many columns for the same span: samples half as often keep them even. At most a day
  // apart: a job older than 100 days gets columns of more samples instead, and times stay far
  // from overflow.
  constexpr int64_t kMaxIntervalNanos = 86'400'000'000'000;
  interval_nanos_ = std::min(kMaxIntervalNanos, std::max<int64_t>(1, interval_nanos_ * 2));
}

void JobTimeline::Close(int64_t last_step, int64_t end_unix_nanos) {
  if (columns_.empty()) return;
  Column& last = columns_.back();
  last.last_step = std::max(last.last_step, last_step);
  last.end_unix_nanos = std::max(last.end_unix_nanos, end_unix_nanos);
}

int64_t JobTimeline::BytesWith(const TimelineSample& s) const {
  const int64_t cols = options_.max_columns;
  // Generous per row and node: map node, strings (with their slack) and every column reserved.
  const auto text = [](size_t n) { return static_cast<int64_t>(2 * std::max<size_t>(n, 15) + 32); };
  const int64_t series = static_cast<int64_t>(sizeof(std::vector<float>)) + cols * 4;
  int64_t b = bytes_ > 0 ? bytes_ : static_cast<int64_t>(sizeof(*this) + sizeof(Column) * cols);
  size_t sections = section_names_.size();
  if (!sections_off_) {
    for (const std::string& name : s.section_names) {
      if (std::find(section_names_.begin(), section_names_.end(), name) == section_names_.end()) {
        b += text(name.size());
        ++sections;
      }
    }
    b += static_cast<int64_t>(sections - section_names_.size()) *
         static_cast<int64_t>(ranks_.size()) * series;
  }
  const int64_t row = kMapNodeBytes + 2 * static_cast<int64_t>(sizeof(RankRow)) + 2 * series +
                      static_cast<int64_t>(sections) * series;
  size_t rows = ranks_.size();
  for (const TimelineSample::Rank& r : s.ranks) {
    if (rows >= static_cast<size_t>(options_.max_rank_rows)) break;
    if (ranks_.count(r.rank) == 0) {
      b += row + text(r.node.size());
      ++rows;
    }
  }
  for (const TimelineSample::Node& n : s.nodes) {
    if (nodes_.count(n.node) == 0) {
      b += kMapNodeBytes + 2 * static_cast<int64_t>(sizeof(NodeRow)) + 3 * series +
           text(n.node.size());
    }
  }
  return b;
}

void JobTimeline::Recount() {
  // Nothing recorded: nothing beyond its owner's own record to charge.
  if (columns_.empty() && ranks_.empty() && nodes_.empty()) {
    bytes_ = 0;
    return;
  }
  int64_t b = sizeof(*this) + VectorBytes(columns_);
  for (const std::string& name : section_names_) b += sizeof(std::string) + name.capacity();
  for (const auto& [rank, row] : ranks_) {
    b += kMapNodeBytes + sizeof(rank) + sizeof(row) + row.node.capacity();
    b += VectorBytes(row.busy) + VectorBytes(row.flagged) + VectorBytes(row.sections);
    for (const std::vector<float>& v : row.sections) {
      b += VectorBytes(v) - static_cast<int64_t>(sizeof(std::vector<float>));
    }
  }
  for (const auto& [name, row] : nodes_) {
    b += kMapNodeBytes + sizeof(std::string) + name.capacity() + sizeof(row);
    b += VectorBytes(row.busy) + VectorBytes(row.gpu_utilization) + VectorBytes(row.sm_active);
  }
  bytes_ = b;
}

void JobTimeline::ToProto(v1::ReportTimeline* out) const {
  out->Clear();
  const int n = static_cast<int>(columns_.size());
  for (const Column& c : columns_) {
    v1::TimelineColumn* p = out->add_columns();
    p->set_first_step(c.first_step);
    p->set_last_step(c.last_step);
    p->set_start_unix_nanos(c.start_unix_nanos);
    p->set_end_unix_nanos(c.end_unix_nanos);
    p->set_samples(c.samples);
    p->set_step_seconds(c.step_seconds);
    if (c.split_known) {
      p->set_efficiency_ratio(c.efficiency_ratio);
      analysis::TimeBreakdown b = c.breakdown;
      for (int i = 0; i < 5; ++i) (*p->mutable_time_ratio())[kComponents[i]] = *Component(&b, i);
    }
  }
  for (const auto& [rank, row] : ranks_) {
    v1::RankSeries* p = out->add_ranks();
    p->set_rank(rank);
    p->set_node(row.node);
    p->set_gpu(row.gpu);
    p->set_pp_stage(row.pp_stage);
    p->mutable_busy_seconds()->Reserve(n);
    for (float v : row.busy) p->add_busy_seconds(v);
    p->mutable_flagged()->Reserve(n);
    for (uint8_t f : row.flagged) p->add_flagged(f != 0);
    p->mutable_section_seconds()->Reserve(n * static_cast<int>(row.sections.size()));
    for (const std::vector<float>& v : row.sections) {
      for (float x : v) p->add_section_seconds(x);
    }
  }
  for (const auto& [name, row] : nodes_) {
    v1::NodeSeries* p = out->add_nodes();
    p->set_node(name);
    p->set_ranks(row.ranks);
    for (float v : row.busy) p->add_busy_seconds(v);
    for (float v : row.gpu_utilization) p->add_gpu_utilization_ratio(v);
    for (float v : row.sm_active) p->add_sm_active_ratio(v);
  }
  out->set_ranks_omitted(ranks_omitted_);
  for (const std::string& name : section_names_) out->add_section_names(name);
  out->set_samples(samples_);
  out->set_sample_interval_nanos(interval_nanos_);
}

JobTimeline JobTimeline::FromProto(const v1::ReportTimeline& saved, JobTimelineOptions options) {
  JobTimeline t(options);
  const size_t n = static_cast<size_t>(saved.columns_size());
  t.columns_.reserve(std::max(n, static_cast<size_t>(t.options_.max_columns)));
  for (const v1::TimelineColumn& p : saved.columns()) {
    Column& c = t.columns_.emplace_back();
    c.first_step = p.first_step();
    c.last_step = p.last_step();
    c.start_unix_nanos = p.start_unix_nanos();
    c.end_unix_nanos = p.end_unix_nanos();
    c.samples = std::max(1, p.samples());
    c.step_seconds = p.step_seconds() > 0 ? p.step_seconds() : 0;
    c.split_known = p.has_efficiency_ratio();
    c.efficiency_ratio = p.efficiency_ratio();
    for (int i = 0; i < 5; ++i) {
      auto it = p.time_ratio().find(kComponents[i]);
      if (it != p.time_ratio().end()) *Component(&c.breakdown, i) = it->second;
    }
  }
  for (const std::string& name : saved.section_names()) t.section_names_.push_back(name);
  const size_t sections = t.section_names_.size();
  for (const v1::RankSeries& p : saved.ranks()) {
    RankRow& row = t.ranks_[p.rank()];
    row.node = p.node();
    row.gpu = p.gpu();
    row.pp_stage = p.pp_stage();
    row.busy.assign(p.busy_seconds().begin(), p.busy_seconds().end());
    row.flagged.assign(p.flagged().begin(), p.flagged().end());
    row.busy.resize(n, -1.0f);
    row.flagged.resize(n, 0);
    row.sections.assign(sections, std::vector<float>(n, -1.0f));
    if (static_cast<size_t>(p.section_seconds_size()) == sections * n) {
      for (size_t s = 0; s < sections; ++s) {
        std::copy(p.section_seconds().begin() + s * n, p.section_seconds().begin() + (s + 1) * n,
                  row.sections[s].begin());
      }
    }
  }
  int dropped_rows = 0;
  while (t.ranks_.size() > static_cast<size_t>(t.options_.max_rank_rows)) {
    t.ranks_.erase(std::prev(t.ranks_.end()));
    ++dropped_rows;
  }
  for (const v1::NodeSeries& p : saved.nodes()) {
    NodeRow& row = t.nodes_[p.node()];
    row.ranks = p.ranks();
    row.busy.assign(p.busy_seconds().begin(), p.busy_seconds().end());
    row.gpu_utilization.assign(p.gpu_utilization_ratio().begin(), p.gpu_utilization_ratio().end());
    row.sm_active.assign(p.sm_active_ratio().begin(), p.sm_active_ratio().end());
  }
  t.ranks_omitted_ = std::max(0, saved.ranks_omitted()) + dropped_rows;
  t.samples_ = std::max<int64_t>(saved.samples(), static_cast<int64_t>(n));
  t.interval_nanos_ = std::max(saved.sample_interval_nanos(), t.interval_nanos_);
  t.PadRows();
  // A smaller limit than the one it was saved under.
  while (static_cast<int>(t.columns_.size()) > t.options_.max_columns) t.MergePairs();
  if (!t.section_names_.empty() && static_cast<int64_t>(t.ranks_.size()) *
                                           static_cast<int64_t>(t.section_names_.size()) *
                                           t.options_.max_columns >
                                       t.options_.max_section_cells) {
    t.sections_off_ = true;
    t.section_names_.clear();
    for (auto& [rank, row] : t.ranks_) row.sections.clear();
  }
  t.Recount();
  return t;
}

}  // namespace stepwatch::collector
