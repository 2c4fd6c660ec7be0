#include "security/tls_client_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA bundle that signed the collector's certificate: talk to the collector over TLS "
          "and verify it (its certificate must name the host in --collector). Empty: plaintext.");
