// Group commit of the deduplication journal: GroupCommitter alone (a sync function the test
// controls), then through BatchDeduper with an injected fdatasync.
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "collector/dedupe.h"
#include "collector/group_commit.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

// Polls `done` every millisecond for at most 10 s (a bounded wait for another thread's progress).
template <typename Fn>
bool Eventually(Fn done) {
  for (int i = 0; i < 10000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return done();
}

// A write-ahead file as the committer sees it: writers bump `written`; a sync makes everything
// written before it durable. The first sync can be held at a gate, and syncs can be made to fail.
struct FakeFile {
  std::atomic<uint64_t> written{0};
  std::atomic<uint64_t> durable{0};
  std::atomic<int> syncs{0};
  std::atomic<bool> fail{false};
  absl::Notification first_sync_entered;
  absl::Notification release_first_sync;
  bool hold_first_sync = false;

  absl::Status Sync() {
    const uint64_t upto = written.load();
    const bool failing = fail.load();  // as the sync starts
    if (syncs.fetch_add(1) == 0 && hold_first_sync) {
      first_sync_entered.Notify();
      release_first_sync.WaitForNotification();
    }
    if (failing) return absl::DataLossError("injected sync failure");
    // Made durable only after the wait: an acknowledgement that came before this would see less.
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    durable.store(std::max(durable.load(), upto));
    return absl::OkStatus();
  }
};

TEST(GroupCommitterTest, ConcurrentWritersShareOneSync) {
  FakeFile file;
  file.hold_first_sync = true;
  GroupCommitter committer([&] { return file.Sync(); }, absl::ZeroDuration());
  // A first writer's sync is under way (held) ...
  std::thread first([&] {
    file.written.fetch_add(1);
    EXPECT_OK(committer.Wait());
  });
  file.first_sync_entered.WaitForNotification();
  // ... while eight more streams write and wait.
  constexpr int kWriters = 8;
  std::vector<std::thread> writers;
  std::atomic<int> ok{0};
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      const uint64_t mine = file.written.fetch_add(1) + 1;
      if (committer.Wait().ok() && file.durable.load() >= mine) ok.fetch_add(1);
    });
  }
  ASSERT_TRUE(Eventually([&] { return committer.waiting() == kWriters; }));
  file.release_first_sync.Notify();
  first.join();
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(ok.load(), kWriters);
  // The held sync, then one for all eight.
  EXPECT_EQ(file.syncs.load(), 2);
  EXPECT_EQ(committer.syncs(), 2u);
}

TEST(GroupCommitterTest, AcknowledgementNeverPrecedesItsSync) {
  FakeFile file;
  GroupCommitter committer([&] { return file.Sync(); }, absl::Milliseconds(1));
  constexpr int kWriters = 4;
  constexpr int kBatches = 50;
  std::atomic<int> early{0};
  std::atomic<int> acked{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.emplace_back([&] {
      for (int b = 0; b < kBatches; ++b) {
        const uint64_t mine = file.written.fetch_add(1) + 1;
        absl::Notification sent;
        // The stream's acknowledgement, as the ingest stream sends it from the callback.
        committer.Then([&](absl::Status st) {
          EXPECT_OK(st);
          if (file.durable.load() < mine) early.fetch_add(1);
          acked.fetch_add(1);
          sent.Notify();
        });
        sent.WaitForNotification();
      }
    });
  }
  for (std::thread& t : writers) t.join();
  EXPECT_EQ(acked.load(), kWriters * kBatches);
  EXPECT_EQ(early.load(), 0);
  EXPECT_LE(committer.syncs(), static_cast<uint64_t>(kWriters * kBatches));
}

TEST(GroupCommitterTest, FailedSyncFailsEveryWaiterItCovered) {
  FakeFile file;
  file.hold_first_sync = true;
  GroupCommitter committer([&] { return file.Sync(); }, absl::ZeroDuration());
  std::thread first([&] { EXPECT_OK(committer.Wait()); });
  file.first_sync_entered.WaitForNotification();
  constexpr int kWaiters = 5;
  absl::Mutex mu;
  std::vector<absl::Status> results;
  for (int w = 0; w < kWaiters; ++w) {
    committer.Then([&](absl::Status st) {
      absl::MutexLock lock(&mu);
      results.push_back(st);
    });
  }
  // The next sync, which covers all five, fails.
  file.fail = true;
  file.release_first_sync.Notify();
  first.join();
  ASSERT_TRUE(Eventually([&] {
    absl::MutexLock lock(&mu);
    return results.size() == kWaiters;
  }));
  for (const absl::Status& st : results) EXPECT_TRUE(absl::IsDataLoss(st)) << st;
  EXPECT_EQ(committer.failed_syncs(), 1u);
  // A later request gets a sync of its own, which succeeds again.
  file.fail = false;
  EXPECT_OK(committer.Wait());
}

TEST(GroupCommitterTest, StopWakesWaitersNoSyncCovered) {
  FakeFile file;
  // Requests wait an hour for others to join: no sync covers them before Stop.
  GroupCommitter committer([&] { return file.Sync(); }, absl::Hours(1));
  absl::Status waiter_status;
  std::thread waiter([&] { waiter_status = committer.Wait(); });
  absl::Status callback_status;
  committer.Then([&](absl::Status st) { callback_status = st; });
  ASSERT_TRUE(Eventually([&] { return committer.waiting() == 2; }));
  committer.Stop();
  waiter.join();
  EXPECT_TRUE(absl::IsCancelled(waiter_status)) << waiter_status;
  EXPECT_TRUE(absl::IsCancelled(callback_status)) << callback_status;
  EXPECT_EQ(file.syncs.load(), 0);
  // After Stop a request fails at once, on the caller's thread.
  EXPECT_TRUE(absl::IsCancelled(committer.Wait()));
}

