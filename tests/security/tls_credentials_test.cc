#include "security/tls_credentials.h"

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "gtest/gtest.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"
#include "security/tls_errors.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/temp_dir.h"

namespace stepwatch::security {
namespace {

using test::TempDir;
using ::testing::HasSubstr;

struct Pem {
  std::string cert;
  std::string key;
};

std::string BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);  // NOLINT(runtime/int): OpenSSL's type
  std::string out(data, static_cast<size_t>(n));
  BIO_free(bio);
  return out;
}

// A self-signed P-256 certificate and its key, made in memory.
Pem SelfSigned(const char* common_name) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  X509* cert = X509_new();
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), 1);
  X509_gmtime_adj(X509_getm_notBefore(cert), 0);
  X509_gmtime_adj(X509_getm_notAfter(cert), 3600);
  X509_set_pubkey(cert, key);
  X509_NAME* name = X509_get_subject_name(cert);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
  X509_set_issuer_name(cert, name);
  X509_sign(cert, key, EVP_sha256());
  BIO* cert_bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(cert_bio, cert);
  BIO* key_bio = BIO_new(BIO_s_mem());
  PEM_write_bio_PrivateKey(key_bio, key, nullptr, nullptr, 0, nullptr, nullptr);
  X509_free(cert);
  EVP_PKEY_free(key);
  return {BioText(cert_bio), BioText(key_bio)};
}

TEST(CheckKeyCertPairTest, AcceptsAPairAndNamesTheFlagsOfAMismatch) {
  const Pem a = SelfSigned("a");
  const Pem b = SelfSigned("b");
  EXPECT_OK(CheckKeyCertPair(a.cert, a.key, "--tls-cert", "a.pem", "--tls-key", "a.key"));
  const absl::Status mismatch =
      CheckKeyCertPair(a.cert, b.key, "--tls-cert", "a.pem", "--tls-key", "b.key");
  EXPECT_THAT(mismatch, test::StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(mismatch.message().find("--tls-key=b.key"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.message().find("--tls-cert=a.pem"), std::string::npos) << mismatch;
  const absl::Status no_cert =
      CheckKeyCertPair(a.key, a.key, "--tls-cert", "k.pem", "--tls-key", "a.key");
  EXPECT_NE(no_cert.message().find("--tls-cert=k.pem"), std::string::npos) << no_cert;
  const absl::Status no_key =
      CheckKeyCertPair(a.cert, a.cert, "--tls-cert", "a.pem", "--tls-key", "c.pem");
  EXPECT_NE(no_key.message().find("--tls-key=c.pem"), std::string::npos) << no_key;
}

TEST(CheckedKeyCertPairTest, RefusesAMismatchAtStart) {
  const TempDir dir("stepwatch-tls-test");
  ASSERT_FALSE(dir.path().empty());
  const Pem a = SelfSigned("a");
  const Pem b = SelfSigned("b");
  ASSERT_OK(WriteFileAtomically(dir.File("cert.pem"), a.cert));
  ASSERT_OK(WriteFileAtomically(dir.File("key.pem"), b.key));
  auto pair = CheckedKeyCertPair::Start("--tls-cert", dir.File("cert.pem"), "--tls-key",
                                        dir.File("key.pem"), 0);
  EXPECT_THAT(pair, test::StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls-key=")));
}

TEST(CheckedKeyCertPairTest, KeepsThePreviousPairWhileARotationIsHalfApplied) {
  const TempDir dir("stepwatch-tls-test");
  ASSERT_FALSE(dir.path().empty());
  const Pem a = SelfSigned("a");
  const Pem b = SelfSigned("b");
  ASSERT_OK(WriteFileAtomically(dir.File("cert.pem"), a.cert));
  ASSERT_OK(WriteFileAtomically(dir.File("key.pem"), a.key));
  auto pair = CheckedKeyCertPair::Start("--tls-cert", dir.File("cert.pem"), "--tls-key",
                                        dir.File("key.pem"), 1);
  ASSERT_OK(pair);
  auto served = [&] { return ReadFile((*pair)->path()).value_or(""); };
  EXPECT_EQ(served(), absl::StrCat(a.key, "\n", a.cert));

  // New certificate, old key: refused, counted once, the old pair still served.
  ASSERT_OK(WriteFileAtomically(dir.File("cert.pem"), b.cert));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while ((*pair)->stats().reload_errors == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ((*pair)->stats().reload_errors, 1u);
  EXPECT_EQ(served(), absl::StrCat(a.key, "\n", a.cert));
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ((*pair)->stats().reload_errors, 1u) << "a persisting bad state is counted once";

  // The rotation completes: the new pair is served.
  ASSERT_OK(WriteFileAtomically(dir.File("key.pem"), b.key));
  while ((*pair)->stats().reloads == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ((*pair)->stats().reloads, 1u);
  EXPECT_EQ(served(), absl::StrCat(b.key, "\n", b.cert));
}

TEST(ExplainTlsFailureTest, NamesTheCommonCauses) {
  const TlsClientFlags tls_with_cert{true, true};
  EXPECT_NE(ExplainTlsFailure("ipv4:127.0.0.1:1: Custom verification check failed with error: "
                              "UNAUTHENTICATED: Hostname Verification Check failed.",
                              tls_with_cert)
                .find("name mismatch"),
            std::string::npos);
  EXPECT_NE(ExplainTlsFailure("Tls handshake failed: SSL_ERROR_SSL: error:0A000086:SSL "
                              "routines::certificate verify failed",
                              tls_with_cert)
                .find("unknown CA"),
            std::string::npos);
  EXPECT_NE(ExplainTlsFailure("certificate has expired", tls_with_cert).find("expired"),
            std::string::npos);
  EXPECT_NE(ExplainTlsFailure("SSL routines::wrong version number", tls_with_cert)
                .find("does not speak TLS"),
            std::string::npos);
  // A bare "Socket closed": the hint depends on what the client offered.
  const std::string closed =
      "failed to connect to all addresses; last error: UNAVAILABLE: "
      "ipv4:127.0.0.1:1: Socket closed";
  EXPECT_NE(ExplainTlsFailure(closed, {true, false}).find("no client certificate"),
            std::string::npos);
  EXPECT_NE(ExplainTlsFailure(closed, {true, false}).find("--tls-cert"), std::string::npos);
  const std::string refused = ExplainTlsFailure(closed, tls_with_cert);
  EXPECT_NE(refused.find("unknown CA"), std::string::npos) << refused;
  EXPECT_NE(refused.find("expired"), std::string::npos) << refused;
  EXPECT_NE(ExplainTlsFailure(closed, {false, false}).find("--tls-ca"), std::string::npos);
  EXPECT_EQ(ExplainTlsFailure("Deadline Exceeded", tls_with_cert), "");
  EXPECT_EQ(ExplainTlsFailure("failed to connect to all addresses; last error: UNAVAILABLE: "
                              "ipv4:127.0.0.1:1: Connection refused",
                              tls_with_cert),
            "");
}

}  // namespace
}  // namespace stepwatch::security
