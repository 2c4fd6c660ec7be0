// stepwatch C++ client: reports the timing of every training step to the stepwatch agent.
//
// Header-only, C++17, POSIX. No dependency beyond the standard library.
//
//   stepwatch::Reporter reporter;  // identity from RANK/WORLD_SIZE/... and $STEPWATCH_SOCKET
//   for (...) {
//     stepwatch::StepScope step(reporter, /*samples=*/batch_size);
//     { stepwatch::PhaseScope p(step, stepwatch::Phase::kData); batch = NextBatch(); }
//     { stepwatch::PhaseScope p(step, stepwatch::Phase::kCompute); Train(batch); }
//     { stepwatch::PhaseScope p(step, "optimizer"); optimizer.Step(); }  // a named section
//   }  // the step's event is sent when `step` goes out of scope
//
// Each step is one JSON message (the step-event datagram v1, docs/step-event.md) to the agent: a
// packet on a
// connection to its SOCK_SEQPACKET socket (`<socket>.seq`) when the agent has one, else a datagram
// on its Unix datagram socket (older agents). A connection queues as many messages as its send
// buffer holds; a datagram socket queues at most net.unix.max_dgram_qlen (10 by default), so bursts
// of ranks finishing a step together lose datagrams. Every message that leaves carries "dropped":
// the events this reporter failed to send since the previous message that left (left out when 0),
// which the agent counts per job. Nothing here throws or blocks the caller: by default events go
// through a bounded in-memory queue to a sender thread owned by the Reporter, so the caller never
// makes a system call. When the agent is absent, its queue is full, or the queue here is full, the
// event is dropped and counted (Reporter::dropped()), and a single warning goes to stderr.
#pragma once

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace stepwatch {

inline constexpr char kDefaultSocketPath[] = "/run/stepwatch/agent.sock";

// The agent's rules for step events (docs/step-event.md), copied so that this header stands alone;
// tests/client proves them equal to the agent's and to proto/step_event_rules.json. What breaks
// them is refused here, where the caller hears of it, not silently by the agent.
// The largest message the agent reads.
inline constexpr size_t kMaxDatagramBytes = 64 * 1024;
// Job ids: 1 to kMaxJobBytes bytes of UTF-8 without control characters.
inline constexpr size_t kMaxJobBytes = 256;
// step_s, data_s, compute_s, comm_s: at most a day.
inline constexpr double kMaxSeconds = 86400;
// world_size (rank is below it); local_rank and gpu. dp_rank, pp_stage, tp_rank: any int >= 0.
inline constexpr int kMaxWorldSize = 1 << 20;
inline constexpr int kMaxGpuIndex = 1023;
// Named sections ("sections"): at most kMaxSections per event (and per Reporter here), each name
// 1 to kMaxSectionNameBytes bytes of [A-Za-z0-9_.:/-] other than the built-in phases' names
// (data, compute, comm); values 0 to kMaxSeconds.
inline constexpr int kMaxSections = 16;
inline constexpr size_t kMaxSectionNameBytes = 64;
// Suffix of the agent's seqpacket socket path.
inline constexpr char kSeqpacketSuffix[] = ".seq";
// Requested send buffer of a connection: the messages it holds while the agent is busy (the
// kernel caps it at net.core.wmem_max).
inline constexpr int kSendBufferBytes = 4 << 20;
// How events reach the agent.
enum class Transport : int { kNone = 0, kSeqpacket = 1, kDatagram = 2 };

// Phases of a step, reported as data_s, compute_s and comm_s.
enum class Phase : int { kData = 0, kCompute = 1, kComm = 2 };

// One step of one rank, as sent. Absent optionals are left out of the JSON.
struct StepRecord {
  int64_t step = 0;                 // >= 0
  double step_s = 0;                // > 0, finite
  std::optional<double> data_s;     // >= 0, finite
  std::optional<double> compute_s;  // >= 0, finite
  std::optional<double> comm_s;     // >= 0, finite
  std::optional<int64_t> samples;   // >= 0
  // Named sections, by the Reporter's section ids (Reporter::SectionId): section_s[id] (>= 0,
  // finite) is sent under the section's name when bit `id` of section_mask is set. Fixed-size, so
  // that queueing a record allocates nothing.
  uint16_t section_mask = 0;
  double section_s[kMaxSections] = {};

  void SetSection(int id, double seconds) noexcept {
    if (id < 0 || id >= kMaxSections) return;
    section_mask = static_cast<uint16_t>(section_mask | (1u << id));
    section_s[id] = seconds;
  }
};

struct ReporterOptions {
  // Identity. Unset values (empty / negative) come from the environment when use_environment:
  // job from STEPWATCH_JOB, TORCHELASTIC_RUN_ID (unless "none"), SLURM_JOB_ID or
  // MASTER_ADDR+MASTER_PORT; rank from RANK or SLURM_PROCID; world_size from WORLD_SIZE or
  // SLURM_NTASKS; local_rank from LOCAL_RANK or SLURM_LOCALID. Otherwise rank 0 of 1.
  std::string job;
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  int gpu = -1;  // NVML index of the rank's GPU
  int dp_rank = -1;
  int pp_stage = -1;
  int tp_rank = -1;
  // Agent socket; empty: $STEPWATCH_SOCKET, else kDefaultSocketPath.
  std::string socket_path;
  bool use_environment = true;

  // Send from an owned thread through a queue of `queue_capacity` events (the caller makes no
  // system call); false: send inline from Send() (a non-blocking send per event).
  bool background = true;
  size_t queue_capacity = 1024;
  // How long queued events may wait before the sender thread sends them.
  std::chrono::milliseconds flush_interval{10};
  // While the agent is unreachable, connecting is retried at most this often.
  std::chrono::milliseconds reconnect_interval{1000};
  // Print the one warning about dropped events to stderr.
  bool warn_on_stderr = true;
};

// Why the agent would refuse `job` (nullptr when it would not): empty, over kMaxJobBytes, not
// UTF-8, or a control character (U+0000..U+001F, U+007F..U+009F).
const char* ValidateJob(const std::string& job) noexcept;
// Why the agent would refuse an event with these values (nullptr when it would not).
const char* ValidateStepRecord(const StepRecord& record) noexcept;
// Why the agent would refuse `name` as a section name (nullptr when it would not).
const char* ValidateSectionName(std::string_view name) noexcept;

class Reporter {
 public:
  explicit Reporter(ReporterOptions options = {}) noexcept;
  // Sends what is still queued (non-blocking sends), then stops the sender thread.
  ~Reporter();
  Reporter(const Reporter&) = delete;
  Reporter& operator=(const Reporter&) = delete;

  // False when the identity was invalid (error() says why): every event is then dropped.
  bool ok() const noexcept { return error_.empty(); }
  const std::string& error() const noexcept { return error_; }

  // Queues (or, without a sender thread, sends) one event. Returns false when it was dropped:
  // invalid values, queue full, agent unreachable (inline mode) or a bad identity.
  bool Send(const StepRecord& record) noexcept;

  // Waits, at most `timeout`, until every event queued before the call was handed to the kernel
  // or dropped. True when that happened in time.
  bool Flush(std::chrono::milliseconds timeout = std::chrono::milliseconds(1000)) noexcept;

  uint64_t sent() const noexcept { return sent_.load(std::memory_order_relaxed); }
  uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  // The transport of the current connection (kNone while there is none).
  Transport transport() const noexcept {
    return static_cast<Transport>(transport_.load(std::memory_order_relaxed));
  }
  // Why the last event was dropped ("" when none was).
  std::string last_error() const;

  const std::string& job() const noexcept { return job_; }
  int rank() const noexcept { return rank_; }
  int world_size() const noexcept { return world_size_; }
  int local_rank() const noexcept { return local_rank_; }
  const std::string& socket_path() const noexcept { return socket_path_; }
  bool background() const noexcept { return thread_.joinable(); }

  // Formats `record` as the message's JSON into buf[0, capacity), with "dropped":`dropped` when
  // that is not 0. Returns the length, or 0 when it does not fit. Does not validate.
  size_t Encode(const StepRecord& record, char* buf, size_t capacity,
                uint64_t dropped = 0) const noexcept;

  // Step numbering used by StepScope: a counter that follows the last step reported.
  int64_t next_step() const noexcept { return next_step_.load(std::memory_order_relaxed); }

  // The id of section `name` on this reporter, registered on first use (ids 0, 1, ... in order of
  // first use): -1 when the name is invalid (ValidateSectionName) or kMaxSections other names are
  // registered; `*why` (when given) then says which. Thread-safe; lock-free once registered.
  int SectionId(std::string_view name, const char** why = nullptr) noexcept;
  // The registered section names, in id order.
  int section_count() const noexcept { return section_count_.load(std::memory_order_acquire); }
  const std::string& section_name(int id) const noexcept { return section_names_[id]; }

 private:
  friend class StepScope;
  friend class PhaseScope;

  // One warning on stderr (not a drop) about a section name that PhaseScope ignores.
  void WarnSection(std::string_view name, const char* why) noexcept;

  void Configure(const ReporterOptions& options);
  bool SendNowLocked(const StepRecord& record) noexcept;
  // The connected socket; -1 after a failed attempt (dropped and counted), -2 while waiting to
  // retry.
  int ConnectLocked() noexcept;
  void Drop(const char* reason, int err) noexcept;
  void CountDrop() noexcept {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    unreported_.fetch_add(1, std::memory_order_relaxed);
  }
  // A connected non-blocking socket of `type` to `path`, or -1 (errno set).
  static int Open(int type, const std::string& path) noexcept;
  void Run() noexcept;

  ReporterOptions options_;
  std::string error_;
  std::string job_;
  int rank_ = 0;
  int world_size_ = 1;
  int local_rank_ = -1;
  std::string socket_path_;
  std::string prefix_;  // '{"job":...,"rank":..,"world_size":..' plus the static optional fields

  std::atomic<uint64_t> sent_{0};
  std::atomic<uint64_t> dropped_{0};
  // Drops not yet reported to the agent (the next message's "dropped" field).
  std::atomic<uint64_t> unreported_{0};
  std::atomic<int> transport_{0};
  std::atomic<bool> warned_{false};
  std::atomic<bool> section_warned_{false};
  std::atomic<int64_t> next_step_{0};

  // Section names: an entry below section_count_ is never written again, so it is read without a
  // lock; sections_mu_ serializes registering.
  std::mutex sections_mu_;
  std::string section_names_[kMaxSections];
  std::atomic<int> section_count_{0};

  // std::mutex, not absl::Mutex: this public header-only client must not depend on Abseil, so its
  // locks are exempt from the clang -Wthread-safety checks (the comments say what each guards).
  // Socket state; guarded by io_mu_.
  std::mutex io_mu_;
  int fd_ = -1;
  std::chrono::steady_clock::time_point next_connect_{};
  // Guarded by error_mu_ (a leaf lock: nothing is locked while holding it).
  mutable std::mutex error_mu_;
  char last_error_[160] = {0};

  // Queue; guarded by queue_mu_.
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;  // wakes the sender
  std::condition_variable done_cv_;   // wakes Flush()
  std::vector<StepRecord> ring_;
  size_t head_ = 0;
  size_t size_ = 0;
  uint64_t enqueued_ = 0;  // events ever queued
  uint64_t handled_ = 0;   // events ever taken off the queue and sent or dropped
  bool stop_ = false;
  bool flush_requested_ = false;
  std::thread thread_;
};

class PhaseScope;

// Times one step; sends its event when destroyed (unless Cancel()ed).
class StepScope {
 public:
  // Step number: one more than the previous step this reporter's scopes reported (0 first).
  explicit StepScope(Reporter& reporter, int64_t samples = -1) noexcept
      : StepScope(reporter, reporter.next_step(), samples) {}
  StepScope(Reporter& reporter, int64_t step, int64_t samples) noexcept
      : reporter_(reporter), step_(step), samples_(samples), start_(Clock::now()) {}
  ~StepScope();
  StepScope(const StepScope&) = delete;
  StepScope& operator=(const StepScope&) = delete;

  void set_samples(int64_t samples) noexcept { samples_ = samples; }
  // The step failed or is not to be reported.
  void Cancel() noexcept { cancelled_ = true; }
  int64_t step() const noexcept { return step_; }

 private:
  friend class PhaseScope;
  using Clock = std::chrono::steady_clock;

  Reporter& reporter_;
  int64_t step_;
  int64_t samples_;
  Clock::time_point start_;
  Clock::duration phase_time_[3] = {};
  PhaseScope* active_ = nullptr;
  bool cancelled_ = false;
  // Named sections: the time of each in this step, those entered in it, those open now, and for
  // an open one the phase it counts toward and that phase's time when it was entered.
  Clock::duration section_time_[kMaxSections] = {};
  uint16_t section_used_ = 0;
  uint16_t section_open_ = 0;
  int8_t section_phase_[kMaxSections] = {};
  Clock::duration section_base_[kMaxSections] = {};
};

// Times a phase or a named section of a step.
//
// Phases (Phase::kData, kCompute, kComm, or the names "data", "compute", "comm") nest: an inner
// phase pauses the outer one, so communication inside compute is not counted as compute.
//
// A named section (any other valid name: "forward", "backward", "optimizer", ...) is reported in
// the event's "sections" and is not a phase of its own: its time counts toward compute_s, unless
// it is entered inside a data or comm phase, whose time it then is. Its own time is the time that
// counts toward that phase while it is open, so a data or comm phase inside it (waiting for other
// ranks inside "backward") is left out of it; a section inside another section counts in both.
// Using one name several times in a step adds up; the same name inside itself counts once. An
// invalid name (ValidateSectionName) or a 17th name on a Reporter times nothing: ok() is false and
// one warning goes to stderr (nothing here throws).
class PhaseScope {
 public:
  PhaseScope(StepScope& step, Phase phase) noexcept : step_(step) {
    EnterPhase(static_cast<int>(phase));
  }
  PhaseScope(StepScope& step, std::string_view name) noexcept;
  PhaseScope(StepScope& step, const char* name) noexcept
      : PhaseScope(step, std::string_view(name != nullptr ? name : "")) {}
  PhaseScope(StepScope& step, const std::string& name) noexcept
      : PhaseScope(step, std::string_view(name)) {}
  ~PhaseScope();
  PhaseScope(const PhaseScope&) = delete;
  PhaseScope& operator=(const PhaseScope&) = delete;

  // False when the name was refused: the scope times nothing.
  bool ok() const noexcept { return ok_; }

 private:
  friend class StepScope;

  void EnterPhase(int index) noexcept {
    index_ = index;
    parent_ = step_.active_;
    const auto now = StepScope::Clock::now();
    if (parent_ != nullptr) step_.phase_time_[parent_->index_] += now - parent_->start_;
    step_.active_ = this;
    start_ = now;
  }

  StepScope& step_;
  int index_ = -1;  // the phase this scope is in the chain of open phases as; -1: not in it
  PhaseScope* parent_ = nullptr;
  StepScope::Clock::time_point start_;
  int section_ = -1;  // the section this scope times; -1: none
  bool ok_ = true;
};

// ------------------------------------------------------------------------------------------------
// Implementation.

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

// Appends `s` as a JSON string literal.
inline void AppendJsonString(const std::string& s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\t':
        out->append("\\t");
        break;
      case '\r':
        out->append("\\r");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 0xf]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Bounded writer into a caller's buffer; `ok` turns false once something did not fit.
struct Writer {
  char* p;
  char* end;
  bool ok = true;

  void Raw(const char* s, size_t n) noexcept {
    if (!ok || static_cast<size_t>(end - p) < n) {
      ok = false;
      return;
    }
    std::memcpy(p, s, n);
    p += n;
  }
  template <size_t N>
  void Lit(const char (&s)[N]) noexcept {
    Raw(s, N - 1);
  }
  void Int(int64_t v) noexcept {
    if (!ok) return;
    auto r = std::to_chars(p, end, v);
    if (r.ec != std::errc()) {
      ok = false;
      return;
    }
    p = r.ptr;
  }
  // Shortest round-trip form ("0.25", "1e-05"): valid JSON for finite values.
  void Double(double v) noexcept {
    if (!ok) return;
    auto r = std::to_chars(p, end, v);
    if (r.ec != std::errc()) {
      ok = false;
      return;
    }
    p = r.ptr;
  }
};

inline bool ValidDuration(const std::optional<double>& d) {
  return !d.has_value() || (std::isfinite(*d) && *d >= 0 && *d <= kMaxSeconds);
}

// Length of the well-formed UTF-8 sequence at s[i] (no overlong forms, surrogates or code points
// over U+10FFFF), 0 when there is none; *cp receives the code point.
inline size_t Utf8At(const std::string& s, size_t i, uint32_t* cp) noexcept {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  size_t len = 0;
  uint32_t min = 0;
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
    min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    min = 0x10000;
  } else {
    return 0;
  }
  if (s.size() - i < len) return 0;
  uint32_t v = c & (0xFFu >> (len + 1));
  for (size_t k = 1; k < len; ++k) {
    const unsigned char cc = static_cast<unsigned char>(s[i + k]);
    if ((cc & 0xC0) != 0x80) return 0;
    v = (v << 6) | (cc & 0x3F);
  }
  if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
  *cp = v;
  return len;
}

}  // namespace client_internal

