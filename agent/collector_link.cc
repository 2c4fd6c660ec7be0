#include "agent/collector_link.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/node_reading.h"
#include "common/log.h"

namespace stepwatch::agent {
namespace {

int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

CollectorLink::CollectorLink(const CollectorLinkOptions& options)
    : options_(options),
      boot_id_(options.spool != nullptr  ? options.spool->boot_id()
               : options.boot_id.empty() ? MakeBootId()
                                         : options.boot_id),
      clock_(options.clock ? options.clock : &real_clock_) {}

CollectorLink::~CollectorLink() { Stop(absl::ZeroDuration()); }

absl::Status CollectorLink::Start() {
  if (options_.agent_id.empty()) return absl::InvalidArgumentError("agent_id is required");
  if (options_.collector.empty()) return absl::InvalidArgumentError("collector is required");
  if (options_.max_buffered_batches == 0 || options_.max_events_per_batch == 0) {
    return absl::InvalidArgumentError("buffer and batch limits must be > 0");
  }
  {
    absl::MutexLock lock(&mu_);
    if (started_) return absl::FailedPreconditionError("already started");
    started_ = true;
    link_since_ = clock_->MonotonicNow();
    if (options_.spool != nullptr) {
      // What an earlier process left goes out first; new batches continue above its seqs.
      last_seq_ = options_.spool->last_seq();
      for (std::shared_ptr<v1::ReportBatch>& batch : options_.spool->TakeRecovered()) {
        Entry e;
        e.seq = batch->seq();
        e.bytes = batch->ByteSizeLong();
        e.batch = std::move(batch);
        e.sent_before = true;
        buffered_bytes_ += e.bytes;
        buffer_.push_back(std::move(e));
      }
    }
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, Millis(options_.keepalive_time));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, Millis(options_.keepalive_timeout));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 0);
  // gRPC's own reconnect backoff (up to 120 s by default) would hide a restarted collector for
  // long after our own, shorter backoff has expired.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, Millis(options_.backoff.initial));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, Millis(options_.backoff.initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, Millis(options_.backoff.max));
  if (!options_.tls_server_name.empty()) args.SetSslTargetNameOverride(options_.tls_server_name);
  channel_ = grpc::CreateCustomChannel(
      options_.collector,
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials(),
      args);
  stub_ = v1::Ingest::NewStub(channel_);
  streamer_ = std::thread([this] { StreamLoop(); });
  return absl::OkStatus();
}

void CollectorLink::Stop(absl::Duration flush_timeout) {
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!started_) return;
    // Bounded flush, and none at all while the collector is away: it cannot hold up shutdown.
    clock_->AwaitFor(&mu_, absl::Condition(this, &CollectorLink::FlushedOrDisconnected),
                     flush_timeout);
    if (!buffer_.empty()) {
      SW_LOG_WARNING << "shutting down with " << buffer_.size()
                     << " batches not acknowledged by the collector"
                     << (options_.spool != nullptr ? " (kept in the spool for the next start)"
                                                   : "");
    }
    stop_ = true;
    if (context_ != nullptr) context_->TryCancel();
  }
  if (streamer_.joinable()) streamer_.join();
}

CollectorLinkStats CollectorLink::stats() const {
  absl::MutexLock lock(&mu_);
  CollectorLinkStats s = stats_;
  s.collector = options_.collector;
  s.boot_id = boot_id_;
  s.buffered_batches = buffer_.size();
  s.buffered_bytes = buffered_bytes_;
  s.last_seq = last_seq_;
  s.acked_seq = acked_seq_;
  s.unspooled_batches = unspooled_;
  if (unspooled_ > 0) {
    for (const Entry& e : buffer_) {
      if (!e.spooled) s.unspooled_events += e.batch->steps_size();
    }
  }
  if (options_.spool != nullptr) s.spool = options_.spool->stats();
  return s;
}

LinkState CollectorLink::link_state() const {
  absl::MutexLock lock(&mu_);
  return LinkState{stats_.connected, link_since_};
}

