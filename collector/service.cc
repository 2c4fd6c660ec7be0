#include "collector/service.h"

#include <string>
#include <utility>

#include "common/log.h"

namespace stepwatch::collector {
namespace {

// One agent's stream. Reads and writes alternate (read a batch, apply it, write its ack, read the
// next), so exactly one operation is outstanding at any time and Finish is called exactly once.
class ReportReactor final : public grpc::ServerBidiReactor<v1::ReportBatch, v1::IngestAck> {
 public:
  ReportReactor(CollectorState* state, std::string peer) : state_(state), peer_(std::move(peer)) {
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
    state_->AgentDisconnected();
    delete this;
  }

 private:
  CollectorState* const state_;
  const std::string peer_;
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
  return new ReportReactor(state_, context->peer());
}

grpc::ServerUnaryReactor* QueryService::Status(grpc::CallbackServerContext* context,
                                               const v1::StatusRequest*,
                                               v1::StatusResponse* response) {
  *response = state_->Status();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* QueryService::Findings(grpc::CallbackServerContext* context,
                                                 const v1::FindingsRequest* request,
                                                 v1::FindingsResponse* response) {
  *response = state_->Findings(request->job());
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* QueryService::Explain(grpc::CallbackServerContext* context,
                                                const v1::ExplainRequest* request,
                                                v1::ExplainResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::ExplainResponse> explained = state_->Explain(request->job());
  if (explained.ok()) *response = *std::move(explained);
  reactor->Finish(ToGrpc(explained.status()));
  return reactor;
}

}  // namespace stepwatch::collector
