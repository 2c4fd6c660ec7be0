#include "collector/dedupe.h"

#include "gtest/gtest.h"

namespace stepwatch::collector {
namespace {

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

}  // namespace
}  // namespace stepwatch::collector
