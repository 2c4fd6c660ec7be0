// gRPC credentials from PEM files. Certificates and keys are watched and reloaded when they change
// (cert-manager rotates them in place), so a rotation needs no restart.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace stepwatch::security {

struct ServerTlsConfig {
  // Empty cert_file and key_file: plaintext (the caller warns).
  std::string cert_file;
  std::string key_file;
  // When set, every client must present a certificate signed by this CA.
  std::string client_ca_file;
  // How often the files are checked for changes.
  unsigned int reload_interval_seconds = 10;
};

struct ClientTlsConfig {
  // Empty ca_file: plaintext. The server's certificate must be signed by this CA and name the
  // host the client connects to (DNS or IP subject alternative name).
  std::string ca_file;
  // Optional client certificate (required by a collector started with --tls-client-ca).
  std::string cert_file;
  std::string key_file;
  unsigned int reload_interval_seconds = 10;
};

bool Enabled(const ServerTlsConfig& config);
bool Enabled(const ClientTlsConfig& config);

// InvalidArgument when the flags are inconsistent (a key without a certificate, a client CA
// without a server certificate) or a file cannot be read or holds no PEM block.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsConfig& config);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsConfig& config);

}  // namespace stepwatch::security
