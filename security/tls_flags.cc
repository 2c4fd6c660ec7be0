#include "security/tls_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) this program presents. The collector's: gRPC (Ingest and "
          "Query) is served over TLS 1.2+; without it gRPC is plaintext (logged loudly at "
          "start). An agent's or stepwatchctl's: its client certificate, for a collector that "
          "requires one (--tls-client-ca). Long-running programs reload it when it changes.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls-cert.");
ABSL_FLAG(std::string, auth_token_file, "",
          "Bearer tokens. The collector's: a file of accepted \"ROLE TOKEN\" lines (ROLE: agent, "
          "may only report; reader, may only query; '#' starts a comment); empty: no token is "
          "required. An agent's or stepwatchctl's: a file whose first line is the token it sends "
          "(role agent for the agent, reader for stepwatchctl); empty: no token. Re-read when it "
          "changes.");
