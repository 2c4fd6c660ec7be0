// Decides whether a gRPC call may go on: with a token store, the call must carry a bearer token
// of the role the method needs (an agent token can only report, a reader token can only query).
// Transport-level checks (TLS, client certificates) happen before any call reaches it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/server_context.h"
#include "security/tokens.h"

namespace stepwatch::security {

class Authorizer {
 public:
  // `tokens` may be null: every call is allowed (deployments that rely on client certificates).
  explicit Authorizer(std::unique_ptr<TokenStore> tokens) : tokens_(std::move(tokens)) {}

  bool requires_tokens() const { return tokens_ != nullptr; }

  // OK, Unauthenticated (no or unknown token) or PermissionDenied (a token of another role).
  absl::Status Authorize(const grpc::ServerContextBase& context, Role role) const;

 private:
  const std::unique_ptr<TokenStore> tokens_;
};

// "unauthenticated" or "permission_denied": the reason a refusal is counted under.
const char* RefusalReason(const absl::Status& status);

}  // namespace stepwatch::security
