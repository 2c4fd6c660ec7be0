#include "security/peer_identity.h"

#include "grpc/grpc_security_constants.h"

namespace stepwatch::security {

std::string PeerCertificateIdentity(const grpc::AuthContext& context) {
  if (!context.IsPeerAuthenticated()) return "";
  // DNS names first: certificate issuers (cert-manager among them) treat the common name as
  // deprecated and may leave it out.
  for (const char* property : {GRPC_PEER_DNS_PROPERTY_NAME, GRPC_X509_CN_PROPERTY_NAME}) {
    std::vector<grpc::string_ref> values = context.FindPropertyValues(property);
    if (!values.empty() && values.front().size() > 0) {
      return std::string(values.front().data(), values.front().size());
    }
  }
  return "";
}

}  // namespace stepwatch::security
