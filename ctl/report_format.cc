#include "ctl/report_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "ctl/format.h"

namespace stepwatch::ctl {
namespace {

constexpr const char* kComponents[] = {"compute", "imbalance", "comm", "data", "other"};
constexpr const char* kFixes[] = {"stragglers", "overlap", "data", "pipeline"};

std::string Time(int64_t unix_nanos, const char* format) {
  return absl::FormatTime(format, absl::FromUnixNanos(unix_nanos), absl::UTCTimeZone());
}

std::string HumanTime(int64_t unix_nanos) {
  return unix_nanos > 0 ? Time(unix_nanos, "%Y-%m-%d %H:%M:%S UTC") : "-";
}

std::string Steps(int64_t first, int64_t last) {
  if (last < 0) return "-";
  return absl::StrCat(first < 0 ? "?" : absl::StrCat(first), "..", last);
}

std::string DashIfNegative(int64_t v) { return v < 0 ? "-" : absl::StrCat(v); }

// --- JSON: a small writer that keeps key order and prints one member per line at the top level.

std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  return absl::StrFormat("%.6g", v);
}

std::string TimeOrNull(int64_t unix_nanos) {
  return unix_nanos > 0 ? json::Quote(Time(unix_nanos, "%Y-%m-%dT%H:%M:%E3SZ")) : "null";
}

std::string NanosOrNull(int64_t unix_nanos) {
  return unix_nanos > 0 ? absl::StrCat(unix_nanos) : "null";
}

// {"a": 1, "b": 2} in the order of `keys`; null when the map is empty (unknown).
std::string RatioObject(const google::protobuf::Map<std::string, double>& map,
                        const char* const* keys, size_t n) {
  if (map.empty()) return "null";
  std::vector<std::string> members;
  for (size_t i = 0; i < n; ++i) {
    auto it = map.find(keys[i]);
    members.push_back(
        absl::StrCat(json::Quote(keys[i]), ": ", it == map.end() ? "null" : Number(it->second)));
  }
  return absl::StrCat("{", absl::StrJoin(members, ", "), "}");
}

// {"stragglers": "estimate", ...} in the order of kFixes; null when unknown (an older collector,
// or a job that never reported its split).
std::string KindObject(const google::protobuf::Map<std::string, std::string>& map) {
  if (map.empty()) return "null";
  std::vector<std::string> members;
  for (const char* fix : kFixes) {
    auto it = map.find(fix);
    if (it != map.end())
      members.push_back(absl::StrCat(json::Quote(fix), ": ", json::Quote(it->second)));
  }
  return absl::StrCat("{", absl::StrJoin(members, ", "), "}");
}

// ["a", "b"]
std::string StringList(const google::protobuf::RepeatedPtrField<std::string>& list) {
  std::vector<std::string> quoted;
  for (const std::string& s : list) quoted.push_back(json::Quote(s));
  return absl::StrCat("[", absl::StrJoin(quoted, ", "), "]");
}

// Steps strictly between the gap's ends: -1 while the job has not reported again.
int64_t MissingSteps(const v1::ReportGap& g) {
  if (g.before_step() < 0) return -1;
  return std::max<int64_t>(0, g.before_step() - g.after_step() - 1);
}

std::string GapJson(const v1::ReportGap& g) {
  return absl::StrCat("{\"cause\": ", json::Quote(g.cause()), ", \"after_step\": ", g.after_step(),
                      ", \"before_step\": ", g.before_step(), ", \"missing_steps\": ",
                      MissingSteps(g) < 0 ? "null" : absl::StrCat(MissingSteps(g)),
                      ", \"from_time\": ", TimeOrNull(g.from_unix_nanos()),
                      ", \"to_time\": ", TimeOrNull(g.to_unix_nanos()), "}");
}

// What a report lacks, for people: one line per gap, and whether it is on disk.
std::string Caveats(const v1::JobReport& r) {
  std::string out;
  if (r.unsaved()) {
    out +=
        "Not saved yet: the collector cannot write it under its --state-dir (disk full or "
        "failing); kept in memory and retried, lost if the collector stops first\n";
  }
  for (const v1::ReportGap& g : r.gaps()) {
    absl::StrAppend(&out, "Partial: the collector restarted after step ", g.after_step(), " (",
                    HumanTime(g.from_unix_nanos()), "); ");
    if (g.before_step() < 0) {
      out += "the job has not reported since\n";
    } else if (MissingSteps(g) == 0) {
      absl::StrAppend(&out, "seen again from step ", g.before_step(), " (",
                      HumanTime(g.to_unix_nanos()), "), no step missing\n");
    } else {
      absl::StrAppend(&out, "steps ", g.after_step() + 1, "..", g.before_step() - 1, " (",
                      MissingSteps(g), ") are missing from this report, seen again from step ",
                      g.before_step(), " (", HumanTime(g.to_unix_nanos()), ")\n");
    }
  }
  return out;
}

// A name as JSON: null when empty (unknown).
std::string OrNull(const std::string& s) { return s.empty() ? "null" : json::Quote(s); }

std::string FindingJson(const v1::Finding& f) {
  std::vector<std::string> causes;
  for (const std::string& c : f.causes()) causes.push_back(json::Quote(c));
  const std::vector<std::pair<const char*, std::string>> members = {
      {"kind", json::Quote(f.kind())},
      {"rank", absl::StrCat(f.rank())},
      {"node", json::Quote(f.node())},
      {"device", json::Quote(f.device())},
      {"gpu", absl::StrCat(f.gpu())},
      {"stage", absl::StrCat(f.stage())},
      {"namespace", OrNull(f.kubernetes_pod().namespace_())},
      {"pod", OrNull(f.kubernetes_pod().pod())},
      {"container", OrNull(f.kubernetes_pod().container())},
      {"cause", json::Quote(f.cause())},
      {"causes", absl::StrCat("[", absl::StrJoin(causes, ", "), "]")},
      {"severity", json::Quote(f.severity())},
      {"persistent", f.persistent() ? "true" : "false"},
      {"since_step", absl::StrCat(f.since_step())},
      {"until_step", absl::StrCat(f.until_step())},
      {"since_time", TimeOrNull(f.since_unix_nanos())},
      {"until_time", TimeOrNull(f.until_step() < 0 ? 0 : f.until_unix_nanos())},
      {"ranks", absl::StrCat("[", absl::StrJoin(f.ranks(), ", "), "]")},
      {"section", f.evidence().has_section() ? json::Quote(f.evidence().section()) : "null"},
      {"section_vs_reference_ratio", f.evidence().has_section_vs_reference_ratio()
                                         ? Number(f.evidence().section_vs_reference_ratio())
                                         : "null"},
      {"summary", json::Quote(f.summary())},
      {"action", json::Quote(f.action())},
  };
  std::string out = "{";
  for (size_t i = 0; i < members.size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "" : ", ", json::Quote(members[i].first), ": ",
                    members[i].second);
  }
  return out + "}";
}