inline const char* ValidateJob(const std::string& job) noexcept {
  if (job.empty()) return "job id is empty";
  static_assert(kMaxJobBytes == 256, "the message below names the limit");
  if (job.size() > kMaxJobBytes) return "job id is over 256 bytes";
  for (size_t i = 0; i < job.size();) {
    uint32_t cp = 0;
    const size_t len = client_internal::Utf8At(job, i, &cp);
    if (len == 0) return "job id is not UTF-8";
    if (cp < 0x20 || (cp >= 0x7F && cp <= 0x9F)) return "job id contains a control character";
    i += len;
  }
  return nullptr;
}

inline const char* ValidateStepRecord(const StepRecord& r) noexcept {
  if (r.step < 0) return "invalid step event: step < 0";
  if (!(std::isfinite(r.step_s) && r.step_s > 0 && r.step_s <= kMaxSeconds)) {
    return "invalid step event: step_s must be > 0 and at most a day";
  }
  if (!client_internal::ValidDuration(r.data_s) || !client_internal::ValidDuration(r.compute_s) ||
      !client_internal::ValidDuration(r.comm_s)) {
    return "invalid step event: a phase duration is negative, not finite or over a day";
  }
  if (r.samples && *r.samples < 0) return "invalid step event: samples < 0";
  for (int id = 0; id < kMaxSections; ++id) {
    if ((r.section_mask & (1u << id)) != 0 && !client_internal::ValidDuration(r.section_s[id])) {
      return "invalid step event: a section duration is negative, not finite or over a day";
    }
  }
  return nullptr;
}

