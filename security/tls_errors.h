// What a failed TLS connection to a collector most likely means. gRPC reports most handshake
// failures as a bare "Socket closed" or an OpenSSL reason string; this turns them into the cause
// and the flags to check.
#pragma once

#include <string>

#include "absl/strings/string_view.h"

namespace stepwatch::security {

struct TlsClientFlags {
  bool tls = false;          // --tls-ca given: the client speaks TLS
  bool client_cert = false;  // --tls-cert/--tls-key given
};

// A sentence naming the likely cause of `grpc_message` (a failed call's error message), or ""
// when it does not look like a TLS or connection-setup failure.
std::string ExplainTlsFailure(absl::string_view grpc_message, const TlsClientFlags& flags);

}  // namespace stepwatch::security
