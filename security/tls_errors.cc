#include "security/tls_errors.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace stepwatch::security {

std::string ExplainTlsFailure(absl::string_view grpc_message, const TlsClientFlags& flags) {
  const std::string m = absl::AsciiStrToLower(grpc_message);
  if (absl::StrContains(m, "hostname verification") || absl::StrContains(m, "hostname mismatch") ||
      absl::StrContains(m, "name mismatch")) {
    return "server name mismatch: the collector's certificate does not name the host or IP in "
           "--collector (check its subject alternative names)";
  }
  if (absl::StrContains(m, "wrong version number") ||
      absl::StrContains(m, "packet length too long") || absl::StrContains(m, "http request")) {
    return "the collector does not speak TLS on this port: drop --tls-ca, or start it with "
           "--tls-cert/--tls-key";
  }
  if (absl::StrContains(m, "certificate has expired") || absl::StrContains(m, "expired")) {
    return "expired certificate: the collector's certificate is out of its validity period "
           "(or this machine's clock is wrong)";
  }
  if (absl::StrContains(m, "certificate verify failed") ||
      absl::StrContains(m, "unable to get local issuer") ||
      absl::StrContains(m, "self signed certificate") || absl::StrContains(m, "unknown ca")) {
    return "unknown CA: the collector's certificate is not signed by --tls-ca, or it is expired "
           "or not yet valid";
  }
  if (absl::StrContains(m, "certificate required") ||
      absl::StrContains(m, "peer did not return a certificate")) {
    return "no client certificate: the collector requires one (--tls-cert and --tls-key, signed "
           "by its --tls-client-ca)";
  }
  if (absl::StrContains(m, "bad certificate") || absl::StrContains(m, "certificate unknown")) {
    return "the collector refused the client certificate (--tls-cert): of another CA than its "
           "--tls-client-ca, or expired";
  }
  // The server ends the handshake without saying why (TLS 1.3 sends its verdict on the client
  // certificate after the client thinks the handshake is done): list the likely causes.
  if (absl::StrContains(m, "socket closed") || absl::StrContains(m, "connection reset") ||
      absl::StrContains(m, "handshake") || absl::StrContains(m, "ssl")) {
    if (!flags.tls) {
      return "the collector closed the connection: it may require TLS (give --tls-ca, and "
             "--tls-cert/--tls-key if it requires client certificates)";
    }
    if (!flags.client_cert) {
      return "no client certificate: the collector closed the TLS connection, so it most "
             "likely requires one (--tls-cert and --tls-key, signed by its --tls-client-ca)";
    }
    return "client certificate refused? the collector closed the TLS connection: --tls-cert is "
           "most likely not signed by its --tls-client-ca (unknown CA) or expired";
  }
  return "";
}

}  // namespace stepwatch::security
