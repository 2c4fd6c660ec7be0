#include "agent/spool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <system_error>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/node_reading.h"
#include "common/file.h"
#include "common/log.h"

namespace stepwatch::agent {
namespace {

constexpr char kMagic[8] = {'S', 'W', 'S', 'P', 'O', 'O', 'L', '1'};
constexpr size_t kHeaderBytes = 24;  // magic, seq (u64), length (u32), CRC-32C (u32)
// No batch comes near this (a link keeps them under 4 MiB); a larger length is corruption.
constexpr uint64_t kMaxRecordBytes = 256 << 20;
constexpr char kBootFile[] = "boot";
constexpr char kBootHeader[] = "stepwatch-spool 1";

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

void PutLe(uint64_t v, int bytes, char* out) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetLe(const char* in, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::UnavailableError(absl::StrCat(what, " ", path, ": ", std::strerror(errno)));
}

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus("cannot write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", dir);
  const int rc = ::fsync(fd);
  ::close(fd);
  return rc == 0 ? absl::OkStatus() : ErrnoStatus("cannot sync", dir);
}

// "batch-<seq>.swb" -> seq; 0 for any other name.
uint64_t SeqOfName(absl::string_view name, absl::string_view ext) {
  if (!absl::ConsumePrefix(&name, "batch-") || !absl::ConsumeSuffix(&name, ext)) return 0;
  uint64_t seq = 0;
  return absl::SimpleAtoi(name, &seq) ? seq : 0;
}

struct BootFile {
  std::string agent_id;
  std::string boot_id;
  uint64_t reserved = 0;
};

// What MakeBootId makes (32 hex digits), with room: a boot_id read back from the disk is sent on
// every batch, so the disk's say is bounded like a peer's.
bool ValidBootId(absl::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                    c == '-' || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::optional<BootFile> ParseBootFile(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
  if (lines.size() != 4 || lines[0] != kBootHeader) return std::nullopt;
  BootFile b;
  if (!absl::ConsumePrefix(&lines[1], "agent_id ") || !absl::ConsumePrefix(&lines[2], "boot_id ") ||
      !absl::ConsumePrefix(&lines[3], "reserved_seq ") ||
      !absl::SimpleAtoi(lines[3], &b.reserved) || !ValidBootId(lines[2])) {
    return std::nullopt;
  }
  b.agent_id = std::string(lines[1]);
  b.boot_id = std::string(lines[2]);
  return b;
}

// Whether the filesystem of `dir` has (next to) no space left for an unprivileged writer.
bool DiskFull(const std::string& dir) {
  struct statvfs vfs;
  if (::statvfs(dir.c_str(), &vfs) != 0) return false;
  return static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize < uint64_t{64} * 1024 ||
         vfs.f_favail == 0;
}

// Overwrites the existing file `path` with `text` in place: no new block is needed when the file
// already holds one (a full disk), and a write of less than a page is not torn by a crash of the
// process. Used only when the atomic rename cannot be had.
absl::Status RewriteInPlace(const std::string& path, absl::string_view text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus("cannot open", path);
  absl::Status st;
  if (::pwrite(fd, text.data(), text.size(), 0) != static_cast<ssize_t>(text.size())) {
    st = ErrnoStatus("cannot rewrite", path);
  } else if (::ftruncate(fd, static_cast<off_t>(text.size())) != 0 || ::fdatasync(fd) != 0) {
    st = ErrnoStatus("cannot sync", path);
  }
  ::close(fd);
  return st;
}

// The complete batch files in `dir` (seq -> path, in seq order); removes the partial files a
// killed writer left behind.
absl::StatusOr<std::map<uint64_t, std::string>> ListBatchFiles(const std::string& dir) {
  std::map<uint64_t, std::string> names;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  for (; !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (absl::StartsWith(name, "boot.tmp.")) {
      // A boot file write a killed process left: on a full disk it holds the space needed.
      std::filesystem::remove(it->path(), ec);
      ec.clear();
    } else if (SeqOfName(name, ".tmp") != 0) {
      // Never renamed into place: the writer died before the batch was complete or sent.
      std::filesystem::remove(it->path(), ec);
      ec.clear();
    } else if (const uint64_t seq = SeqOfName(name, ".swb"); seq != 0) {
      names[seq] = it->path().string();
    }
  }
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list spool directory ", dir, ": ", ec.message()));
  }
  return names;
}

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : data) c = kCrcTable[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

absl::StatusOr<std::unique_ptr<Spool>> Spool::Open(const SpoolOptions& options,
                                                   const std::string& agent_id) {
  if (options.dir.empty()) return absl::InvalidArgumentError("spool directory is empty");
  if (agent_id.empty()) return absl::InvalidArgumentError("agent_id is required");
  std::error_code ec;
  std::filesystem::create_directories(options.dir, ec);
  if (ec) {
    const std::string message =
        absl::StrCat("cannot create spool directory ", options.dir, ": ", ec.message());
    return ec == std::errc::no_space_on_device ? absl::ResourceExhaustedError(message)
                                               : absl::FailedPreconditionError(message);
  }
  const std::string lock_path = absl::StrCat(options.dir, "/lock");
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    const std::string message =
        absl::StrCat("spool directory ", options.dir, " is not writable: ", std::strerror(err));
    return err == ENOSPC || err == EDQUOT ? absl::ResourceExhaustedError(message)
                                          : absl::FailedPreconditionError(message);
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::FailedPreconditionError(absl::StrCat(
        "spool directory ", options.dir,
        err == EWOULDBLOCK ? " is in use by another stepwatch-agent" : " cannot be locked: ",
        err == EWOULDBLOCK ? "" : std::strerror(err)));
  }
  std::unique_ptr<Spool> spool(new Spool(options, agent_id, fd));
  if (absl::Status st = spool->Load(); !st.ok()) return st;
  return spool;
}

