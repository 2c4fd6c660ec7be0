// gRPC credentials from PEM files. Certificates and keys are watched and reloaded when they change
// (cert-manager rotates them in place), so a rotation needs no restart; a key and certificate are
// served only once checked to be a pair (docs/security.md, "Certificate rotation").
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace stepwatch::security {

struct ServerTlsConfig {
  // Empty cert_file and key_file: plaintext (the caller warns).
  std::string cert_file;
  std::string key_file;
  // When set, every client must present a certificate signed by this CA.
  std::string client_ca_file;
  // How often the files are checked for changes.
  unsigned int reload_interval_seconds = 10;
};

struct ClientTlsConfig {
  // Empty ca_file: plaintext. The server's certificate must be signed by this CA and name the
  // host the client connects to (DNS or IP subject alternative name).
  std::string ca_file;
  // Optional client certificate (required by a collector started with --tls-client-ca).
  std::string cert_file;
  std::string key_file;
  unsigned int reload_interval_seconds = 10;
};

bool Enabled(const ServerTlsConfig& config);
bool Enabled(const ClientTlsConfig& config);

// OK when `key_pem` holds the private key of the first certificate in `cert_pem`; otherwise
// InvalidArgument naming the flags and files (`cert_flag`=`cert_file`, `key_flag`=`key_file`).
absl::Status CheckKeyCertPair(const std::string& cert_pem, const std::string& key_pem,
                              const std::string& cert_flag, const std::string& cert_file,
                              const std::string& key_flag, const std::string& key_file);

// A certificate and key that gRPC reads only after they were checked to be a pair, so that a
// rotation caught half-applied (new certificate, old key) keeps the previous pair serving instead
// of failing every handshake. The checked pair lives in memory (a memfd, key then certificate in
// one PEM, at path()); a watcher thread re-reads the source files every interval and swaps the
// memfd in one dup2 when they hold a new, matching pair. gRPC's file watcher reads path().
class CheckedKeyCertPair {
 public:
  struct Stats {
    uint64_t reloads = 0;        // new pairs taken after the first
    uint64_t reload_errors = 0;  // distinct contents of the files refused (mismatch, unreadable)
  };

  // Reads and checks the files now: InvalidArgument naming the flags when they do not hold a
  // matching pair. `reload_interval_seconds` 0: read once, no thread.
  static absl::StatusOr<std::unique_ptr<CheckedKeyCertPair>> Start(
      std::string cert_flag, std::string cert_file, std::string key_flag, std::string key_file,
      unsigned int reload_interval_seconds);
  ~CheckedKeyCertPair();
  CheckedKeyCertPair(const CheckedKeyCertPair&) = delete;
  CheckedKeyCertPair& operator=(const CheckedKeyCertPair&) = delete;

  // /proc/self/fd/N: the last pair that passed the check.
  const std::string& path() const { return path_; }
  Stats stats() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CheckedKeyCertPair(std::string cert_flag, std::string cert_file, std::string key_flag,
                     std::string key_file);
  // Reads and checks the files; publishes them when they are new and a pair.
  absl::Status Refresh(bool first) ABSL_LOCKS_EXCLUDED(mu_);
  void WatchLoop(absl::Duration interval) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string cert_flag_, cert_file_, key_flag_, key_file_;
  int slot_fd_ = -1;  // the fd number path() names; only Refresh() (one thread at a time) swaps it
  std::string path_;
  uint64_t generation_ = 0;  // Refresh() only
  std::string published_;    // Refresh() only: key + certificate now at path()
  std::string refused_;      // Refresh() only: last refused contents, so each is logged once
  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  Stats stats_ ABSL_GUARDED_BY(mu_);
  std::thread watcher_;
};

// Credentials plus what must outlive them: the checked pair gRPC reads (null without TLS).
struct ServerTls {
  std::shared_ptr<grpc::ServerCredentials> credentials;
  std::shared_ptr<CheckedKeyCertPair> identity;
};
struct ChannelTls {
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::shared_ptr<CheckedKeyCertPair> identity;  // null without a client certificate
};

// InvalidArgument when the flags are inconsistent (a key without a certificate, a client CA
// without a server certificate), a file cannot be read or holds no PEM block, or the key is not
// the certificate's.
absl::StatusOr<ServerTls> MakeServerCredentials(const ServerTlsConfig& config);
absl::StatusOr<ChannelTls> MakeChannelCredentials(const ClientTlsConfig& config);

}  // namespace stepwatch::security