std::vector<std::shared_ptr<v1::ReportBatch>> CollectorLink::BuildBatches(CutContents cut) const {
  std::vector<v1::StepEvent>& steps = cut.steps;
  std::vector<std::shared_ptr<v1::ReportBatch>> batches;
  size_t next_step = 0;
  do {
    auto batch = std::make_shared<v1::ReportBatch>();
    batch->set_agent_id(options_.agent_id);
    batch->set_boot_id(boot_id_);
    batch->set_created_unix_nanos(cut.created_unix_nanos);
    *batch->mutable_node() = cut.node;
    if (batches.empty()) {
      for (auto& g : cut.gpus) *batch->add_gpus() = std::move(g);
      if (cut.host) *batch->mutable_host() = std::move(*cut.host);
    }
    const size_t end = std::min(steps.size(), next_step + options_.max_events_per_batch);
    batch->mutable_steps()->Reserve(static_cast<int>(end - next_step));
    for (; next_step < end; ++next_step) *batch->add_steps() = std::move(steps[next_step]);
    batches.push_back(std::move(batch));
  } while (next_step < steps.size());
  // The exits ride in the last batch, after every step of this cut.
  for (auto& x : cut.rank_exits) *batches.back()->add_rank_exits() = std::move(x);
  for (auto& job : cut.released_jobs) batches.back()->add_released_jobs(std::move(job));
  return batches;
}

void CollectorLink::Enqueue(CutContents cut) {
  absl::MutexLock cut_lock(&cut_mu_);
  // Built outside mu_: the stream thread and stats() are not held up by the copying.
  std::vector<std::shared_ptr<v1::ReportBatch>> batches = BuildBatches(std::move(cut));
  {
    absl::MutexLock lock(&mu_);
    for (auto& batch : batches) batch->set_seq(++last_seq_);
  }
  // Seqs are handed out in cut order (cut_mu_ is held), so the buffer stays sorted by seq.
  size_t spooled = batches.size();
  if (options_.spool != nullptr) {
    RespoolHeld();
    spooled = SpoolBatches(batches);
  }

  std::vector<uint64_t> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < batches.size(); ++i) {
      Entry e;
      e.seq = batches[i]->seq();
      e.bytes = batches[i]->ByteSizeLong();
      e.batch = std::move(batches[i]);
      e.spooled = i < spooled;
      if (!e.spooled) {
        ++unspooled_;
        stats_.events_unspooled_total += e.batch->steps_size();
      }
      buffered_bytes_ += e.bytes;
      stats_.events_shipped_total += e.batch->steps_size();
      buffer_.push_back(std::move(e));
      ++stats_.batches_created_total;
    }
    // Keep at least the newest batch even when it alone exceeds the byte bound.
    while (buffer_.size() > options_.max_buffered_batches ||
           (buffer_.size() > 1 && buffered_bytes_ > options_.max_buffered_bytes)) {
      buffered_bytes_ -= buffer_.front().bytes;
      if (!buffer_.front().spooled) --unspooled_;
      dropped.push_back(buffer_.front().seq);
      buffer_.pop_front();
      ++stats_.batches_dropped_total;
    }
  }
  if (options_.spool != nullptr) {
    for (uint64_t seq : dropped) options_.spool->Remove(seq, /*dropped=*/true);
  }
}

void CollectorLink::RespoolHeld() {
  constexpr size_t kMaxPerCut = 64;
  std::vector<std::shared_ptr<v1::ReportBatch>> held;
  {
    absl::MutexLock lock(&mu_);
    if (unspooled_ == 0) return;
    for (const Entry& e : buffer_) {
      if (e.spooled) continue;
      // A copy: the stream thread sets base_seq on the shared one.
      held.push_back(std::make_shared<v1::ReportBatch>(*e.batch));
      if (held.size() == kMaxPerCut) break;
    }
  }
  absl::Status st = options_.spool->Reserve(held.back()->seq());
  size_t written = 0;
  while (st.ok() && written < held.size()) {
    st = options_.spool->Write(*held[written]);
    if (st.ok()) ++written;
  }
  if (written == 0) return;  // still full: the next cut tries again
  std::vector<uint64_t> gone;
  {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < written; ++i) {
      const uint64_t seq = held[i]->seq();
      auto it = std::lower_bound(buffer_.begin(), buffer_.end(), seq,
                                 [](const Entry& e, uint64_t s) { return e.seq < s; });
      if (it == buffer_.end() || it->seq != seq) {
        gone.push_back(seq);  // acknowledged or dropped meanwhile: not to be replayed
        continue;
      }
      if (!it->spooled) {
        it->spooled = true;
        --unspooled_;
        ++stats_.batches_respooled_total;
      }
    }
  }
  for (uint64_t seq : gone) options_.spool->Remove(seq, /*dropped=*/false);
}

