// stepwatch C++ client: how a Reporter is set up and torn down: its identity (from the options or
// the environment), the fixed start of every message, and the sender thread.
#pragma once

#include <sys/un.h>
#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "stepwatch/client_record.h"
#include "stepwatch/client_reporter.h"
#include "stepwatch/detail/client_json.h"
#include "stepwatch/detail/reporter_send.h"

namespace stepwatch {

namespace client_internal {

// Parses a non-negative decimal int from the environment variable; nullopt when unset or empty;
// sets *bad when set but not a number.
inline std::optional<long> EnvInt(const char* name, bool* bad) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return std::nullopt;
  long value = 0;
  const char* end = raw + std::strlen(raw);
  auto [ptr, ec] = std::from_chars(raw, end, value);
  if (ec != std::errc() || ptr != end) {
    *bad = true;
    return std::nullopt;
  }
  return value;
}

inline std::string EnvString(const char* name) {
  const char* raw = std::getenv(name);
  return raw == nullptr ? std::string() : std::string(raw);
}

// The first of the environment variables `a` and `b` that is set, as an integer; nullopt when
// neither is (or `env` is false), and when one is set but not an integer (*error says which).
inline std::optional<long> FirstEnvInt(bool env, const char* a, const char* b, std::string* error) {
  if (!env) return std::nullopt;
  for (const char* name : {a, b}) {
    bool bad = false;
    const std::optional<long> value = EnvInt(name, &bad);
    if (bad) {
      *error = std::string("environment variable ") + name + " is not an integer";
      return std::nullopt;
    }
    if (value) return value;
  }
  return std::nullopt;
}

// A rank's place in its job; local_rank -1 when unknown.
struct Ranks {
  long rank = 0;
  long world = 1;
  long local_rank = -1;
};

// The ranks from the options, else the environment (RANK or SLURM_PROCID, WORLD_SIZE or
// SLURM_NTASKS, LOCAL_RANK or SLURM_LOCALID), else rank 0 of 1. False, with *error, when an
// environment variable is not an integer or the ranks break the step-event rules.
inline bool ResolveRanks(const ReporterOptions& o, Ranks* out, std::string* error) {
  const bool env = o.use_environment;
  Ranks r{o.rank, o.world_size, o.local_rank};
  if (r.rank < 0) r.rank = FirstEnvInt(env, "RANK", "SLURM_PROCID", error).value_or(0);
  if (!error->empty()) return false;
  if (r.world < 0) r.world = FirstEnvInt(env, "WORLD_SIZE", "SLURM_NTASKS", error).value_or(1);
  if (!error->empty()) return false;
  if (r.local_rank < 0) {
    r.local_rank = FirstEnvInt(env, "LOCAL_RANK", "SLURM_LOCALID", error).value_or(-1);
  }
  if (!error->empty()) return false;
  if (!step_event::IntegerInRange(step_event::kWorldSize, r.world)) {
    *error = "world_size must be in [1, " + std::to_string(kMaxWorldSize) + "], got " +
             std::to_string(r.world);
    return false;
  }
  if (r.rank < 0 || r.rank >= r.world) {
    *error =
        "rank " + std::to_string(r.rank) + " is not below world_size " + std::to_string(r.world);
    return false;
  }
  *out = r;
  return true;
}

// The job id the environment names: STEPWATCH_JOB, TORCHELASTIC_RUN_ID (unless "none"),
// SLURM_JOB_ID or MASTER_ADDR+MASTER_PORT; "" when none does.
inline std::string JobFromEnvironment() {
  std::string job = EnvString("STEPWATCH_JOB");
  if (job.empty()) {
    std::string run_id = EnvString("TORCHELASTIC_RUN_ID");
    if (run_id != "none") job = run_id;
  }
  if (job.empty()) {
    std::string slurm = EnvString("SLURM_JOB_ID");
    if (!slurm.empty()) job = "slurm-" + slurm;
  }
  if (job.empty()) {
    std::string addr = EnvString("MASTER_ADDR");
    std::string port = EnvString("MASTER_PORT");
    if (!addr.empty() && !port.empty()) job = "torch-" + addr + "-" + port;
  }
  return job;
}

// The job id of a single-process run that names none: this host and process.
inline std::string LocalJobId() {
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
  return std::string("local-") + host + "-" + std::to_string(::getpid());
}

// The start of every message: '{"job":...,"rank":..,"world_size":..' and the optional identity
// fields that are set (>= 0). Integers only: std::to_string of an int ignores the locale.
inline std::string EventPrefix(const std::string& job, const Ranks& ranks,
                               const ReporterOptions& o) {
  std::string prefix = "{\"job\":";
  AppendJsonString(job, &prefix);
  prefix +=
      ",\"rank\":" + std::to_string(ranks.rank) + ",\"world_size\":" + std::to_string(ranks.world);
  const std::pair<const char*, long> optional_fields[] = {
      {"local_rank", ranks.local_rank}, {"gpu", o.gpu},         {"dp_rank", o.dp_rank},
      {"pp_stage", o.pp_stage},         {"tp_rank", o.tp_rank},
  };
  for (const auto& [name, value] : optional_fields) {
    if (value >= 0) prefix += std::string(",\"") + name + "\":" + std::to_string(value);
  }
  return prefix;
}
}  // namespace client_internal

