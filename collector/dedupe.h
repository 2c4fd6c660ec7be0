// Deduplication of ReportBatch sequence numbers per (agent_id, boot_id).
//
// Agents resend unacknowledged batches after a reconnect, so the collector sees some batches
// twice. Each (agent_id, boot_id) stream keeps a contiguous watermark W: every seq <= W has been
// received (or was given up by the agent, see base_seq). Seqs above W that arrived out of order are
// remembered until the gap below them closes.
//
// With a journal file (the collector's --state-dir) the record of applied batches survives the
// collector: every applied batch is appended and fdatasync'ed before it is acknowledged, and the
// next process replays the file, so a batch applied just before a crash is not counted again when
// the agent resends it. One fdatasync serves every batch appended before it (group commit, at most
// one per commit interval).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "collector/group_commit.h"

namespace stepwatch::collector {

// How the journal's appends are made durable.
struct JournalSyncOptions {
  // At most one fdatasync per interval, shared by every stream (GroupCommitter); waiting batches
  // are acknowledged when it ends. Zero: each batch's wait syncs at once, on its own thread (one
  // fdatasync per batch, shared only by batches appended while an earlier one ran).
  absl::Duration commit_interval = absl::Milliseconds(10);
  // Syncs the file's data (tests count calls and inject failures); null: ::fdatasync.
  std::function<int(int fd)> sync_file;
};

struct DeduperOptions {
  // Streams (agent_id, boot_id) remembered; the least recently used is forgotten beyond this.
  size_t max_streams = 10000;
  // Out-of-order seqs remembered above the watermark per stream; beyond this the watermark jumps
  // over the oldest gap (those batches are treated as lost).
  size_t max_pending_per_stream = 4096;
  // Journal of applied batches; empty keeps the state in memory only.
  std::string journal_path;
  // The journal is rewritten as a snapshot of the live state once this many records, and at least
  // as many as the last snapshot held, were appended since: its size stays within about twice the
  // snapshot (bounded by max_streams and max_pending_per_stream) plus this many records.
  size_t compact_after_records = 65536;
  JournalSyncOptions journal_sync;
};

// The journal file: a magic header ("SWDEDUP2"), then records of one Observe each (agent_id,
// boot_id, seq, base_seq), each framed by a record marker, its length and a CRC-32C of length and
// payload. A damaged record is skipped and reading resumes at the next marker that starts a valid
// record, so damage costs only the records it touches; a damaged tail (a power loss mid-append) is
// cut. Files of the first format ("SWDEDUP1": length and checksum, no marker) are still read, up
// to their first damaged record, and rewritten in the current one.
class DedupeJournal {
 public:
  struct Record {
    std::string agent_id;
    std::string boot_id;
    uint64_t seq = 0;
    uint64_t base_seq = 0;
  };
  // What Read found besides the records.
  struct ReadStats {
    int version = 0;  // 1 or 2; 0 when the file is missing, empty or its header is unknown
    bool header_damaged = false;
    // The file ends in a damaged record (also counted in damaged_records).
    bool torn = false;
    // Records (or damaged stretches that held at least one) skipped, and their bytes.
    uint64_t damaged_records = 0;
    uint64_t damaged_bytes = 0;
  };

  explicit DedupeJournal(std::string path, JournalSyncOptions sync = {})
      : path_(std::move(path)), sync_options_(std::move(sync)) {}
  ~DedupeJournal();
  DedupeJournal(const DedupeJournal&) = delete;
  DedupeJournal& operator=(const DedupeJournal&) = delete;

  // The valid records of the file (none when it does not exist), and what was damaged.
  absl::StatusOr<std::vector<Record>> Read(ReadStats* stats) const;
  // Replaces the file by these records (temporary file, fdatasync, rename, directory fsync) and
  // keeps it open for Append; the first one starts the committer (with a commit interval).
  absl::Status Rewrite(const std::vector<Record>& records);
  // Appends one record (one write(): a killed process leaves all of it or none) and returns the
  // position to pass to SyncTo or WhenSynced.
  absl::StatusOr<uint64_t> Append(const Record& record);
  // Returns once what was appended up to `position` is fdatasync'ed, unless a concurrent caller
  // already did: one sync serves every batch appended before it (group commit). Thread-safe:
  // called without the lock that serialises Append and Rewrite.
  absl::Status SyncTo(uint64_t position);
  // SyncTo without waiting: `done` gets its status, on the committer's thread (with a commit
  // interval) or at once on this one (when already synced, or without an interval, after the
  // sync).
  void WhenSynced(uint64_t position, GroupCommitter::Done done);

  const std::string& path() const { return path_; }
  uint64_t bytes() const { return bytes_; }
  // Bytes written so far (a position for SyncTo that covers every record appended).
  uint64_t written() const { return written_.load(); }
  // fdatasyncs run for appended records, and those that failed.
  uint64_t syncs() const { return syncs_.load(); }
  uint64_t failed_syncs() const { return failed_syncs_.load(); }

