#include "security/authorizer.h"

namespace stepwatch::security {

absl::Status Authorizer::Authorize(const grpc::ServerContextBase& context, Role role) const {
  if (tokens_ == nullptr) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  absl::string_view header;
  if (it != metadata.end()) header = absl::string_view(it->second.data(), it->second.size());
  return tokens_->Check(header, role);
}

const char* RefusalReason(const absl::Status& status) {
  return absl::IsPermissionDenied(status) ? "permission_denied" : "unauthenticated";
}

}  // namespace stepwatch::security
