#include "collector/dedupe.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using ::stepwatch::test::StatusIs;
using ::testing::HasSubstr;

TEST(BatchDeduperTest, InOrderBatchesMoveTheWatermark) {
  BatchDeduper d;
  for (uint64_t seq = 1; seq <= 5; ++seq) {
    BatchDeduper::Result r = d.Observe("a", "boot1", seq, 1);
    EXPECT_FALSE(r.duplicate) << seq;
    EXPECT_EQ(r.acked_seq, seq);
  }
}

TEST(BatchDeduperTest, ResentBatchesAreDuplicatesButStillAcked) {
  BatchDeduper d;
  d.Observe("a", "b", 1, 1);
  d.Observe("a", "b", 2, 1);
  BatchDeduper::Result r = d.Observe("a", "b", 1, 1);
  EXPECT_TRUE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 2u);
  r = d.Observe("a", "b", 2, 1);
  EXPECT_TRUE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 2u);
}

TEST(BatchDeduperTest, GapHoldsTheWatermarkUntilFilled) {
  BatchDeduper d;
  EXPECT_EQ(d.Observe("a", "b", 1, 1).acked_seq, 1u);
  BatchDeduper::Result r = d.Observe("a", "b", 3, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 1u);
  r = d.Observe("a", "b", 3, 1);  // seen above the watermark
  EXPECT_TRUE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 1u);
  r = d.Observe("a", "b", 2, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 3u);
}

TEST(BatchDeduperTest, BaseSeqSkipsBatchesTheAgentDropped) {
  BatchDeduper d;
  EXPECT_EQ(d.Observe("a", "b", 1, 1).acked_seq, 1u);
  // The agent dropped 2..9 from a full buffer; its lowest held batch is 10.
  BatchDeduper::Result r = d.Observe("a", "b", 10, 10);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 10u);
  // A late copy of a dropped batch is below the watermark now.
  EXPECT_TRUE(d.Observe("a", "b", 5, 10).duplicate);
}

TEST(BatchDeduperTest, FirstBatchAfterCollectorRestartStartsAtBaseSeq) {
  // A fresh collector meets an agent at seq 41 holding 38..41 unacknowledged.
  BatchDeduper d;
  EXPECT_EQ(d.Observe("a", "b", 38, 38).acked_seq, 38u);
  EXPECT_EQ(d.Observe("a", "b", 39, 38).acked_seq, 39u);
}

TEST(BatchDeduperTest, BaseSeqAboveSeqIsClamped) {
  BatchDeduper d;
  BatchDeduper::Result r = d.Observe("a", "b", 3, 100);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 3u);
}

