// The flags of a /metrics endpoint, shared by stepwatch-agent and stepwatch-collector: defined once
// here, so that both spell, document and check them alike. Each binary sets its own default of
// --metrics-listen (FlagsSpec::defaults).
#pragma once

#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "http/metrics_endpoint.h"

ABSL_DECLARE_FLAG(std::string, metrics_listen);
ABSL_DECLARE_FLAG(std::string, metrics_basic_auth_file);
ABSL_DECLARE_FLAG(int32_t, metrics_threads);
ABSL_DECLARE_FLAG(int32_t, metrics_max_connections);

namespace stepwatch::http {

// The file defining the flags, for FlagsSpec::shared_flag_files.
inline constexpr char kMetricsEndpointFlagsFile[] = "http/metrics_endpoint_flags.cc";

// InvalidArgument naming the flag when --metrics-threads or --metrics-max-connections is not
// positive.
absl::Status CheckMetricsEndpointFlags();

// The endpoint's options from the flags (listen, basic auth, threads, connections); the rest keep
// their defaults.
MetricsEndpointOptions MetricsEndpointOptionsFromFlags();

}  // namespace stepwatch::http
