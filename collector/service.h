// The collector's gRPC services: Ingest (one long-lived bidirectional stream per agent) and Query
// (stepwatchctl), both on the callback API and both thin layers over CollectorState.
#pragma once

#include "collector/state.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::collector {

class IngestService final : public v1::Ingest::CallbackService {
 public:
  explicit IngestService(CollectorState* state) : state_(state) {}
  grpc::ServerBidiReactor<v1::ReportBatch, v1::IngestAck>* Report(
      grpc::CallbackServerContext* context) override;

 private:
  CollectorState* const state_;
};

class QueryService final : public v1::Query::CallbackService {
 public:
  explicit QueryService(const CollectorState* state) : state_(state) {}
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const v1::StatusRequest* request,
                                   v1::StatusResponse* response) override;
  grpc::ServerUnaryReactor* Findings(grpc::CallbackServerContext* context,
                                     const v1::FindingsRequest* request,
                                     v1::FindingsResponse* response) override;
  grpc::ServerUnaryReactor* Explain(grpc::CallbackServerContext* context,
                                    const v1::ExplainRequest* request,
                                    v1::ExplainResponse* response) override;

 private:
  const CollectorState* const state_;
};

}  // namespace stepwatch::collector
