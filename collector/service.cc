#include "collector/service.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "collector/convert.h"
#include "collector/dedupe.h"
#include "collector/queries.h"
#include "common/log.h"
#include "common/text.h"
#include "google/protobuf/arena.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/proto_buffer_writer.h"
#include "security/peer_identity.h"
#include "security/tokens.h"

namespace stepwatch::collector {
namespace {

std::string Suppressed(uint64_t n) {
  return n > 0 ? absl::StrCat(" [", n, " similar suppressed]") : std::string();
}

// One agent's stream. Reads and writes alternate (read a batch, apply it, write its ack, read the
// next), so exactly one operation is outstanding at any time and Finish is called exactly once.
// Batches arrive as bytes: parsing them here tells a malformed message from the end of the stream.
class ReportReactor final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `authorized`: the outcome of the token check. `identity`: the node a verified client
  // certificate names (empty when node identity is not verified, or without client
  // certificates); every batch must claim that node. An error when the certificate names none.
  // `refusal_log` (the service's) rate-limits the refusal warnings of every stream.
  ReportReactor(CollectorState* state, LogRateLimiter* refusal_log, std::string peer,
                const absl::Status& authorized, absl::StatusOr<std::string> identity)
      : state_(state), refusal_log_(refusal_log), peer_(std::move(peer)) {
    if (!authorized.ok()) {
      state_->CountRefused(security::RefusalReason(authorized));
      SW_LOG_WARNING << "refusing ingest stream from " << peer_ << ": " << authorized.message();
      Finish(grpc::Status(authorized.code() == absl::StatusCode::kPermissionDenied
                              ? grpc::StatusCode::PERMISSION_DENIED
                              : grpc::StatusCode::UNAUTHENTICATED,
                          std::string(authorized.message())));
      return;
    }
    if (!identity.ok()) {
      // A certificate the CA signed but that names no node could otherwise report as any node.
      state_->CountRefused("no_identity");
      uint64_t suppressed = 0;
      if (refusal_log_->Allow(&suppressed)) {
        SW_LOG_WARNING << "refusing ingest stream from " << peer_ << ": "
                       << identity.status().message() << Suppressed(suppressed);
      }
      Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          std::string(identity.status().message())));
      return;
    }
    identity_ = *std::move(identity);
    connected_ = true;
    state_->AgentConnected();
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent closed its side, or the stream broke, or the server is shutting down.
      Finish(grpc::Status::OK);
      return;
    }
    // Each batch in its own arena: nothing of a large batch (strings, steps) outlives it.
    google::protobuf::Arena arena;
    v1::ReportBatch* batch = google::protobuf::Arena::CreateMessage<v1::ReportBatch>(&arena);
    if (grpc::Status parsed =
            grpc::SerializationTraits<v1::ReportBatch>::Deserialize(&request_, batch);
        !parsed.ok()) {
      state_->CountMalformed("unparsable");
      Refuse(grpc::StatusCode::INVALID_ARGUMENT,
             "the message is not a stepwatch.v1.ReportBatch protobuf");
      return;
    }
    // Before anything of the batch is logged or compared: its identifiers are within bounds.
    if (const std::optional<FieldProblem> bad = CheckBatchIdentifiers(*batch); bad.has_value()) {
      state_->CountMalformed("bad_field", &*bad);
      Refuse(grpc::StatusCode::INVALID_ARGUMENT,
             absl::StrCat("ReportBatch ", bad->field, " is ",
                          std::string(bad->reason) == "too_long" ? "longer than its bound"
                                                                 : "holding control characters",
                          " (docs/security.md)"));
      return;
    }
    if (!identity_.empty() && batch->node().node() != identity_) {
      // A certificate proves one node; a batch that claims another is forged or misconfigured.
      state_->CountRefused("node_mismatch");
      SW_LOG_WARNING << "refusing ingest stream from " << peer_ << ": its certificate is for node "
                     << identity_ << " but a batch claims node "
                     << EscapeControlCharacters(batch->node().node());
      Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "the client certificate is for node " + identity_ +
                              ", the batch claims node " + batch->node().node()));
      return;
    }
    if (agent_id_.empty() && !batch->agent_id().empty()) {
      agent_id_ = batch->agent_id();
      node_ = batch->node().node();
      SW_LOG_INFO << "agent connected: agent_id=" << agent_id_ << " node=" << node_
                  << " boot_id=" << batch->boot_id() << " peer=" << peer_;
    }
    BatchDeduper::Sync durable;
    absl::StatusOr<v1::IngestAck> ack = state_->Apply(*batch, &durable);
    if (!ack.ok()) {
      SW_LOG_WARNING << "rejecting ingest stream from " << peer_ << ": " << ack.status();
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(ack.status().message())));
      return;
    }
    // The acknowledgement goes out only after the sync that covers the batch's journal record
    // (with --state-dir): from the journal's committer thread, so that no gRPC thread waits for
    // the disk; at once without a journal. Nothing else of this stream is outstanding meanwhile.
    durable.Then([this, ack = *std::move(ack)](const absl::Status& synced) {
      if (absl::IsCancelled(synced)) {
        // The journal closed before its sync: unacknowledged, the batch is resent.
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the collector is stopping"));
        return;
      }
      state_->CountJournalSyncError(synced);
      SendAck(ack);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "cannot send acknowledgement"));
      return;
    }
    response_.Clear();
    StartRead(&request_);
  }

  void OnCancel() override { cancelled_ = true; }

  void OnDone() override {
    if (!agent_id_.empty()) {
      SW_LOG_INFO << "agent disconnected: agent_id=" << agent_id_ << " node=" << node_
                  << (cancelled_ ? " (stream cancelled)" : "");
    }
    if (connected_) state_->AgentDisconnected();
    delete this;
  }

 private:
  void SendAck(const v1::IngestAck& ack) {
    bool own_buffer = false;
    if (grpc::Status st =
            grpc::SerializationTraits<v1::IngestAck>::Serialize(ack, &response_, &own_buffer);
        !st.ok()) {
      Finish(grpc::Status(grpc::StatusCode::INTERNAL, "cannot encode the acknowledgement"));
      return;
    }
    StartWrite(&response_);
  }

  // Ends the stream for a batch that cannot be applied (already counted).
  void Refuse(grpc::StatusCode code, const std::string& why) {
    uint64_t suppressed = 0;
    if (refusal_log_->Allow(&suppressed)) {
      SW_LOG_WARNING << "rejecting ingest stream from " << peer_ << ": " << why
                     << Suppressed(suppressed);
    }
    Finish(grpc::Status(code, why));
  }

  CollectorState* const state_;
  LogRateLimiter* const refusal_log_;
  const std::string peer_;
  std::string identity_;
  bool connected_ = false;
  std::string agent_id_;
  std::string node_;
  bool cancelled_ = false;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