TEST(BatchDeduperTest, StreamsAreIndependentPerAgentAndBoot) {
  BatchDeduper d;
  d.Observe("a", "boot1", 1, 1);
  d.Observe("a", "boot1", 2, 1);
  // A restarted agent (new boot id) starts again at 1: not a duplicate.
  BatchDeduper::Result r = d.Observe("a", "boot2", 1, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 1u);
  r = d.Observe("other", "boot1", 1, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(d.stream_count(), 3u);
  d.ForgetAgent("a");
  EXPECT_EQ(d.stream_count(), 1u);
  EXPECT_FALSE(d.Observe("a", "boot1", 1, 1).duplicate);
}

TEST(BatchDeduperTest, PendingSetIsBounded) {
  DeduperOptions o;
  o.max_streams = 10;
  o.max_pending_per_stream = 4;
  BatchDeduper d(o);
  d.Observe("a", "b", 1, 1);
  // seq 2 never arrives; 3..7 pile up above the gap.
  for (uint64_t seq = 3; seq <= 6; ++seq) EXPECT_EQ(d.Observe("a", "b", seq, 1).acked_seq, 1u);
  // The fifth pending seq exceeds the bound: the watermark gives up on 2.
  EXPECT_EQ(d.Observe("a", "b", 7, 1).acked_seq, 7u);
}

TEST(BatchDeduperTest, LeastRecentlyUsedStreamIsEvicted) {
  DeduperOptions o;
  o.max_streams = 2;
  o.max_pending_per_stream = 16;
  BatchDeduper d(o);
  d.Observe("a", "b", 1, 1);
  d.Observe("c", "d", 1, 1);
  d.Observe("a", "b", 2, 1);  // a/b is now the most recently used
  d.Observe("e", "f", 1, 1);  // evicts c/d
  EXPECT_EQ(d.stream_count(), 2u);
  EXPECT_TRUE(d.Observe("a", "b", 2, 1).duplicate);
  EXPECT_FALSE(d.Observe("c", "d", 1, 1).duplicate);
}

// A journal file in a fresh directory of its own, removed afterwards.
class JournalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stepwatch-dedupe-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  DeduperOptions Options(size_t compact_after = 65536) const {
    DeduperOptions o;
    o.journal_path = (dir_ / "dedupe.journal").string();
    o.compact_after_records = compact_after;
    return o;
  }

  // Observe + Commit (+ the sync before the acknowledgement), as the collector does for a batch
  // it applies. What a killed process wrote is in the file whether or not it was synced.
  static BatchDeduper::Result Apply(BatchDeduper* d, const char* agent, const char* boot,
                                    uint64_t seq, uint64_t base, bool sync = true) {
    BatchDeduper::Result r = d->Observe(agent, boot, seq, base);
    if (!r.duplicate) {
      BatchDeduper::Sync s;
      EXPECT_OK(d->Commit(agent, boot, seq, base, &s));
      if (sync) {
        EXPECT_OK(s.Wait());
      }
    }
    return r;
  }

  uintmax_t FileSize() const { return std::filesystem::file_size(dir_ / "dedupe.journal"); }

  std::filesystem::path dir_;
};

TEST_F(JournalTest, AppliedBatchesAreDuplicatesAfterARestart) {
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    for (uint64_t seq = 1; seq <= 3; ++seq) Apply(&d, "a", "boot1", seq, 1);
    Apply(&d, "a", "boot1", 5, 1);  // out of order: 4 still missing
    Apply(&d, "b", "boot9", 7, 7);  // a fresh stream starting at its base
    EXPECT_EQ(d.journal_records(), 5u);
  }  // the process dies: only the file remains
  BatchDeduper d(Options());
  ASSERT_OK(d.OpenJournal());
  for (uint64_t seq = 1; seq <= 3; ++seq) EXPECT_TRUE(d.Observe("a", "boot1", seq, 1).duplicate);
  EXPECT_TRUE(d.Observe("a", "boot1", 5, 1).duplicate);
  EXPECT_TRUE(d.Observe("b", "boot9", 7, 7).duplicate);
  // What was never applied is not taken for a duplicate.
  BatchDeduper::Result r = d.Observe("a", "boot1", 4, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 5u);
  EXPECT_FALSE(d.Observe("a", "boot2", 1, 1).duplicate);
}

TEST_F(JournalTest, ObservedButNotCommittedIsCountedAgain) {
  // A collector killed between Observe and Commit never acknowledged, nor showed, the batch.
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    Apply(&d, "a", "b", 1, 1);
    EXPECT_FALSE(d.Observe("a", "b", 2, 1).duplicate);
  }
  BatchDeduper d(Options());
  ASSERT_OK(d.OpenJournal());
  EXPECT_TRUE(d.Observe("a", "b", 1, 1).duplicate);
  EXPECT_FALSE(d.Observe("a", "b", 2, 1).duplicate);
}

TEST_F(JournalTest, TornTailIsCutAndReported) {
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    Apply(&d, "a", "b", 1, 1);
    Apply(&d, "a", "b", 2, 1);
  }
  // Half a record, as a power loss mid-append leaves it.
  const std::string whole = DedupeJournal::Encode({"a", "b", 3, 1});
  {
    std::ofstream f(dir_ / "dedupe.journal", std::ios::binary | std::ios::app);
    f.write(whole.data(), static_cast<std::streamsize>(whole.size() / 2));
  }
  BatchDeduper d(Options());
  absl::Status st = d.OpenJournal();
  EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_TRUE(d.Observe("a", "b", 2, 1).duplicate);
  EXPECT_FALSE(d.Observe("a", "b", 3, 1).duplicate);
  BatchDeduper::Sync sync;
  ASSERT_OK(d.Commit("a", "b", 3, 1, &sync));
  ASSERT_OK(sync.Wait());
  // The cut file takes appends again and reads back whole.
  BatchDeduper again(Options());
  EXPECT_OK(again.OpenJournal());
  EXPECT_TRUE(again.Observe("a", "b", 3, 1).duplicate);
}

