// The node a client certificate names, and when a stream must be refused for naming none: the
// properties gRPC fills from a verified certificate, on a fake AuthContext.
#include "security/peer_identity.h"

#include <string>
#include <utility>
#include <vector>

#include "grpc/grpc_security_constants.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace stepwatch::security {
namespace {

using ::stepwatch::test::StatusIs;
using ::testing::HasSubstr;

// AuthPropertyIterator's default constructor is protected.
struct NoProperties : grpc::AuthPropertyIterator {};

// What gRPC's SSL transport sets: the peer is "authenticated" only when the certificate names it
// (a SAN or a CN); the PEM of any verified certificate is there.
class FakeAuthContext : public grpc::AuthContext {
 public:
  explicit FakeAuthContext(std::vector<std::pair<std::string, std::string>> properties,
                           bool authenticated)
      : properties_(std::move(properties)), authenticated_(authenticated) {}
  bool IsPeerAuthenticated() const override { return authenticated_; }
  std::vector<grpc::string_ref> GetPeerIdentity() const override { return {}; }
  std::string GetPeerIdentityPropertyName() const override { return ""; }
  std::vector<grpc::string_ref> FindPropertyValues(const std::string& name) const override {
    std::vector<grpc::string_ref> out;
    for (const auto& [k, v] : properties_) {
      if (k == name) out.emplace_back(v);
    }
    return out;
  }
  grpc::AuthPropertyIterator begin() const override { return NoProperties(); }
  grpc::AuthPropertyIterator end() const override { return NoProperties(); }
  void AddProperty(const std::string& key, const grpc::string_ref& value) override {
    properties_.emplace_back(key, std::string(value.data(), value.size()));
  }
  bool SetPeerIdentityPropertyName(const std::string&) override { return true; }

 private:
  std::vector<std::pair<std::string, std::string>> properties_;
  bool authenticated_;
};

const std::pair<std::string, std::string> kPem{GRPC_X509_PEM_CERT_PROPERTY_NAME,
                                               "-----BEGIN CERTIFICATE-----..."};
const std::pair<std::string, std::string> kSsl{GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME, "ssl"};

TEST(PeerIdentityTest, DnsNameFirstThenCommonName) {
  FakeAuthContext both({kSsl,
                        kPem,
                        {GRPC_X509_CN_PROPERTY_NAME, "cn-name"},
                        {GRPC_PEER_DNS_PROPERTY_NAME, ""},
                        {GRPC_PEER_DNS_PROPERTY_NAME, "node-a"}},
                       true);
  EXPECT_EQ(PeerCertificate(both).node, "node-a");
  EXPECT_TRUE(PeerCertificate(both).certificate);
  FakeAuthContext cn_only({kSsl, kPem, {GRPC_X509_CN_PROPERTY_NAME, "node-b"}}, true);
  EXPECT_EQ(PeerCertificateIdentity(cn_only), "node-b");
  absl::StatusOr<std::string> verified = VerifiedNodeIdentity(cn_only, true);
  ASSERT_OK(verified);
  EXPECT_EQ(*verified, "node-b");
}

TEST(PeerIdentityTest, ACertificateNamingNoNodeIsRefused) {
  // Signed by the CA, with only an IP name: gRPC does not call the peer authenticated.
  FakeAuthContext nameless({kSsl, kPem, {GRPC_PEER_IP_PROPERTY_NAME, "10.0.0.7"}}, false);
  const PeerIdentity id = PeerCertificate(nameless);
  EXPECT_TRUE(id.certificate);
  EXPECT_EQ(id.node, "");
  for (bool required : {false, true}) {
    absl::StatusOr<std::string> verified = VerifiedNodeIdentity(nameless, required);
    EXPECT_THAT(verified,
                StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("names no node")));
  }
}

TEST(PeerIdentityTest, UnusableNamesAreRefused) {
  FakeAuthContext long_name(
      {kSsl, kPem, {GRPC_PEER_DNS_PROPERTY_NAME, std::string(kMaxNodeIdentityBytes + 1, 'n')}},
      true);
  EXPECT_EQ(VerifiedNodeIdentity(long_name, true).status().code(),
            absl::StatusCode::kPermissionDenied);
  FakeAuthContext control({kSsl, kPem, {GRPC_X509_CN_PROPERTY_NAME, "node\x1b[2J"}}, true);
  EXPECT_EQ(VerifiedNodeIdentity(control, true).status().code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(PeerIdentityTest, NoCertificateIsNothingToVerifyUnlessOneIsRequired) {
  FakeAuthContext plaintext({}, false);
  absl::StatusOr<std::string> verified = VerifiedNodeIdentity(plaintext, false);
  ASSERT_OK(verified);
  EXPECT_EQ(*verified, "");
  EXPECT_EQ(VerifiedNodeIdentity(plaintext, true).status().code(),
            absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace stepwatch::security