// [1, null, 2]: the timeline's per-column values, null where the report has -1 (unknown).
std::string SeriesList(const google::protobuf::RepeatedField<float>& values, int from, int count) {
  std::string out = "[";
  for (int i = from; i < from + count && i < values.size(); ++i) {
    absl::StrAppend(&out, i == from ? "" : ", ", values[i] < 0 ? "null" : Number(values[i]));
  }
  return out + "]";
}

std::string TimelineColumnJson(const v1::TimelineColumn& c) {
  return absl::StrCat(
      "{\"first_step\": ", c.first_step(), ", \"last_step\": ", c.last_step(),
      ", \"start_unix_nanos\": ", c.start_unix_nanos(),
      ", \"end_unix_nanos\": ", c.end_unix_nanos(), ", \"samples\": ", c.samples(),
      ", \"step_seconds\": ", c.step_seconds() > 0 ? Number(c.step_seconds()) : "null",
      ", \"efficiency_ratio\": ", c.has_efficiency_ratio() ? Number(c.efficiency_ratio()) : "null",
      ", \"breakdown\": ", RatioObject(c.time_ratio(), kComponents, std::size(kComponents)), "}");
}

// section_seconds as one list per section (the report's is section-major, flat).
std::string RankSeriesJson(const v1::RankSeries& r, int columns, int sections) {
  std::string flagged = "[";
  for (int i = 0; i < r.flagged_size(); ++i) {
    absl::StrAppend(&flagged, i == 0 ? "" : ", ", r.flagged(i) ? "true" : "false");
  }
  std::string per_section = "[";
  if (r.section_seconds_size() == sections * columns) {
    for (int s = 0; s < sections; ++s) {
      absl::StrAppend(&per_section, s == 0 ? "" : ", ",
                      SeriesList(r.section_seconds(), s * columns, columns));
    }
  }
  return absl::StrCat("{\"rank\": ", r.rank(), ", \"node\": ", json::Quote(r.node()),
                      ", \"gpu\": ", r.gpu(), ", \"pp_stage\": ", r.pp_stage(),
                      ", \"busy_seconds\": ", SeriesList(r.busy_seconds(), 0, columns),
                      ", \"flagged\": ", flagged, "], \"section_seconds\": ", per_section, "]}");
}

