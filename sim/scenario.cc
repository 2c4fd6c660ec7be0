#include "sim/scenario.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json.h"

namespace stepwatch::sim {
namespace {

constexpr double kMaxClockMhz = 1980;
constexpr uint64_t kThermalThrottle = 0x20 | 0x40;  // SW and HW thermal slowdown

using json::Value;

absl::Status FieldError(absl::string_view where, absl::string_view key, absl::string_view want) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": \"", key, "\" must be ", want));
}

absl::Status GetInt(const Value& obj, absl::string_view where, absl::string_view key, int64_t lo,
                    int64_t hi, int64_t* out) {
  const Value* v = obj.Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number() || !v->is_integer() || v->as_int64() < lo || v->as_int64() > hi) {
    return FieldError(where, key, absl::StrCat("an integer in [", lo, ", ", hi, "]"));
  }
  *out = v->as_int64();
  return absl::OkStatus();
}

template <typename T>
absl::Status GetSmallInt(const Value& obj, absl::string_view where, absl::string_view key,
                         int64_t lo, int64_t hi, T* out) {
  int64_t v = *out;
  absl::Status s = GetInt(obj, where, key, lo, hi, &v);
  if (s.ok()) *out = static_cast<T>(v);
  return s;
}

absl::Status GetDouble(const Value& obj, absl::string_view where, absl::string_view key, double lo,
                       double hi, double* out) {
  const Value* v = obj.Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number() || !(v->as_double() >= lo && v->as_double() <= hi)) {
    return FieldError(where, key, absl::StrCat("a number in [", lo, ", ", hi, "]"));
  }
  *out = v->as_double();
  return absl::OkStatus();
}

absl::Status GetString(const Value& obj, absl::string_view where, absl::string_view key,
                       std::string* out) {
  const Value* v = obj.Find(key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string() || v->as_string().empty())
    return FieldError(where, key, "a non-empty string");
  *out = v->as_string();
  return absl::OkStatus();
}

#define SW_SIM_CHECK(expr)                 \
  do {                                     \
    absl::Status sw_sim_s_ = (expr);       \
    if (!sw_sim_s_.ok()) return sw_sim_s_; \
  } while (0)

bool KnownKind(const std::string& k) {
  for (const char* known : {"slow_rank", "slow_node", "data_stall", "low_gpu_util", "comm_slowdown",
                            "throttled_gpu", "hang", "rescale", "slow_stage"}) {
    if (k == known) return true;
  }
  return false;
}

// One entry of "faults", checked against the scenario's ranks, nodes and stages.
absl::StatusOr<Fault> ParseFault(const Value& fv, const Scenario& sc) {
  Fault f;
  SW_SIM_CHECK(GetString(fv, "fault", "kind", &f.kind));
  if (!KnownKind(f.kind)) {
    return absl::InvalidArgumentError(absl::StrCat("fault: unknown kind \"", f.kind, "\""));
  }
  SW_SIM_CHECK(GetInt(fv, "fault", "onset", 0, sc.steps, &f.onset));
  SW_SIM_CHECK(GetInt(fv, "fault", "end", -1, sc.steps, &f.end));
  if (f.end >= 0 && f.end <= f.onset) {
    return absl::InvalidArgumentError("fault: \"end\" must be after \"onset\"");
  }
  const int ranks = sc.nodes * sc.gpus_per_node;
  SW_SIM_CHECK(GetSmallInt(fv, "fault", "rank", -1, ranks - 1, &f.rank));
  SW_SIM_CHECK(GetSmallInt(fv, "fault", "node", -1, sc.nodes - 1, &f.node));
  SW_SIM_CHECK(GetSmallInt(fv, "fault", "stage", -1, sc.pp_stages - 1, &f.stage));
  SW_SIM_CHECK(GetSmallInt(fv, "fault", "nodes", 0, 4096, &f.nodes));
  SW_SIM_CHECK(GetDouble(fv, "fault", "factor", 0.01, 100, &f.factor));
  SW_SIM_CHECK(GetDouble(fv, "fault", "extra_s", 0, 3600, &f.extra_s));
  if ((f.kind == "slow_rank" || f.kind == "throttled_gpu") && f.rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat("fault ", f.kind, ": \"rank\" is required"));
  }
  if (f.kind == "slow_node" && f.node < 0) {
    return absl::InvalidArgumentError("fault slow_node: \"node\" is required");
  }
  if (f.kind == "slow_stage" && f.stage < 0) {
    return absl::InvalidArgumentError("fault slow_stage: \"stage\" is required");
  }
  if (f.kind == "rescale") {
    if (f.nodes <= 0) return absl::InvalidArgumentError("fault rescale: \"nodes\" is required");
    if ((f.nodes * sc.gpus_per_node) % sc.pp_stages != 0) {
      return absl::InvalidArgumentError("fault rescale: pp_stages must divide the new ranks");
    }
    f.end = -1;
  }
  return f;
}

}  // namespace

