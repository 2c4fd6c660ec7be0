#include "collector/dedupe.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/log.h"

namespace stepwatch::collector {
namespace {

constexpr absl::string_view kMagicV1 = "SWDEDUP1";
constexpr absl::string_view kMagic = "SWDEDUP2";
// Starts every record of the current format: after a damaged record, reading resumes at the next
// marker whose record checks out.
constexpr absl::string_view kRecordMarker = "\xf5\x3d\x9a\x6c";
// Marker, u32 payload length, u32 CRC-32C of the length and the payload.
constexpr size_t kRecordHeaderBytes = 12;
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

// FNV-1a: the first format's checksum.
uint32_t ChecksumV1(absl::string_view data) {
  uint32_t h = 2166136261u;
  for (unsigned char c : data) h = (h ^ c) * 16777619u;
  return h;
}

// Reflected CRC-32C (polynomial 0x82F63B78), one table lookup per byte.
constexpr std::array<uint32_t, 256> MakeCrc32cTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrc32cTable = MakeCrc32cTable();

// The running (pre-inverted) CRC-32C state after `data`.
uint32_t ExtendCrc32c(uint32_t c, absl::string_view data) {
  for (unsigned char b : data) c = kCrc32cTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c;
}

// Record starts tried inside damaged stretches before the rest of the file is given up on: each
// costs a CRC of up to kMaxRecordBytes, so a file of nothing but markers still reads in bounded
// time (65,536 x 4 KiB).
constexpr uint64_t kMaxDamagedCandidates = 65536;

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

// The first format: records of u32 length, u32 FNV-1a, payload; reading stops at the first
// damaged one (nothing marks where the next record starts).
void ReadV1(absl::string_view rest, std::vector<DedupeJournal::Record>* records,
            DedupeJournal::ReadStats* stats) {
  while (!rest.empty()) {
    DedupeJournal::Record r;
    const size_t len = rest.size() >= 8 ? GetLe(rest.data(), 4) : kMaxRecordBytes + 1;
    if (len > kMaxRecordBytes || rest.size() < 8 + len ||
        GetLe(rest.data() + 4, 4) != ChecksumV1(rest.substr(8, len)) ||
        !DecodePayload(rest.substr(8, len), &r)) {
      stats->torn = true;
      ++stats->damaged_records;
      stats->damaged_bytes += rest.size();
      return;
    }
    records->push_back(std::move(r));
    rest.remove_prefix(8 + len);
  }
}

// One record of the current format at the start of `rest`; its size, or 0 when it is damaged.
size_t DecodeV2(absl::string_view rest, DedupeJournal::Record* r) {
  if (rest.size() < kRecordHeaderBytes || rest.substr(0, kRecordMarker.size()) != kRecordMarker) {
    return 0;
  }
  const size_t len = GetLe(rest.data() + 4, 4);
  if (len > kMaxRecordBytes || rest.size() < kRecordHeaderBytes + len) return 0;
  const uint32_t crc = ExtendCrc32c(ExtendCrc32c(0xffffffffu, rest.substr(4, 4)),
                                    rest.substr(kRecordHeaderBytes, len));
  if (GetLe(rest.data() + 8, 4) != (crc ^ 0xffffffffu)) return 0;
  if (!DecodePayload(rest.substr(kRecordHeaderBytes, len), r)) return 0;
  return kRecordHeaderBytes + len;
}

// The current format: a damaged stretch ends at the next marker that starts a valid record.
void ReadV2(absl::string_view rest, std::vector<DedupeJournal::Record>* records,
            DedupeJournal::ReadStats* stats) {
  size_t pos = 0;
  bool damaged = false;  // inside a damaged stretch
  uint64_t candidates = 0;
  while (pos < rest.size()) {
    DedupeJournal::Record r;
    if (const size_t n = DecodeV2(rest.substr(pos), &r); n > 0) {
      records->push_back(std::move(r));
      pos += n;
      damaged = false;
      continue;
    }
    // A new stretch, or one more record start (a marker) inside the one we are in.
    if (!damaged || rest.substr(pos, kRecordMarker.size()) == kRecordMarker) {
      ++stats->damaged_records;
    }
    damaged = true;
    if (++candidates > kMaxDamagedCandidates) {
      stats->damaged_bytes += rest.size() - pos;
      break;
    }
    const size_t next = rest.find(kRecordMarker, pos + 1);
    const size_t end = next == absl::string_view::npos ? rest.size() : next;
    stats->damaged_bytes += end - pos;
    pos = end;
  }
  stats->torn = damaged;
}

}  // namespace

uint32_t DedupeJournal::Crc32c(absl::string_view data) {
  return ExtendCrc32c(0xffffffffu, data) ^ 0xffffffffu;
}

DedupeJournal::~DedupeJournal() {
  // Its last sync uses fd_; requests it does not cover fail (their batches are not acknowledged).
  if (committer_) committer_->Stop();
  if (fd_ >= 0) ::close(fd_);
}

namespace {
std::string Payload(const DedupeJournal::Record& r) {
  std::string payload;
  PutLe(&payload, r.agent_id.size(), 2);
  payload.append(r.agent_id);
  PutLe(&payload, r.boot_id.size(), 2);
  payload.append(r.boot_id);
  PutLe(&payload, r.seq, 8);
  PutLe(&payload, r.base_seq, 8);
  return payload;
}
}  // namespace

std::string DedupeJournal::Encode(const Record& r) {
  const std::string payload = Payload(r);
  std::string len;
  PutLe(&len, payload.size(), 4);
  std::string out(kRecordMarker);
  out.append(len);
  PutLe(&out, Crc32c(absl::StrCat(len, payload)), 4);
  out.append(payload);
  return out;
}

std::string DedupeJournal::EncodeV1(const Record& r) {
  const std::string payload = Payload(r);
  std::string out;
  PutLe(&out, payload.size(), 4);
  PutLe(&out, ChecksumV1(payload), 4);
  out.append(payload);
  return out;
}

absl::StatusOr<std::vector<DedupeJournal::Record>> DedupeJournal::Read(ReadStats* stats) const {
  *stats = ReadStats();
  std::vector<Record> records;
  absl::StatusOr<std::string> data = ReadFile(path_, kMaxJournalBytes);
  if (absl::IsNotFound(data.status())) return records;
  if (!data.ok()) return data.status();
  if (data->empty()) return records;
  const absl::string_view header = absl::string_view(*data).substr(0, kMagic.size());
  const absl::string_view rest = absl::string_view(*data).substr(header.size());
  if (header == kMagic) {
    stats->version = 2;
    ReadV2(rest, &records, stats);
  } else if (header == kMagicV1) {
    stats->version = 1;
    ReadV1(rest, &records, stats);
  } else {
    // A damaged header: the records after it may still be whole, in either format.
    stats->header_damaged = true;
    ReadV2(rest, &records, stats);
    if (records.empty()) {
      *stats = ReadStats();
      stats->header_damaged = true;
      ReadV1(rest, &records, stats);
    }
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
  {
    absl::MutexLock lock(&sync_mu_);
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
    bytes_ = data.size();
    written_ += data.size();
    synced_.store(written_.load());  // the new file was synced whole
  }
  if (!committer_ && sync_options_.commit_interval > absl::ZeroDuration()) {
    committer_ = std::make_unique<GroupCommitter>([this] { return SyncWritten(); },
                                                  sync_options_.commit_interval);
  }
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

bool DedupeJournal::Synced(uint64_t position) { return synced_.load() >= position; }

absl::Status DedupeJournal::SyncWrittenLocked() {
  // Everything written before this load is covered by the sync below.
  const uint64_t upto = written_.load();
  if (synced_ >= upto) return absl::OkStatus();
  ++syncs_;
  const int rc = sync_options_.sync_file ? sync_options_.sync_file(fd_) : ::fdatasync(fd_);
  if (rc != 0) {
    ++failed_syncs_;
    return ErrnoStatus("cannot sync", path_);
  }
  synced_.store(std::max(synced_.load(), upto));
  return absl::OkStatus();
}

absl::Status DedupeJournal::SyncWritten() {
  absl::MutexLock lock(&sync_mu_);
  return SyncWrittenLocked();
}

absl::Status DedupeJournal::SyncTo(uint64_t position) {
  if (committer_) return Synced(position) ? absl::OkStatus() : committer_->Wait();
  // Without a committer the first waiter syncs for everyone appended before it; the others wait
  // on sync_mu_ and find their record covered.
  absl::MutexLock lock(&sync_mu_);
  if (synced_ >= position) return absl::OkStatus();
  return SyncWrittenLocked();
}

void DedupeJournal::WhenSynced(uint64_t position, GroupCommitter::Done done) {
  if (committer_ && !Synced(position)) {
    committer_->Then(std::move(done));
    return;
  }
  done(SyncTo(position));
}

BatchDeduper::BatchDeduper(DeduperOptions options) : options_(std::move(options)) {
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
  auto journal = std::make_unique<DedupeJournal>(options_.journal_path, options_.journal_sync);
  DedupeJournal::ReadStats stats;
  absl::StatusOr<std::vector<DedupeJournal::Record>> records = journal->Read(&stats);
  if (!records.ok()) return records.status();
  journal_damaged_records_ = stats.damaged_records;
  for (const DedupeJournal::Record& r : *records) Observe(r.agent_id, r.boot_id, r.seq, r.base_seq);
  // Compacted at once: this also cuts a torn tail, so that appends follow a whole record.
  std::vector<DedupeJournal::Record> snapshot = Snapshot();
  if (absl::Status st = journal->Rewrite(snapshot); !st.ok()) return st;
  journal_ = std::move(journal);
  journal_records_ = 0;
  snapshot_records_ = snapshot.size();
  if (stats.damaged_records > 0 || stats.header_damaged) {
    // The batches of the damaged records are applied again if their agents resend them.
    return absl::DataLossError(absl::StrCat(
        options_.journal_path, ": ", stats.damaged_records, " damaged records (",
        stats.damaged_bytes, " bytes) skipped",
        stats.torn ? ", the last at the end of the file" : "",
        stats.header_damaged ? ", damaged header" : "", "; ", records->size(), " records read",
        stats.version == 1 ? " (first format, rewritten in the current one)" : ""));
  }
  if (stats.version == 1) {
    SW_LOG_INFO << options_.journal_path << ": " << records->size()
                << " records of the first format read and rewritten in the current one";
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

void BatchDeduper::SyncAppended(Sync* sync) const {
  *sync = Sync();
  if (!journal_) return;
  sync->journal_ = journal_.get();
  sync->position_ = journal_->written();
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