std::string NodeSeriesJson(const v1::NodeSeries& n, int columns) {
  return absl::StrCat(
      "{\"node\": ", json::Quote(n.node()), ", \"ranks\": ", n.ranks(),
      ", \"busy_seconds\": ", SeriesList(n.busy_seconds(), 0, columns),
      ", \"gpu_utilization_ratio\": ", SeriesList(n.gpu_utilization_ratio(), 0, columns),
      ", \"sm_active_ratio\": ", SeriesList(n.sm_active_ratio(), 0, columns), "}");
}

// The report's timeline: one column, rank or node per line; null when the report has none.
std::string TimelineJson(const v1::JobReport& r, const std::string& indent) {
  if (!r.has_timeline()) return "null";
  const v1::ReportTimeline& t = r.timeline();
  const int columns = t.columns_size();
  const int sections = t.section_names_size();
  const std::string inner = indent + "  ";
  // [\n item,\n item\n] at `inner` + 2.
  auto list = [&inner](int n, const auto& item) {
    std::string out = "[";
    for (int i = 0; i < n; ++i) absl::StrAppend(&out, i == 0 ? "\n" : ",\n", inner, "  ", item(i));
    return absl::StrCat(out, n == 0 ? "" : absl::StrCat("\n", inner), "]");
  };
  return absl::StrCat(
      "{\n", inner, "\"samples\": ", t.samples(), ",\n", inner,
      "\"sample_interval_nanos\": ", t.sample_interval_nanos(), ",\n", inner,
      "\"ranks_omitted\": ", t.ranks_omitted(), ",\n", inner,
      "\"section_names\": ", StringList(t.section_names()), ",\n", inner,
      "\"columns\": ", list(columns, [&t](int i) { return TimelineColumnJson(t.columns(i)); }),
      ",\n", inner, "\"ranks\": ",
      list(t.ranks_size(), [&](int i) { return RankSeriesJson(t.ranks(i), columns, sections); }),
      ",\n", inner, "\"nodes\": ",
      list(t.nodes_size(), [&](int i) { return NodeSeriesJson(t.nodes(i), columns); }), "\n",
      indent, "}");
}

