#include "security/tls_credentials.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/file.h"
#include "common/log.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "openssl/bio.h"
#include "openssl/err.h"
#include "openssl/evp.h"
#include "openssl/pem.h"
#include "openssl/x509.h"

namespace stepwatch::security {
namespace {

// How often gRPC re-reads the checked copy (in memory) and the CA file.
constexpr unsigned int kCheckedCopyPollSeconds = 1;

// Reads a file now so that a typo in a path fails at start, not at the first handshake.
absl::Status CheckPem(const char* flag, const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path, 1 << 20);
  if (!data.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": ", data.status().message()));
  }
  if (!absl::StrContains(*data, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(flag, "=", path, ": not a PEM file"));
  }
  return absl::OkStatus();
}

// OpenSSL's reason for the last failure, and a clean error queue for the next caller.
std::string OpenSslError() {
  const unsigned long code = ERR_peek_last_error();  // NOLINT(runtime/int): OpenSSL's type
  std::string out = code == 0                                  ? ""
                    : ERR_reason_error_string(code) == nullptr ? ""
                                                               : ERR_reason_error_string(code);
  ERR_clear_error();
  return out;
}

// A memfd holding `data` whose mtime is `generation` seconds: gRPC's file watcher compares
// whole-second mtimes before and after reading, so distinct generations are never mixed.
absl::StatusOr<int> MakeMemfd(const std::string& data, uint64_t generation) {
  const int fd = memfd_create("stepwatch-tls", MFD_CLOEXEC);
  if (fd < 0) return absl::InternalError(absl::StrCat("memfd_create: ", std::strerror(errno)));
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("writing a memfd: ", std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  const struct timespec times[2] = {{static_cast<time_t>(generation), 0},
                                    {static_cast<time_t>(generation), 0}};
  if (futimens(fd, times) != 0) {
    const int e = errno;
    close(fd);
    return absl::InternalError(absl::StrCat("futimens on a memfd: ", std::strerror(e)));
  }
  return fd;
}

}  // namespace

absl::Status CheckKeyCertPair(const std::string& cert_pem, const std::string& key_pem,
                              const std::string& cert_flag, const std::string& cert_file,
                              const std::string& key_flag, const std::string& key_file) {
  auto free_bio = [](BIO* b) { BIO_free(b); };
  std::unique_ptr<BIO, decltype(free_bio)> cert_bio(
      BIO_new_mem_buf(cert_pem.data(), static_cast<int>(cert_pem.size())), free_bio);
  std::unique_ptr<BIO, decltype(free_bio)> key_bio(
      BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())), free_bio);
  if (cert_bio == nullptr || key_bio == nullptr) return absl::ResourceExhaustedError("BIO_new");
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr), &X509_free);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        cert_flag, "=", cert_file, ": no readable certificate (", OpenSslError(), ")"));
  }
  // An empty passphrase: an encrypted key fails here instead of prompting on the terminal.
  char no_passphrase[] = "";
  std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)> key(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, no_passphrase), &EVP_PKEY_free);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, "=", key_file, ": no readable unencrypted private key (", OpenSslError(), ")"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    OpenSslError();
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, "=", key_file, " is not the private key of the certificate in ", cert_flag, "=",
        cert_file, " (a rotation half applied? replace both at once, docs/security.md)"));
  }
  return absl::OkStatus();
}

CheckedKeyCertPair::CheckedKeyCertPair(std::string cert_flag, std::string cert_file,
                                       std::string key_flag, std::string key_file)
    : cert_flag_(std::move(cert_flag)),
      cert_file_(std::move(cert_file)),
      key_flag_(std::move(key_flag)),
      key_file_(std::move(key_file)) {}

absl::StatusOr<std::unique_ptr<CheckedKeyCertPair>> CheckedKeyCertPair::Start(
    std::string cert_flag, std::string cert_file, std::string key_flag, std::string key_file,
    unsigned int reload_interval_seconds) {
  std::unique_ptr<CheckedKeyCertPair> pair(new CheckedKeyCertPair(
      std::move(cert_flag), std::move(cert_file), std::move(key_flag), std::move(key_file)));
  if (absl::Status s = pair->Refresh(/*first=*/true); !s.ok()) return s;
  if (reload_interval_seconds > 0) {
    const absl::Duration interval = absl::Seconds(reload_interval_seconds);
    CheckedKeyCertPair* p = pair.get();
    pair->watcher_ = std::thread([p, interval] { p->WatchLoop(interval); });
  }
  return pair;
}

CheckedKeyCertPair::~CheckedKeyCertPair() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
  if (slot_fd_ >= 0) close(slot_fd_);
}

CheckedKeyCertPair::Stats CheckedKeyCertPair::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void CheckedKeyCertPair::WatchLoop(absl::Duration interval) {
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_), interval)) return;
    }
    if (absl::Status s = Refresh(/*first=*/false); !s.ok()) {
      SW_LOG_ERROR << "TLS certificate not reloaded, the previous one keeps serving: "
                   << s.message();
    }
  }
}

