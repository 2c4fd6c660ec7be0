#include "security/tls_credentials.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace stepwatch::security {
namespace {

// Reads a file now so that a typo in a path fails at start, not at the first handshake.
absl::Status CheckPem(const char* flag, const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path, 1 << 20);
  if (!data.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": ", data.status().message()));
  }
  if (!absl::StrContains(*data, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return absl::OkStatus();
}

}  // namespace

bool Enabled(const ServerTlsConfig& c) { return !c.cert_file.empty() || !c.key_file.empty(); }
bool Enabled(const ClientTlsConfig& c) {
  return !c.ca_file.empty() || !c.cert_file.empty() || !c.key_file.empty();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTlsConfig& c) {
  if (!Enabled(c)) {
    if (!c.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (c.cert_file.empty() || c.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (absl::Status s = CheckPem("--tls-cert", c.cert_file); !s.ok()) return s;
  if (absl::Status s = CheckPem("--tls-key", c.key_file); !s.ok()) return s;
  if (!c.client_ca_file.empty()) {
    if (absl::Status s = CheckPem("--tls-client-ca", c.client_ca_file); !s.ok()) return s;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      c.key_file, c.cert_file, c.client_ca_file, c.reload_interval_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!c.client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::experimental::TlsServerCredentials(options);
  if (creds == nullptr) return absl::InternalError("gRPC refused the TLS server options");
  return creds;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTlsConfig& c) {
  if (!Enabled(c)) return grpc::InsecureChannelCredentials();
  if (c.ca_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca");
  }
  if (c.cert_file.empty() != c.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (absl::Status s = CheckPem("--tls-ca", c.ca_file); !s.ok()) return s;
  if (!c.cert_file.empty()) {
    if (absl::Status s = CheckPem("--tls-cert", c.cert_file); !s.ok()) return s;
    if (absl::Status s = CheckPem("--tls-key", c.key_file); !s.ok()) return s;
  }
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      c.key_file, c.cert_file, c.ca_file, c.reload_interval_seconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (!c.cert_file.empty()) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  std::shared_ptr<grpc::ChannelCredentials> creds = grpc::experimental::TlsCredentials(options);
  if (creds == nullptr) return absl::InternalError("gRPC refused the TLS channel options");
  return creds;
}

}  // namespace stepwatch::security