  static std::string Encode(const Record& record);
  // A record of the first format (for tests of upgrades).
  static std::string EncodeV1(const Record& record);
  // CRC-32C (Castagnoli) of `data`.
  static uint32_t Crc32c(absl::string_view data);

 private:
  // Syncs everything written so far (the committer's sync).
  absl::Status SyncWritten() ABSL_LOCKS_EXCLUDED(sync_mu_);
  absl::Status SyncWrittenLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sync_mu_);
  bool Synced(uint64_t position) ABSL_LOCKS_EXCLUDED(sync_mu_);

  std::string path_;
  const JournalSyncOptions sync_options_;
  absl::Mutex sync_mu_;
  int fd_ = -1;  // replaced only under sync_mu_ (and the owner's lock)
  uint64_t bytes_ = 0;
  // Bytes ever written (rewrites included) and how many of them are known synced.
  std::atomic<uint64_t> written_{0};
  // Advanced only under sync_mu_; read without it, so that a stream never waits for a sync under
  // way to learn that its record is not synced yet.
  std::atomic<uint64_t> synced_{0};
  std::atomic<uint64_t> syncs_{0};
  std::atomic<uint64_t> failed_syncs_{0};
  // Started by the first Rewrite with a commit interval (before the journal is shared: OpenJournal
  // publishes it after that Rewrite); stopped before fd_ is closed.
  std::unique_ptr<GroupCommitter> committer_;
};

class BatchDeduper {
 public:
  struct Result {
    bool duplicate = false;
    // The watermark after this batch: every seq in [1, acked_seq] is accounted for.
    uint64_t acked_seq = 0;
  };

  explicit BatchDeduper(DeduperOptions options = {});

  // Replays the journal (options.journal_path) into this deduper and compacts it; call once,
  // before the first Observe. Without a journal path: nothing.
  absl::Status OpenJournal();

  // Records batch `seq` of a stream. `base_seq` is the lowest seq the agent still holds: anything
  // below it will never come again, so the watermark may move to base_seq - 1. Not thread-safe.
  Result Observe(absl::string_view agent_id, absl::string_view boot_id, uint64_t seq,
                 uint64_t base_seq);

  // What a Commit leaves to do before the acknowledgement, outside the caller's lock: the
  // fdatasync of its record. Valid while the deduper lives.
  class Sync {
   public:
    // Blocks until the record is synced.
    absl::Status Wait() const { return journal_ ? journal_->SyncTo(position_) : absl::OkStatus(); }
    // Calls `done` once the record is synced (DedupeJournal::WhenSynced); at once without one.
    void Then(GroupCommitter::Done done) const {
      if (journal_ == nullptr) {
        done(absl::OkStatus());
      } else {
        journal_->WhenSynced(position_, std::move(done));
      }
    }

   private:
    friend class BatchDeduper;
    DedupeJournal* journal_ = nullptr;
    uint64_t position_ = 0;
  };

  // Journals batch `seq` of a stream once it has been applied (call with the arguments Observe got
  // when it was not a duplicate); `sync->Wait()` must then succeed before the acknowledgement goes
  // out. Compacts the journal when it has grown enough. Without a journal: nothing.
  absl::Status Commit(absl::string_view agent_id, absl::string_view boot_id, uint64_t seq,
                      uint64_t base_seq, Sync* sync);

  // For a duplicate batch: its acknowledgement may cover batches whose records are not synced
  // yet (sent again on a new stream while the first copy's sync is pending), so it waits for
  // everything appended so far. Without a journal, or when all is synced: nothing to wait for.
  void SyncAppended(Sync* sync) const;

  // Forgets every stream of `agent_id` (used when its node expires).
  void ForgetAgent(absl::string_view agent_id);

  size_t stream_count() const { return streams_.size(); }
  // Records appended to the journal since it was last rewritten, and its size.
  size_t journal_records() const { return journal_records_; }
  uint64_t journal_bytes() const { return journal_ ? journal_->bytes() : 0; }
  // fdatasyncs of appended records (each serves every record appended before it).
  uint64_t journal_syncs() const { return journal_ ? journal_->syncs() : 0; }
  // Commits that failed to reach the journal.
  uint64_t journal_errors() const { return journal_errors_; }
  // Damaged records skipped when the journal was opened.
  uint64_t journal_damaged_records() const { return journal_damaged_records_; }

 private:
  using Key = std::pair<std::string, std::string>;
  struct Stream {
    uint64_t watermark = 0;
    absl::btree_set<uint64_t> pending;  // received seqs above watermark
    std::list<Key>::iterator lru;
  };

  static void Compact(Stream* s);
  // The live state as journal records whose replay rebuilds it (least recently used first).
  std::vector<DedupeJournal::Record> Snapshot() const;

  DeduperOptions options_;
  absl::flat_hash_map<Key, Stream> streams_;
  std::list<Key> lru_;  // front = most recently used
  std::unique_ptr<DedupeJournal> journal_;
  size_t journal_records_ = 0;   // appended since the last rewrite
  size_t snapshot_records_ = 0;  // written by the last rewrite
  uint64_t journal_errors_ = 0;
  uint64_t journal_damaged_records_ = 0;
};

}  // namespace stepwatch::collector
