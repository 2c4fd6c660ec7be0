// Who a client is, as its verified certificate says.
#pragma once

#include <string>

#include "grpcpp/security/auth_context.h"

namespace stepwatch::security {

// The identity a verified client certificate proves: its first DNS subject alternative name, else
// its subject common name. Empty when the peer is not authenticated by a certificate (plaintext,
// or TLS without client certificates).
std::string PeerCertificateIdentity(const grpc::AuthContext& context);

}  // namespace stepwatch::security