inline Reporter::Reporter(ReporterOptions options) noexcept : options_(std::move(options)) {
  try {
    Configure(options_);
  } catch (...) {
    error_ = "cannot configure the stepwatch reporter (out of memory)";
  }
  if (!error_.empty()) {
    Drop(error_.c_str(), 0);
    dropped_.store(0);  // the warning is out; nothing was dropped yet
    unreported_.store(0);
    return;
  }
  if (options_.flush_interval < std::chrono::milliseconds(1)) {
    options_.flush_interval = std::chrono::milliseconds(1);  // never spin
  }
  if (options_.background) {
    try {
      ring_.resize(options_.queue_capacity > 0 ? options_.queue_capacity : 1);
      thread_ = std::thread([this] { Run(); });
    } catch (...) {
      ring_.clear();  // no thread: send inline
    }
  }
}

inline Reporter::~Reporter() {
  if (thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(queue_mu_);
      stop_ = true;
    }
    queue_cv_.notify_one();
    thread_.join();
  }
  std::lock_guard<std::mutex> lock(io_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

inline void Reporter::Configure(const ReporterOptions& o) {
  client_internal::Ranks ranks;
  if (!client_internal::ResolveRanks(o, &ranks, &error_)) return;
  std::string job = o.job;
  if (job.empty() && o.use_environment) job = client_internal::JobFromEnvironment();
  if (job.empty()) {
    if (ranks.world > 1) {
      error_ = "cannot tell the job id of a " + std::to_string(ranks.world) +
               "-rank job: set STEPWATCH_JOB or ReporterOptions::job";
      return;
    }
    job = client_internal::LocalJobId();
  }
  if (const char* invalid = ValidateJob(job)) {
    error_ = std::string(invalid) + ": the agent would refuse every event";
    return;
  }
  if (ranks.local_rank > kMaxGpuIndex || o.gpu > kMaxGpuIndex) {
    error_ = "local_rank and gpu must be at most " + std::to_string(kMaxGpuIndex);
    return;
  }

  std::string path = o.socket_path;
  if (path.empty() && o.use_environment) path = client_internal::EnvString("STEPWATCH_SOCKET");
  if (path.empty()) path = kDefaultSocketPath;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    error_ = "socket path is too long: " + path;
    return;
  }

  job_ = job;
  rank_ = static_cast<int>(ranks.rank);
  world_size_ = static_cast<int>(ranks.world);
  local_rank_ = static_cast<int>(ranks.local_rank);
  socket_path_ = path;
  prefix_ = client_internal::EventPrefix(job_, ranks, o);
}
}  // namespace stepwatch
