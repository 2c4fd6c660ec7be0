#include "collector/dedupe.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"

namespace stepwatch::collector {
namespace {

constexpr absl::string_view kMagic = "SWDEDUP1";
// agent_id and node names are at most 256 bytes; a boot_id is a UUID. Commit refuses ids longer
// than kMaxIdBytes, so a longer record is damage.
constexpr size_t kMaxIdBytes = 1024;
constexpr size_t kMaxRecordBytes = 4096;
constexpr size_t kMaxJournalBytes = size_t{1} << 30;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  return v;
}

// FNV-1a: enough to tell a torn or damaged record from a whole one.
uint32_t Checksum(absl::string_view data) {
  uint32_t h = 2166136261u;
  for (unsigned char c : data) h = (h ^ c) * 16777619u;
  return h;
}

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot write", path);
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Parses one record payload: u16 agent length, agent, u16 boot length, boot, u64 seq, u64 base.
bool DecodePayload(absl::string_view p, DedupeJournal::Record* r) {
  if (p.size() < 2) return false;
  const size_t agent_len = GetLe(p.data(), 2);
  p.remove_prefix(2);
  if (p.size() < agent_len + 2) return false;
  r->agent_id = std::string(p.substr(0, agent_len));
  p.remove_prefix(agent_len);
  const size_t boot_len = GetLe(p.data(), 2);
  p.remove_prefix(2);
  if (p.size() != boot_len + 16) return false;
  r->boot_id = std::string(p.substr(0, boot_len));
  p.remove_prefix(boot_len);
  r->seq = GetLe(p.data(), 8);
  r->base_seq = GetLe(p.data() + 8, 8);
  return true;
}

}  // namespace

DedupeJournal::~DedupeJournal() {
  if (fd_ >= 0) ::close(fd_);
}

std::string DedupeJournal::Encode(const Record& r) {
  std::string payload;
  PutLe(&payload, r.agent_id.size(), 2);
  payload.append(r.agent_id);
  PutLe(&payload, r.boot_id.size(), 2);
  payload.append(r.boot_id);
  PutLe(&payload, r.seq, 8);
  PutLe(&payload, r.base_seq, 8);
  std::string out;
  PutLe(&out, payload.size(), 4);
  PutLe(&out, Checksum(payload), 4);
  out.append(payload);
  return out;
}

absl::StatusOr<std::vector<DedupeJournal::Record>> DedupeJournal::Read(bool* torn) const {
  *torn = false;
  std::vector<Record> records;
  absl::StatusOr<std::string> data = ReadFile(path_, kMaxJournalBytes);
  if (absl::IsNotFound(data.status())) return records;
  if (!data.ok()) return data.status();
  absl::string_view rest = *data;
  if (rest.substr(0, kMagic.size()) != kMagic) {
    *torn = !rest.empty();
    return records;
  }
  rest.remove_prefix(kMagic.size());
  while (!rest.empty()) {
    Record r;
    const size_t len = rest.size() >= 8 ? GetLe(rest.data(), 4) : kMaxRecordBytes + 1;
    if (len > kMaxRecordBytes || rest.size() < 8 + len ||
        GetLe(rest.data() + 4, 4) != Checksum(rest.substr(8, len)) ||
        !DecodePayload(rest.substr(8, len), &r)) {
      *torn = true;
      break;
    }
    records.push_back(std::move(r));
    rest.remove_prefix(8 + len);
  }
  return records;
}