size_t CollectorLink::SpoolBatches(const std::vector<std::shared_ptr<v1::ReportBatch>>& batches) {
  absl::Status st = options_.spool->Reserve(batches.back()->seq());
  size_t written = 0;
  while (st.ok() && written < batches.size()) {
    st = options_.spool->Write(*batches[written]);
    if (st.ok()) ++written;
  }
  if (!st.ok()) {
    // Still sent from memory: only a crash before the acknowledgement could lose these.
    uint64_t suppressed = 0;
    if (spool_log_.Allow(&suppressed)) {
      SW_LOG_WARNING << "spool: " << st.message() << "; " << (batches.size() - written)
                     << " batches held in memory only until the spool takes them (a crash loses "
                        "them; stepwatch_agent_spool_unspooled_batches)";
    }
  }
  return written;
}

void CollectorLink::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  clock_->AwaitFor(&mu_, absl::Condition(this, &CollectorLink::Stopping), d);
}

bool CollectorLink::WaitForChannel() {
  // gRPC waits in real time, in short slices; the connect timeout is measured on the clock.
  const absl::Duration deadline = clock_->MonotonicNow() + options_.connect_timeout;
  bool tried = false;
  while (clock_->MonotonicNow() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return false;
    }
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return true;
    // A refused connection fails this attempt at once; our backoff decides when to try again.
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && tried) return false;
    if (state == GRPC_CHANNEL_SHUTDOWN) return false;
    tried = true;
    // Short slices so that Stop() is never held up by a connection attempt.
    channel_->WaitForStateChange(state,
                                 std::chrono::system_clock::now() + std::chrono::milliseconds(100));
  }
  return false;
}

std::string CollectorLink::ProbeFailure() {
  if (channel_->GetState(/*try_to_connect=*/false) != GRPC_CHANNEL_TRANSIENT_FAILURE) return "";
  // Not wait_for_ready: on a failing channel the call fails at once with the channel's last
  // error, the only place gRPC says why (e.g. the TLS handshake's reason).
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  if (options_.token != nullptr) {
    context.AddMetadata("authorization", options_.token->AuthorizationHeader());
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::ReportBatch, v1::IngestAck>> stream =
      stub_->Report(&context);
  stream->WritesDone();
  const grpc::Status status = stream->Finish();
  return status.ok() ? std::string() : status.error_message();
}

void CollectorLink::ExplainFailure(const std::string& grpc_message, std::string* last_cause) {
  const std::string cause = security::ExplainTlsFailure(grpc_message, options_.tls_flags);
  // Once per cause, not once per retry; a failure without a known cause keeps the last one.
  if (cause.empty() || cause == *last_cause) return;
  *last_cause = cause;
  uint64_t suppressed = 0;
  if (cause_log_.Allow(&suppressed)) {
    SW_LOG_WARNING << "collector " << options_.collector << ": cannot connect: " << grpc_message
                   << " (likely cause: " << cause << ")";
  }
}

void CollectorLink::StreamLoop() {
  Backoff backoff(options_.backoff);
  LogRateLimiter failure_log(3, std::chrono::seconds(30));
  uint64_t failures = 0;
  // The likely cause last logged; cleared by a stream that worked.
  std::string last_cause;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      ++stats_.connect_attempts_total;
    }
    bool progressed = false;
    std::string error;
    if (WaitForChannel()) {
      progressed = RunStream();
      absl::MutexLock lock(&mu_);
      error = stream_error_;
    } else {
      error = ProbeFailure();
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
    }
    if (progressed) {
      backoff.Reset();
      failures = 0;
      last_cause.clear();
    } else {
      // Only a stream that never got an acknowledgement may have failed on TLS or setup.
      ExplainFailure(error, &last_cause);
    }
    ++failures;
    const absl::Duration delay = absl::Trunc(backoff.Next(), absl::Milliseconds(1));
    uint64_t suppressed = 0;
    if (failure_log.Allow(&suppressed)) {
      SW_LOG_WARNING << "collector " << options_.collector << " unavailable (" << failures
                     << (failures == 1 ? " failure" : " failures in a row") << "), retrying in "
                     << absl::FormatDuration(delay);
    }
    SleepUnlessStopped(delay);
  }
}

