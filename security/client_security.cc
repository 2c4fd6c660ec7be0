#include "security/client_security.h"

#include "absl/strings/str_cat.h"

namespace stepwatch::security {

absl::StatusOr<ClientSecurity> MakeClientSecurity(const ClientTlsConfig& tls,
                                                  const std::string& token_file) {
  ClientSecurity out;
  absl::StatusOr<ChannelTls> channel = MakeChannelCredentials(tls);
  if (!channel.ok()) return channel.status();
  out.credentials = std::move(channel->credentials);
  out.identity = std::move(channel->identity);
  if (!token_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenSource>> token = TokenSource::Open(token_file);
    if (!token.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--auth-token-file=", token_file, ": ", token.status().message()));
    }
    out.token = *std::move(token);
  }
  return out;
}

}  // namespace stepwatch::security
