#include "collector/published_state.h"

#include <algorithm>
#include <iterator>

#include "collector/state.h"

namespace stepwatch::collector {
namespace {

// Rank rows built per hold of the ingest mutex (see AdvanceExpireAndPublish).
constexpr int kRankRowsPerHold = 4096;
// Rank rows (four medians over every rank's window) cost about 3 us per rank: rebuilt at every
// tick while that is under kRankRowsAlwaysRebuildNanos, else once kRankRowsCostMultiple times
// their cost has passed, so that they take at most ~5% of a core (100,000 ranks: every ~6 s).
constexpr int64_t kRankRowsAlwaysRebuildNanos = 5'000'000;
constexpr int64_t kRankRowsCostMultiple = 20;

}  // namespace

int64_t NanosSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              start)
      .count();
}

std::map<std::string, InvolvedNode> InvolvedNodes(const std::vector<analysis::Finding>& findings) {
  std::map<std::string, InvolvedNode> out;
  for (const analysis::Finding& f : findings) {
    if (!f.node.empty()) {
      InvolvedNode& n = out[f.node];
      if (f.gpu >= 0) {
        n.gpus.insert(f.gpu);
      } else {
        n.every_gpu = true;
      }
    }
    for (const analysis::DeviceEvidence& d : f.evidence.devices) {
      if (d.node.empty()) continue;
      InvolvedNode& n = out[d.node];
      if (d.gpu >= 0) n.gpus.insert(d.gpu);
    }
  }
  return out;
}

void IndexView(PublishedState* view) {
  const StateSnapshot& s = view->snapshot;
  for (const analysis::Finding& f : s.findings) ++view->findings_per_job[f.job];
  // Sorted once per tick so that no scrape scans every node.
  view->nodes_by_last_seen.resize(s.nodes.size());
  for (size_t i = 0; i < s.nodes.size(); ++i) view->nodes_by_last_seen[i] = i;
  std::sort(view->nodes_by_last_seen.begin(), view->nodes_by_last_seen.end(),
            [&nodes = s.nodes](uint32_t a, uint32_t b) {
              return nodes[a].last_seen_unix_nanos < nodes[b].last_seen_unix_nanos;
            });
}

void SelectRankSeries(int top_ranks_per_job, int max_rank_series, PublishedState* view) {
  const auto slower = [](const analysis::RankSnapshot* a, const analysis::RankSnapshot* b) {
    if (a->busy_vs_median_ratio != b->busy_vs_median_ratio) {
      return a->busy_vs_median_ratio > b->busy_vs_median_ratio;
    }
    return a->rank < b->rank;
  };
  const std::vector<analysis::JobSnapshot>& jobs = view->snapshot.jobs;
  auto* out = &view->snapshot.top_ranks;
  const size_t cap = static_cast<size_t>(std::max(0, max_rank_series));
  const size_t top_k = static_cast<size_t>(std::max(0, top_ranks_per_job));
  // Flagged ranks of every job come first, so that the cap never hides a verdict behind a merely
  // slow rank; then each job's slowest unflagged ranks.
  std::vector<std::vector<const analysis::RankSnapshot*>> rest(jobs.size());
  uint64_t dropped = 0;
  std::vector<const analysis::RankSnapshot*> ranks;
  for (size_t j = 0; j < jobs.size(); ++j) {
    auto found = view->ranks.find(jobs[j].job);
    if (found == view->ranks.end()) continue;
    ranks.clear();
    for (const analysis::RankSnapshot& r : *found->second) ranks.push_back(&r);
    std::sort(ranks.begin(), ranks.end(), slower);
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (ranks[i]->straggler) {
        if (out->size() < cap) {
          out->emplace_back(jobs[j].job, *ranks[i]);
        } else {
          ++dropped;
        }
      } else if (i < top_k) {
        rest[j].push_back(ranks[i]);
      }
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    for (const analysis::RankSnapshot* r : rest[j]) {
      if (out->size() < cap) {
        out->emplace_back(jobs[j].job, *r);
      } else {
        ++dropped;
      }
    }
  }
  view->rank_series_dropped = dropped;
}

