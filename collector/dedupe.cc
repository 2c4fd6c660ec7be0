#include "collector/dedupe.h"

#include <algorithm>
#include <vector>

namespace stepwatch::collector {

BatchDeduper::BatchDeduper(DeduperOptions options) : options_(options) {
  options_.max_streams = std::max<size_t>(options_.max_streams, 1);
  options_.max_pending_per_stream = std::max<size_t>(options_.max_pending_per_stream, 1);
}

void BatchDeduper::Compact(Stream* s) {
  while (!s->pending.empty()) {
    auto it = s->pending.begin();
    if (*it <= s->watermark) {
      s->pending.erase(it);
    } else if (*it == s->watermark + 1) {
      s->watermark = *it;
      s->pending.erase(it);
    } else {
      break;
    }
  }
}

BatchDeduper::Result BatchDeduper::Observe(absl::string_view agent_id, absl::string_view boot_id,
                                           uint64_t seq, uint64_t base_seq) {
  Key key{std::string(agent_id), std::string(boot_id)};
  auto it = streams_.find(key);
  if (it == streams_.end()) {
    if (streams_.size() >= options_.max_streams) {
      streams_.erase(lru_.back());
      lru_.pop_back();
    }
    lru_.push_front(key);
    it = streams_.emplace(std::move(key), Stream{}).first;
    it->second.lru = lru_.begin();
  } else {
    lru_.splice(lru_.begin(), lru_, it->second.lru);
  }
  Stream& s = it->second;

  Result result;
  result.duplicate = seq <= s.watermark || s.pending.contains(seq);
  if (!result.duplicate) s.pending.insert(seq);
  // The agent never holds a batch above the one it sends, so base_seq beyond seq is bogus.
  const uint64_t base = std::min(base_seq, seq);
  if (base > 0 && base - 1 > s.watermark) s.watermark = base - 1;
  Compact(&s);
  while (s.pending.size() > options_.max_pending_per_stream) {
    // Give up on the oldest gap: jump to just below the lowest pending seq.
    s.watermark = *s.pending.begin() - 1;
    Compact(&s);
  }
  result.acked_seq = s.watermark;
  return result;
}

void BatchDeduper::ForgetAgent(absl::string_view agent_id) {
  std::vector<Key> doomed;
  for (const auto& [key, stream] : streams_) {
    if (key.first == agent_id) doomed.push_back(key);
  }
  for (const Key& key : doomed) {
    auto it = streams_.find(key);
    lru_.erase(it->second.lru);
    streams_.erase(it);
  }
}

}  // namespace stepwatch::collector
