#include "agent/spool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/collector_link.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::agent {
namespace {

using test::StatusIs;
using ::testing::HasSubstr;

const char kAgent[] = "node-a-0123456789abcdef";

class SpoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(dir_.empty());
    options_.dir = dir_ + "/spool";
    options_.seq_lease = 100;
  }

  std::unique_ptr<Spool> Open() {
    absl::StatusOr<std::unique_ptr<Spool>> s = Spool::Open(options_, kAgent);
    EXPECT_OK(s);
    return s.ok() ? *std::move(s) : nullptr;
  }

  static v1::ReportBatch Batch(const Spool& spool, uint64_t seq, int steps) {
    v1::ReportBatch b;
    b.set_agent_id(kAgent);
    b.set_boot_id(spool.boot_id());
    b.set_seq(seq);
    for (int i = 0; i < steps; ++i) {
      v1::StepEvent* e = b.add_steps();
      e->set_job("job");
      e->set_step(static_cast<int64_t>(seq * 1000 + i));
    }
    return b;
  }

  std::string BatchFile(uint64_t seq) const {
    char name[64];
    std::snprintf(name, sizeof(name), "/batch-%020llu.swb", static_cast<unsigned long long>(seq));
    return options_.dir + name;
  }

  test::TempDir temp_dir_{"stepwatch-agent-test"};
  const std::string dir_ = temp_dir_.path();
  SpoolOptions options_;
};

TEST(Crc32cTest, KnownValue) {
  // The check value of CRC-32C (RFC 3720 B.4).
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
}

TEST_F(SpoolTest, UnackedBatchesAreReplayedWithTheirIdsAndAckedOnesAreNot) {
  std::string boot_id;
  {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    boot_id = spool->boot_id();
    EXPECT_EQ(boot_id.size(), 32u);
    EXPECT_EQ(spool->last_seq(), 0u);
    EXPECT_TRUE(spool->TakeRecovered().empty());
    ASSERT_OK(spool->Reserve(4));
    for (uint64_t seq = 1; seq <= 4; ++seq) ASSERT_OK(spool->Write(Batch(*spool, seq, 3)));
    EXPECT_EQ(spool->stats().batches, 4u);
    EXPECT_GT(spool->stats().bytes, 0u);
    spool->Remove(1, /*dropped=*/false);
    spool->Remove(2, /*dropped=*/false);
    EXPECT_EQ(spool->stats().batches, 2u);
    EXPECT_EQ(spool->stats().dropped_batches_total, 0u);
  }
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  // Same boot, and new seqs start above everything the first process may have used (its lease).
  EXPECT_EQ(spool->boot_id(), boot_id);
  EXPECT_GE(spool->last_seq(), 4u);
  const SpoolStats s = spool->stats();
  EXPECT_EQ(s.replayed_batches_total, 2u);
  EXPECT_EQ(s.batches, 2u);
  EXPECT_EQ(s.corrupt_records_total, 0u);
  std::vector<std::shared_ptr<v1::ReportBatch>> got = spool->TakeRecovered();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]->seq(), 3u);
  EXPECT_EQ(got[1]->seq(), 4u);
  EXPECT_EQ(got[0]->boot_id(), boot_id);
  ASSERT_EQ(got[1]->steps_size(), 3);
  EXPECT_EQ(got[1]->steps(2).step(), 4002);
  EXPECT_TRUE(spool->TakeRecovered().empty());
}

TEST_F(SpoolTest, SeqsNeverRepeatAcrossRestartsEvenWhenEverythingWasAcked) {
  uint64_t first_last = 0;
  {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    ASSERT_OK(spool->Reserve(7));
    for (uint64_t seq = 1; seq <= 7; ++seq) {
      ASSERT_OK(spool->Write(Batch(*spool, seq, 1)));
      spool->Remove(seq, /*dropped=*/false);
    }
    EXPECT_EQ(spool->stats().batches, 0u);
  }
  for (int restart = 0; restart < 3; ++restart) {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    EXPECT_GE(spool->last_seq(), 7u);
    EXPECT_GT(spool->last_seq(), first_last) << "restart " << restart;
    first_last = spool->last_seq();
    // Use a few seqs past the lease boundary: the next start must begin above them.
    const uint64_t next = spool->last_seq() + options_.seq_lease + 5;
    ASSERT_OK(spool->Reserve(next));
    ASSERT_OK(spool->Write(Batch(*spool, next, 1)));
    spool->Remove(next, /*dropped=*/false);
    spool.reset();
    std::unique_ptr<Spool> again = Open();
    ASSERT_NE(again, nullptr);
    EXPECT_GE(again->last_seq(), next);
  }
}

