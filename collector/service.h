// The collector's gRPC services: Ingest (one long-lived bidirectional stream per agent) and Query
// (stepwatchctl), both on the callback API and both thin layers over CollectorState.
#pragma once

#include <chrono>

#include "collector/state.h"
#include "common/log.h"
#include "security/authorizer.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::collector {

// Ingest reads each batch as bytes and parses it itself (a raw callback method): a message that
// is not a ReportBatch ends the stream with INVALID_ARGUMENT and is counted
// (malformed{reason="unparsable"}), where gRPC's own parsing would end it as if the agent had
// closed it.
class IngestService final : public v1::Ingest::WithRawCallbackMethod_Report<v1::Ingest::Service> {
 public:
  // `authorizer` must outlive the service.
  // With `verify_node_identity`, a client certificate's identity must match every batch's node,
  // and a certificate that names no usable node is refused (PERMISSION_DENIED, counted as
  // refused{reason="no_identity"}). `certificates_required`: the server asks every client for a
  // certificate (--tls-client-ca), so a stream without one has no identity either.
  IngestService(CollectorState* state, const security::Authorizer* authorizer,
                bool verify_node_identity = true, bool certificates_required = false)
      : state_(state),
        authorizer_(authorizer),
        verify_node_identity_(verify_node_identity),
        certificates_required_(certificates_required) {}
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Report(
      grpc::CallbackServerContext* context) override;

 private:
  CollectorState* const state_;
  const security::Authorizer* const authorizer_;
  const bool verify_node_identity_;
  const bool certificates_required_;
  // Refused streams and malformed batches: logged at a bounded rate (a hostile client may send
  // them in a loop), always counted.
  LogRateLimiter refusal_log_{5, std::chrono::minutes(1)};
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