absl::StatusOr<Scenario> ParseScenario(absl::string_view text) {
  absl::StatusOr<Value> parsed = json::Parse(text);
  if (!parsed.ok()) return parsed.status();
  const Value& root = *parsed;
  if (!root.is_object()) return absl::InvalidArgumentError("scenario: not a JSON object");
  Scenario sc;
  const char* w = "scenario";
  SW_SIM_CHECK(GetString(root, w, "name", &sc.name));
  if (sc.name.empty()) return absl::InvalidArgumentError("scenario: \"name\" is required");
  SW_SIM_CHECK(GetString(root, w, "job", &sc.job));
  int64_t seed = static_cast<int64_t>(sc.seed);
  SW_SIM_CHECK(GetInt(root, w, "seed", 0, INT64_MAX, &seed));
  sc.seed = static_cast<uint64_t>(seed);
  SW_SIM_CHECK(GetSmallInt(root, w, "nodes", 1, 4096, &sc.nodes));
  SW_SIM_CHECK(GetSmallInt(root, w, "gpus_per_node", 1, 64, &sc.gpus_per_node));
  SW_SIM_CHECK(GetInt(root, w, "steps", 1, 100'000'000, &sc.steps));
  SW_SIM_CHECK(GetDouble(root, w, "step_s", 1e-4, 3600, &sc.step_seconds));
  SW_SIM_CHECK(GetDouble(root, w, "noise_cv", 0, 0.5, &sc.noise_cv));
  SW_SIM_CHECK(GetDouble(root, w, "compute_fraction", 0.01, 1, &sc.compute_fraction));
  SW_SIM_CHECK(GetDouble(root, w, "data_fraction", 0, 0.99, &sc.data_fraction));
  if (sc.compute_fraction + sc.data_fraction > 1) {
    return absl::InvalidArgumentError("scenario: compute_fraction + data_fraction exceeds 1");
  }
  std::string report = "full";
  SW_SIM_CHECK(GetString(root, w, "report", &report));
  if (report == "full") {
    sc.report = Report::kFull;
  } else if (report == "step_comm") {
    sc.report = Report::kStepComm;
  } else if (report == "step_only") {
    sc.report = Report::kStepOnly;
  } else {
    return FieldError(w, "report", "one of full, step_comm, step_only");
  }
  SW_SIM_CHECK(GetInt(root, w, "samples_per_rank", 0, 1'000'000'000, &sc.samples_per_rank));
  SW_SIM_CHECK(GetDouble(root, w, "gpu_interval_s", 0.01, 3600, &sc.gpu_interval_s));
  SW_SIM_CHECK(GetSmallInt(root, w, "pp_stages", 1, 1024, &sc.pp_stages));
  SW_SIM_CHECK(GetSmallInt(root, w, "idle_gpus_per_node", 0, 64, &sc.idle_gpus_per_node));
  if (const Value* v = root.Find("sm_activity")) {
    if (!v->is_bool()) return FieldError(w, "sm_activity", "true or false");
    sc.sm_activity = v->as_bool();
  }
  if ((sc.nodes * sc.gpus_per_node) % sc.pp_stages != 0) {
    return absl::InvalidArgumentError("scenario: pp_stages must divide the number of ranks");
  }
  if (const Value* phases = root.Find("phases")) {
    if (!phases->is_array()) return FieldError(w, "phases", "an array");
    for (const Value& p : phases->as_array()) {
      if (!p.is_object()) return FieldError(w, "phases", "an array of objects");
      Phase ph;
      ph.step_seconds = sc.step_seconds;
      SW_SIM_CHECK(GetInt(p, "phase", "steps", 1, 100'000'000, &ph.steps));
      SW_SIM_CHECK(GetDouble(p, "phase", "step_s", 1e-4, 3600, &ph.step_seconds));
      sc.phases.push_back(ph);
    }
  }
  if (const Value* faults = root.Find("faults")) {
    if (!faults->is_array()) return FieldError(w, "faults", "an array");
    for (const Value& fv : faults->as_array()) {
      if (!fv.is_object()) return FieldError(w, "faults", "an array of objects");
      absl::StatusOr<Fault> f = ParseFault(fv, sc);
      if (!f.ok()) return f.status();
      sc.faults.push_back(*std::move(f));
    }
  }
  return sc;
}

absl::StatusOr<Scenario> LoadScenario(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open scenario file ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<Scenario> sc = ParseScenario(ss.str());
  if (!sc.ok()) {
    return absl::Status(sc.status().code(), absl::StrCat(path, ": ", sc.status().message()));
  }
  return sc;
}

Generator::Generator(Scenario scenario) : sc_(std::move(scenario)), rng_(sc_.seed) {
  // Per-GPU throughput (relative to the start) at each node count, for the rescale verdicts.
  std::vector<std::pair<int, double>> seen = {{sc_.nodes, 1.0}};
  for (const Fault& f : sc_.faults) {
    Truth t;
    t.fault_kind = f.kind;
    t.onset_step = f.onset;
    t.end_step = f.end;
    t.job = sc_.job;
    if (f.rank >= 0 && f.kind != "rescale") {
      t.rank = f.rank;
      t.node = absl::StrCat("node-", f.rank / sc_.gpus_per_node);
      t.gpu = f.rank % sc_.gpus_per_node;
    }
    if (f.kind == "slow_node") t.node = absl::StrCat("node-", f.node);
    if (f.kind == "rescale") {
      // Worth reporting only when per-GPU throughput fell below 80% of the best smaller size.
      const double throughput = 1 / f.factor;
      double best_smaller = 0;
      for (const auto& [n, v] : seen) {
        if (n < f.nodes) best_smaller = std::max(best_smaller, v);
      }
      t.expect_finding = best_smaller > 0 && throughput / best_smaller < 0.8;
      seen.push_back({f.nodes, throughput});
    }
    truth_.push_back(t);
  }
}

const std::string& Generator::NodeName(int node) {
  while (static_cast<int>(node_names_.size()) <= node) {
    node_names_.push_back(absl::StrCat("node-", node_names_.size()));
  }
  return node_names_[node];
}

bool Generator::Active(const Fault& f, int64_t step) const {
  return step >= f.onset && (f.end < 0 || step < f.end);
}

double Generator::BaseStep(int64_t step) const {
  int64_t at = 0;
  for (const Phase& p : sc_.phases) {
    if (step < at + p.steps) return p.step_seconds;
    at += p.steps;
  }
  return sc_.step_seconds;
}

int Generator::Nodes(int64_t step) const {
  int nodes = sc_.nodes;
  for (const Fault& f : sc_.faults) {
    if (f.kind == "rescale" && step >= f.onset) nodes = f.nodes;
  }
  return nodes;
}

double Generator::ThroughputFactor(int64_t step) const {
  double factor = 1;
  for (const Fault& f : sc_.faults) {
    if (f.kind == "rescale" && step >= f.onset) factor = f.factor;
  }
  return factor;
}

void Generator::AddStepEvents(int64_t step, int world, double step_seconds, const RankSplit& split,
                              Tick* tick) {
  const int per_stage = world / sc_.pp_stages;
  tick->samples.reserve(world);
  for (int r = 0; r < world; ++r) {
    analysis::StepEvent s;
    s.job = sc_.job;
    s.rank = r;
    s.world_size = world;
    s.step = step;
    const double busy = split.compute[r] + split.data[r];
    s.step_seconds = step_seconds;
    const double wait = step_seconds - busy;
    if (sc_.report == Report::kFull) {
      s.data_seconds = split.data[r];
      s.compute_seconds = split.compute[r];
      s.comm_seconds = wait;
    } else if (sc_.report == Report::kStepComm) {
      s.comm_seconds = wait;
    }
    if (sc_.samples_per_rank > 0) s.samples = sc_.samples_per_rank;
    s.local_rank = r % sc_.gpus_per_node;
    s.gpu = r % sc_.gpus_per_node;
    if (sc_.pp_stages > 1) {
      s.pp_stage = r / per_stage;
      s.dp_rank = r % per_stage;
      s.tp_rank = 0;
    }
    s.node = NodeName(r / sc_.gpus_per_node);
    s.pid = 10000 + r;
    s.received_unix_nanos = now_;
    tick->samples.push_back(std::move(s));
  }
}

void Generator::AddGpuAndHostSamples(int nodes, bool hung, double step_seconds,
                                     const RankSplit& split,
                                     std::normal_distribution<double>* normal, Tick* tick) {
  if (elapsed_s_ < next_gpu_sample_) return;
  while (next_gpu_sample_ <= elapsed_s_) next_gpu_sample_ += sc_.gpu_interval_s;
  for (int n = 0; n < nodes; ++n) {
    const std::string& node = NodeName(n);
    for (int g = 0; g < sc_.gpus_per_node + sc_.idle_gpus_per_node; ++g) {
      analysis::GpuSample x;
      x.node = node;
      x.index = g;
      x.sampled_unix_nanos = now_;
      x.sm_clock_max_mhz = kMaxClockMhz;
      x.power_limit_watts = 400;
      if (g >= sc_.gpus_per_node) {
        x.utilization_ratio = 0;
        x.sm_clock_mhz = 210;
        x.power_watts = 60;
        x.temperature_celsius = 35;
        x.throttle_reasons = 0x1;  // idle
        tick->gpus.push_back(std::move(x));
        continue;
      }
      const int r = n * sc_.gpus_per_node + g;
      // NVML utilization counts any running kernel, communication included: only the data wait
      // leaves the GPU idle (or a hang, where the collective spins).
      double util = hung ? 1.0 : 1 - split.data[r] / step_seconds;
      util = util * split.gpu_util[r] * (1 + 0.01 * (*normal)(rng_));
      x.utilization_ratio = std::clamp(util, 0.0, 1.0);
      x.sm_clock_mhz = split.clock[r];
      x.power_watts = split.throttled[r] ? 300 : 330;
      x.temperature_celsius = split.throttled[r] ? 91 : 66;
      x.throttle_reasons = split.throttled[r] ? kThermalThrottle : 0;
      x.pids = {static_cast<uint32_t>(10000 + r)};
      if (sc_.sm_activity) {
        // SM activity counts compute only: waiting for data or for the collective is not.
        const double sm = hung ? 0.0 : split.compute[r] / step_seconds * split.gpu_util[r];
        x.sm_activity_ratio = std::clamp(sm * (1 + 0.01 * (*normal)(rng_)), 0.0, 1.0);
      }
      tick->gpus.push_back(std::move(x));
    }
    analysis::HostSample h;
    h.node = node;
    h.sampled_unix_nanos = now_;
    h.cpu_count = 96;
    h.cpu_utilization_ratio = split.host_busy[n] ? 0.98 : 0.35;
    tick->hosts.push_back(std::move(h));
  }
}

bool Generator::Next(Tick* tick) {
  if (step_ >= sc_.steps) return false;
  const int64_t k = step_++;
  std::normal_distribution<double> normal(0, 1);
  const int nodes = Nodes(k);
  const int world = nodes * sc_.gpus_per_node;
  const double base = BaseStep(k) * ThroughputFactor(k);
  const double comm_fraction = std::max(0.0, 1 - sc_.compute_fraction - sc_.data_fraction);

  bool hung = false;
  double comm_factor = 1, data_extra = 0;
  for (const Fault& f : sc_.faults) {
    if (!Active(f, k)) continue;
    if (f.kind == "hang") hung = true;
    if (f.kind == "comm_slowdown") comm_factor *= f.factor;
    if (f.kind == "data_stall") data_extra += f.extra_s;
  }

  tick->step = k;
  tick->world_size = world;
  tick->samples.clear();
  tick->gpus.clear();
  tick->hosts.clear();

  // Per-rank split of this step.
  RankSplit split;
  split.compute.assign(world, 0);
  split.data.assign(world, 0);
  split.gpu_util.assign(world, 1.0);
  split.clock.assign(world, kMaxClockMhz);
  split.throttled.assign(world, false);
  split.host_busy.assign(nodes, false);
  double max_busy = 0;
  const int per_stage = world / sc_.pp_stages;
  for (int r = 0; r < world; ++r) {
    double c = base * sc_.compute_fraction * std::max(0.2, 1 + sc_.noise_cv * normal(rng_));
    double d = base * sc_.data_fraction * std::max(0.0, 1 + sc_.noise_cv * normal(rng_));
    for (const Fault& f : sc_.faults) {
      if (!Active(f, k)) continue;
      if ((f.kind == "slow_rank" && f.rank == r) ||
          (f.kind == "slow_node" && f.node == r / sc_.gpus_per_node) ||
          (f.kind == "slow_stage" && f.stage == r / per_stage)) {
        c *= f.factor;  // the rank's whole busy time is `factor` slower
        d *= f.factor;
      }
      if (f.kind == "slow_node" && f.node == r / sc_.gpus_per_node) split.host_busy[f.node] = true;
      if (f.kind == "throttled_gpu" && f.rank == r) {
        c *= f.factor;
        split.clock[r] = kMaxClockMhz / f.factor;
        split.throttled[r] = true;
      }
      if (f.kind == "low_gpu_util" && (f.rank < 0 || f.rank == r)) split.gpu_util[r] *= f.factor;
    }
    d += data_extra;
    split.compute[r] = c;
    split.data[r] = d;
    max_busy = std::max(max_busy, c + d);
  }
  const double comm =
      base * comm_fraction * comm_factor * std::max(0.1, 1 + sc_.noise_cv / 2 * normal(rng_));
  const double step_seconds = max_busy + comm;
  elapsed_s_ += hung ? base : step_seconds;
  now_ = kStartUnixNanos + static_cast<int64_t>(elapsed_s_ * 1e9);
  tick->unix_nanos = now_;

  for (size_t i = 0; i < sc_.faults.size(); ++i) {
    if (sc_.faults[i].onset == k) truth_[i].onset_unix_nanos = now_;
    if (sc_.faults[i].end == k) truth_[i].end_unix_nanos = now_;
  }

  if (!hung) AddStepEvents(k, world, step_seconds, split, tick);
  AddGpuAndHostSamples(nodes, hung, step_seconds, split, &normal, tick);
  return true;
}

}  // namespace stepwatch::sim
