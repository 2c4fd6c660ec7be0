// Deduplication of ReportBatch sequence numbers per (agent_id, boot_id).
//
// Agents resend unacknowledged batches after a reconnect, so the collector sees some batches
// twice. Each (agent_id, boot_id) stream keeps a contiguous watermark W: every seq <= W has been
// received (or was given up by the agent, see base_seq). Seqs above W that arrived out of order are
// remembered until the gap below them closes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <string>
#include <utility>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"

namespace stepwatch::collector {

struct DeduperOptions {
  // Streams (agent_id, boot_id) remembered; the least recently used is forgotten beyond this.
  size_t max_streams = 10000;
  // Out-of-order seqs remembered above the watermark per stream; beyond this the watermark jumps
  // over the oldest gap (those batches are treated as lost).
  size_t max_pending_per_stream = 4096;
};

class BatchDeduper {
 public:
  struct Result {
    bool duplicate = false;
    // The watermark after this batch: every seq in [1, acked_seq] is accounted for.
    uint64_t acked_seq = 0;
  };

  explicit BatchDeduper(DeduperOptions options = {});

  // Records batch `seq` of a stream. `base_seq` is the lowest seq the agent still holds: anything
  // below it will never come again, so the watermark may move to base_seq - 1. Not thread-safe.
  Result Observe(absl::string_view agent_id, absl::string_view boot_id, uint64_t seq,
                 uint64_t base_seq);

  // Forgets every stream of `agent_id` (used when its node expires).
  void ForgetAgent(absl::string_view agent_id);

  size_t stream_count() const { return streams_.size(); }

 private:
  using Key = std::pair<std::string, std::string>;
  struct Stream {
    uint64_t watermark = 0;
    absl::btree_set<uint64_t> pending;  // received seqs above watermark
    std::list<Key>::iterator lru;
  };

  static void Compact(Stream* s);

  DeduperOptions options_;
  absl::flat_hash_map<Key, Stream> streams_;
  std::list<Key> lru_;  // front = most recently used
};

}  // namespace stepwatch::collector