Spool::Spool(const SpoolOptions& options, std::string agent_id, int lock_fd)
    : options_(options), agent_id_(std::move(agent_id)), lock_fd_(lock_fd) {}

Spool::~Spool() { ::close(lock_fd_); }

std::string Spool::BatchPath(uint64_t seq, absl::string_view ext) const {
  return absl::StrFormat("%s/batch-%020d%s", options_.dir, seq, ext);
}

absl::Status Spool::Load() {
  std::optional<BootFile> boot;
  uint64_t corrupt = 0;
  absl::StatusOr<std::string> text = ReadFile(absl::StrCat(options_.dir, "/", kBootFile), 4096);
  if (text.ok()) {
    boot = ParseBootFile(*text);
    if (!boot) {
      ++corrupt;
      SW_LOG_WARNING << "spool " << options_.dir
                     << ": unreadable boot file, recovering from batches";
    } else if (boot->agent_id != agent_id_) {
      return absl::FailedPreconditionError(
          absl::StrCat("spool directory ", options_.dir, " holds batches of agent ", boot->agent_id,
                       ", not ", agent_id_, ": give each agent its own --spool-dir"));
    }
  } else if (!absl::IsNotFound(text.status())) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read the spool's boot file: ", text.status().message()));
  }

  absl::StatusOr<std::map<uint64_t, std::string>> names = ListBatchFiles(options_.dir);
  if (!names.ok()) return names.status();

  boot_id_ = boot ? boot->boot_id : "";
  uint64_t max_seq = boot ? boot->reserved : 0;
  std::map<uint64_t, uint64_t> sizes;
  std::error_code ec;
  for (const auto& [seq, path] : *names) {
    absl::StatusOr<std::string> data = ReadFile(path, kMaxRecordBytes + kHeaderBytes);
    auto batch = std::make_shared<v1::ReportBatch>();
    bool ok = data.ok() && data->size() >= kHeaderBytes &&
              std::memcmp(data->data(), kMagic, sizeof(kMagic)) == 0 &&
              GetLe(data->data() + 8, 8) == seq &&
              GetLe(data->data() + 16, 4) == data->size() - kHeaderBytes;
    if (ok) {
      const absl::string_view payload = absl::string_view(*data).substr(kHeaderBytes);
      ok = GetLe(data->data() + 20, 4) == Crc32c(payload) &&
           batch->ParseFromArray(payload.data(), static_cast<int>(payload.size())) &&
           batch->seq() == seq && batch->agent_id() == agent_id_ &&
           (boot_id_.empty() || batch->boot_id() == boot_id_) && ValidBootId(batch->boot_id());
    }
    if (!ok) {
      ++corrupt;
      SW_LOG_WARNING << "spool: skipping unreadable batch " << path;
      std::filesystem::remove(path, ec);
      continue;
    }
    // Without a boot file the batches tell which boot they belong to.
    if (boot_id_.empty()) boot_id_ = batch->boot_id();
    max_seq = std::max(max_seq, seq);
    sizes[seq] = data->size();
    recovered_.push_back(std::move(batch));
  }
  if (boot_id_.empty()) boot_id_ = MakeBootId();
  start_seq_ = max_seq;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [seq, size] : sizes) bytes_ += size;
    files_ = std::move(sizes);
    stats_.corrupt_records_total = corrupt;
    stats_.replayed_batches_total = recovered_.size();
  }
  // Lease the next block now: this also proves the directory is writable.
  absl::Status st = Reserve(start_seq_ + 1);
  if (!st.ok() && DiskFull(options_.dir)) {
    // No boot file to rewrite in place, and no room for one: the caller decides whether to run
    // without a spool (the batches found stay on disk for a later start).
    return absl::ResourceExhaustedError(
        absl::StrCat("spool directory ", options_.dir, " is on a full disk: ", st.message()));
  }
  return st;
}

