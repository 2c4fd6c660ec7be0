// The collector's gRPC services: Ingest (one long-lived bidirectional stream per agent) and Query
// (stepwatchctl), both on the callback API and both thin layers over CollectorState.
#pragma once

#include "collector/state.h"
#include "security/authorizer.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::collector {

class IngestService final : public v1::Ingest::CallbackService {
 public:
  // `authorizer` must outlive the service.
  // With `verify_node_identity`, a client certificate's identity must match every batch's node.
  IngestService(CollectorState* state, const security::Authorizer* authorizer,
                bool verify_node_identity = true)
      : state_(state), authorizer_(authorizer), verify_node_identity_(verify_node_identity) {}
  grpc::ServerBidiReactor<v1::ReportBatch, v1::IngestAck>* Report(
      grpc::CallbackServerContext* context) override;

 private:
  CollectorState* const state_;
  const security::Authorizer* const authorizer_;
  const bool verify_node_identity_;
};

class QueryService final : public v1::Query::CallbackService {
 public:
  // `state` counts refused calls; `authorizer` must outlive the service.
  QueryService(CollectorState* state, const security::Authorizer* authorizer)
      : state_(state), authorizer_(authorizer) {}
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Findings(grpc::CallbackServerContext* context,
                                     const v1::FindingsRequest* request,
                                     v1::FindingsResponse* response) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* context,
                                    const v1::ExplainRequest* request,
                                    v1::ExplainResponse* response) override;
  grpc::ServerUnaryReactor* Report(grpc::CallbackServerContext* context,
                                   const v1::ReportRequest* request,
                                   v1::ReportResponse* response) override;

 private:
  // Authorizes a call for the reader role; counts and returns the refusal otherwise.
  grpc::Status AuthorizeReader(grpc::CallbackServerContext* context) const;

  CollectorState* const state_;
  const security::Authorizer* const authorizer_;
};

}  // namespace stepwatch::collector
