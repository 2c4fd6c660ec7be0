// The agent's on-disk spool: every report batch is written here before it is first sent and
// deleted once the collector acknowledges it, so batches survive an agent crash and are replayed by
// the next agent process with their original (agent_id, boot_id, seq); the collector then counts
// each once.
//
// Layout of the directory:
//   lock                  flock'ed while an agent uses the directory (one agent per spool)
//   boot                  agent_id, boot_id and the highest seq handed out so far (a lease,
//                         extended in blocks), written atomically
//   batch-<seq>.swb       one batch: 24-byte header (magic, seq, length, CRC-32C) + ReportBatch
//   batch-<seq>.tmp       a batch being written; renamed to .swb once complete and synced
// A restarted agent continues the same boot_id above the leased seq, so its new batches never
// reuse an id the collector may have seen. Unreadable records are counted and deleted, never
// fatal.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "stepwatch/v1/stepwatch.pb.h"

namespace stepwatch::agent {

struct SpoolOptions {
  // Created (with parents) when missing.
  std::string dir;
  // fdatasync each batch before it is renamed into place and the directory after: batches then
  // survive a power loss too, not only a crash of the agent.
  bool sync = true;
  // Seqs reserved per write of the boot file.
  uint64_t seq_lease = 4096;
};

struct SpoolStats {
  uint64_t batches = 0;
  uint64_t bytes = 0;
  // Batches found at start (left by an earlier agent process), to be sent again.
  uint64_t replayed_batches_total = 0;
  // Records that could not be read back (bad header, checksum or contents); deleted.
  uint64_t corrupt_records_total = 0;
  // Batches deleted before the collector acknowledged them (the bound was reached).
  uint64_t dropped_batches_total = 0;
  uint64_t write_errors_total = 0;
  // Lease writes that could not get a new file (a full disk) and rewrote the boot file in place.
  uint64_t boot_rewrites_in_place_total = 0;
};

// CRC-32C (Castagnoli) of `data`.
uint32_t Crc32c(absl::string_view data);

class Spool {
 public:
  // Opens (creating if needed) and locks `options.dir` for agent `agent_id`, and reads back the
  // batches left there. Fails when the directory cannot be used or belongs to another agent; with
  // ResourceExhausted when it is on a full disk and has no boot file yet (with one, a full disk
  // only keeps new batches off the disk: Write fails and is counted).
  static absl::StatusOr<std::unique_ptr<Spool>> Open(const SpoolOptions& options,
                                                     const std::string& agent_id);
  ~Spool();
  Spool(const Spool&) = delete;
  Spool& operator=(const Spool&) = delete;

  // The boot_id to send under: the previous process's when the spool had one.
  const std::string& boot_id() const { return boot_id_; }
  // The highest seq that may already have been used; new batches start above it.
  uint64_t last_seq() const { return start_seq_; }
  // The batches found at Open, in seq order; empty after the first call.
  std::vector<std::shared_ptr<v1::ReportBatch>> TakeRecovered();

  // Persists that seqs up to `seq` may be used (extends the lease in the boot file when needed).
  // Call before writing batches with such seqs.
  absl::Status Reserve(uint64_t seq) ABSL_LOCKS_EXCLUDED(mu_);
  // Writes a batch (its seq set) durably. The caller keeps it in memory either way.
  absl::Status Write(const v1::ReportBatch& batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes batch `seq`: acknowledged, or `dropped` to make room.
  void Remove(uint64_t seq, bool dropped) ABSL_LOCKS_EXCLUDED(mu_);

  SpoolStats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Spool(const SpoolOptions& options, std::string agent_id, int lock_fd);
  absl::Status Load() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status WriteBootFile(uint64_t reserved) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string BatchPath(uint64_t seq, absl::string_view ext) const;

  const SpoolOptions options_;
  const std::string agent_id_;
  const int lock_fd_;
  std::string boot_id_;
  uint64_t start_seq_ = 0;
  std::vector<std::shared_ptr<v1::ReportBatch>> recovered_;

  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t boot_rewrites_in_place_ ABSL_GUARDED_BY(mu_) = 0;
  // seq -> file size of every batch on disk.
  std::map<uint64_t, uint64_t> files_ ABSL_GUARDED_BY(mu_);
  uint64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  SpoolStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stepwatch::agent