inline const char* ValidateSectionName(std::string_view name) noexcept {
  if (name.empty()) return "section name is empty";
  static_assert(kMaxSectionNameBytes == 64, "the message below names the limit");
  if (name.size() > kMaxSectionNameBytes) return "section name is over 64 bytes";
  for (const char ch : name) {
    const bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                    (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == ':' || ch == '/' ||
                    ch == '-';
    if (!ok) return "section name has a character other than A-Za-z0-9_.:/-";
  }
  if (name == "data" || name == "compute" || name == "comm") {
    return "section name is a built-in phase (data, compute, comm)";
  }
  return nullptr;
}

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
  using client_internal::EnvInt;
  using client_internal::EnvString;
  bool bad = false;
  const bool env = o.use_environment;
  auto first_int = [&](const char* a, const char* b) -> std::optional<long> {
    if (!env) return std::nullopt;
    bool bad_a = false;
    auto v = EnvInt(a, &bad_a);
    if (bad_a) {
      bad = true;
      error_ = std::string("environment variable ") + a + " is not an integer";
      return std::nullopt;
    }
    if (v) return v;
    bool bad_b = false;
    v = EnvInt(b, &bad_b);
    if (bad_b) {
      bad = true;
      error_ = std::string("environment variable ") + b + " is not an integer";
    }
    return v;
  };

  long rank = o.rank;
  long world = o.world_size;
  long local_rank = o.local_rank;
  if (rank < 0) rank = first_int("RANK", "SLURM_PROCID").value_or(0);
  if (bad) return;
  if (world < 0) world = first_int("WORLD_SIZE", "SLURM_NTASKS").value_or(1);
  if (bad) return;
  if (local_rank < 0) local_rank = first_int("LOCAL_RANK", "SLURM_LOCALID").value_or(-1);
  if (bad) return;
  if (world < 1 || world > kMaxWorldSize) {
    error_ = "world_size must be in [1, " + std::to_string(kMaxWorldSize) + "], got " +
             std::to_string(world);
    return;
  }
  if (rank < 0 || rank >= world) {
    error_ = "rank " + std::to_string(rank) + " is not below world_size " + std::to_string(world);
    return;
  }

  std::string job = o.job;
  if (job.empty() && env) {
    job = EnvString("STEPWATCH_JOB");
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
  }
  if (job.empty()) {
    if (world > 1) {
      error_ = "cannot tell the job id of a " + std::to_string(world) +
               "-rank job: set STEPWATCH_JOB or ReporterOptions::job";
      return;
    }
    char host[256] = {0};
    if (::gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "unknown");
    job = std::string("local-") + host + "-" + std::to_string(::getpid());
  }

  if (const char* invalid = ValidateJob(job)) {
    error_ = std::string(invalid) + ": the agent would refuse every event";
    return;
  }
  if (local_rank > kMaxGpuIndex || o.gpu > kMaxGpuIndex) {
    error_ = "local_rank and gpu must be at most " + std::to_string(kMaxGpuIndex);
    return;
  }

  std::string path = o.socket_path;
  if (path.empty() && env) path = EnvString("STEPWATCH_SOCKET");
  if (path.empty()) path = kDefaultSocketPath;
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    error_ = "socket path is too long: " + path;
    return;
  }

  job_ = job;
  rank_ = static_cast<int>(rank);
  world_size_ = static_cast<int>(world);
  local_rank_ = static_cast<int>(local_rank);
  socket_path_ = path;

  prefix_ = "{\"job\":";
  client_internal::AppendJsonString(job_, &prefix_);
  prefix_ +=
      ",\"rank\":" + std::to_string(rank_) + ",\"world_size\":" + std::to_string(world_size_);
  const std::pair<const char*, int> optional_fields[] = {
      {"local_rank", local_rank_}, {"gpu", o.gpu},         {"dp_rank", o.dp_rank},
      {"pp_stage", o.pp_stage},    {"tp_rank", o.tp_rank},
  };
  for (const auto& [name, value] : optional_fields) {
    if (value >= 0) prefix_ += std::string(",\"") + name + "\":" + std::to_string(value);
  }
}

