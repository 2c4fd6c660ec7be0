// The pure parts of `stepwatchctl serve`: its URLs (percent-encoding of job names, routing) and the
// job-list page, kept apart from the HTTP server and the gRPC calls so that they can be tested on
// canned answers. Everything a collector sends (job and node names, summaries) is hostile input:
// it reaches a page only through EscapeHtml, and a URL only percent-encoded.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::ctl {

// Where the live view listens unless told otherwise: loopback only, since it has no
// authentication.
inline constexpr char kDefaultServeListen[] = "127.0.0.1:9470";

// Whether HOST of a HOST:PORT `listen` address is a loopback one (127.0.0.0/8, ::1, localhost).
// An empty host (every interface) or an unparsable address is not.
bool IsLoopbackListen(absl::string_view listen);

// Every byte but the unreserved ones (A-Z a-z 0-9 - . _ ~) as %XX, so that any job name is one
// path segment ('/' included).
std::string PercentEncode(absl::string_view text);
// The inverse: %XX (either case) decoded, other bytes kept. nullopt for a malformed escape ('%'
// not followed by two hex digits), for a decoded NUL and for bytes that are not UTF-8 (a job name
// is a protobuf string).
std::optional<std::string> PercentDecode(absl::string_view text);

// "/jobs/<percent-encoded job>", and the same with "#finding-<index>" when index >= 0.
std::string JobPath(const std::string& job);
std::string FindingPath(const std::string& job, int index);

enum class PageKind {
  kJobList,          // "/" (and "/index.html")
  kJob,              // "/jobs/<job>"
  kNotFound,         // any other path, or a job that does not decode
  kMethodNotAllowed  // any method but GET and HEAD
};
struct Route {
  PageKind kind = PageKind::kNotFound;
  std::string job;  // kJob: the decoded job name
};
// `path` is the request target without its query (HttpRequest::path).
Route RouteRequest(absl::string_view method, absl::string_view path);

// Where in `report`'s findings (the index the job page's id="finding-<index>" carries) the active
// finding `finding` is: same kind, rank, node and GPU, and since_step; when no row starts at that
// step (the replicas saw it start at different steps), the row of the same kind, rank, node and GPU
// that is still active. -1 when none.
int FindingIndexInReport(const v1::Finding& finding, const v1::JobReport& report);

// A collector that gave no answer, and why in words.
struct CollectorProblem {
  std::string collector;
  std::string why;
};

struct JobListPage {
  // Merged answers of the collectors that answered (Findings answers only active findings).
  v1::StatusResponse status;
  v1::FindingsResponse findings;
  // Reports of the jobs with active findings, by job, for the findings' anchors; a job missing
  // here gets links to its page without an anchor.
  std::vector<v1::JobReport> reports;
  std::vector<std::string> answered;
  std::vector<CollectorProblem> failed;
  int refresh_seconds = 0;  // > 0: the page reloads itself this often
  int64_t now_unix_nanos = 0;
};
std::string RenderJobListHtml(const JobListPage& page);

// A small page for an error (404, 405, 502, 503): `title` and `message` are escaped here. With
// refresh_seconds > 0 it reloads itself (a live page whose collectors are down comes back with
// them).
std::string RenderErrorHtml(int status, const std::string& title, const std::string& message,
                            const std::vector<CollectorProblem>& failed = {},
                            int refresh_seconds = 0);

// The banner naming collectors that did not answer, inserted at the top of `page`'s body (after
// the <body> tag, or at the start when it has none). Nothing is inserted when `failed` is empty.
std::string WithCollectorBanner(std::string page, const std::vector<CollectorProblem>& failed);

}  // namespace stepwatch::ctl
