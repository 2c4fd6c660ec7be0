#include "ctl/format.h"

#include <algorithm>
#include <cmath>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/message.h"

namespace stepwatch::ctl {
namespace {

std::string RankOrDash(int32_t v) { return v < 0 ? "-" : absl::StrCat(v); }

bool Named(const v1::KubernetesPod& pod) {
  return !pod.namespace_().empty() || !pod.pod().empty() || !pod.container().empty();
}

// The job's named sections (its order), then any a row has that the job does not list.
std::vector<std::string> SectionNames(const v1::ExplainResponse& e) {
  std::vector<std::string> names(e.job().section_names().begin(), e.job().section_names().end());
  for (const v1::RankRow& r : e.ranks()) {
    for (const v1::SectionMedian& s : r.sections()) {
      if (std::find(names.begin(), names.end(), s.name()) == names.end()) names.push_back(s.name());
    }
  }
  return names;
}

const v1::SectionMedian* FindSection(const v1::RankRow& r, const std::string& name) {
  for (const v1::SectionMedian& s : r.sections()) {
    if (s.name() == name) return &s;
  }
  return nullptr;
}

// Per-rank section medians, one column per section, each against the median rank's value in that
// section (over every rank of the answer, not only the rows shown).
std::string FormatSections(const v1::ExplainResponse& e,
                           const std::vector<const v1::RankRow*>& shown) {
  const std::vector<std::string> names = SectionNames(e);
  if (names.empty()) return "";
  std::string out =
      "\nSections (per rank: median over recent steps; % = vs the median rank in that section)\n";
  if (shown.empty()) {
    absl::StrAppend(&out, "  ", absl::StrJoin(names, ", "), "\n");
  } else {
    std::vector<double> medians;
    for (const std::string& name : names) {
      std::vector<double> values;
      for (const v1::RankRow& r : e.ranks()) {
        if (const v1::SectionMedian* s = FindSection(r, name)) values.push_back(s->seconds());
      }
      double median = 0;
      if (values.size() >= 2) {
        std::sort(values.begin(), values.end());
        const size_t n = values.size();
        median = n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
      }
      medians.push_back(median);
    }
    std::vector<std::vector<std::string>> rows(1, {" ", "RANK"});
    for (const std::string& name : names) rows[0].push_back(name);
    for (const v1::RankRow* r : shown) {
      std::vector<std::string> row = {r->straggler() ? "!" : " ", absl::StrCat(r->rank())};
      for (size_t i = 0; i < names.size(); ++i) {
        const v1::SectionMedian* s = FindSection(*r, names[i]);
        if (s == nullptr) {
          row.push_back("-");
          continue;
        }
        std::string cell = FormatDuration(s->seconds());
        if (medians[i] > 0) {
          absl::StrAppendFormat(&cell, " (%+.0f%%)", (s->seconds() / medians[i] - 1) * 100);
        }
        row.push_back(std::move(cell));
      }
      rows.push_back(std::move(row));
    }
    out += FormatTable(rows);
  }
  if (e.job().sections_folded() > 0) {
    absl::StrAppend(&out, "  ", e.job().sections_folded(),
                    " section values not kept: a job keeps its first 16 section names\n");
  }
  return out;
}

}  // namespace

std::string FormatDuration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "-";
  if (seconds == 0) return "0";
  if (seconds < 1e-3) return absl::StrFormat("%.0f us", seconds * 1e6);
  if (seconds < 1) return absl::StrFormat("%.1f ms", seconds * 1e3);
  return absl::StrFormat("%.2f s", seconds);
}

std::string FormatPercent(double ratio) {
  if (!std::isfinite(ratio) || ratio < 0) return "-";
  return absl::StrFormat("%.0f%%", ratio * 100);
}

std::string Bar(double fraction, int width) {
  static const char* const kPartial[] = {"", "▏", "▎", "▍", "▌", "▋", "▊", "▉"};
  if (!std::isfinite(fraction) || width <= 0) return "";
  fraction = std::clamp(fraction, 0.0, 1.0);
  const int eighths = static_cast<int>(std::lround(fraction * width * 8));
  std::string out;
  for (int i = 0; i < eighths / 8; ++i) out += "█";
  out += kPartial[eighths % 8];
  return out;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (row.size() > widths.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line;
    out += '\n';
  }
  return out;
}