StateSnapshot CopySnapshot(const PublishedState& view, NodeScope scope, int64_t now) {
  const StateSnapshot& published = view.snapshot;
  if (scope == NodeScope::kAll) return published;
  StateSnapshot s;
  // Everything but the nodes (bounded by the jobs, findings and rank-series limits), then the
  // nodes involved: the copy costs what the scrape exports, not the fleet.
  s.node_down_nanos = published.node_down_nanos;
  s.jobs = published.jobs;
  s.findings = published.findings;
  s.top_ranks = published.top_ranks;
  s.nodes_tracked = published.nodes_tracked;
  s.memory_budget_bytes = published.memory_budget_bytes;
  s.detector_timings = published.detector_timings;
  s.rank_pods = published.rank_pods;
  std::vector<uint32_t> picked;
  const std::vector<NodeSnapshot>& nodes = published.nodes;
  for (const auto& [name, involved] : InvolvedNodes(published.findings)) {
    auto it = std::lower_bound(
        nodes.begin(), nodes.end(), name,
        [](const NodeSnapshot& n, const std::string& key) { return n.node < key; });
    if (it != nodes.end() && it->node == name) picked.push_back(it - nodes.begin());
  }
  for (uint32_t i : view.nodes_by_last_seen) {
    if (now - nodes[i].last_seen_unix_nanos <= published.node_down_nanos) break;
    picked.push_back(i);
  }
  std::sort(picked.begin(), picked.end());
  picked.erase(std::unique(picked.begin(), picked.end()), picked.end());
  s.nodes.reserve(picked.size());
  for (uint32_t i : picked) s.nodes.push_back(nodes[i]);
  return s;
}

void CollectorState::PublishRankRows(PublishedState* view) {
  const auto start = std::chrono::steady_clock::now();
  const bool rebuild =
      rank_rows_cost_nanos_ < kRankRowsAlwaysRebuildNanos ||
      NanosSince(rank_rows_built_at_) >= kRankRowsCostMultiple * rank_rows_cost_nanos_;
  const std::shared_ptr<const PublishedState> previous = Published();
  bool built_any = false;
  view->ranks.reserve(view->snapshot.jobs.size());
  for (const analysis::JobSnapshot& j : view->snapshot.jobs) {
    if (!rebuild) {
      if (auto it = previous->ranks.find(j.job); it != previous->ranks.end()) {
        view->ranks.emplace(j.job, it->second);
        continue;
      }
    }
    // Rows are what a tick costs most at scale: 100,000 ranks take longer than ingest may wait.
    // They are built in slices, each under the mutex on its own, so ingest waits at most one
    // slice; rows of one job may then be a few slices apart.
    auto rows = std::make_shared<std::vector<analysis::RankSnapshot>>();
    for (int first = 0; first < j.world_size; first += kRankRowsPerHold) {
      const auto slice_at = std::chrono::steady_clock::now();
      std::vector<analysis::RankSnapshot> slice;
      {
        absl::MutexLock lock(&mu_);
        slice = engine_.Ranks(j.job, first, first + kRankRowsPerHold);
      }
      const int64_t held = NanosSince(slice_at);
      view->rank_rows_locked_nanos += held;
      view->longest_hold_nanos = std::max(view->longest_hold_nanos, held);
      rows->insert(rows->end(), std::make_move_iterator(slice.begin()),
                   std::make_move_iterator(slice.end()));
    }
    view->ranks.emplace(j.job, std::move(rows));
    built_any = true;
  }
  const auto unlocked_at = std::chrono::steady_clock::now();
  if (built_any || view->ranks.size() != previous->ranks.size()) {
    SelectRankSeries(options_.top_ranks_per_job, options_.max_rank_series, view);
  } else {
    view->snapshot.top_ranks = previous->snapshot.top_ranks;
    view->rank_series_dropped = previous->rank_series_dropped;
  }
  view->build_unlocked_nanos = NanosSince(unlocked_at);
  view->rank_rows_rebuilt = rebuild;
  if (rebuild) {
    rank_rows_built_at_ = start;
    rank_rows_cost_nanos_ = NanosSince(start);
  }
}

}  // namespace stepwatch::collector