absl::Status CheckedKeyCertPair::Refresh(bool first) {
  absl::StatusOr<std::string> cert = ReadFile(cert_file_, 1 << 20);
  absl::StatusOr<std::string> key = ReadFile(key_file_, 1 << 20);
  absl::Status problem;
  if (!cert.ok()) {
    problem = absl::InvalidArgumentError(
        absl::StrCat(cert_flag_, "=", cert_file_, ": ", cert.status().message()));
  } else if (!key.ok()) {
    problem = absl::InvalidArgumentError(
        absl::StrCat(key_flag_, "=", key_file_, ": ", key.status().message()));
  }
  // The key first: OpenSSL finds each block by its name, and gRPC reads this one file for both.
  const std::string combined = problem.ok() ? absl::StrCat(*key, "\n", *cert) : std::string();
  if (problem.ok() && combined == published_) {
    refused_.clear();
    return absl::OkStatus();
  }
  if (problem.ok()) {
    problem = CheckKeyCertPair(*cert, *key, cert_flag_, cert_file_, key_flag_, key_file_);
  }
  if (!problem.ok()) {
    if (first) return problem;
    // Each refused state is logged and counted once, not at every interval it persists.
    const std::string seen = combined.empty() ? std::string(problem.message()) : combined;
    if (seen == refused_) return absl::OkStatus();
    refused_ = seen;
    absl::MutexLock lock(&mu_);
    ++stats_.reload_errors;
    return problem;
  }
  absl::StatusOr<int> fd = MakeMemfd(combined, ++generation_);
  if (!fd.ok()) {
    if (first) return fd.status();
    absl::MutexLock lock(&mu_);
    ++stats_.reload_errors;
    return fd.status();
  }
  if (slot_fd_ < 0) {
    slot_fd_ = *fd;
    path_ = absl::StrCat("/proc/self/fd/", slot_fd_);
  } else {
    // One step: gRPC sees the old pair or the new one, never a mix. dup2 keeps O_CLOEXEC off.
    if (dup2(*fd, slot_fd_) < 0) {
      const int e = errno;
      close(*fd);
      absl::MutexLock lock(&mu_);
      ++stats_.reload_errors;
      return absl::InternalError(absl::StrCat("dup2: ", std::strerror(e)));
    }
    close(*fd);
    fcntl(slot_fd_, F_SETFD, FD_CLOEXEC);
    SW_LOG_INFO << "TLS certificate " << cert_file_ << " and key " << key_file_
                << " reloaded (checked to be a pair)";
    absl::MutexLock lock(&mu_);
    ++stats_.reloads;
  }
  published_ = combined;
  refused_.clear();
  return absl::OkStatus();
}

bool Enabled(const ServerTlsConfig& c) { return !c.cert_file.empty() || !c.key_file.empty(); }
bool Enabled(const ClientTlsConfig& c) {
  return !c.ca_file.empty() || !c.cert_file.empty() || !c.key_file.empty();
}

absl::StatusOr<ServerTls> MakeServerCredentials(const ServerTlsConfig& c) {
  if (!Enabled(c)) {
    if (!c.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
    }
    return ServerTls{grpc::InsecureServerCredentials(), nullptr};
  }
  if (c.cert_file.empty() || c.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (absl::Status s = CheckPem("--tls-cert", c.cert_file); !s.ok()) return s;
  if (absl::Status s = CheckPem("--tls-key", c.key_file); !s.ok()) return s;
  if (!c.client_ca_file.empty()) {
    if (absl::Status s = CheckPem("--tls-client-ca", c.client_ca_file); !s.ok()) return s;
  }
  absl::StatusOr<std::unique_ptr<CheckedKeyCertPair>> identity = CheckedKeyCertPair::Start(
      "--tls-cert", c.cert_file, "--tls-key", c.key_file, c.reload_interval_seconds);
  if (!identity.ok()) return identity.status();
  ServerTls out;
  out.identity = *std::move(identity);
  // gRPC polls the checked copy every second: a pair is served about a second after it passed.
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      out.identity->path(), out.identity->path(), c.client_ca_file, kCheckedCopyPollSeconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (!c.client_ca_file.empty()) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  out.credentials = grpc::experimental::TlsServerCredentials(options);
  if (out.credentials == nullptr) return absl::InternalError("gRPC refused the TLS server options");
  return out;
}

absl::StatusOr<ChannelTls> MakeChannelCredentials(const ClientTlsConfig& c) {
  if (!Enabled(c)) return ChannelTls{grpc::InsecureChannelCredentials(), nullptr};
  if (c.ca_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key need --tls-ca");
  }
  if (c.cert_file.empty() != c.key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (absl::Status s = CheckPem("--tls-ca", c.ca_file); !s.ok()) return s;
  ChannelTls out;
  if (!c.cert_file.empty()) {
    if (absl::Status s = CheckPem("--tls-cert", c.cert_file); !s.ok()) return s;
    if (absl::Status s = CheckPem("--tls-key", c.key_file); !s.ok()) return s;
    absl::StatusOr<std::unique_ptr<CheckedKeyCertPair>> identity = CheckedKeyCertPair::Start(
        "--tls-cert", c.cert_file, "--tls-key", c.key_file, c.reload_interval_seconds);
    if (!identity.ok()) return identity.status();
    out.identity = *std::move(identity);
  }
  const std::string identity_path = out.identity == nullptr ? "" : out.identity->path();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      identity_path, identity_path, c.ca_file, kCheckedCopyPollSeconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (out.identity != nullptr) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  out.credentials = grpc::experimental::TlsCredentials(options);
  if (out.credentials == nullptr) {
    return absl::InternalError("gRPC refused the TLS channel options");
  }
  return out;
}

}  // namespace stepwatch::security
