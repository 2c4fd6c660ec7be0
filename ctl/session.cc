#include "ctl/session.h"

#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/text.h"
#include "security/tls_errors.h"

namespace stepwatch::ctl {

int Fail(const std::string& message) {
  std::cerr << "stepwatchctl: " << EscapeControlCharacters(message) << "\n";
  return 1;
}

std::string DescribeFailure(const Session& session, const std::string& address,
                            const grpc::Status& s) {
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE ||
      s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // gRPC often says only "Socket closed" for a refused handshake: name the likely cause.
    const std::string cause = stepwatch::security::ExplainTlsFailure(
        s.error_message(), {session.tls_ca, session.tls_cert});
    return absl::StrCat("cannot reach collector at ", address, ": ", s.error_message(),
                        cause.empty() ? "" : absl::StrCat(" (likely cause: ", cause, ")"));
  }
  if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      s.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    return absl::StrCat("collector at ", address, " refused the request: ", s.error_message(),
                        " (see --auth-token-file, --tls-cert)");
  }
  return s.error_message();
}

std::string DescribeFailureOf(const Session& session, const std::string& address,
                              const grpc::Status& s) {
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::UNAUTHENTICATED:
    case grpc::StatusCode::PERMISSION_DENIED:
      return DescribeFailure(session, address, s);
    default:
      return absl::StrCat("collector at ", address, ": ", s.error_message());
  }
}

std::string AskedOnly(const Session& session, const std::string& asked) {
  if (session.dns) return "";
  return absl::StrCat(" on ",
                      session.several() ? "the collectors asked (" : "the collector asked (", asked,
                      "); each job lives on --replicas of the collectors: to ask every one, give "
                      "them all, --collector=HOST:PORT,HOST:PORT,..., or "
                      "--collector=dns:///NAME:PORT");
}

}  // namespace stepwatch::ctl