absl::Status DedupeJournal::Rewrite(const std::vector<Record>& records) {
  std::string data(kMagic);
  for (const Record& r : records) data.append(Encode(r));
  const std::string tmp = absl::StrCat(path_, ".tmp");
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoStatus("cannot create", tmp);
  absl::Status st = WriteAll(fd, data, tmp);
  if (st.ok() && ::fdatasync(fd) != 0) st = ErrnoStatus("cannot sync", tmp);
  if (st.ok() && ::rename(tmp.c_str(), path_.c_str()) != 0) st = ErrnoStatus("cannot rename", tmp);
  if (!st.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return st;
  }
  // The rename must reach the disk before records are appended to the new file.
  const size_t slash = path_.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
  absl::MutexLock lock(&sync_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  bytes_ = data.size();
  written_ += data.size();
  synced_ = written_;  // the new file was synced whole
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DedupeJournal::Append(const Record& record) {
  if (fd_ < 0) return absl::FailedPreconditionError(absl::StrCat(path_, " is not open"));
  const std::string data = Encode(record);
  if (absl::Status st = WriteAll(fd_, data, path_); !st.ok()) return st;
  bytes_ += data.size();
  written_ += data.size();
  return written_.load();
}

absl::Status DedupeJournal::SyncTo(uint64_t position) {
  absl::MutexLock lock(&sync_mu_);
  if (synced_ >= position) return absl::OkStatus();
  // Everything written before this load is covered by the sync below.
  const uint64_t upto = written_.load();
  if (::fdatasync(fd_) != 0) return ErrnoStatus("cannot sync", path_);
  synced_ = std::max(synced_, upto);
  return absl::OkStatus();
}

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

absl::Status BatchDeduper::OpenJournal() {
  if (options_.journal_path.empty() || journal_) return absl::OkStatus();
  auto journal = std::make_unique<DedupeJournal>(options_.journal_path);
  bool torn = false;
  absl::StatusOr<std::vector<DedupeJournal::Record>> records = journal->Read(&torn);
  if (!records.ok()) return records.status();
  for (const DedupeJournal::Record& r : *records) Observe(r.agent_id, r.boot_id, r.seq, r.base_seq);
  // Compacted at once: this also cuts a torn tail, so that appends follow a whole record.
  std::vector<DedupeJournal::Record> snapshot = Snapshot();
  if (absl::Status st = journal->Rewrite(snapshot); !st.ok()) return st;
  journal_ = std::move(journal);
  journal_records_ = 0;
  snapshot_records_ = snapshot.size();
  if (torn) {
    return absl::DataLossError(absl::StrCat("damaged tail of ", options_.journal_path, " ignored (",
                                            records->size(), " records read)"));
  }
  return absl::OkStatus();
}

std::vector<DedupeJournal::Record> BatchDeduper::Snapshot() const {
  std::vector<DedupeJournal::Record> out;
  for (auto key = lru_.rbegin(); key != lru_.rend(); ++key) {
    const Stream& s = streams_.at(*key);
    // (W, base W) replays to watermark W; each pending seq (base 0) to itself.
    if (s.watermark > 0) out.push_back({key->first, key->second, s.watermark, s.watermark});
    for (uint64_t seq : s.pending) out.push_back({key->first, key->second, seq, 0});
  }
  return out;
}

absl::Status BatchDeduper::Commit(absl::string_view agent_id, absl::string_view boot_id,
                                  uint64_t seq, uint64_t base_seq, Sync* sync) {
  *sync = Sync();
  if (!journal_) return absl::OkStatus();
  if (agent_id.size() > kMaxIdBytes || boot_id.size() > kMaxIdBytes) {
    ++journal_errors_;
    return absl::InvalidArgumentError(
        absl::StrCat("agent_id or boot_id longer than ", kMaxIdBytes, " bytes: not journaled"));
  }
  absl::Status compacted;
  if (journal_records_ >= std::max(options_.compact_after_records, snapshot_records_)) {
    // The state already holds this batch, so the snapshot covers it.
    std::vector<DedupeJournal::Record> snapshot = Snapshot();
    compacted = journal_->Rewrite(snapshot);
    if (compacted.ok()) {
      journal_records_ = 0;
      snapshot_records_ = snapshot.size();
      return compacted;
    }
  }
  // Also when compacting failed: the old file is still open and takes the record.
  ++journal_records_;
  absl::StatusOr<uint64_t> appended =
      journal_->Append({std::string(agent_id), std::string(boot_id), seq, base_seq});
  if (appended.ok()) {
    sync->journal_ = journal_.get();
    sync->position_ = *appended;
  }
  absl::Status st = appended.ok() ? compacted : appended.status();
  if (!st.ok()) ++journal_errors_;
  return st;
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