inline size_t Reporter::Encode(const StepRecord& r, char* buf, size_t capacity,
                               uint64_t dropped) const noexcept {
  client_internal::Writer w{buf, buf + capacity};
  w.Raw(prefix_.data(), prefix_.size());
  w.Lit(",\"step\":");
  w.Int(r.step);
  w.Lit(",\"step_s\":");
  w.Double(r.step_s);
  if (r.data_s) {
    w.Lit(",\"data_s\":");
    w.Double(*r.data_s);
  }
  if (r.compute_s) {
    w.Lit(",\"compute_s\":");
    w.Double(*r.compute_s);
  }
  if (r.comm_s) {
    w.Lit(",\"comm_s\":");
    w.Double(*r.comm_s);
  }
  if (r.samples) {
    w.Lit(",\"samples\":");
    w.Int(*r.samples);
  }
  if (r.section_mask != 0) {
    // Names need no escaping: they are [A-Za-z0-9_.:/-] only.
    const int registered = section_count();
    w.Lit(",\"sections\":{");
    bool first = true;
    for (int id = 0; id < kMaxSections; ++id) {
      if ((r.section_mask & (1u << id)) == 0) continue;
      if (id >= registered) {
        w.ok = false;  // an id this reporter never gave out (Send() refuses such records)
        break;
      }
      if (!first) w.Lit(",");
      first = false;
      w.Lit("\"");
      w.Raw(section_names_[id].data(), section_names_[id].size());
      w.Lit("\":");
      w.Double(r.section_s[id]);
    }
    w.Lit("}");
  }
  if (dropped > 0) {
    w.Lit(",\"dropped\":");
    w.Int(static_cast<int64_t>(dropped));
  }
  w.Lit("}");
  return w.ok ? static_cast<size_t>(w.p - buf) : 0;
}