// The journal in a fresh directory of its own, removed afterwards.
class JournalCommitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("stepwatch-journal-commit-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  DeduperOptions Options(absl::Duration interval, std::function<int(int)> sync_file) const {
    DeduperOptions o;
    o.journal_path = (dir_ / "dedupe.journal").string();
    o.journal_sync.commit_interval = interval;
    o.journal_sync.sync_file = std::move(sync_file);
    return o;
  }

  std::filesystem::path dir_;
};

// Batches of many streams committed while a sync is held share the next fdatasync; every one is
// a duplicate for the next process.
TEST_F(JournalCommitTest, StreamsCommittedDuringASyncShareTheNext) {
  std::atomic<int> syncs{0};
  absl::Notification entered;
  absl::Notification release;
  BatchDeduper d(Options(absl::Milliseconds(2), [&](int fd) {
    if (syncs.fetch_add(1) == 0) {
      entered.Notify();
      release.WaitForNotification();
    }
    return ::fdatasync(fd);
  }));
  ASSERT_OK(d.OpenJournal());
  absl::Mutex state_mu;  // the collector's ingest lock
  auto commit = [&](const std::string& agent) {
    BatchDeduper::Sync sync;
    {
      absl::MutexLock lock(&state_mu);
      EXPECT_FALSE(d.Observe(agent, "boot", 1, 1).duplicate);
      EXPECT_OK(d.Commit(agent, "boot", 1, 1, &sync));
    }
    return sync;  // waited for outside the lock
  };
  std::thread first([&] { EXPECT_OK(commit("agent-first").Wait()); });
  entered.WaitForNotification();
  constexpr int kStreams = 6;
  std::atomic<int> acked{0};
  for (int s = 0; s < kStreams; ++s) {
    commit("agent-" + std::to_string(s)).Then([&](absl::Status st) {
      EXPECT_OK(st);
      acked.fetch_add(1);
    });
  }
  EXPECT_EQ(acked.load(), 0);  // none before its sync
  release.Notify();
  first.join();
  ASSERT_TRUE(Eventually([&] { return acked.load() == kStreams; }));
  EXPECT_EQ(syncs.load(), 2);
  EXPECT_EQ(d.journal_syncs(), 2u);

  BatchDeduper restarted(Options(absl::ZeroDuration(), nullptr));
  ASSERT_OK(restarted.OpenJournal());
  EXPECT_TRUE(restarted.Observe("agent-first", "boot", 1, 1).duplicate);
  for (int s = 0; s < kStreams; ++s) {
    EXPECT_TRUE(restarted.Observe("agent-" + std::to_string(s), "boot", 1, 1).duplicate) << s;
  }
}

// A batch sent again (on a new stream) while its first copy's sync is pending is a duplicate, and
// its acknowledgement waits for that sync too.
TEST_F(JournalCommitTest, DuplicateWaitsForTheSyncOfItsFirstCopy) {
  absl::Notification entered;
  absl::Notification release;
  BatchDeduper d(Options(absl::Milliseconds(1), [&](int fd) {
    entered.Notify();
    release.WaitForNotification();
    return ::fdatasync(fd);
  }));
  ASSERT_OK(d.OpenJournal());
  ASSERT_FALSE(d.Observe("a", "b", 1, 1).duplicate);
  BatchDeduper::Sync first;
  ASSERT_OK(d.Commit("a", "b", 1, 1, &first));
  std::atomic<int> acked{0};
  first.Then([&](absl::Status st) {
    EXPECT_OK(st);
    acked.fetch_add(1);
  });
  entered.WaitForNotification();  // the first copy's sync is under way
  ASSERT_TRUE(d.Observe("a", "b", 1, 1).duplicate);
  BatchDeduper::Sync again;
  d.SyncAppended(&again);
  again.Then([&](absl::Status st) {
    EXPECT_OK(st);
    acked.fetch_add(1);
  });
  EXPECT_EQ(acked.load(), 0);
  release.Notify();
  ASSERT_TRUE(Eventually([&] { return acked.load() == 2; }));
  // Everything is synced now: a duplicate is acknowledged at once.
  bool at_once = false;
  d.SyncAppended(&again);
  again.Then([&](absl::Status st) { at_once = st.ok(); });
  EXPECT_TRUE(at_once);
}

// A failing disk fails the wait of every batch the sync covered, with and without an interval.
TEST_F(JournalCommitTest, FailedFdatasyncFailsTheBatchesItCovered) {
  for (absl::Duration interval : {absl::ZeroDuration(), absl::Milliseconds(2)}) {
    std::filesystem::remove_all(dir_ / "dedupe.journal");
    std::atomic<bool> fail{true};
    BatchDeduper d(Options(interval, [&](int fd) {
      if (!fail.load()) return ::fdatasync(fd);
      errno = EIO;
      return -1;
    }));
    ASSERT_OK(d.OpenJournal());
    std::vector<BatchDeduper::Sync> syncs(3);
    for (uint64_t seq = 1; seq <= syncs.size(); ++seq) {
      ASSERT_FALSE(d.Observe("a", "b", seq, 1).duplicate);
      ASSERT_OK(d.Commit("a", "b", seq, 1, &syncs[seq - 1]));
    }
    for (const BatchDeduper::Sync& s : syncs) {
      absl::Status st = s.Wait();
      EXPECT_TRUE(absl::IsUnavailable(st)) << st;
      EXPECT_NE(st.message().find("cannot sync"), std::string::npos) << st;
    }
    fail = false;
    EXPECT_OK(syncs.back().Wait());  // the disk is back: the next sync covers it
    EXPECT_GE(d.journal_syncs(), 2u);
  }
}

}  // namespace
}  // namespace stepwatch::collector