// Finishes a Query call: with the refusal when it was not authorized, else with what `answer`
// (which fills the response) returns; `answer` runs only for authorized calls.
template <typename AnswerFn>
grpc::ServerUnaryReactor* FinishAuthorized(grpc::CallbackServerContext* context,
                                           const grpc::Status& authorized, AnswerFn answer) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(authorized.ok() ? answer() : authorized);
  return reactor;
}

}  // namespace

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* IngestService::Report(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<std::string> identity = std::string();
  if (verify_node_identity_) {
    identity = security::VerifiedNodeIdentity(*context->auth_context(), certificates_required_);
  }
  return new ReportReactor(state_, &refusal_log_, context->peer(),
                           authorizer_->Authorize(*context, security::Role::kAgent),
                           std::move(identity));
}

grpc::Status QueryService::AuthorizeReader(grpc::CallbackServerContext* context) const {
  absl::Status s = authorizer_->Authorize(*context, security::Role::kReader);
  if (s.ok()) return grpc::Status::OK;
  state_->CountRefused(security::RefusalReason(s));
  return ToGrpc(s);
}

grpc::ServerUnaryReactor* QueryService::Status(grpc::CallbackServerContext* context,
                                               const v1::StatusRequest*,
                                               v1::StatusResponse* response) {
  return FinishAuthorized(context, AuthorizeReader(context), [&] {
    *response = state_->Status();
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::Findings(grpc::CallbackServerContext* context,
                                                 const v1::FindingsRequest* request,
                                                 v1::FindingsResponse* response) {
  return FinishAuthorized(context, AuthorizeReader(context), [&] {
    *response = state_->Findings(request->job());
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::Explain(grpc::CallbackServerContext* context,
                                                const v1::ExplainRequest* request,
                                                v1::ExplainResponse* response) {
  return FinishAuthorized(context, AuthorizeReader(context), [&] {
    absl::StatusOr<v1::ExplainResponse> explained = state_->Explain(request->job());
    if (!explained.ok()) return ToGrpc(explained.status());
    *response = *std::move(explained);
    return grpc::Status::OK;
  });
}

grpc::ServerUnaryReactor* QueryService::Report(grpc::CallbackServerContext* context,
                                               const v1::ReportRequest* request,
                                               v1::ReportResponse* response) {
  return FinishAuthorized(context, AuthorizeReader(context), [&] {
    return ToGrpc(ReportAnswer(state_->reports(), request->job(), response));
  });
}

}  // namespace stepwatch::collector
