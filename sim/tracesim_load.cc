// Loaders of the committed traces for the trace-driven simulator (sim/tracesim.h): the per-rank
// step splits that sim/traces/kineto_steps.py writes, and the Alibaba PAI mini-batch traces.
#include <algorithm>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "sim/tracesim.h"

namespace stepwatch::sim {
namespace {

bool ReadLine(std::ifstream& in, std::string* line) {
  return static_cast<bool>(std::getline(in, *line));
}

}  // namespace

absl::StatusOr<std::vector<DpTrace>> LoadKinetoSteps(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  constexpr absl::string_view kHeader =
      "trace,rank,world_size,step,step_s,data_s,compute_s,comm_s,exposed_comm_s,other_s";
  if (!ReadLine(in, &line) || absl::StripTrailingAsciiWhitespace(line) != kHeader) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected the header ", kHeader));
  }
  struct Rows {
    int world = 0;
    std::map<int, std::map<int64_t, RankStep>> by_rank;
  };
  std::vector<std::string> order;
  std::map<std::string, Rows> traces;
  for (int line_no = 2; ReadLine(in, &line); ++line_no) {
    absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    int rank = 0, world = 0;
    int64_t step = 0;
    double v[6];
    bool ok = f.size() == 10 && !f[0].empty() && absl::SimpleAtoi(f[1], &rank) &&
              absl::SimpleAtoi(f[2], &world) && absl::SimpleAtoi(f[3], &step) && rank >= 0 &&
              world > rank;
    for (int i = 0; ok && i < 6; ++i) ok = absl::SimpleAtod(f[4 + i], &v[i]) && v[i] >= 0;
    if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": malformed row"));
    const std::string name(f[0]);
    if (!traces.count(name)) order.push_back(name);
    Rows& rows = traces[name];
    rows.world = std::max(rows.world, world);
    RankStep r;
    r.step = v[0];
    r.data = v[1];
    r.compute = v[2];
    r.comm = v[3];
    r.exposed_comm = v[4];
    r.other = v[5];
    rows.by_rank[rank].emplace(step, r);
  }
  std::vector<DpTrace> out;
  for (const std::string& name : order) {
    const Rows& rows = traces[name];
    DpTrace t;
    t.name = name;
    t.ranks = static_cast<int>(rows.by_rank.size());
    t.job_world_size = rows.world;
    for (const auto& [step, r0] : rows.by_rank.begin()->second) {
      std::vector<RankStep> rs;
      for (const auto& [rank, steps] : rows.by_rank) {
        auto it = steps.find(step);
        if (it == steps.end()) break;
        rs.push_back(it->second);
      }
      if (static_cast<int>(rs.size()) != t.ranks) continue;
      t.steps.push_back(step);
      t.rank_steps.push_back(std::move(rs));
    }
    out.push_back(std::move(t));
  }
  return out;
}

absl::StatusOr<DpTrace> LoadPaiTrace(const std::string& path, const std::string& name) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::string line;
  if (!ReadLine(in, &line) ||
      absl::StripTrailingAsciiWhitespace(line) != ",worker,gpu,time,batch_time_norm") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected the header ,worker,gpu,time,batch_time_norm"));
  }
  std::map<int64_t, std::map<int, double>> by_step;  // step -> worker -> busy ms
  int max_worker = -1;
  for (int line_no = 2; ReadLine(in, &line); ++line_no) {
    absl::string_view text = absl::StripTrailingAsciiWhitespace(line);
    if (text.empty()) continue;
    std::vector<absl::string_view> f = absl::StrSplit(text, ',');
    int worker = 0;
    int64_t time = 0;
    double busy = 0;
    if (f.size() != 5 || !absl::SimpleAtoi(f[1], &worker) || !absl::SimpleAtoi(f[3], &time) ||
        !absl::SimpleAtod(f[4], &busy) || worker < 0 || worker > 100000 || time < 0 ||
        !(busy > 0)) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_no, ": malformed row"));
    }
    max_worker = std::max(max_worker, worker);
    by_step[time / 10].emplace(worker, busy);
  }
  DpTrace t;
  t.name = name;
  t.ranks = t.job_world_size = max_worker + 1;
  for (const auto& [step, rows] : by_step) {
    if (static_cast<int>(rows.size()) != t.ranks) continue;
    double step_ms = 0;
    for (const auto& [w, busy] : rows) step_ms = std::max(step_ms, busy);
    std::vector<RankStep> rs;
    for (const auto& [w, busy] : rows) {
      RankStep r;
      r.compute = busy / 1000;
      r.step = step_ms / 1000;
      r.exposed_comm = (step_ms - busy) / 1000;
      rs.push_back(r);
    }
    t.steps.push_back(step);
    t.rank_steps.push_back(std::move(rs));
  }
  return t;
}

}  // namespace stepwatch::sim
