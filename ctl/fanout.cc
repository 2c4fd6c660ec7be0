#include "ctl/fanout.h"

namespace stepwatch::ctl {

CollectorClients::CollectorClients(const std::vector<std::string>& addresses,
                                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                                   const grpc::ChannelArguments& channel_args,
                                   std::string authorization, absl::Duration timeout)
    : authorization_(std::move(authorization)), timeout_(timeout) {
  for (const std::string& address : addresses) {
    stubs_.emplace(address, std::make_unique<v1::Query::Stub>(
                                grpc::CreateCustomChannel(address, credentials, channel_args)));
  }
}

grpc::ChannelArguments QueryChannelArguments(const std::string& tls_target_name) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxReplyBytes);
  if (!tls_target_name.empty()) args.SetSslTargetNameOverride(tls_target_name);
  return args;
}

v1::Query::Stub* CollectorClients::StubFor(const std::string& address) const {
  return stubs_.at(address).get();
}

}  // namespace stepwatch::ctl