std::vector<std::shared_ptr<v1::ReportBatch>> Spool::TakeRecovered() {
  return std::move(recovered_);
}

absl::Status Spool::WriteBootFile(uint64_t reserved) {
  // A fixed width, so that every rewrite has the same size (see RewriteInPlace).
  const std::string text = absl::StrFormat("%s\nagent_id %s\nboot_id %s\nreserved_seq %020d\n",
                                           kBootHeader, agent_id_, boot_id_, reserved);
  const std::string path = absl::StrCat(options_.dir, "/", kBootFile);
  absl::Status st = WriteFileAtomically(path, text);
  if (st.ok()) return st;
  // A full disk has no block for the temporary copy; the boot file holds one already.
  if (absl::Status in_place = RewriteInPlace(path, text); in_place.ok()) {
    ++boot_rewrites_in_place_;
    return in_place;
  }
  return st;
}

absl::Status Spool::Reserve(uint64_t seq) {
  absl::MutexLock lock(&mu_);
  if (seq <= reserved_) return absl::OkStatus();
  const uint64_t reserved = seq + std::max<uint64_t>(options_.seq_lease, 1) - 1;
  if (absl::Status st = WriteBootFile(reserved); !st.ok()) {
    ++stats_.write_errors_total;
    return st;
  }
  reserved_ = reserved;
  return absl::OkStatus();
}

absl::Status Spool::Write(const v1::ReportBatch& batch) {
  std::string record(kHeaderBytes, '\0');
  std::memcpy(record.data(), kMagic, sizeof(kMagic));
  if (!batch.AppendToString(&record)) {
    absl::MutexLock lock(&mu_);
    ++stats_.write_errors_total;
    return absl::InternalError("cannot serialize batch");
  }
  const absl::string_view payload = absl::string_view(record).substr(kHeaderBytes);
  PutLe(batch.seq(), 8, record.data() + 8);
  PutLe(payload.size(), 4, record.data() + 16);
  PutLe(Crc32c(payload), 4, record.data() + 20);

  const std::string tmp = BatchPath(batch.seq(), ".tmp");
  const std::string path = BatchPath(batch.seq(), ".swb");
  absl::Status st;
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    st = ErrnoStatus("cannot create", tmp);
  } else {
    st = WriteAll(fd, record, tmp);
    if (st.ok() && options_.sync && ::fdatasync(fd) != 0) st = ErrnoStatus("cannot sync", tmp);
    if (::close(fd) != 0 && st.ok()) st = ErrnoStatus("cannot close", tmp);
    if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) st = ErrnoStatus("cannot rename", tmp);
    if (!st.ok()) ::unlink(tmp.c_str());
  }
  // The rename itself must reach the disk too, or a power loss could forget the batch.
  if (st.ok() && options_.sync) st = SyncDir(options_.dir);
  absl::MutexLock lock(&mu_);
  if (!st.ok()) {
    ++stats_.write_errors_total;
    return st;
  }
  auto [it, inserted] = files_.emplace(batch.seq(), record.size());
  if (inserted) bytes_ += record.size();
  return absl::OkStatus();
}

void Spool::Remove(uint64_t seq, bool dropped) {
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(seq);
    if (it == files_.end()) return;
    bytes_ -= it->second;
    files_.erase(it);
    if (dropped) ++stats_.dropped_batches_total;
  }
  // A deletion lost to a power cut only means a duplicate the collector ignores: no sync.
  if (::unlink(BatchPath(seq, ".swb").c_str()) != 0 && errno != ENOENT) {
    SW_LOG_WARNING << "spool: cannot delete " << BatchPath(seq, ".swb") << ": "
                   << std::strerror(errno);
  }
}

SpoolStats Spool::stats() const {
  absl::MutexLock lock(&mu_);
  SpoolStats s = stats_;
  s.boot_rewrites_in_place_total = boot_rewrites_in_place_;
  s.batches = files_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace stepwatch::agent
