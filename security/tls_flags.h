// The transport-security flags every stepwatch binary that speaks gRPC takes: defined once here so
// that the agent, the collector and stepwatchctl spell and document them alike. --tls-ca (the
// clients' CA of the collector) is in tls_client_flags.h: the collector has no use for it.
#pragma once

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, tls_cert);
ABSL_DECLARE_FLAG(std::string, tls_key);
ABSL_DECLARE_FLAG(std::string, auth_token_file);

namespace stepwatch::security {

// The file defining the flags, for FlagsSpec::shared_flag_files.
inline constexpr char kTlsFlagsFile[] = "security/tls_flags.cc";

}  // namespace stepwatch::security