TEST_F(SpoolTest, DroppedBatchesAreCountedAndGone) {
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  ASSERT_OK(spool->Reserve(3));
  for (uint64_t seq = 1; seq <= 3; ++seq) ASSERT_OK(spool->Write(Batch(*spool, seq, 1)));
  const uint64_t bytes = spool->stats().bytes;
  spool->Remove(1, /*dropped=*/true);
  EXPECT_EQ(spool->stats().dropped_batches_total, 1u);
  EXPECT_LT(spool->stats().bytes, bytes);
  EXPECT_FALSE(std::filesystem::exists(BatchFile(1)));
  EXPECT_TRUE(std::filesystem::exists(BatchFile(2)));
  // Removing twice counts once.
  spool->Remove(1, /*dropped=*/true);
  EXPECT_EQ(spool->stats().dropped_batches_total, 1u);
}

TEST_F(SpoolTest, CorruptAndTruncatedRecordsAreSkippedCountedAndDeleted) {
  std::string boot_id;
  {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    boot_id = spool->boot_id();
    ASSERT_OK(spool->Reserve(4));
    for (uint64_t seq = 1; seq <= 4; ++seq) ASSERT_OK(spool->Write(Batch(*spool, seq, 5)));
  }
  // 1: truncated in the payload; 2: one payload byte flipped; 4: cut inside the header.
  std::filesystem::resize_file(BatchFile(1), std::filesystem::file_size(BatchFile(1)) - 3);
  {
    std::fstream f(BatchFile(2), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(30);
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x40);
    f.seekp(30);
    f.write(&c, 1);
  }
  std::filesystem::resize_file(BatchFile(4), 10);
  // A half-written batch of a process that died mid-write, and a stray file: not records.
  { std::ofstream(options_.dir + "/batch-00000000000000000009.tmp") << "partial"; }
  { std::ofstream(options_.dir + "/README") << "not a batch"; }

  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  EXPECT_EQ(spool->boot_id(), boot_id);
  const SpoolStats s = spool->stats();
  EXPECT_EQ(s.corrupt_records_total, 3u);
  EXPECT_EQ(s.replayed_batches_total, 1u);
  std::vector<std::shared_ptr<v1::ReportBatch>> got = spool->TakeRecovered();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]->seq(), 3u);
  EXPECT_EQ(got[0]->steps_size(), 5);
  EXPECT_FALSE(std::filesystem::exists(BatchFile(1)));
  EXPECT_FALSE(std::filesystem::exists(BatchFile(2)));
  EXPECT_FALSE(std::filesystem::exists(options_.dir + "/batch-00000000000000000009.tmp"));
  EXPECT_TRUE(std::filesystem::exists(options_.dir + "/README"));
}

TEST_F(SpoolTest, UnreadableBootFileIsRecoveredFromTheBatches) {
  std::string boot_id;
  {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    boot_id = spool->boot_id();
    ASSERT_OK(spool->Reserve(2));
    for (uint64_t seq = 1; seq <= 2; ++seq) ASSERT_OK(spool->Write(Batch(*spool, seq, 1)));
  }
  { std::ofstream(options_.dir + "/boot", std::ios::trunc) << "garbage"; }
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  EXPECT_EQ(spool->boot_id(), boot_id);
  EXPECT_GE(spool->last_seq(), 2u);
  EXPECT_EQ(spool->stats().corrupt_records_total, 1u);
  EXPECT_EQ(spool->TakeRecovered().size(), 2u);
}

TEST_F(SpoolTest, OneAgentPerDirectory) {
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  absl::StatusOr<std::unique_ptr<Spool>> second = Spool::Open(options_, kAgent);
  ASSERT_THAT(second, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("in use")));
  spool.reset();
  absl::StatusOr<std::unique_ptr<Spool>> other = Spool::Open(options_, "node-b-0000000000000000");
  EXPECT_THAT(other, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("own --spool-dir")));
}

