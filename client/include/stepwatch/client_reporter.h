// stepwatch C++ client: the Reporter, which owns the connection to the agent and the queue to its
// sender thread, and its options. Its members are defined in stepwatch/detail/reporter_setup.h
// and stepwatch/detail/reporter_send.h; include stepwatch/client.h, which has them all.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "stepwatch/client_record.h"

namespace stepwatch {

// Where the agent listens unless told otherwise.
inline constexpr char kDefaultSocketPath[] = "/run/stepwatch/agent.sock";
// Suffix of the agent's seqpacket socket path.
inline constexpr char kSeqpacketSuffix[] = ".seq";
// Requested send buffer of a connection: the messages it holds while the agent is busy (the
// kernel caps it at net.core.wmem_max).
inline constexpr int kSendBufferBytes = 4 << 20;
// How events reach the agent.
enum class Transport : int { kNone = 0, kSeqpacket = 1, kDatagram = 2 };

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

}  // namespace stepwatch