bool CollectorLink::RunStream() {
  grpc::ClientContext context;
  if (options_.token != nullptr) {
    context.AddMetadata("authorization", options_.token->AuthorizationHeader());
  }
  {
    absl::MutexLock lock(&mu_);
    if (stop_) return false;
    context_ = &context;
    written_seq_ = 0;
    stream_broken_ = false;
    acked_on_stream_ = false;
    stream_error_.clear();
    awaiting_ack_since_.reset();
  }
  std::unique_ptr<grpc::ClientReaderWriter<v1::ReportBatch, v1::IngestAck>> stream =
      stub_->Report(&context);
  SW_LOG_INFO << "connected to collector " << options_.collector << " (agent_id "
              << options_.agent_id << ", boot_id " << boot_id_ << ")";
  {
    absl::MutexLock lock(&mu_);
    stats_.connected = true;
    link_since_ = clock_->MonotonicNow();
    ++stats_.connects_total;
  }
  std::thread reader([this, &stream] {
    v1::IngestAck ack;
    while (stream->Read(&ack)) OnAck(ack);
    absl::MutexLock lock(&mu_);
    stream_broken_ = true;
  });

  mu_.Lock();
  std::string why = WriteUntilBroken(stream.get());
  const bool acked = acked_on_stream_;
  if (stop_) why.clear();  // shutting down is not worth a warning
  stats_.connected = false;
  link_since_ = clock_->MonotonicNow();
  mu_.Unlock();

  // A stream the collector closed has ended on its own, and Finish() then reports the
  // collector's status; otherwise cancelling is what unblocks the reader.
  if (why != "stream closed") context.TryCancel();
  reader.join();
  const grpc::Status status = stream->Finish();
  {
    absl::MutexLock lock(&mu_);
    context_ = nullptr;
    if (!status.ok()) stream_error_ = status.error_message();
  }
  if (!why.empty()) {
    SW_LOG_WARNING << "disconnected from collector " << options_.collector << ": " << why
                   << (status.ok() ? std::string()
                                   : absl::StrCat(" (", status.error_message(), ")"));
  }
  return acked;
}

std::string CollectorLink::WriteUntilBroken(
    grpc::ClientReaderWriter<v1::ReportBatch, v1::IngestAck>* stream) {
  while (true) {
    // Until there is something to do, or the acknowledgement deadline. An acknowledgement that
    // moves the deadline later only makes this wake early and wait again.
    const absl::Duration ack_wait =
        awaiting_ack_since_ ? *awaiting_ack_since_ + options_.ack_timeout - clock_->MonotonicNow()
                            : absl::InfiniteDuration();
    clock_->AwaitFor(&mu_, absl::Condition(this, &CollectorLink::StreamHasWork), ack_wait);
    if (stop_) return "";
    if (stream_broken_) {
      return "stream closed";
    }
    if (awaiting_ack_since_ &&
        clock_->MonotonicNow() >= *awaiting_ack_since_ + options_.ack_timeout) {
      return absl::StrCat("no acknowledgement for ", absl::FormatDuration(options_.ack_timeout));
    }
    // The next batch to write: the oldest one above what this stream has carried.
    auto it = buffer_.begin();
    while (it != buffer_.end() && it->seq <= written_seq_) ++it;
    if (it == buffer_.end()) continue;
    std::shared_ptr<v1::ReportBatch> batch = it->batch;
    batch->set_base_seq(buffer_.front().seq);
    const bool resend = it->sent_before;
    it->sent_before = true;
    written_seq_ = it->seq;
    if (!awaiting_ack_since_) awaiting_ack_since_ = clock_->MonotonicNow();
    mu_.Unlock();
    const bool ok = stream->Write(*batch);
    mu_.Lock();
    if (!ok) {
      return "write failed";
    }
    ++stats_.batches_sent_total;
    if (resend) ++stats_.batches_resent_total;
  }
}

void CollectorLink::OnAck(const v1::IngestAck& ack) {
  std::vector<uint64_t> acked;
  {
    absl::MutexLock lock(&mu_);
    if (!ack.boot_id().empty() && ack.boot_id() != boot_id_) return;
    acked_on_stream_ = true;
    if (ack.acked_seq() <= acked_seq_) return;
    acked_seq_ = ack.acked_seq();
    while (!buffer_.empty() && buffer_.front().seq <= acked_seq_) {
      buffered_bytes_ -= buffer_.front().bytes;
      if (!buffer_.front().spooled) --unspooled_;
      acked.push_back(buffer_.front().seq);
      buffer_.pop_front();
      ++stats_.batches_acknowledged_total;
    }
    // Seqs below the oldest batch held were given up (dropped, or skipped by a restart over the
    // spool's lease), but the batches already written told the collector an older base_seq: it
    // waits for them forever. Writing the oldest batch again carries the new base_seq.
    if (!buffer_.empty() && buffer_.front().seq > acked_seq_ + 1 &&
        written_seq_ >= buffer_.front().seq) {
      written_seq_ = buffer_.front().seq - 1;
    }
    if (acked_seq_ >= written_seq_) {
      awaiting_ack_since_.reset();
    } else {
      awaiting_ack_since_ = clock_->MonotonicNow();
    }
  }
  if (options_.spool != nullptr) {
    for (uint64_t seq : acked) options_.spool->Remove(seq, /*dropped=*/false);
  }
}

}  // namespace stepwatch::agent
