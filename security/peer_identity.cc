#include "security/peer_identity.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "grpc/grpc_security_constants.h"

namespace stepwatch::security {
namespace {

bool HasProperty(const grpc::AuthContext& context, const char* name) {
  for (const grpc::string_ref& v : context.FindPropertyValues(name)) {
    if (v.size() > 0) return true;
  }
  return false;
}

}  // namespace

PeerIdentity PeerCertificate(const grpc::AuthContext& context) {
  PeerIdentity id;
  // gRPC marks a peer authenticated only when its certificate names it (a SAN or a CN): a
  // verified certificate that names nothing still leaves its PEM in the context.
  id.certificate =
      context.IsPeerAuthenticated() || HasProperty(context, GRPC_X509_PEM_CERT_PROPERTY_NAME);
  if (!id.certificate) return id;
  // DNS names first: certificate issuers (cert-manager among them) treat the common name as
  // deprecated and may leave it out.
  for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
    for (const grpc::string_ref& v : context.FindPropertyValues(property)) {
      if (v.size() > 0) {
        id.node.assign(v.data(), v.size());
        return id;
      }
    }
  }
  return id;
}

std::string PeerCertificateIdentity(const grpc::AuthContext& context) {
  return PeerCertificate(context).node;
}

absl::StatusOr<std::string> VerifiedNodeIdentity(const grpc::AuthContext& context,
                                                 bool certificate_required) {
  const PeerIdentity id = PeerCertificate(context);
  if (!id.certificate && !certificate_required) return std::string();
  if (!id.certificate) {
    return absl::PermissionDeniedError(
        "no verified client certificate: node identity cannot be checked");
  }
  if (id.node.empty()) {
    return absl::PermissionDeniedError(
        "the client certificate names no node (no DNS subject alternative name and no common "
        "name); with --verify-node-identity every agent's certificate must name its node");
  }
  if (id.node.size() > kMaxNodeIdentityBytes ||
      FindControlCharacter(id.node) != absl::string_view::npos) {
    return absl::PermissionDeniedError(
        absl::StrCat("the client certificate's node name is not usable (longer than ",
                     kMaxNodeIdentityBytes, " bytes or with control characters)"));
  }
  return id.node;
}

}  // namespace stepwatch::security
