#include "collector/service.h"

#include <string>
#include <utility>

#include "common/log.h"
#include "security/peer_identity.h"

namespace stepwatch::collector {
namespace {

// One agent's stream. Reads and writes alternate (read a batch, apply it, write its ack, read the
// next), so exactly one operation is outstanding at any time and Finish is called exactly once.
class ReportReactor final : public grpc::ServerBidiReactor<v1::ReportBatch, v1::IngestAck> {
 public:
  // `authorized`: the outcome of the token check. `identity`: the node a verified client
  // certificate names (empty without client certificates); every batch must claim that node.
  ReportReactor(CollectorState* state, std::string peer, const absl::Status& authorized,
                std::string identity)
      : state_(state), peer_(std::move(peer)), identity_(std::move(identity)) {
    if (!authorized.ok()) {
      state_->CountRefused(security::RefusalReason(authorized));
      SW_LOG_WARNING << "refusing ingest stream from " << peer_ << ": " << authorized.message();
      Finish(grpc::Status(authorized.code() == absl::StatusCode::kPermissionDenied
                              ? grpc::StatusCode::PERMISSION_DENIED
                              : grpc::StatusCode::UNAUTHENTICATED,
                          std::string(authorized.message())));
      return;
    }
    connected_ = true;
    state_->AgentConnected();
    StartRead(&batch_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The agent closed its side, or the stream broke, or the server is shutting down.
      Finish(grpc::Status::OK);
      return;
    }
    if (agent_id_.empty() && !batch_.agent_id().empty()) {
      agent_id_ = batch_.agent_id();
      node_ = batch_.node().node();
      SW_LOG_INFO << "agent connected: agent_id=" << agent_id_ << " node=" << node_
                  << " boot_id=" << batch_.boot_id() << " peer=" << peer_;
    }
    if (!identity_.empty() && batch_.node().node() != identity_) {
      // A certificate proves one node; a batch that claims another is forged or misconfigured.
      state_->CountRefused("node_mismatch");
      SW_LOG_WARNING << "refusing ingest stream from " << peer_ << ": its certificate is for node "
                     << identity_ << " but a batch claims node " << batch_.node().node();
      Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED,
                          "the client certificate is for node " + identity_ +
                              ", the batch claims node " + batch_.node().node()));
      return;
    }
    absl::StatusOr<v1::IngestAck> ack = state_->Apply(batch_);
    if (!ack.ok()) {
      SW_LOG_WARNING << "rejecting ingest stream from " << peer_ << ": " << ack.status();
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, std::string(ack.status().message())));
      return;
    }
    ack_ = *std::move(ack);
    StartWrite(&ack_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "cannot send acknowledgement"));
      return;
    }
    StartRead(&batch_);
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
  CollectorState* const state_;
  const std::string peer_;
  const std::string identity_;
  bool connected_ = false;
  std::string agent_id_;
  std::string node_;
  bool cancelled_ = false;
  v1::ReportBatch batch_;
  v1::IngestAck ack_;
};

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

grpc::ServerBidiReactor<v1::ReportBatch, v1::IngestAck>* IngestService::Report(
    grpc::CallbackServerContext* context) {
  return new ReportReactor(
      state_, context->peer(), authorizer_->Authorize(*context, security::Role::kAgent),
      verify_node_identity_ ? security::PeerCertificateIdentity(*context->auth_context())
                            : std::string());
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
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = AuthorizeReader(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  *response = state_->Status();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* QueryService::Findings(grpc::CallbackServerContext* context,
                                                 const v1::FindingsRequest* request,
                                                 v1::FindingsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = AuthorizeReader(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  *response = state_->Findings(request->job());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* QueryService::Explain(grpc::CallbackServerContext* context,
                                                const v1::ExplainRequest* request,
                                                v1::ExplainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = AuthorizeReader(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  absl::StatusOr<v1::ExplainResponse> explained = state_->Explain(request->job());
  if (explained.ok()) *response = *std::move(explained);
  reactor->Finish(ToGrpc(explained.status()));
  return reactor;
}

grpc::ServerUnaryReactor* QueryService::Report(grpc::CallbackServerContext* context,
                                               const v1::ReportRequest* request,
                                               v1::ReportResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status s = AuthorizeReader(context); !s.ok()) {
    reactor->Finish(s);
    return reactor;
  }
  if (request->job().empty()) {
    for (v1::JobReport& r : state_->reports().List()) *response->add_reports() = std::move(r);
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }
  absl::StatusOr<v1::JobReport> report = state_->reports().Get(request->job());
  if (report.ok()) *response->mutable_report() = *std::move(report);
  reactor->Finish(ToGrpc(report.status()));
  return reactor;
}

}  // namespace stepwatch::collector
