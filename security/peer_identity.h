// Who a client is, as its verified certificate says.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/auth_context.h"

namespace stepwatch::security {

// Longest node identity a certificate may give (a node name's bound at the collector).
inline constexpr size_t kMaxNodeIdentityBytes = 256;

// What a client certificate says about its holder.
struct PeerIdentity {
  // The peer presented a certificate that the TLS handshake verified.
  bool certificate = false;
  // The node it names: its first non-empty DNS subject alternative name, else its subject common
  // name. Empty when it names neither (an IP, URI or e-mail name alone names no node), and without
  // a certificate (plaintext, or TLS without client certificates).
  std::string node;
};

PeerIdentity PeerCertificate(const grpc::AuthContext& context);

// PeerCertificate(context).node.
std::string PeerCertificateIdentity(const grpc::AuthContext& context);

// The node a client may report for when node identity is verified: the certificate's node, or
// the empty string when there is no certificate and none is required (nothing to verify).
// PermissionDenied, with a message that says why, when a certificate is required
// (`certificate_required`: the server asks every client for one) or presented but names no usable
// node: neither a DNS name nor a common name, or one longer than kMaxNodeIdentityBytes or with
// control characters (which no batch's node name may have).
absl::StatusOr<std::string> VerifiedNodeIdentity(const grpc::AuthContext& context,
                                                 bool certificate_required);

}  // namespace stepwatch::security