std::string FormatJobs(const v1::StatusResponse& status) {
  std::string out;
  if (status.jobs().empty()) {
    out += "No jobs reporting.\n";
  } else {
    std::vector<std::vector<std::string>> rows = {{"JOB", "WORLD", "REPORTING", "LAST STEP",
                                                   "STEP TIME", "STEPS/S", "SAMPLES/S",
                                                   "EFFICIENCY", "FINDINGS"}};
    for (const v1::JobStatus& j : status.jobs()) {
      rows.push_back(
          {j.job(), absl::StrCat(j.world_size()), absl::StrCat(j.ranks_reporting()),
           j.last_step() < 0 ? "-" : absl::StrCat(j.last_step()), FormatDuration(j.step_seconds()),
           absl::StrFormat("%.2f", j.steps_per_second()),
           j.samples_per_second() > 0 ? absl::StrFormat("%.0f", j.samples_per_second()) : "-",
           j.efficiency_ratio() > 0 ? FormatPercent(j.efficiency_ratio()) : "-",
           absl::StrCat(j.finding_count())});
    }
    out += FormatTable(rows);
  }
  return out;
}

std::string FormatStatus(const v1::StatusResponse& status, int64_t now_unix_nanos) {
  std::string out = FormatJobs(status);
  out += '\n';
  if (status.nodes().empty()) {
    out += "No nodes reporting.\n";
    return out;
  }
  std::vector<std::vector<std::string>> rows = {{"NODE", "LAST SEEN", "CPU", "GPUS (utilization)"}};
  for (const v1::NodeStatus& n : status.nodes()) {
    const double age_s = (now_unix_nanos - n.last_seen_unix_nanos()) / 1e9;
    std::string gpus;
    if (!n.nvml_available() && n.gpus().empty()) {
      gpus = n.nvml_error().empty() ? "no NVML" : absl::StrCat("no NVML (", n.nvml_error(), ")");
    }
    for (const v1::GpuStatus& g : n.gpus()) {
      if (!gpus.empty()) gpus += ' ';
      absl::StrAppend(
          &gpus, g.index(), ":",
          g.has_utilization_gpu_ratio() ? FormatPercent(g.utilization_gpu_ratio()) : "?");
    }
    rows.push_back({n.node(), absl::StrFormat("%.1fs ago", std::max(0.0, age_s)),
                    n.has_cpu_utilization_ratio() ? FormatPercent(n.cpu_utilization_ratio()) : "-",
                    gpus});
  }
  out += FormatTable(rows);
  return out;
}

std::string FormatFindings(const v1::FindingsResponse& findings) {
  if (findings.findings().empty()) return "No active findings.\n";
  std::vector<std::vector<std::string>> rows = {
      {"SEVERITY", "KIND", "JOB", "RANK", "NODE", "GPU", "SINCE STEP", "CAUSE", "SUMMARY"}};
  std::vector<const v1::KubernetesPod*> pods;
  for (const v1::Finding& f : findings.findings()) {
    rows.push_back({f.severity(), f.kind(), f.job().empty() ? "-" : f.job(), RankOrDash(f.rank()),
                    f.node().empty() ? "-" : f.node(),
                    // A network port's finding names the port where a GPU's names the GPU.
                    f.device().empty() ? RankOrDash(f.gpu()) : f.device(),
                    absl::StrCat(f.since_step(), f.persistent() ? "" : " (transient)"),
                    f.cause().empty() ? "-" : f.cause(), f.summary()});
    pods.push_back(&f.kubernetes_pod());
  }
  AddPodColumns(pods, &rows);
  return FormatTable(rows);
}

std::string PodCell(const v1::KubernetesPod& pod) {
  if (pod.namespace_().empty() && pod.pod().empty()) return "-";
  return absl::StrCat(pod.namespace_().empty() ? "-" : pod.namespace_(), "/",
                      pod.pod().empty() ? "-" : pod.pod());
}

std::string ContainerCell(const v1::KubernetesPod& pod) {
  return pod.container().empty() ? "-" : pod.container();
}

void AddPodColumns(const std::vector<const v1::KubernetesPod*>& pods,
                   std::vector<std::vector<std::string>>* rows) {
  if (std::none_of(pods.begin(), pods.end(),
                   [](const v1::KubernetesPod* p) { return Named(*p); })) {
    return;
  }
  // Before the last column (the summary or the bar), which is the one allowed to run long.
  auto insert = [](std::vector<std::string>* row, std::string pod, std::string container) {
    const auto at = row->empty() ? row->end() : row->end() - 1;
    row->insert(row->insert(at, std::move(pod)) + 1, std::move(container));
  };
  insert(&(*rows)[0], "POD", "CONTAINER");
  for (size_t i = 0; i < pods.size() && i + 1 < rows->size(); ++i) {
    insert(&(*rows)[i + 1], PodCell(*pods[i]), ContainerCell(*pods[i]));
  }
}