inline bool Reporter::Send(const StepRecord& record) noexcept {
  if (!ok()) {
    dropped_.fetch_add(1, std::memory_order_relaxed);  // nothing can ever report it
    return false;
  }
  if (const char* invalid = ValidateStepRecord(record)) {
    Drop(invalid, 0);
    return false;
  }
  if ((record.section_mask >> section_count()) != 0) {
    Drop("invalid step event: a section id this reporter did not give out", 0);
    return false;
  }
  if (!thread_.joinable()) {
    std::lock_guard<std::mutex> lock(io_mu_);
    return SendNowLocked(record);
  }
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(queue_mu_);
    if (size_ == ring_.size()) {
      if (warned_.load(std::memory_order_relaxed)) {
        // Hot path of a stalled sender: count, format nothing.
        CountDrop();
      } else {
        Drop("the stepwatch client's queue is full", 0);
      }
      return false;
    }
    ring_[(head_ + size_) % ring_.size()] = record;
    ++size_;
    ++enqueued_;
    wake = size_ == ring_.size() / 2 + 1;
  }
  if (wake) queue_cv_.notify_one();  // half full: send before the periodic flush
  return true;
}

inline bool Reporter::Flush(std::chrono::milliseconds timeout) noexcept {
  if (!thread_.joinable()) return true;
  std::unique_lock<std::mutex> lock(queue_mu_);
  const uint64_t target = enqueued_;
  flush_requested_ = true;
  queue_cv_.notify_one();
  return done_cv_.wait_for(lock, timeout, [&] { return handled_ >= target; });
}

