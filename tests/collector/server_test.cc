// A real collector server on free loopback ports: batches on an Ingest stream, acks, duplicates,
// the Query service, /metrics scraped over HTTP, and the state file across a restart.
#include "collector/server.h"

#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <future>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/file.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/rpc_method.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"
#include "tests/collector/test_util.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::collector {
namespace {

using ::stepwatch::test::StatusIs;
using ::testing::HasSubstr;

using testing::StepBatch;

// Polls `pred` every 20 ms for at most `timeout`.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/stepwatch-collector-test-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    state_dir_ = dir;
    StartServer();
  }
  void TearDown() override {
    server_.reset();
    unlink((state_dir_ + "/scaling_history").c_str());
    unlink((state_dir_ + "/dedupe.journal").c_str());
    rmdir(state_dir_.c_str());
  }

  // `journal_sync`: with it, batches are journaled (as with --state-dir) and synced by it.
  void StartServer(std::function<int(int)> journal_sync = nullptr) {
    CollectorServerOptions o;
    o.grpc_listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.state_dir = state_dir_;
    o.tick_nanos = 50'000'000;
    if (journal_sync) {
      o.state.dedupe.journal_path = state_dir_ + "/dedupe.journal";
      o.state.dedupe.journal_sync.sync_file = std::move(journal_sync);
    }
    auto server = CollectorServer::Start(o, &clock_);
    ASSERT_OK(server);
    server_ = *std::move(server);
    ASSERT_GT(server_->grpc_port(), 0);
    ASSERT_GT(server_->metrics_port(), 0);
    channel_ = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->grpc_port()),
                                   grpc::InsecureChannelCredentials());
  }

  std::unique_ptr<grpc::ClientContext> Context() {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  // Drives the state's time and the server's ticker: ticks happen only as a test moves it.
  SimulatedClock clock_;
  std::string state_dir_;
  std::unique_ptr<CollectorServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
};

TEST_F(ServerTest, BatchOverTheReceiveLimitIsRefusedAndOthersStillServed) {
  grpc::ChannelArguments args;
  args.SetMaxSendMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->grpc_port()),
                                           grpc::InsecureChannelCredentials(), args);
  auto ingest = v1::Ingest::NewStub(channel);
  // A batch of 9 MiB: over the 8 MiB default, whatever it holds.
  v1::ReportBatch big = StepBatch("n0", 1, "job", 8, 0, 0.1);
  big.mutable_node()->set_driver_version(std::string(9 << 20, 'x'));
  ASSERT_GT(big.ByteSizeLong(),
            static_cast<size_t>(CollectorServerOptions{}.max_receive_message_bytes));
  {
    auto ctx = Context();
    auto stream = ingest->Report(ctx.get());
    stream->Write(big);
    v1::IngestAck ack;
    EXPECT_FALSE(stream->Read(&ack));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  EXPECT_EQ(server_->state()->Snapshot().counters.batches_received, 0u);
  // A batch of normal size on a new stream is applied.
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  ASSERT_TRUE(stream->Write(StepBatch("n0", 1, "job", 8, 0, 0.1)));
  v1::IngestAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  EXPECT_EQ(ack.acked_seq(), 1u);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, IngestStreamAcksAndIgnoresDuplicates) {
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  v1::IngestAck ack;
  const uint64_t sent[] = {1, 2, 1, 4, 3};
  const uint64_t expected_acks[] = {1, 2, 2, 2, 4};
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(stream->Write(StepBatch("node-0", sent[i], "job", 4, sent[i], 0.1)));
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_EQ(ack.boot_id(), "boot-1");
    EXPECT_EQ(ack.acked_seq(), expected_acks[i]) << "after seq " << sent[i];
  }
  EXPECT_TRUE(WaitFor([&] { return server_->state()->Snapshot().agents_connected == 1; }));
  ASSERT_TRUE(stream->WritesDone());
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(WaitFor([&] { return server_->state()->Snapshot().agents_connected == 0; }));

  server_->state()->Tick();  // readers see what the last Tick published
  StateSnapshot s = server_->state()->Snapshot();
  EXPECT_EQ(s.counters.batches_received, 5u);
  EXPECT_EQ(s.counters.duplicate_batches, 1u);
  EXPECT_EQ(s.counters.steps_received, 16u);  // 4 distinct batches x 4 ranks
}