// The members of a report; `indent` prefixes each line.
std::string ReportMembers(const v1::JobReport& r, bool with_findings, const std::string& indent) {
  std::vector<std::pair<const char*, std::string>> m = {
      {"job", json::Quote(r.job())},
      {"state", json::Quote(r.state())},
      {"end_reason", r.end_reason().empty() ? "null" : json::Quote(r.end_reason())},
      {"world_size", absl::StrCat(r.world_size())},
      {"first_step", absl::StrCat(r.first_step())},
      {"last_step", absl::StrCat(r.last_step())},
      {"start_time", TimeOrNull(r.start_unix_nanos())},
      {"end_time", TimeOrNull(r.end_unix_nanos())},
      {"start_unix_nanos", NanosOrNull(r.start_unix_nanos())},
      {"end_unix_nanos", NanosOrNull(r.end_unix_nanos())},
      {"step_seconds", r.step_seconds() > 0 ? Number(r.step_seconds()) : "null"},
      {"efficiency_ratio", r.has_efficiency_ratio() ? Number(r.efficiency_ratio()) : "null"},
      {"scaling_efficiency_ratio",
       r.has_scaling_efficiency_ratio() ? Number(r.scaling_efficiency_ratio()) : "null"},
      {"breakdown", RatioObject(r.time_ratio(), kComponents, std::size(kComponents))},
      {"whatif", RatioObject(r.whatif_speedup_ratio(), kFixes, std::size(kFixes))},
      {"whatif_kind", KindObject(r.whatif_kind())},
      {"sections", StringList(r.section_names())},
      {"sections_folded", absl::StrCat(r.sections_folded())},
      {"finding_count", absl::StrCat(r.finding_count())},
      {"findings_dropped", absl::StrCat(r.findings_dropped())},
      {"unsaved", r.unsaved() ? "true" : "false"},
      {"partial", r.gaps().empty() ? "false" : "true"},
  };
  {
    std::string gaps = "[";
    for (int i = 0; i < r.gaps_size(); ++i) {
      absl::StrAppend(&gaps, i == 0 ? "" : ", ", GapJson(r.gaps(i)));
    }
    m.emplace_back("gaps", gaps + "]");
  }
  if (with_findings) {
    std::string list = "[";
    for (int i = 0; i < r.findings_size(); ++i) {
      absl::StrAppend(&list, i == 0 ? "\n" : ",\n", indent, "  ", FindingJson(r.findings(i)));
    }
    absl::StrAppend(&list, r.findings().empty() ? "" : absl::StrCat("\n", indent), "]");
    m.emplace_back("findings", std::move(list));
    m.emplace_back("timeline", TimelineJson(r, indent));
  }
  std::string out;
  for (size_t i = 0; i < m.size(); ++i) {
    absl::StrAppend(&out, indent, json::Quote(m[i].first), ": ", m[i].second,
                    i + 1 < m.size() ? ",\n" : "\n");
  }
  return out;
}

}  // namespace

namespace {

// The last known breakdown, what-ifs and sections.
std::string FormatReportFigures(const v1::JobReport& r) {
  std::string out;
  if (!r.time_ratio().empty()) {
    out += "\nWhere the step time went (last known)\n";
    std::vector<std::vector<std::string>> rows;
    for (const char* component : kComponents) {
      auto it = r.time_ratio().find(component);
      const double v = it == r.time_ratio().end() ? 0 : it->second;
      rows.push_back(
          {absl::StrCat("  ", component), absl::StrFormat("%5.1f%%", v * 100), Bar(v, 24)});
    }
    out += FormatTable(rows);
  }
  if (!r.whatif_speedup_ratio().empty()) {
    out += "\nWhat if (last known)\n";
    std::vector<std::vector<std::string>> rows;
    for (const char* fix : kFixes) {
      auto it = r.whatif_speedup_ratio().find(fix);
      if (it == r.whatif_speedup_ratio().end()) continue;
      auto kind = r.whatif_kind().find(fix);
      const std::string bound =
          kind == r.whatif_kind().end() || kind->second == "estimate"
              ? ""
              : absl::StrCat("(", absl::StrReplaceAll(kind->second, {{"_", " "}}), ")");
      rows.push_back(
          {absl::StrCat("  ", fix, " fixed"), absl::StrFormat("%.2fx faster", it->second), bound});
    }
    out += FormatTable(rows);
  }
  if (!r.section_names().empty()) {
    absl::StrAppend(&out, "\nSections (last known): ", absl::StrJoin(r.section_names(), ", "),
                    "\n");
    if (r.sections_folded() > 0) {
      absl::StrAppend(&out, "  ", r.sections_folded(),
                      " section values not kept: a job keeps its first 16 section names\n");
    }
  }

  return out;
}

}  // namespace