inline std::string Reporter::last_error() const {
  std::lock_guard<std::mutex> lock(error_mu_);
  return last_error_;
}

inline void Reporter::Run() noexcept {
  std::vector<StepRecord> batch;
  batch.reserve(ring_.size());
  std::unique_lock<std::mutex> lock(queue_mu_);
  while (true) {
    queue_cv_.wait_for(lock, options_.flush_interval,
                       [&] { return stop_ || flush_requested_ || size_ > ring_.size() / 2; });
    flush_requested_ = false;
    batch.clear();
    for (; size_ > 0; --size_) {
      batch.push_back(ring_[head_]);
      head_ = (head_ + 1) % ring_.size();
    }
    const bool stopping = stop_;
    lock.unlock();
    if (!batch.empty()) {
      std::lock_guard<std::mutex> io(io_mu_);
      for (const StepRecord& r : batch) SendNowLocked(r);
    }
    lock.lock();
    handled_ += batch.size();
    done_cv_.notify_all();
    if (stopping && size_ == 0) return;
  }
}

inline int Reporter::Open(int type, const std::string& path) noexcept {
  if (path.size() >= sizeof(sockaddr_un::sun_path)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  const int fd = ::socket(AF_UNIX, type | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (type == SOCK_SEQPACKET) {
    // Room for bursts; the default buffer still works when the request is refused.
    const int bytes = kSendBufferBytes;
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.data(), path.size());
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

inline int Reporter::ConnectLocked() noexcept {
  if (fd_ >= 0) return fd_;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_connect_) return -2;
  next_connect_ = now + options_.reconnect_interval;
  // The seqpacket socket when the agent has one; else datagrams (an older agent).
  int fd = Open(SOCK_SEQPACKET, socket_path_ + kSeqpacketSuffix);
  Transport transport = Transport::kSeqpacket;
  if (fd < 0) {
    fd = Open(SOCK_DGRAM, socket_path_);
    transport = Transport::kDatagram;
  }
  if (fd < 0) {
    Drop("cannot reach the stepwatch agent", errno);
    return -1;
  }
  fd_ = fd;
  transport_.store(static_cast<int>(transport), std::memory_order_relaxed);
  return fd_;
}

inline bool Reporter::SendNowLocked(const StepRecord& record) noexcept {
  char buf[4096];
  // Drops since the last message that left ride along with this one.
  const uint64_t pending = unreported_.load(std::memory_order_relaxed);
  const size_t n = Encode(record, buf, sizeof(buf), pending);
  if (n == 0) {
    Drop("step event does not fit in a datagram", 0);
    return false;
  }
  const int fd = ConnectLocked();
  if (fd == -2) {
    CountDrop();  // the failed attempt recorded the reason
    return false;
  }
  if (fd < 0) return false;
  if (::send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL) == static_cast<ssize_t>(n)) {
    sent_.fetch_add(1, std::memory_order_relaxed);
    if (pending > 0) unreported_.fetch_sub(pending, std::memory_order_relaxed);
    return true;
  }
  const int err = errno;
  if (err == ECONNREFUSED || err == ENOTCONN || err == ENOENT || err == EBADF ||
      err == EDESTADDRREQ || err == EPIPE || err == ECONNRESET) {
    // The agent went away or restarted (or refused the connection): connect again on the next
    // event.
    ::close(fd_);
    fd_ = -1;
    transport_.store(static_cast<int>(Transport::kNone), std::memory_order_relaxed);
    next_connect_ = {};
  }
  Drop("sending to the stepwatch agent failed", err);
  return false;
}

inline void Reporter::Drop(const char* reason, int err) noexcept {
  CountDrop();
  if (warned_.load(std::memory_order_relaxed) && err == EAGAIN) return;  // hot path: agent busy
  char message[sizeof(last_error_)];
  if (err != 0) {
    std::snprintf(message, sizeof(message), "%s at %s: %s", reason, socket_path_.c_str(),
                  std::strerror(err));
  } else {
    std::snprintf(message, sizeof(message), "%s", reason);
  }
  {
    std::lock_guard<std::mutex> lock(error_mu_);
    std::memcpy(last_error_, message, sizeof(message));
  }
  if (!warned_.exchange(true) && options_.warn_on_stderr) {
    std::fprintf(stderr,
                 "stepwatch: %s; step events are dropped (counted in Reporter::dropped()) until "
                 "it works. This warning is not repeated.\n",
                 message);
  }
}

inline int Reporter::SectionId(std::string_view name, const char** why) noexcept {
  const int known = section_count_.load(std::memory_order_acquire);
  for (int id = 0; id < known; ++id) {
    if (section_names_[id] == name) return id;
  }
  const char* invalid = ValidateSectionName(name);
  if (invalid == nullptr) {
    std::lock_guard<std::mutex> lock(sections_mu_);
    const int n = section_count_.load(std::memory_order_relaxed);
    for (int id = known; id < n; ++id) {
      if (section_names_[id] == name) return id;
    }
    if (n < kMaxSections) {
      try {
        section_names_[n].assign(name.data(), name.size());
      } catch (...) {
        if (why != nullptr) *why = "out of memory";
        return -1;
      }
      section_count_.store(n + 1, std::memory_order_release);
      return n;
    }
    invalid = "more than 16 section names on one reporter";
  }
  if (why != nullptr) *why = invalid;
  return -1;
}

inline void Reporter::WarnSection(std::string_view name, const char* why) noexcept {
  if (section_warned_.exchange(true) || !options_.warn_on_stderr) return;
  // The name as given, shortened and with anything unprintable as '?': it goes to a terminal.
  char shown[kMaxSectionNameBytes + 1];
  size_t n = 0;
  for (; n < name.size() && n < kMaxSectionNameBytes; ++n) {
    const unsigned char c = static_cast<unsigned char>(name[n]);
    shown[n] = c >= 0x20 && c < 0x7F ? static_cast<char>(c) : '?';
  }
  shown[n] = '\0';
  std::fprintf(stderr, "stepwatch: section \"%s%s\" ignored: %s. This warning is not repeated.\n",
               shown, name.size() > n ? "..." : "", why);
}

inline PhaseScope::PhaseScope(StepScope& step, std::string_view name) noexcept : step_(step) {
  static constexpr std::string_view kPhaseNames[] = {"data", "compute", "comm"};
  for (int p = 0; p < 3; ++p) {
    if (name == kPhaseNames[p]) {
      EnterPhase(p);
      return;
    }
  }
  const char* why = nullptr;
  const int id = step.reporter_.SectionId(name, &why);
  if (id < 0) {
    ok_ = false;
    step.reporter_.WarnSection(name, why);
    return;
  }
  const uint16_t bit = static_cast<uint16_t>(1u << id);
  step_.section_used_ = static_cast<uint16_t>(step_.section_used_ | bit);
  if ((step_.section_open_ & bit) != 0) return;  // inside itself: the outer scope times it
  step_.section_open_ = static_cast<uint16_t>(step_.section_open_ | bit);
  section_ = id;
  int phase = 1;  // outside any phase: compute
  if (step_.active_ == nullptr) {
    EnterPhase(phase);  // in the chain as compute, so that phases inside it pause it
  } else {
    // Inside a phase: the section is that phase's time. Bring its count up to now.
    PhaseScope* active = step_.active_;
    const auto now = StepScope::Clock::now();
    step_.phase_time_[active->index_] += now - active->start_;
    active->start_ = now;
    phase = active->index_;
  }
  step_.section_phase_[id] = static_cast<int8_t>(phase);
  step_.section_base_[id] = step_.phase_time_[phase];
}

inline PhaseScope::~PhaseScope() {
  const auto now = StepScope::Clock::now();
  if (index_ >= 0) {
    // In the chain (a phase, or a section entered outside any phase).
    step_.phase_time_[index_] += now - start_;
    if (parent_ != nullptr) parent_->start_ = now;
    step_.active_ = parent_;
  } else if (section_ >= 0 && step_.active_ != nullptr) {
    PhaseScope* active = step_.active_;
    step_.phase_time_[active->index_] += now - active->start_;
    active->start_ = now;
  }
  if (section_ >= 0) {
    const int phase = step_.section_phase_[section_];
    step_.section_time_[section_] += step_.phase_time_[phase] - step_.section_base_[section_];
    step_.section_open_ = static_cast<uint16_t>(step_.section_open_ & ~(1u << section_));
  }
}

inline StepScope::~StepScope() {
  if (cancelled_) return;
  const auto end = Clock::now();
  if (active_ != nullptr) {
    // A phase still open (scopes destroyed out of order): count it up to now.
    phase_time_[active_->index_] += end - active_->start_;
    active_->start_ = end;
  }
  for (int id = 0; id < kMaxSections; ++id) {
    if ((section_open_ & (1u << id)) == 0) continue;
    // A section still open (likewise): up to now.
    section_time_[id] += phase_time_[section_phase_[id]] - section_base_[id];
    section_base_[id] = phase_time_[section_phase_[id]];
  }
  auto seconds = [](Clock::duration d) { return std::chrono::duration<double>(d).count(); };
  StepRecord r;
  r.step = step_;
  r.step_s = seconds(end - start_);
  if (phase_time_[0].count() > 0) r.data_s = seconds(phase_time_[0]);
  if (phase_time_[1].count() > 0) r.compute_s = seconds(phase_time_[1]);
  if (phase_time_[2].count() > 0) r.comm_s = seconds(phase_time_[2]);
  if (samples_ >= 0) r.samples = samples_;
  for (int id = 0; id < kMaxSections; ++id) {
    if ((section_used_ & (1u << id)) != 0) r.SetSection(id, seconds(section_time_[id]));
  }
  reporter_.next_step_.store(step_ + 1, std::memory_order_relaxed);
  reporter_.Send(r);
}

}  // namespace stepwatch