TEST_F(ServerTest, MalformedBatchEndsTheStreamWithInvalidArgument) {
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  v1::ReportBatch bad = StepBatch("node-0", 1, "job", 2, 0, 0.1);
  bad.clear_boot_id();
  ASSERT_TRUE(stream->Write(bad));
  v1::IngestAck ack;
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server_->state()->Tick();
  EXPECT_EQ(server_->state()->Snapshot().counters.ingest_errors, 1u);
}

// A message that is no ReportBatch is not the end of the stream: the stream ends with
// INVALID_ARGUMENT and the batch is counted as unparsable.
TEST_F(ServerTest, UnparsableMessageEndsTheStreamWithInvalidArgumentAndIsCounted) {
  auto ctx = Context();
  const grpc::internal::RpcMethod method("/stepwatch.v1.Ingest/Report",
                                         grpc::internal::RpcMethod::BIDI_STREAMING);
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          channel_.get(), method, ctx.get()));
  const auto bytes = [](const std::string& s) {
    grpc::Slice slice(s);
    return grpc::ByteBuffer(&slice, 1);
  };
  // A batch first: parsed, applied and acknowledged as ever.
  ASSERT_TRUE(stream->Write(bytes(StepBatch("node-0", 1, "job", 2, 0, 0.1).SerializeAsString())));
  grpc::ByteBuffer raw_ack;
  ASSERT_TRUE(stream->Read(&raw_ack));
  v1::IngestAck ack;
  ASSERT_TRUE(grpc::SerializationTraits<v1::IngestAck>::Deserialize(&raw_ack, &ack).ok());
  EXPECT_EQ(ack.acked_seq(), 1u);
  // Field 1 claims 100 bytes and carries 3.
  ASSERT_TRUE(stream->Write(bytes(std::string("\x0a\x64xyz", 5))));
  EXPECT_FALSE(stream->Read(&raw_ack));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  server_->state()->Tick();
  const StateSnapshot s = server_->state()->Snapshot();
  EXPECT_EQ(s.counters.batches_received, 1u);
  auto it = s.counters.malformed.find("unparsable");
  ASSERT_NE(it, s.counters.malformed.end());
  EXPECT_EQ(it->second, 1u);
  EXPECT_EQ(s.counters.ingest_errors, 1u);
}

// Identifiers out of bounds end the stream before anything of the batch is applied or logged.
TEST_F(ServerTest, OversizedBootIdEndsTheStreamWithInvalidArgument) {
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  v1::ReportBatch bad = StepBatch("node-0", 1, "job", 2, 0, 0.1);
  bad.set_boot_id(std::string(1 << 20, 'b'));
  ASSERT_TRUE(stream->Write(bad));
  v1::IngestAck ack;
  EXPECT_FALSE(stream->Read(&ack));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  server_->state()->Tick();
  const StateSnapshot s = server_->state()->Snapshot();
  EXPECT_EQ(s.counters.batches_received, 0u);
  EXPECT_EQ(s.counters.malformed.at("bad_field"), 1u);
  EXPECT_EQ(s.counters.fields_refused.at({"boot_id", "too_long"}), 1u);
}