TEST_F(SpoolTest, UnusableDirectoryIsAClearError) {
  const std::string file = dir_ + "/a-file";
  { std::ofstream(file) << "x"; }
  options_.dir = file + "/spool";
  absl::StatusOr<std::unique_ptr<Spool>> s = Spool::Open(options_, kAgent);
  ASSERT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition,
                          HasSubstr("cannot create spool directory")));
  if (::geteuid() != 0) {  // root writes anywhere
    options_.dir = dir_ + "/read-only";
    std::filesystem::create_directories(options_.dir);
    ::chmod(options_.dir.c_str(), 0500);
    s = Spool::Open(options_, kAgent);
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not writable")));
    ::chmod(options_.dir.c_str(), 0700);
  }
}

// When the boot file cannot be replaced atomically (a full disk has no block for the temporary
// copy; here a directory squats its name), the lease is rewritten in place: the spool still
// opens, replays its batches and never reuses a leased seq.
TEST_F(SpoolTest, LeaseIsRewrittenInPlaceWhenNoNewFileCanBeMade) {
  uint64_t first_lease = 0;
  std::string boot_id;
  {
    std::unique_ptr<Spool> spool = Open();
    ASSERT_NE(spool, nullptr);
    boot_id = spool->boot_id();
    ASSERT_OK(spool->Reserve(1));
    ASSERT_OK(spool->Write(Batch(*spool, 1, 3)));
    first_lease = spool->last_seq() + options_.seq_lease;
    EXPECT_EQ(spool->stats().boot_rewrites_in_place_total, 0u);
  }
  const std::string squat = absl::StrCat(options_.dir, "/boot.tmp.", ::getpid());
  ASSERT_TRUE(std::filesystem::create_directory(squat));
  {
    std::ofstream keep(squat + "/x");  // non-empty: Open cannot clear it away
  }
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  EXPECT_EQ(spool->boot_id(), boot_id);
  EXPECT_EQ(spool->stats().boot_rewrites_in_place_total, 1u);
  EXPECT_GE(spool->last_seq(), first_lease);
  EXPECT_EQ(spool->TakeRecovered().size(), 1u);
  const uint64_t second_start = spool->last_seq();
  spool.reset();
  std::filesystem::remove_all(squat);
  // The rewritten file reads back: the next start continues above the lease it holds.
  spool = Open();
  ASSERT_NE(spool, nullptr);
  EXPECT_EQ(spool->boot_id(), boot_id);
  EXPECT_GE(spool->last_seq(), second_start + options_.seq_lease - 1);
  EXPECT_EQ(spool->stats().boot_rewrites_in_place_total, 0u);
}

// Without a boot file to rewrite, a directory where none can be made is an error (not a full
// disk here, so not ResourceExhausted: the start fails).
TEST_F(SpoolTest, NoBootFileAndNoRoomForOneIsAnError) {
  std::filesystem::create_directories(options_.dir);
  const std::string squat = absl::StrCat(options_.dir, "/boot.tmp.", ::getpid());
  ASSERT_TRUE(std::filesystem::create_directory(squat));
  { std::ofstream keep(squat + "/x"); }
  absl::StatusOr<std::unique_ptr<Spool>> s = Spool::Open(options_, kAgent);
  ASSERT_FALSE(s.ok());
  EXPECT_FALSE(absl::IsResourceExhausted(s.status())) << s.status();
}

// A boot_id read back from the disk goes out on every batch: one that MakeBootId could not have
// made (control characters, a megabyte) makes the boot file unreadable, not a label.
TEST_F(SpoolTest, ABootIdThatIsNotOursIsNotSentOn) {
  std::filesystem::create_directories(options_.dir);
  {
    std::ofstream boot(options_.dir + "/boot");
    boot << "stepwatch-spool 1\nagent_id " << kAgent << "\nboot_id evil\x1b[2J\nreserved_seq 7\n";
  }
  std::unique_ptr<Spool> spool = Open();
  ASSERT_NE(spool, nullptr);
  EXPECT_EQ(spool->stats().corrupt_records_total, 1u);
  EXPECT_EQ(spool->boot_id().find('\x1b'), std::string::npos);
  EXPECT_EQ(spool->boot_id().size(), 32u);
}

}  // namespace
}  // namespace stepwatch::agent
