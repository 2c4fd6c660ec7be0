// Asking several collectors: all of them at once (fleet-wide commands), or a job's owners in
// rendezvous order (common/collectors.h), going on down the order past those that do not answer
// or do not know the job (a job that moved during a failover is on the next ones).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "stepwatch/v1/stepwatch.grpc.pb.h"

namespace stepwatch::ctl {

// One collector's answer to one request.
template <typename Response>
struct Answer {
  std::string collector;
  grpc::Status status;
  Response response;
  // Set to false by the asker when the collector answered but does not know the job (an answer
  // that cannot say so by NOT_FOUND, such as an empty list of findings).
  bool job_known = true;

  bool Knows() const { return status.ok() && job_known; }
  bool Failed() const { return !status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND; }
};

// What a job's owners said: `known` from those that know the job, in the order asked (at most
// `replicas`); the addresses that answered without knowing it, and those that did not answer.
template <typename Response>
struct OwnersAnswers {
  std::vector<Answer<Response>> known;
  std::vector<Answer<Response>> unknown;
  std::vector<Answer<Response>> failed;
};

// Walks `order` (the job's RendezvousOrder) asking `replicas - known` collectors at a time with
// `ask`, until `replicas` know the job or the order is exhausted. At most order.size() asks, in at
// most order.size() rounds.
template <typename Response>
OwnersAnswers<Response> AskOwners(
    const std::vector<std::string>& order, int replicas,
    const std::function<std::vector<Answer<Response>>(const std::vector<std::string>&)>& ask) {
  OwnersAnswers<Response> out;
  size_t next = 0;
  while (static_cast<int>(out.known.size()) < replicas && next < order.size()) {
    const size_t want = static_cast<size_t>(replicas) - out.known.size();
    std::vector<std::string> round(order.begin() + next,
                                   order.begin() + std::min(order.size(), next + want));
    next += round.size();
    for (Answer<Response>& a : ask(round)) {
      if (a.Knows()) {
        out.known.push_back(std::move(a));
      } else if (a.Failed()) {
        out.failed.push_back(std::move(a));
      } else {
        out.unknown.push_back(std::move(a));
      }
    }
  }
  return out;
}

// The largest reply taken from a collector. Replies about large jobs exceed gRPC's default 4 MiB
// receive limit (explain of a 100,000-rank job is about 7 MB); the collector sends at most 64 MiB
// (collector/server.h), its status and findings capped at 48 MiB.
constexpr int kMaxReplyBytes = 64 << 20;

// The arguments of every collector channel: kMaxReplyBytes, and with `tls_target_name` (the
// Service name of dns:///NAME:PORT) the name each collector's certificate must carry, since each is
// dialled by its address.
grpc::ChannelArguments QueryChannelArguments(const std::string& tls_target_name);

// A Query stub per collector, sharing credentials and channel arguments; every call is bounded by
// `timeout` and carries the bearer token when there is one.
class CollectorClients {
 public:
  CollectorClients(const std::vector<std::string>& addresses,
                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                   const grpc::ChannelArguments& channel_args, std::string authorization,
                   absl::Duration timeout);

  // Starts `call(stub, context, request, response, done)` on every one of `targets` at once and
  // waits for all to finish (each within the timeout). Answers are in the order of `targets`.
  template <typename Request, typename Response>
  using AsyncCall =
      std::function<void(v1::Query::StubInterface::async_interface*, grpc::ClientContext*,
                         const Request*, Response*, std::function<void(grpc::Status)>)>;
  template <typename Request, typename Response>
  std::vector<Answer<Response>> Ask(const std::vector<std::string>& targets, const Request& request,
                                    const AsyncCall<Request, Response>& call) const;

 private:
  v1::Query::Stub* StubFor(const std::string& address) const;

  std::map<std::string, std::unique_ptr<v1::Query::Stub>> stubs_;
  std::string authorization_;
  absl::Duration timeout_;
};

template <typename Request, typename Response>
std::vector<Answer<Response>> CollectorClients::Ask(
    const std::vector<std::string>& targets, const Request& request,
    const AsyncCall<Request, Response>& call) const {
  std::vector<Answer<Response>> answers(targets.size());
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  absl::Mutex mu;
  size_t pending = targets.size();  // guarded by mu
  const auto deadline = std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout_);
  for (size_t i = 0; i < targets.size(); ++i) {
    answers[i].collector = targets[i];
    auto& context = contexts.emplace_back(std::make_unique<grpc::ClientContext>());
    if (!authorization_.empty()) context->AddMetadata("authorization", authorization_);
    context->set_deadline(deadline);
    call(StubFor(targets[i])->async(), context.get(), &request, &answers[i].response,
         [&answers, &mu, &pending, i](const grpc::Status& status) {
           absl::MutexLock lock(&mu);
           answers[i].status = status;
           --pending;
         });
  }
  // gRPC calls every callback once, at the latest at the deadline.
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(
      +[](size_t* n) { return *n == 0; }, &pending));
  return answers;
}

}  // namespace stepwatch::ctl