TEST_F(ServerTest, QueryServiceAnswers) {
  auto ingest = v1::Ingest::NewStub(channel_);
  {
    auto ctx = Context();
    auto stream = ingest->Report(ctx.get());
    v1::ReportBatch b = StepBatch("node-7", 1, "bert", 8, 0, 0.1);
    b.add_gpus()->set_index(0);
    b.mutable_gpus(0)->set_utilization_gpu_ratio(0.42);
    ASSERT_TRUE(stream->Write(b));
    v1::IngestAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    stream->WritesDone();
    ASSERT_TRUE(stream->Finish().ok());
  }
  server_->state()->Tick();  // queries answer from what the last Tick published
  auto query = v1::Query::NewStub(channel_);
  v1::StatusResponse status;
  ASSERT_TRUE(query->Status(Context().get(), v1::StatusRequest(), &status).ok());
  ASSERT_EQ(status.jobs_size(), 1);
  EXPECT_EQ(status.jobs(0).job(), "bert");
  EXPECT_EQ(status.jobs(0).world_size(), 8);
  ASSERT_EQ(status.nodes_size(), 1);
  EXPECT_EQ(status.nodes(0).node(), "node-7");
  ASSERT_EQ(status.nodes(0).gpus_size(), 1);
  EXPECT_DOUBLE_EQ(status.nodes(0).gpus(0).utilization_gpu_ratio(), 0.42);

  v1::FindingsResponse findings;
  EXPECT_TRUE(query->Findings(Context().get(), v1::FindingsRequest(), &findings).ok());

  v1::ExplainRequest req;
  req.set_job("bert");
  v1::ExplainResponse explain;
  ASSERT_TRUE(query->Explain(Context().get(), req, &explain).ok());
  EXPECT_EQ(explain.job().job(), "bert");
  req.set_job("missing");
  EXPECT_EQ(query->Explain(Context().get(), req, &explain).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(ServerTest, MetricsScrapeHasDesignNamesAndPassesPromtool) {
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  for (uint64_t seq = 1; seq <= 40; ++seq) {
    v1::ReportBatch b = StepBatch("node-1", seq, "llm", 8, seq, 0.1, 3, 0.18);
    v1::GpuSample* g = b.add_gpus();
    g->set_index(3);
    g->set_utilization_gpu_ratio(0.9);
    g->set_sm_clock_mhz(1000);
    b.mutable_host()->set_cpu_utilization_ratio(0.5);
    ASSERT_TRUE(stream->Write(b));
    v1::IngestAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    clock_.AdvanceTime(absl::Milliseconds(200));
  }
  std::string body;
  // The ticker advances the engine, one tick per 50 ms of the clock; wait until a tick after the
  // last batch has published the job-level figures.
  ASSERT_TRUE(WaitFor([&] {
    clock_.AdvanceTime(absl::Milliseconds(50));
    absl::StatusOr<std::string> got = testing::HttpGet(server_->metrics_port(), "/metrics");
    if (!got.ok()) return false;
    body = *got;
    return body.find("stepwatch_job_step_seconds{job=\"llm\"}") != std::string::npos &&
           body.find("stepwatch_collector_batches_received_total 40") != std::string::npos;
  })) << body;
  for (const char* needle :
       {"# TYPE stepwatch_job_step_seconds gauge", "stepwatch_job_efficiency_ratio{job=\"llm\"}",
        "stepwatch_job_time_ratio{component=\"imbalance\",job=\"llm\"}",
        "stepwatch_job_whatif_speedup_ratio{fix=\"stragglers\",job=\"llm\"}",
        "stepwatch_job_world_size{job=\"llm\"} 8",
        // A GPU in no Kubernetes pod: its pod labels are there, empty.
        "stepwatch_gpu_utilization_ratio{container=\"\",gpu=\"3\",namespace=\"\",node=\"node-1\","
        "pod=\"\"} 0.9",
        "stepwatch_gpu_sm_clock_hertz{container=\"\",gpu=\"3\",namespace=\"\",node=\"node-1\","
        "pod=\"\"} 1000000000",
        "stepwatch_host_cpu_utilization_ratio{node=\"node-1\"} 0.5",
        "stepwatch_node_up{node=\"node-1\"} 1", "stepwatch_collector_batches_received_total 40",
        "stepwatch_collector_agents_connected 1"}) {
    EXPECT_NE(body.find(needle), std::string::npos) << needle << "\n" << body;
  }
  absl::StatusOr<std::string> lint = testing::PromtoolCheck(body);
  if (!absl::IsUnavailable(lint.status())) {
    ASSERT_OK(lint);
    EXPECT_EQ(*lint, "") << body;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

TEST_F(ServerTest, ShutdownWithAnOpenStreamIsBoundedAndSavesState) {
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  ASSERT_TRUE(stream->Write(StepBatch("node-0", 1, "job", 2, 0, 0.1)));
  v1::IngestAck ack;
  ASSERT_TRUE(stream->Read(&ack));
  const auto start = std::chrono::steady_clock::now();
  server_->Shutdown(200'000'000);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_FALSE(stream->Read(&ack));  // the server ended the stream
  stream->Finish();
  absl::StatusOr<std::string> saved = ReadFile(state_dir_ + "/scaling_history");
  ASSERT_OK(saved);
  EXPECT_EQ(*saved, server_->state()->SerializeScalingHistory());
  // A new collector on the same state dir starts from it.
  server_.reset();
  StartServer();
  EXPECT_EQ(server_->state()->SerializeScalingHistory(), *saved);
}

// With a journal, an acknowledgement leaves only after the fdatasync that covers its batch: each
// sync is counted only once it has ended, 30 ms after it started, so an acknowledgement sent
// before it would arrive with the count short.
TEST_F(ServerTest, AcknowledgementFollowsTheSyncOfItsBatch) {
  server_.reset();
  std::atomic<int> syncs_done{0};
  StartServer([&](int fd) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    const int rc = ::fdatasync(fd);
    syncs_done.fetch_add(1);
    return rc;
  });
  auto ingest = v1::Ingest::NewStub(channel_);
  auto ctx = Context();
  auto stream = ingest->Report(ctx.get());
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    ASSERT_TRUE(stream->Write(StepBatch("node-0", seq, "job", 2, seq, 0.1)));
    v1::IngestAck ack;
    ASSERT_TRUE(stream->Read(&ack));
    EXPECT_EQ(ack.acked_seq(), seq);
    // One batch in flight at a time: each needs a sync of its own.
    EXPECT_GE(syncs_done.load(), static_cast<int>(seq)) << "seq " << seq;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  server_.reset();  // before the sync function's counter goes
}

TEST_F(ServerTest, HealthServiceSaysServing) {
  // grpc.health.v1.Health/Check with an empty HealthCheckRequest; the answer's field 1 (status)
  // is SERVING (1), encoded as the bytes 08 01.
  grpc::GenericStub stub(channel_);
  auto ctx = Context();
  grpc::Slice empty_message("");
  grpc::ByteBuffer request(&empty_message, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(ctx.get(), "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                 &response, [&done](grpc::Status s) { done.set_value(s); });
  grpc::Status status = done.get_future().get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));
}

// The ticker runs on the server's clock: the state file is saved (besides at shutdown) once the
// clock has moved a save interval, 60 s by default, and not before.
TEST_F(ServerTest, TickerSavesTheStateOnTheClocksSchedule) {
  const std::string path = state_dir_ + "/scaling_history";
  const absl::Time start = clock_.TimeNow();
  // The ticker waits for its first tick, 50 ms on.
  ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() == start + absl::Milliseconds(50); }));
  clock_.AdvanceTime(absl::Seconds(59));
  // It ticked once and waits for the next tick; the save is not due yet.
  ASSERT_TRUE(WaitFor([&] {
    return clock_.next_deadline() == start + absl::Seconds(59) + absl::Milliseconds(50);
  }));
  EXPECT_THAT(ReadFile(path), StatusIs(absl::StatusCode::kNotFound));
  clock_.AdvanceTime(absl::Seconds(1));
  EXPECT_TRUE(WaitFor([&] { return ReadFile(path).ok(); }));
}

TEST_F(ServerTest, TickerKeepsItsScheduleWhenTheWallClockStepsBack) {
  const std::string path = state_dir_ + "/scaling_history";
  const absl::Duration start = clock_.MonotonicNow();
  ASSERT_TRUE(WaitFor([&] { return clock_.next_deadline() != absl::InfiniteFuture(); }));
  // NTP or an operator sets the wall clock back an hour: ticks and the save, due 60 s after the
  // start on the monotonic clock, must not wait for the wall clock to catch up.
  clock_.StepWallTime(absl::Hours(-1));
  clock_.AdvanceTime(absl::Seconds(60));
  EXPECT_EQ(clock_.MonotonicNow() - start, absl::Seconds(60));
  EXPECT_TRUE(WaitFor([&] { return ReadFile(path).ok(); }));
}

TEST_F(ServerTest, BusyPortIsAClearError) {
  CollectorServerOptions o;
  o.grpc_listen = absl::StrCat("127.0.0.1:", server_->grpc_port());
  o.metrics_listen = "";
  auto second = CollectorServer::Start(o, &clock_);
  EXPECT_THAT(second, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("cannot listen")));
}

}  // namespace
}  // namespace stepwatch::collector