namespace {

// The what-ifs, largest speed-up first, the best single fix and the gain if all were fixed.
std::string FormatWhatIf(const v1::ExplainResponse& e, bool breakdown_known) {
  struct Fix {
    const char* key;
    const char* label;
    double speedup;
  };
  std::vector<Fix> fixes;
  for (const Fix& f :
       {Fix{"stragglers", "stragglers fixed (as fast as the healthy ranks)", 0},
        Fix{"overlap", "communication fully overlapped with compute", 0},
        Fix{"data", "no data-loading stall", 0}, Fix{"pipeline", "pipeline stages balanced", 0}}) {
    auto it = e.whatif_speedup_ratio().find(f.key);
    if (it == e.whatif_speedup_ratio().end() || !std::isfinite(it->second)) continue;
    fixes.push_back({f.key, f.label, it->second});
  }
  if (fixes.empty() || !breakdown_known) {
    return "  - (unknown until the ranks report how their step splits)\n";
  }
  std::stable_sort(fixes.begin(), fixes.end(),
                   [](const Fix& a, const Fix& b) { return a.speedup > b.speedup; });
  std::vector<std::vector<std::string>> rows;
  for (const Fix& f : fixes) {
    // What the step events can support: a bound says which side the real gain lies on. Without
    // a kind (an older collector) overlap is the one bound.
    auto kind = e.whatif_kind().find(f.key);
    const std::string k = kind != e.whatif_kind().end()     ? kind->second
                          : std::string(f.key) == "overlap" ? "upper_bound"
                                                            : "estimate";
    const char* note = "";
    if (k == "upper_bound") {
      note = std::string(f.key) == "overlap" ? "(upper bound: some communication cannot overlap)"
                                             : "(upper bound)";
    } else if (k == "lower_bound") {
      note = "(lower bound)";
    }
    rows.push_back({absl::StrCat("  ", f.label), absl::StrFormat("%.2fx faster", f.speedup), note});
  }
  std::string out = FormatTable(rows);
  const WhatIfSummary summary = SummarizeWhatIf(e);
  if (summary.best_speedup < 1.005) {
    out += "  None of these fixes would make a noticeable difference.\n";
    return out;
  }
  absl::StrAppendFormat(&out, "  Best single fix: %s (%.2fx faster)\n", fixes.front().label,
                        summary.best_speedup);
  if (fixes.size() > 1) {
    absl::StrAppendFormat(&out, "  All fixed together: %s%.2fx faster%s\n",
                          summary.combined_is_upper_bound ? "up to " : "", summary.combined_speedup,
                          summary.combined_clamped ? " (limited by the compute share)" : "");
  }
  return out;
}

// The set fields of an evidence message as "name=value" (in declaration order; lists joined by
// ","; a throttle mask in hex): generic, so a new field shows without a change here.
std::string EvidenceFields(const google::protobuf::Message& m) {
  using FD = google::protobuf::FieldDescriptor;
  const google::protobuf::Reflection* r = m.GetReflection();
  std::vector<const FD*> fields;
  r->ListFields(m, &fields);
  std::vector<std::string> out;
  for (const FD* fd : fields) {
    if (fd->cpp_type() == FD::CPPTYPE_MESSAGE) continue;  // devices: one line each
    const bool rep = fd->is_repeated();
    std::vector<std::string> values;
    for (int i = 0, n = rep ? r->FieldSize(m, fd) : 1; i < n; ++i) {
      switch (fd->cpp_type()) {
        case FD::CPPTYPE_DOUBLE:
          values.push_back(
              absl::StrFormat("%.4g", rep ? r->GetRepeatedDouble(m, fd, i) : r->GetDouble(m, fd)));
          break;
        case FD::CPPTYPE_INT32:
          values.push_back(absl::StrCat(rep ? r->GetRepeatedInt32(m, fd, i) : r->GetInt32(m, fd)));
          break;
        case FD::CPPTYPE_INT64:
          values.push_back(absl::StrCat(rep ? r->GetRepeatedInt64(m, fd, i) : r->GetInt64(m, fd)));
          break;
        case FD::CPPTYPE_UINT64:
          values.push_back(
              absl::StrFormat("0x%x", rep ? r->GetRepeatedUInt64(m, fd, i) : r->GetUInt64(m, fd)));
          break;
        case FD::CPPTYPE_STRING:
          values.push_back(rep ? r->GetRepeatedString(m, fd, i) : r->GetString(m, fd));
          break;
        default:
          break;
      }
    }
    out.push_back(absl::StrCat(fd->name(), "=", absl::StrJoin(values, ",")));
  }
  return absl::StrJoin(out, " ");
}

// The evidence of one finding, indented under it: its figures, then one line per device.
std::string FormatEvidence(const v1::FindingEvidence& e) {
  std::string out;
  const std::string figures = EvidenceFields(e);
  if (!figures.empty()) absl::StrAppend(&out, "      evidence: ", figures, "\n");
  for (const v1::DeviceEvidence& d : e.devices()) {
    v1::DeviceEvidence rest = d;  // its place is named up front
    rest.clear_node();
    rest.clear_gpu();
    rest.clear_rank();
    const std::string where =
        absl::StrCat(d.node().empty() ? "-" : d.node(),
                     d.gpu() >= 0 ? absl::StrCat(" GPU ", d.gpu()) : std::string(),
                     d.rank() >= 0 ? absl::StrCat(" (rank ", d.rank(), ")") : std::string());
    const std::string figures_here = EvidenceFields(rest);
    if (figures_here.empty()) continue;  // a place without figures (no GPU readings)
    absl::StrAppend(&out, "      device ", where, ": ", figures_here, "\n");
  }
  return out;
}

}  // namespace

