// What an agent or stepwatchctl needs to talk to a collector that requires TLS and tokens.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "security/tls_credentials.h"
#include "security/tokens.h"

namespace stepwatch::security {

struct ClientSecurity {
  std::shared_ptr<grpc::ChannelCredentials> credentials;  // never null (plaintext when no TLS)
  std::shared_ptr<TokenSource> token;                     // null when no token file is given
  // The checked client certificate gRPC reads: must live as long as `credentials`.
  std::shared_ptr<CheckedKeyCertPair> identity;
};

// InvalidArgument naming the flag when a file is missing or malformed.
absl::StatusOr<ClientSecurity> MakeClientSecurity(const ClientTlsConfig& tls,
                                                  const std::string& token_file);

}  // namespace stepwatch::security
