// --tls-ca, the flag of the programs that connect to a collector (the agent, stepwatchctl): defined
// once here so that both spell and document it alike.
#pragma once

#include <string>

#include "absl/flags/declare.h"

ABSL_DECLARE_FLAG(std::string, tls_ca);

namespace stepwatch::security {

// The file defining the flag, for FlagsSpec::shared_flag_files.
inline constexpr char kTlsClientFlagsFile[] = "security/tls_client_flags.cc";

}  // namespace stepwatch::security