std::string FormatReport(const v1::JobReport& r) {
  std::string out = absl::StrFormat("Job %s: %s", r.job(), r.state());
  if (r.end_reason() == "exited") out += " (every rank's process exited)";
  if (r.end_reason() == "expired") out += " (silent, forgotten after --expire)";
  absl::StrAppend(&out, ", ", r.world_size(), " ranks, steps ",
                  Steps(r.first_step(), r.last_step()), "\n");
  out += Caveats(r);
  absl::StrAppend(&out, "Started ", HumanTime(r.start_unix_nanos()));
  if (r.end_unix_nanos() > 0) {
    const absl::Duration took = absl::Nanoseconds(r.end_unix_nanos() - r.start_unix_nanos());
    absl::StrAppend(&out, ", ended ", HumanTime(r.end_unix_nanos()), " (",
                    took < absl::Seconds(1)
                        ? "under 1s"
                        : absl::FormatDuration(absl::Trunc(took, absl::Seconds(1))),
                    ")");
  }
  out += '\n';
  absl::StrAppend(&out, "Step time ", r.step_seconds() > 0 ? FormatDuration(r.step_seconds()) : "-",
                  ", efficiency (ideal / actual step time) ",
                  r.has_efficiency_ratio() ? FormatPercent(r.efficiency_ratio()) : "unknown");
  if (r.has_scaling_efficiency_ratio()) {
    absl::StrAppend(&out, ", scaling efficiency ", FormatPercent(r.scaling_efficiency_ratio()));
  }
  out += '\n';

  out += FormatReportFigures(r);
  absl::StrAppend(&out, "\nFindings (", r.finding_count(), " in all");
  if (r.findings_dropped() > 0)
    absl::StrAppend(&out, ", ", r.findings_dropped(), " oldest dropped");
  out += ")\n";
  if (r.findings().empty()) {
    out += "  none\n";
    return out;
  }
  std::vector<std::vector<std::string>> rows = {
      {"SEVERITY", "KIND", "RANK", "NODE", "GPU", "CAUSE", "STEPS", "SUMMARY"}};
  std::vector<const v1::KubernetesPod*> pods;
  for (const v1::Finding& f : r.findings()) {
    pods.push_back(&f.kubernetes_pod());
    rows.push_back({f.severity(), f.kind(), DashIfNegative(f.rank()),
                    f.node().empty() ? "-" : f.node(), DashIfNegative(f.gpu()),
                    f.cause().empty() ? "-" : f.cause(),
                    absl::StrCat(f.since_step(), "..",
                                 f.until_step() < 0 ? "(active)" : absl::StrCat(f.until_step())),
                    f.summary()});
  }
  AddPodColumns(pods, &rows);
  out += FormatTable(rows);
  return out;
}

std::string FormatReportList(const v1::ReportResponse& response) {
  if (response.reports().empty()) return "No job reports.\n";
  std::vector<std::vector<std::string>> rows = {
      {"JOB", "STATE", "WORLD", "STEPS", "ENDED", "FINDINGS", "NOTE"}};
  for (const v1::JobReport& r : response.reports()) {
    std::vector<std::string> notes;
    if (r.unsaved()) notes.push_back("unsaved");
    if (!r.gaps().empty()) notes.push_back("partial");
    rows.push_back({r.job(), r.state(), absl::StrCat(r.world_size()),
                    Steps(r.first_step(), r.last_step()), HumanTime(r.end_unix_nanos()),
                    absl::StrCat(r.finding_count()),
                    notes.empty() ? "-" : absl::StrJoin(notes, ",")});
  }
  return FormatTable(rows);
}

std::string ReportToJson(const v1::JobReport& report) {
  return absl::StrCat("{\n", ReportMembers(report, /*with_findings=*/true, "  "), "}\n");
}

std::string ReportListToJson(const v1::ReportResponse& response) {
  std::string out = "{\n  \"reports\": [";
  for (int i = 0; i < response.reports_size(); ++i) {
    absl::StrAppend(&out, i == 0 ? "\n" : ",\n", "    {\n",
                    ReportMembers(response.reports(i), /*with_findings=*/false, "      "), "    }");
  }
  absl::StrAppend(&out, response.reports().empty() ? "" : "\n  ", "]\n}\n");
  return out;
}

}  // namespace stepwatch::ctl
