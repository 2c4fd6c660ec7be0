// The Query service's calls in the shape CollectorClients::Ask takes, for every command and page
// that asks the collectors.
#pragma once

#include <functional>
#include <utility>

#include "ctl/fanout.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::ctl {

using StatusCall = CollectorClients::AsyncCall<v1::StatusRequest, v1::StatusResponse>;
using FindingsCall = CollectorClients::AsyncCall<v1::FindingsRequest, v1::FindingsResponse>;
using ExplainCall = CollectorClients::AsyncCall<v1::ExplainRequest, v1::ExplainResponse>;
using ReportCall = CollectorClients::AsyncCall<v1::ReportRequest, v1::ReportResponse>;

inline const StatusCall kStatus =
    [](auto* stub, grpc::ClientContext* c, const v1::StatusRequest* r, v1::StatusResponse* out,
       std::function<void(grpc::Status)> done) { stub->Status(c, r, out, std::move(done)); };
inline const FindingsCall kFindings =
    [](auto* stub, grpc::ClientContext* c, const v1::FindingsRequest* r, v1::FindingsResponse* out,
       std::function<void(grpc::Status)> done) { stub->Findings(c, r, out, std::move(done)); };
inline const ExplainCall kExplain =
    [](auto* stub, grpc::ClientContext* c, const v1::ExplainRequest* r, v1::ExplainResponse* out,
       std::function<void(grpc::Status)> done) { stub->Explain(c, r, out, std::move(done)); };
inline const ReportCall kReport =
    [](auto* stub, grpc::ClientContext* c, const v1::ReportRequest* r, v1::ReportResponse* out,
       std::function<void(grpc::Status)> done) { stub->Report(c, r, out, std::move(done)); };

}  // namespace stepwatch::ctl