WhatIfSummary SummarizeWhatIf(const v1::ExplainResponse& e) {
  return SummarizeWhatIf(e.whatif_speedup_ratio(), e.time_ratio());
}

namespace {

// The job's line, efficiency and scaling efficiency.
std::string FormatExplainHeader(const v1::ExplainResponse& e) {
  const v1::JobStatus& j = e.job();
  std::string out =
      absl::StrFormat("Job %s: %d ranks (%d reporting), last step %d, step time %s, %.2f steps/s",
                      j.job(), j.world_size(), j.ranks_reporting(), j.last_step(),
                      FormatDuration(j.step_seconds()), j.steps_per_second());
  if (j.samples_per_second() > 0)
    absl::StrAppendFormat(&out, ", %.0f samples/s", j.samples_per_second());
  out += '\n';
  absl::StrAppend(&out, "Efficiency (ideal / actual step time): ",
                  j.efficiency_ratio() > 0 ? FormatPercent(j.efficiency_ratio()) : "unknown", "\n");
  if (e.has_scaling_efficiency_ratio()) {
    absl::StrAppend(&out, "Scaling efficiency (per-GPU throughput vs smaller runs): ",
                    FormatPercent(e.scaling_efficiency_ratio()), "\n");
  }
  // Analysed without some ranks: the verdicts below saw less than the job sent.
  if (j.incomplete_steps() > 0 || j.late_samples() > 0) {
    absl::StrAppend(&out, "Incomplete: ", j.incomplete_steps(),
                    " steps analysed without every rank, ", j.late_samples(),
                    " rank samples came after their step was analysed (one node's reports far "
                    "behind the others'?)\n");
  }
  return out;
}

// The breakdown table; sets *known to whether the breakdown is known at all.
std::string FormatBreakdown(const v1::ExplainResponse& e, const ExplainFormatOptions& options,
                            bool* known) {
  std::string out;
  out += "\nWhere the step time goes\n";
  std::vector<std::vector<std::string>> rows;
  // Unknown: absent, or (from collectors that fill it in regardless) all zero.
  double breakdown_sum = 0;
  for (const auto& [component, share] : e.time_ratio()) {
    if (std::isfinite(share) && share > 0) breakdown_sum += share;
  }
  const bool breakdown_known = breakdown_sum > 0;
  *known = breakdown_known;
  for (const char* component : {"compute", "imbalance", "comm", "data", "other"}) {
    auto it = e.time_ratio().find(component);
    const double v = it == e.time_ratio().end() ? 0 : it->second;
    rows.push_back({absl::StrCat("  ", component),
                    breakdown_known ? absl::StrFormat("%5.1f%%", v * 100) : "    -",
                    breakdown_known ? Bar(v, options.bar_width) : ""});
  }
  out += FormatTable(rows);
  if (!breakdown_known) {
    out +=
        "  unknown: the ranks report only their step time, not how it splits into data, compute "
        "and communication (see docs/clients.md)\n";
  }

  return out;
}

// The per-rank table (the flagged and slowest ranks beyond max_rank_rows); fills *shown with its
// rows, in rank order.
std::string FormatRanks(const v1::ExplainResponse& e, const ExplainFormatOptions& options,
                        std::vector<const v1::RankRow*>* shown_out) {
  std::string out;
  std::vector<std::vector<std::string>> rows;
  std::vector<const v1::RankRow*> shown;
  if (!e.ranks().empty()) {
    for (const v1::RankRow& r : e.ranks()) shown.push_back(&r);
    size_t hidden = 0;
    if (options.max_rank_rows > 0 && static_cast<int>(shown.size()) > options.max_rank_rows) {
      // Keep the flagged ranks and the slowest others.
      std::stable_sort(shown.begin(), shown.end(), [](const v1::RankRow* a, const v1::RankRow* b) {
        if (a->straggler() != b->straggler()) return a->straggler();
        return a->busy_vs_median_ratio() > b->busy_vs_median_ratio();
      });
      hidden = shown.size() - options.max_rank_rows;
      shown.resize(options.max_rank_rows);
      std::sort(shown.begin(), shown.end(),
                [](const v1::RankRow* a, const v1::RankRow* b) { return a->rank() < b->rank(); });
    }
    double max_busy = 0;
    for (const v1::RankRow* r : shown) max_busy = std::max(max_busy, r->busy_seconds());
    out +=
        "\nRanks (medians over recent steps; busy = data + compute; bar = busy time, ! = "
        "straggler)\n";
    rows = {{" ", "RANK", "NODE", "GPU", "BUSY", "COMPUTE", "DATA", "COMM", "VS MEDIAN", ""}};
    std::vector<const v1::KubernetesPod*> pods;
    for (const v1::RankRow* r : shown) {
      pods.push_back(&r->kubernetes_pod());
      rows.push_back({r->straggler() ? "!" : " ", absl::StrCat(r->rank()),
                      r->node().empty() ? "-" : r->node(), RankOrDash(r->gpu()),
                      FormatDuration(r->busy_seconds()), FormatDuration(r->compute_seconds()),
                      FormatDuration(r->data_seconds()), FormatDuration(r->comm_seconds()),
                      r->comparable()
                          ? absl::StrFormat("%+.0f%%", (r->busy_vs_median_ratio() - 1) * 100)
                          : "-",
                      Bar(max_busy > 0 ? r->busy_seconds() / max_busy : 0, options.bar_width)});
    }
    AddPodColumns(pods, &rows);
    out += FormatTable(rows);
    if (hidden > 0) {
      absl::StrAppend(&out, "  ... ", hidden, " more ranks closer to the median not shown\n");
    }
  }
  *shown_out = std::move(shown);
  return out;
}

std::string FormatExplainFindings(const v1::ExplainResponse& e) {
  std::string out;
  out += "\nFindings\n";
  if (e.findings().empty()) {
    out += "  none\n";
  } else {
    for (const v1::Finding& f : e.findings()) {
      absl::StrAppend(&out, "  [", f.severity(), "] ", f.kind(), " since step ", f.since_step(),
                      ": ", f.summary(), "\n");
      if (!f.cause().empty()) absl::StrAppend(&out, "      cause: ", f.cause(), "\n");
      if (Named(f.kubernetes_pod())) {
        absl::StrAppend(&out, "      pod: ", PodCell(f.kubernetes_pod()), " container ",
                        ContainerCell(f.kubernetes_pod()), "\n");
      }
      absl::StrAppend(&out, FormatEvidence(f.evidence()));
      if (!f.action().empty()) absl::StrAppend(&out, "      action: ", f.action(), "\n");
    }
  }
  return out;
}

}  // namespace

std::string FormatExplain(const v1::ExplainResponse& e, const ExplainFormatOptions& options) {
  std::string out = FormatExplainHeader(e);
  bool breakdown_known = false;
  out += FormatBreakdown(e, options, &breakdown_known);
  out += "\nWhat if (largest speed-up first)\n";
  out += FormatWhatIf(e, breakdown_known);
  std::vector<const v1::RankRow*> shown;
  out += FormatRanks(e, options, &shown);
  out += FormatSections(e, shown);
  out += FormatExplainFindings(e);
  return out;
}

}  // namespace stepwatch::ctl