TEST_F(JournalTest, DamagedRecordInTheMiddleCostsOnlyThatRecord) {
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    for (uint64_t seq = 1; seq <= 3; ++seq) Apply(&d, "a", "b", seq, 1);
  }
  // The file is the magic (8 bytes), then the records; flip one byte of the second record.
  const size_t record = DedupeJournal::Encode({"a", "b", 1, 1}).size();
  {
    std::fstream f(dir_ / "dedupe.journal", std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(static_cast<std::streamoff>(8 + record + record - 3));
    f.put('\x5a');
  }
  BatchDeduper d(Options());
  EXPECT_TRUE(absl::IsDataLoss(d.OpenJournal()));
  EXPECT_EQ(d.journal_damaged_records(), 1u);
  EXPECT_TRUE(d.Observe("a", "b", 1, 1).duplicate);
  EXPECT_FALSE(d.Observe("a", "b", 2, 1).duplicate);  // its record was lost
  EXPECT_TRUE(d.Observe("a", "b", 3, 1).duplicate);   // read past the damage
}

TEST(JournalFormatTest, Crc32cMatchesTheCheckValue) {
  EXPECT_EQ(DedupeJournal::Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(DedupeJournal::Crc32c(""), 0u);
}

// Every byte of a small journal flipped in turn (two ways): only the record that holds it is
// lost, and it is counted; a damaged header loses nothing.
TEST_F(JournalTest, EveryFlippedByteCostsOnlyTheRecordThatHoldsIt) {
  const std::vector<DedupeJournal::Record> records = {{"node-0", "boot-a", 1, 1},
                                                      {"node-0", "boot-a", 2, 1},
                                                      {"node-17", "0f8fad5b", 9, 7},
                                                      {"n", "b", 1ull << 40, 0}};
  const std::string path = (dir_ / "dedupe.journal").string();
  {
    DedupeJournal j(path);
    ASSERT_OK(j.Rewrite(records));
  }
  std::string whole;
  {
    std::ifstream f(path, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  }
  // Where each record starts, and the end.
  std::vector<size_t> starts = {8};
  for (const DedupeJournal::Record& r : records) {
    starts.push_back(starts.back() + DedupeJournal::Encode(r).size());
  }
  ASSERT_EQ(starts.back(), whole.size());
  for (size_t pos = 0; pos < whole.size(); ++pos) {
    for (unsigned char mask : {0x01, 0xa5}) {
      std::string damaged = whole;
      damaged[pos] = static_cast<char>(damaged[pos] ^ mask);
      {
        std::ofstream f(path, std::ios::binary | std::ios::trunc);
        f.write(damaged.data(), static_cast<std::streamsize>(damaged.size()));
      }
      size_t hit = records.size();  // the header
      for (size_t k = 0; k < records.size(); ++k) {
        if (pos >= starts[k] && pos < starts[k + 1]) hit = k;
      }
      DedupeJournal j(path);
      DedupeJournal::ReadStats stats;
      absl::StatusOr<std::vector<DedupeJournal::Record>> read = j.Read(&stats);
      ASSERT_OK(read);
      std::vector<uint64_t> expected;
      for (size_t k = 0; k < records.size(); ++k) {
        if (k != hit) expected.push_back(records[k].seq);
      }
      std::vector<uint64_t> got;
      for (const DedupeJournal::Record& r : *read) got.push_back(r.seq);
      ASSERT_EQ(got, expected) << "byte " << pos << " ^ " << int{mask};
      for (size_t k = 0, i = 0; k < records.size(); ++k) {
        if (k == hit) continue;
        EXPECT_EQ((*read)[i].agent_id, records[k].agent_id);
        EXPECT_EQ((*read)[i].boot_id, records[k].boot_id);
        EXPECT_EQ((*read)[i].base_seq, records[k].base_seq);
        ++i;
      }
      EXPECT_EQ(stats.damaged_records, hit == records.size() ? 0u : 1u) << "byte " << pos;
      EXPECT_EQ(stats.header_damaged, hit == records.size()) << "byte " << pos;
      EXPECT_EQ(stats.torn, hit == records.size() - 1) << "byte " << pos;
    }
  }
}

// A stretch of nothing but would-be record starts, each claiming 4,000 bytes (a CRC each): reading
// gives up after a bounded number of them rather than taking minutes.
TEST_F(JournalTest, ResynchronisationIsBoundedOnAFileOfFalseRecordStarts) {
  std::string data = "SWDEDUP2" + DedupeJournal::Encode({"a", "b", 1, 1});
  for (int i = 0; i < 80000; ++i) data += std::string("\xf5\x3d\x9a\x6c\xa0\x0f\x00\x00", 8);
  data += DedupeJournal::Encode({"a", "b", 2, 1});
  {
    std::ofstream f(dir_ / "dedupe.journal", std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  DedupeJournal j((dir_ / "dedupe.journal").string());
  DedupeJournal::ReadStats stats;
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<DedupeJournal::Record>> read = j.Read(&stats);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_OK(read);
  ASSERT_GE(read->size(), 1u);
  EXPECT_EQ((*read)[0].seq, 1u);
  EXPECT_GT(stats.damaged_records, 65536u);
  EXPECT_GT(stats.damaged_bytes, 0u);
  std::printf("dedupe journal: %zu bytes of false record starts read in %.2f s\n", data.size(), s);
  EXPECT_LT(s, 60.0);
}

TEST_F(JournalTest, FirstFormatJournalIsReadAndRewrittenInTheCurrentOne) {
  {
    std::ofstream f(dir_ / "dedupe.journal", std::ios::binary);
    std::string data = "SWDEDUP1";
    for (uint64_t seq = 1; seq <= 3; ++seq) data += DedupeJournal::EncodeV1({"a", "b", seq, 1});
    data += DedupeJournal::EncodeV1({"c", "d", 5, 5});
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
  }
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    EXPECT_TRUE(d.Observe("a", "b", 3, 1).duplicate);
    EXPECT_TRUE(d.Observe("c", "d", 5, 5).duplicate);
    EXPECT_FALSE(d.Observe("a", "b", 4, 1).duplicate);
  }
  std::ifstream f(dir_ / "dedupe.journal", std::ios::binary);
  std::string head(8, '\0');
  f.read(head.data(), 8);
  EXPECT_EQ(head, "SWDEDUP2");
  BatchDeduper d(Options());
  ASSERT_OK(d.OpenJournal());
  EXPECT_TRUE(d.Observe("a", "b", 2, 1).duplicate);
  EXPECT_TRUE(d.Observe("c", "d", 5, 5).duplicate);
}

TEST_F(JournalTest, CompactionBoundsTheFileAndKeepsTheState) {
  BatchDeduper d(Options(/*compact_after=*/100));
  ASSERT_OK(d.OpenJournal());
  // 10,000 in-order batches of one stream: the live state is one watermark.
  for (uint64_t seq = 1; seq <= 10000; ++seq) Apply(&d, "agent", "boot", seq, 1, /*sync=*/false);
  EXPECT_LE(d.journal_records(), 100u);
  const size_t record = DedupeJournal::Encode({"agent", "boot", 1, 1}).size();
  EXPECT_LE(FileSize(), 8 + 102 * record);
  EXPECT_EQ(FileSize(), d.journal_bytes());
  // A gap held open stays in the snapshot.
  Apply(&d, "agent", "boot", 10002, 1);
  for (uint64_t seq = 1; seq <= 300; ++seq) Apply(&d, "other", "boot", seq, 1, /*sync=*/false);
  BatchDeduper restarted(Options(100));
  ASSERT_OK(restarted.OpenJournal());
  EXPECT_TRUE(restarted.Observe("agent", "boot", 10000, 1).duplicate);
  EXPECT_TRUE(restarted.Observe("agent", "boot", 10002, 1).duplicate);
  EXPECT_TRUE(restarted.Observe("other", "boot", 300, 1).duplicate);
  BatchDeduper::Result r = restarted.Observe("agent", "boot", 10001, 1);
  EXPECT_FALSE(r.duplicate);
  EXPECT_EQ(r.acked_seq, 10002u);
  EXPECT_EQ(restarted.stream_count(), 2u);
}

TEST_F(JournalTest, UnwritableJournalIsAnErrorNotACrash) {
  DeduperOptions o;
  o.journal_path = (dir_ / "missing-dir" / "dedupe.journal").string();
  BatchDeduper d(o);
  EXPECT_THAT(d.OpenJournal(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot create")));
  // Deduplication goes on in memory.
  EXPECT_FALSE(d.Observe("a", "b", 1, 1).duplicate);
  BatchDeduper::Sync sync;
  EXPECT_OK(d.Commit("a", "b", 1, 1, &sync));
  EXPECT_OK(sync.Wait());
  EXPECT_TRUE(d.Observe("a", "b", 1, 1).duplicate);
}

TEST_F(JournalTest, OverlongIdsAreRefusedAndDoNotDamageTheJournal) {
  const std::string long_boot(2000, 'b');
  {
    BatchDeduper d(Options());
    ASSERT_OK(d.OpenJournal());
    Apply(&d, "a", "b", 1, 1);
    BatchDeduper::Sync sync;
    ASSERT_FALSE(d.Observe("a", long_boot, 1, 1).duplicate);
    EXPECT_TRUE(absl::IsInvalidArgument(d.Commit("a", long_boot, 1, 1, &sync)));
    EXPECT_EQ(d.journal_errors(), 1u);
    Apply(&d, "a", "b", 2, 1);
  }
  BatchDeduper d(Options());
  EXPECT_OK(d.OpenJournal());  // nothing torn
  EXPECT_TRUE(d.Observe("a", "b", 2, 1).duplicate);
}

TEST_F(JournalTest, OneSyncServesEveryEarlierCommit) {
  BatchDeduper d(Options());
  ASSERT_OK(d.OpenJournal());
  BatchDeduper::Sync first;
  BatchDeduper::Sync second;
  ASSERT_FALSE(d.Observe("a", "b", 1, 1).duplicate);
  ASSERT_OK(d.Commit("a", "b", 1, 1, &first));
  ASSERT_FALSE(d.Observe("a", "b", 2, 1).duplicate);
  ASSERT_OK(d.Commit("a", "b", 2, 1, &second));
  EXPECT_OK(second.Wait());
  EXPECT_OK(first.Wait());  // already covered: returns without a sync
  EXPECT_EQ(FileSize(), d.journal_bytes());
}

// What a journaled batch costs: one write() under the collector's lock and one fdatasync() before
// the acknowledgement, shared by the batches of concurrent streams (here without the commit
// interval's wait, which group commit adds). Printed for docs/reliability.md; asserts only that
// every commit succeeded.
TEST_F(JournalTest, CommitCost) {
  DeduperOptions options = Options();
  options.journal_sync.commit_interval = absl::ZeroDuration();
  BatchDeduper d(options);
  ASSERT_OK(d.OpenJournal());
  const char* boot = "0f8fad5b-d9cb-469f-a165-70867728950e";
  uint64_t seq = 0;
  const uint64_t empty = d.journal_bytes();
  for (int group : {1, 8}) {
    constexpr int kBatches = 256;
    const auto start = std::chrono::steady_clock::now();
    for (int n = 0; n < kBatches; n += group) {
      BatchDeduper::Sync sync;
      for (int g = 0; g < group; ++g) {
        ++seq;
        ASSERT_FALSE(d.Observe("node-0000", boot, seq, 1).duplicate);
        ASSERT_OK(d.Commit("node-0000", boot, seq, 1, &sync));
      }
      ASSERT_OK(sync.Wait());
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        kBatches;
    std::printf("dedupe journal: %.1f us per batch, %d batch(es) per fdatasync (%s)\n", us, group,
                dir_.string().c_str());
  }
  std::printf("dedupe journal: %.1f bytes per record\n",
              static_cast<double>(d.journal_bytes() - empty) / static_cast<double>(seq));
}

}  // namespace
}  // namespace stepwatch::collector
